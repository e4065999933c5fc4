"""The policy store's Lua scripts: each is one atomic step on a job's policy keys (see `cache.policy_store`).

Every script that writes checks the update lease first, so a holder whose lease ran out changes nothing (fencing).
"""

from __future__ import annotations

from cache.learner_registry import snapshot_lua

# Store the first version unless the job already has one (then return that one).
# KEYS: version, policy, optim, events. ARGV: weights, optim ('' for none), ttl ms, version
INIT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return tonumber(redis.call('GET', KEYS[1])) end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
if ARGV[2] ~= '' then redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3]) end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', 64, '*', 'v', ARGV[4])
redis.call('PEXPIRE', KEYS[4], ARGV[3])
return tonumber(ARGV[4])
"""

# Publish and acknowledge as one step: the new version, the optimizer state, the aggregator's state, the removal of
# the gradients that went into it, and its record in the applied log, all or nothing. Returns {the new version,
# the work snapshot after it (`cache.learner_registry.WorkSnapshot`), the gradients that landed after the one read
# last}: the publisher's next look and read come with it.
# KEYS: version, lock, new policy, optim, events, retired policy, gradients, gradients freed, aggregator, applied,
#       learners (id -> held version), learner deadlines, tasks, tasks closed
# ARGV: lease value, expected version, weights, optim, ttl ms, retired grace ms, applied maxlen, retired version,
#       the id read last ('' to read none), how many to read at most, n ids, ids..., n aggregator pairs, field,
#       value, ..., then the applied record's field/value pairs
PUBLISH_ACK = (
    """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return redis.error_reply('FENCE update lease not held') end
local cur = tonumber(redis.call('GET', KEYS[1]))
if cur == nil then return redis.error_reply('FENCE store not initialised') end
if cur ~= tonumber(ARGV[2]) then
  return redis.error_reply('FENCE version is ' .. cur .. ', expected ' .. ARGV[2])
end
local n = tonumber(ARGV[11])
for i = 12, 11 + n do
  if #redis.call('XRANGE', KEYS[7], ARGV[i], ARGV[i]) == 0 then
    return redis.error_reply('FENCE gradient ' .. ARGV[i] .. ' is gone')
  end
end
local new = cur + 1
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[5])
if ARGV[4] ~= '' then redis.call('SET', KEYS[4], ARGV[4], 'PX', ARGV[5]) end
redis.call('SET', KEYS[1], new, 'PX', ARGV[5])
if KEYS[6] ~= KEYS[3] then
  -- The version leaving the newest K: kept a grace period only while a registered learner holds it, else dropped.
  local held = false
  for _, v in ipairs(redis.call('HVALS', KEYS[11])) do
    if v == ARGV[8] then held = true break end
  end
  if held then redis.call('PEXPIRE', KEYS[6], ARGV[6]) else redis.call('UNLINK', KEYS[6]) end
end
redis.call('XADD', KEYS[5], 'MAXLEN', '~', 64, '*', 'v', new)
redis.call('PEXPIRE', KEYS[5], ARGV[5])
for i = 12, 11 + n do
  redis.call('XDEL', KEYS[7], ARGV[i])
  redis.call('LPUSH', KEYS[8], '1')
end
if n > 0 then
  redis.call('LTRIM', KEYS[8], 0, 1023)
  redis.call('PEXPIRE', KEYS[8], ARGV[5])
end
local a = 12 + n
local pairs_n = tonumber(ARGV[a])
if pairs_n > 0 then
  redis.call('HSET', KEYS[9], unpack(ARGV, a + 1, a + 2 * pairs_n))
  redis.call('PEXPIRE', KEYS[9], ARGV[5])
end
local r = a + 2 * pairs_n + 1
if r <= #ARGV then
  redis.call('XADD', KEYS[10], 'MAXLEN', '~', ARGV[7], '*', 'version', new, unpack(ARGV, r))
  redis.call('PEXPIRE', KEYS[10], ARGV[5])
end
"""
    + snapshot_lua("KEYS[11]", "KEYS[12]", "KEYS[13]", "KEYS[14]", "KEYS[7]")
    + """
local landed = {}
if ARGV[9] ~= '' then landed = redis.call('XRANGE', KEYS[7], '(' .. ARGV[9], '+', 'COUNT', ARGV[10]) end
return {new, snapshot, landed}
"""
)

# KEYS: version, lock, optim. ARGV: lease value, the version the state belongs to, state, ttl ms.
SAVE_OPTIM = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return redis.error_reply('FENCE update lease not held') end
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return redis.error_reply('FENCE version moved past ' .. ARGV[2]) end
redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
return 1
"""

# KEYS: lock. ARGV: lease value, lease ms. Extends the lease only while the caller still holds it.
REFRESH_LEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: version. ARGV: the version the caller holds ('' for none), policy key prefix. The policy key shares the
# job's hash tag (same slot) but depends on the version read here.
NEWER = """
local v = redis.call('GET', KEYS[1])
if not v then return false end
if v == ARGV[1] then return {v} end
return {v, redis.call('GET', ARGV[2] .. v)}
"""

# KEYS: lock, released (the list a waiting `acquire` blocks on). ARGV: lease value, ttl ms of that list, and
# 'owner' when ARGV[1] is only the owner (whatever its fencing token: the holder died and the token is unknown).
RELEASE_LEASE = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or (ARGV[3] == 'owner' and held and string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. ':') then
  redis.call('DEL', KEYS[1])
  redis.call('LPUSH', KEYS[2], '1')
  redis.call('LTRIM', KEYS[2], 0, 15)
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
"""
