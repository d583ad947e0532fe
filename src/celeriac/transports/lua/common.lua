-- celeriac's Redis broker: the key layout, and the helpers every script shares.
--
-- celeriac/_redis.py puts this file in front of each script of this directory when it
-- loads it (SCRIPT LOAD, then EVALSHA), so every script Redis runs starts with this
-- header. ARGV[1] is always the namespace (the URL's ?namespace=, default "celeriac");
-- every key starts with it:
--
--   <ns>:seq              string  INCR counter. A message id is a value of it, zero-padded
--                                 to 16 digits, so ids sort as strings in publish order.
--   <ns>:m:<id>           hash    one message: q queue, s score (9 - priority), n hand-outs
--                                 so far, e envelope (JSON: headers, properties, content
--                                 type), b body; once dead-lettered also r reason, t when
--                                 (unix seconds).
--   <ns>:q:<queue>        zset    ready ids, score s. Equal scores sort by member, so
--                                 ZRANGE order is higher priority first, then oldest (FIFO).
--   <ns>:delayed          zset    delayed ids (all queues), score = due time (unix ms).
--   <ns>:dq:<queue>       set     the delayed ids of one queue, so purge need not scan all.
--   <ns>:owned:<consumer> set     ids handed to that consumer and not yet settled. Holding
--                                 them is the lease: nothing else ever redelivers them.
--   <ns>:consumers        zset    consumer -> lease expiry (unix ms). Any heartbeat renews
--                                 its own and returns every expired consumer's ids.
--   <ns>:idle:<queue>     set     consumers asleep in a fetch that found this queue empty.
--   <ns>:wake:<consumer>  list    an idle consumer BLPOPs it; whatever makes a message ready
--                                 (or delayed) in a queue pushes a token to each consumer in
--                                 that queue's idle set, then empties the set.
--   <ns>:dead             zset    dead-lettered ids, score = order of death (from <ns>:seq).
--
-- Broadcasts use pub/sub channels <ns>:bc:<channel> and no keys. Times come from Redis
-- (TIME), so producers and workers whose clocks differ agree on due times and leases.
-- Keys are built here from the namespace, so the scripts need a standalone Redis (one
-- server, or one primary with replicas), not Cluster.

local ns = ARGV[1]

local function key(...)
  return ns .. ':' .. table.concat({...}, ':')
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function new_id()
  return string.format('%016d', redis.call('INCR', key('seq')))
end

-- A token left for a consumer that died while idle must not linger forever.
local WAKE_TTL_MS = 60000

-- Queues that got a ready or delayed message in this script: notify() wakes their sleepers.
local touched = {}

-- Put message `id` back on its queue; `uncount` takes back its last hand-out (a message
-- given back unstarted). Returns its queue, or false if the message no longer exists.
local function make_ready(id, uncount)
  local k = key('m', id)
  local f = redis.call('HMGET', k, 'q', 's')
  local q, s = f[1], f[2]
  if not q then
    return false
  end
  if uncount and redis.call('HINCRBY', k, 'n', -1) < 0 then
    redis.call('HSET', k, 'n', 0)
  end
  redis.call('ZADD', key('q', q), s, id)
  touched[q] = true
  return q
end

-- Wake each consumer asleep on a touched queue with one token. The idle set is emptied:
-- a consumer registers again with every fetch that comes back empty.
local function notify()
  for q in pairs(touched) do
    local idle = key('idle', q)
    for _, c in ipairs(redis.call('SMEMBERS', idle)) do
      local w = key('wake', c)
      redis.call('RPUSH', w, 1)
      redis.call('PEXPIRE', w, WAKE_TTL_MS)
    end
    redis.call('DEL', idle)
  end
  touched = {}
end

-- End of common.lua; the script itself follows.
