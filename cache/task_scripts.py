"""The task board's Lua scripts: each is one atomic step on a job's task stream (see `cache.tasks`).

`STEP` stores a finished task's gradient with its ack and claims the next task; `DEAD_LETTER` gives a task up with
its reason; `HEARTBEAT` refreshes a learner's lease; `ENQUEUE` appends a round's tasks and may close the round.
"""

from __future__ import annotations

# Prelude: `now`, the server clock in ms (leases are compared on one clock, not the callers').
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Prelude: `wake(key, n, ttl)` pushes n wake-ups onto a bounded list that idle waiters block on.
_WAKE = """
local function wake(key, n, ttl)
  for _ = 1, n do redis.call('LPUSH', key, '1') end
  redis.call('LTRIM', key, 0, 1023)
  redis.call('PEXPIRE', key, ttl)
end
"""

# One round trip per task: store the finished task's gradient with its ack (when one is given), then claim the next.
# KEYS: tasks, learners, deadlines, dead letters, version, aggregator, closed, wake, control, gradients
# ARGV: group, me, lease ms, max attempts, ttl ms, dead-letter maxlen, pending scan count, held version,
#       policy key prefix, gradient maxlen, the task the caller computes meanwhile ('' for none: a learner that
#       claims ahead holds it, and it is not handed out again), finished task id ('' for none), then the
#       gradient's fields
STEP = (
    _NOW
    + _WAKE
    + """
local stored = false
if ARGV[12] ~= '' then
  local mine = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[12], ARGV[12], 1, ARGV[2])
  if #mine == 0 then
    stored = 'lost'
  elseif redis.call('XLEN', KEYS[10]) >= tonumber(ARGV[10]) then
    return {'full'}
  else
    stored = redis.call('XADD', KEYS[10], '*', unpack(ARGV, 13))
    redis.call('PEXPIRE', KEYS[10], ARGV[5])
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[12])
    redis.call('XDEL', KEYS[1], ARGV[12])
    wake(KEYS[8], 1, ARGV[5])
  end
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, id in ipairs(dead) do
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local version = redis.call('GET', KEYS[5])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], version or '0')
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
local claimed = false
local next_expiry = false
local dropped = 0
local ok, pending = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[7]))
if not ok then pending = {} end
for _, p in ipairs(pending) do
  local id, owner, deliveries = p[1], p[2], tonumber(p[4])
  if owner == ARGV[2] then
    -- Already ours and not the one we compute, yet we ask for work: the reply that carried it was lost (a retry
    -- after a dropped connection). Hand it out again, or it would stay ours, unworked, for as long as our lease lives.
    if not claimed and id ~= ARGV[11] then
      local entries = redis.call('XRANGE', KEYS[1], id, id)
      if #entries > 0 then claimed = entries[1] end
    end
  else
    local deadline = redis.call('ZSCORE', KEYS[3], owner)
    if deadline then
      deadline = tonumber(deadline)
      if not next_expiry or deadline < next_expiry then next_expiry = deadline end
    elseif not claimed then
      local entries = redis.call('XRANGE', KEYS[1], id, id)
      if #entries == 0 or deliveries >= tonumber(ARGV[4]) then
        local reason = 'attempts'
        if #entries == 0 then reason = 'entry gone' end
        redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'kind', 'task', 'id', id, 'reason',
          reason .. ' (' .. deliveries .. ' deliveries, last holder ' .. owner .. ')')
        redis.call('PEXPIRE', KEYS[4], ARGV[5])
        redis.call('XACK', KEYS[1], ARGV[1], id)
        redis.call('XDEL', KEYS[1], id)
        redis.call('XADD', KEYS[9], 'MAXLEN', '~', 64, '*', 'event', 'dead-letter')
        wake(KEYS[8], 1, ARGV[5])
        dropped = dropped + 1
      else
        local got = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id)
        if got[1] then claimed = got[1] end
      end
    end
  end
end
if not claimed then
  local ok2, got = pcall(redis.call, 'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
  if ok2 and got then claimed = got[1][2][1] end
end
local weights = false
if claimed and version and version ~= ARGV[8] then
  -- the policy key shares the job's hash tag (same slot) but depends on the version read here
  weights = redis.call('GET', ARGV[9] .. version) or false
end
local outstanding = redis.call('XLEN', KEYS[1])
local agg = redis.call('HMGET', KEYS[6], 'kl_coef', 'target_version')
return {stored, claimed, version or false, outstanding, next_expiry or false, redis.call('HGETALL', KEYS[2]),
        agg[1] or false, agg[2] or false, redis.call('GET', KEYS[7]) or false, dropped, now, weights}
"""
)

# KEYS: tasks, dead letters, wake, control. ARGV: group, me, task id, reason, dead-letter maxlen, ttl ms
DEAD_LETTER = (
    _WAKE
    + """
local mine = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #mine == 0 then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'task', 'id', ARGV[3], 'reason', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', 64, '*', 'event', 'dead-letter')
wake(KEYS[3], 1, ARGV[6])
return 1
"""
)

# KEYS: deadlines. ARGV: me, lease ms, ttl ms
HEARTBEAT = (
    _NOW
    + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

# KEYS: tasks, wake, closed. ARGV: maxlen, ttl ms, round to close ('' keeps it open), then one header per task
ENQUEUE = (
    _WAKE
    + """
local room = tonumber(ARGV[1]) - redis.call('XLEN', KEYS[1])
local ids = {}
for i = 4, #ARGV do
  if #ids >= room then break end
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'h', ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if #ids == #ARGV - 3 and ARGV[3] ~= '' then
  redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[2])
end
wake(KEYS[2], math.min(#ids + 1, 64), ARGV[2])
return ids
"""
)
