-- celeriac's Redis broker: the key layout, and the helpers every script shares.
--
-- celeriac/clients/redis/connector.py puts this file in front of each script of this directory when it
-- loads it (SCRIPT LOAD, then EVALSHA), so every script Redis runs starts with this
-- header. ARGV[1] is always the namespace (the URL's ?namespace=, default "celeriac");
-- every key starts with it:
--
--   <ns>:seq              string  INCR counter. A message id is a value of it, zero-padded
--                                 to 16 digits, so ids sort as strings in publish order.
--   <ns>:m:<id>           hash    one message: q queue, s score (9 - priority), n hand-outs
--                                 so far (absent until the first), e envelope (JSON:
--                                 headers, properties, content type), b body; once
--                                 dead-lettered also r reason, t when (unix seconds).
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
-- Broadcasts use pub/sub channels <ns>:bc:<db>:<channel> (Endpoint.channel) and no
-- keys. Times come from Redis (TIME), so producers and workers whose clocks differ agree
-- on due times and leases.
-- Keys are built here from the namespace. On a Redis Cluster the transport
-- (transports/redis_cluster.py) passes a hash tag per queue, "{<ns>:<queue>}", as the
-- namespace and one queue per call, so every key a script touches is in that queue's slot.

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

-- Take back message hash `k`'s last hand-out (a message given back unstarted).
local function uncount(k)
  if redis.call('HINCRBY', k, 'n', -1) < 0 then
    redis.call('HSET', k, 'n', 0)
  end
end

-- Put message `id` back on its queue; `uncounted`: its last hand-out does not count.
-- Returns its queue, or false if the message no longer exists.
local function make_ready(id, uncounted)
  local k = key('m', id)
  local f = redis.call('HMGET', k, 'q', 's')
  local q, s = f[1], f[2]
  if not q then
    return false
  end
  if uncounted then
    uncount(k)
  end
  redis.call('ZADD', key('q', q), s, id)
  touched[q] = true
  return q
end

-- Hold message `id` of queue `q` in the delay store until `due` (unix ms). A sleeper on
-- `q` is woken too: it may have to wake earlier than it planned.
local function put_delayed(id, q, due)
  redis.call('ZADD', key('delayed'), due, id)
  redis.call('SADD', key('dq', q), id)
  touched[q] = true
end

-- Wake each consumer asleep on a touched queue with one token. The idle set is emptied:
-- a consumer registers again with every fetch that comes back empty.
local function notify()
  for q in pairs(touched) do
    local idle = key('idle', q)
    local sleepers = redis.call('SMEMBERS', idle)
    if #sleepers > 0 then
      for _, c in ipairs(sleepers) do
        local w = key('wake', c)
        redis.call('RPUSH', w, 1)
        redis.call('PEXPIRE', w, WAKE_TTL_MS)
      end
      redis.call('DEL', idle)
    end
  end
  touched = {}
end

-- Promote due delayed messages, renew the consumer's lease, and hand it up to `limit`
-- ready messages across `queues` (distinct): highest priority first, then oldest. With
-- `register`, a consumer that finds fewer than `limit` registers as idle on the queues:
-- the queues are empty now, and it is about to BLPOP its wake list for more (a token
-- that comes while it is still busy only makes it look again). Returns {wait, id, queue,
-- deliveries, envelope, body, id, ...}:
-- wait is the ms until the next delayed message is due (0: due now, fetch again; -1:
-- none is delayed). Used by fetch.lua and exchange.lua.
local function fetch_ready(me, lease, limit, register, queues)
  local now = now_ms()

  -- A bounded batch per call, so a backlog of due messages cannot stall Redis; the rest
  -- make the reply's wait 0 and the caller comes straight back.
  local PROMOTE_BATCH = 1000
  local delayed = key('delayed')
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, PROMOTE_BATCH)) do
    redis.call('ZREM', delayed, id)
    local q = make_ready(id, false)
    if q then
      redis.call('SREM', key('dq', q), id)
    end
  end
  notify()

  -- A consumer that fetches is alive. This also re-registers one that was presumed dead
  -- and came back: what it takes now is protected by its heartbeats again.
  redis.call('ZADD', key('consumers'), now + lease, me)
  -- Tokens pushed before this look are answered by it.
  redis.call('DEL', key('wake', me))

  local picked = {}
  if #queues == 1 then
    local popped = redis.call('ZPOPMIN', key('q', queues[1]), limit)
    for i = 1, #popped, 2 do
      picked[#picked + 1] = popped[i]
    end
  else
    -- Each queue's first `limit` in its own order, merged by (score, id): the same order
    -- one queue holding them all would give.
    local cands = {}
    for _, q in ipairs(queues) do
      local r = redis.call('ZRANGE', key('q', q), 0, limit - 1, 'WITHSCORES')
      for i = 1, #r, 2 do
        cands[#cands + 1] = {tonumber(r[i + 1]), r[i], q}
      end
    end
    table.sort(cands, function(a, b)
      if a[1] ~= b[1] then
        return a[1] < b[1]
      end
      return a[2] < b[2]
    end)
    for i = 1, math.min(limit, #cands) do
      redis.call('ZREM', key('q', cands[i][3]), cands[i][2])
      picked[#picked + 1] = cands[i][2]
    end
  end

  local out = {-1}
  local taken = {}
  for _, id in ipairs(picked) do
    local k = key('m', id)
    local f = redis.call('HMGET', k, 'q', 'e', 'b')
    if f[1] then
      taken[#taken + 1] = id
      out[#out + 1] = id
      out[#out + 1] = f[1]
      out[#out + 1] = redis.call('HINCRBY', k, 'n', 1)
      out[#out + 1] = f[2]
      out[#out + 1] = f[3]
    end
  end
  if #taken > 0 then
    redis.call('SADD', key('owned', me), unpack(taken))
  end

  if #taken < limit and register then
    for _, q in ipairs(queues) do
      redis.call('SADD', key('idle', q), me)
    end
  end
  local next_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if next_due[2] then
    out[1] = math.max(tonumber(next_due[2]) - now, 0)
  end
  return out
end

-- End of common.lua; the script itself follows.
