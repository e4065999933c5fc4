"""The replay store's Lua scripts: each step runs atomically inside Redis, so a concurrent reader never sees an
entry half evicted and an evicted entry's priority is never written back.

KEYS of every script, all in the job's hash slot: 1 data (stream of copied batches), 2 index (hash replay id ->
"stream id|bytes|seq|actor"), 3 order (zset replay id -> seq, oldest first), 4 actors (zset, score 0, members
"actor\\0<seq, 16 digits>\\0replay id": each actor's entries in arrival order by lex range), 5 priority (zset replay
id -> priority), 6 state (hash: bytes, peak_bytes, seq, evicted, max_priority).
"""

_EVICT = """
local function evict(rid)
  local rec = redis.call('HGET', KEYS[2], rid)
  if not rec then return 0 end
  local sid, size, seq, actor = string.match(rec, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
  redis.call('XDEL', KEYS[1], sid)
  redis.call('HDEL', KEYS[2], rid)
  redis.call('ZREM', KEYS[3], rid)
  redis.call('ZREM', KEYS[4], actor .. '\\0' .. string.format('%016d', tonumber(seq)) .. '\\0' .. rid)
  redis.call('ZREM', KEYS[5], rid)
  redis.call('HINCRBY', KEYS[6], 'bytes', -tonumber(size))
  redis.call('HINCRBY', KEYS[6], 'evicted', 1)
  return 1
end
"""

_TOUCH = """
local function touch(ttl)
  for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
"""

_INSERT = """
local function insert(rid, actor, fields, seq, prio, cap, bmax, per, what)
  local size = 0
  for i = 1, #fields do size = size + #fields[i] end
  if size > bmax then
    return nil, 'TOOBIG ' .. what .. ' has ' .. size .. ' bytes, over replay_capacity_mb (' .. bmax .. ' bytes)'
  end
  local evicted = 0
  if per > 0 then
    local lo, hi = '[' .. actor .. '\\0', '[' .. actor .. '\\0\\255'
    while redis.call('ZLEXCOUNT', KEYS[4], lo, hi) >= per do
      local m = redis.call('ZRANGEBYLEX', KEYS[4], lo, hi, 'LIMIT', 0, 1)[1]
      local gone = evict(string.match(m, '%z[0-9]+%z(.*)$'))  -- %z: Lua 5.1 patterns cannot hold a NUL
      if gone == 0 then return nil, 'CORRUPT replay actor index member without an entry' end
      evicted = evicted + gone
    end
  end
  local bytes = tonumber(redis.call('HGET', KEYS[6], 'bytes') or 0)
  while redis.call('ZCARD', KEYS[3]) >= cap or bytes + size > bmax do
    local oldest = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not oldest or evict(oldest) == 0 then return nil, 'CORRUPT replay order without an entry' end
    evicted = evicted + 1
    bytes = tonumber(redis.call('HGET', KEYS[6], 'bytes') or 0)
  end
  if seq then
    -- A restored entry keeps its arrival seq; later arrivals come after every restored one.
    if seq > tonumber(redis.call('HGET', KEYS[6], 'seq') or 0) then redis.call('HSET', KEYS[6], 'seq', seq) end
  else
    seq = redis.call('HINCRBY', KEYS[6], 'seq', 1)
  end
  local sid = redis.call('XADD', KEYS[1], '*', unpack(fields))
  redis.call('HSET', KEYS[2], rid, sid .. '|' .. size .. '|' .. seq .. '|' .. actor)
  redis.call('ZADD', KEYS[3], seq, rid)
  redis.call('ZADD', KEYS[4], 0, actor .. '\\0' .. string.format('%016d', seq) .. '\\0' .. rid)
  if prio then redis.call('ZADD', KEYS[5], prio, rid) end
  bytes = redis.call('HINCRBY', KEYS[6], 'bytes', size)
  if bytes > tonumber(redis.call('HGET', KEYS[6], 'peak_bytes') or 0) then
    redis.call('HSET', KEYS[6], 'peak_bytes', bytes)
  end
  return evicted, bytes
end

local function held(rid)  -- the reply for an entry the store has already
  if redis.call('HEXISTS', KEYS[2], rid) == 0 then return nil end
  return {0, 0, tonumber(redis.call('HGET', KEYS[6], 'bytes') or 0)}
end

local function added(ttl, evicted, bytes)  -- insert's outcome as the reply
  if not evicted then return redis.error_reply(bytes) end
  touch(ttl)
  return {1, evicted, bytes}
end
"""

_STORE = _EVICT + _TOUCH + _INSERT  # what ADD and PUT share

# KEYS 1-6 as above, 7 the job's trajectory stream. ARGV: stream id, replay id, actor, capacity, bytes max, per-actor
# max (0: none), ttl ms, prioritized (1/0). Copies the landed batch (it must still be on the stream: before its ack)
# and evicts, oldest first, the actor's entries over its per-actor bound and then any entry over the count or byte
# bound. Returns {added (1/0), evicted, bytes after}; a batch larger than the whole byte bound is an error.
ADD = (
    _STORE
    + """
local rid = ARGV[2]
if held(rid) then return held(rid) end
local src = redis.call('XRANGE', KEYS[7], ARGV[1], ARGV[1])
if #src == 0 then return redis.error_reply('GONE trajectory batch ' .. ARGV[1] .. ' is not on the stream') end
local prio = nil
if ARGV[8] == '1' then
  -- A new entry gets the highest priority seen, so it is sampled at least about as often as any other (PER).
  prio = tonumber(redis.call('HGET', KEYS[6], 'max_priority') or 1)
end
return added(ARGV[7], insert(rid, ARGV[3], src[1][2], nil, prio, tonumber(ARGV[4]), tonumber(ARGV[5]),
  tonumber(ARGV[6]), 'batch ' .. ARGV[1]))
"""
)

# KEYS 1-6 as above. ARGV: replay id, actor, seq, capacity, bytes max, per-actor max (0: none), ttl ms, priority
# ('': none), then the batch's fields (flat). Puts back an entry a checkpoint kept, with its arrival seq, evicting as
# ADD does. Returns {added (1/0), evicted, bytes after}.
PUT = (
    _STORE
    + """
local rid = ARGV[1]
if held(rid) then return held(rid) end
local fields = {}
for i = 9, #ARGV do fields[#fields + 1] = ARGV[i] end
return added(ARGV[7], insert(rid, ARGV[2], fields, tonumber(ARGV[3]), tonumber(ARGV[8]), tonumber(ARGV[4]),
  tonumber(ARGV[5]), tonumber(ARGV[6]), 'replayed batch ' .. rid))
"""
)

# ARGV: ttl ms, then replay id, priority pairs. ZADD XX: an entry evicted meanwhile stays gone. Returns how many
# priorities were written.
UPDATE_PRIORITIES = (
    _TOUCH
    + """
local n = 0
local top = tonumber(redis.call('HGET', KEYS[6], 'max_priority') or 0)
for i = 2, #ARGV, 2 do
  local p = tonumber(ARGV[i + 1])
  if redis.call('ZADD', KEYS[5], 'XX', 'CH', p, ARGV[i]) == 1 or redis.call('ZSCORE', KEYS[5], ARGV[i]) then
    n = n + 1
    if p > top then top = p end
  end
end
if n > 0 then redis.call('HSET', KEYS[6], 'max_priority', tostring(top)) end
touch(ARGV[1])
return n
"""
)

# ARGV: replay id. The copied batch's fields (flat), or nil when it was evicted.
READ = """
local rec = redis.call('HGET', KEYS[2], ARGV[1])
if not rec then return false end
local src = redis.call('XRANGE', KEYS[1], string.match(rec, '^([^|]*)|'), string.match(rec, '^([^|]*)|'))
if #src == 0 then return false end
return src[1][2]
"""
