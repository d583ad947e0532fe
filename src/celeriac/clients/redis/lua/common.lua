-- celeriac's Redis broker: the key layout, and the helpers every script shares.
--
-- celeriac/clients/redis/connector.py puts this file in front of each script of this directory when it
-- loads it (SCRIPT LOAD, then EVALSHA), so every script Redis runs starts with this
-- header. ARGV[1] is always the namespace (the URL's ?namespace=, default "celeriac");
-- every key starts with it:
--
--   <ns>:seq              string  INCR counter. A message id is a value of it, zero-padded
--                                 to 16 digits, so ids sort as strings in publish order.
--   <ns>:m:<id>           string  one message, "<s>,<#q>,<#e>,<q><e><b>" (pack_msg): s score
--                                 (9 - priority), q queue, e envelope (protocol.py's compact
--                                 JSON: headers and properties without their defaults), b
--                                 body. One string, not a hash: a hash holding a value over
--                                 hash-max-listpack-value (64 bytes) becomes a hash table
--                                 (~900 bytes a message against ~200).
--                         hash    the same message in the earlier layout, still read
--                                 (read_msg): fields q, s, n hand-outs so far, e, b. A dead
--                                 letter is always this hash, with r reason, t when (unix s).
--   <ns>:counts           hash    id -> hand-outs so far of a string-form message (absent:
--                                 none), so a queued message costs no counter at all.
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

-- A message's string: score, queue, envelope and body, the lengths first so that any
-- bytes may follow. A fair score is a number: %.17g keeps all its digits.
local function pack_msg(q, s, e, b)
  if type(s) == 'number' then
    s = string.format('%.17g', s)
  end
  return s .. ',' .. #q .. ',' .. #e .. ',' .. q .. e .. b
end

-- Store message `id`. A compact envelope (protocol.pack: "[...]") makes the string form;
-- a full one (Message.envelope: "{...}") the earlier layout's hash, which workers of the
-- previous version read (compact_messages=False, transports/redis.py, during an upgrade).
local function store_msg(id, q, s, e, b)
  if string.sub(e, 1, 1) == '{' then
    redis.call('HSET', key('m', id), 'q', q, 's', s, 'e', e, 'b', b)
  else
    redis.call('SET', key('m', id), pack_msg(q, s, e, b))
  end
end

-- Message `id`: queue, score, envelope, body, and whether it is the earlier layout's
-- hash; nil if it no longer exists.
local function read_msg(id)
  local k = key('m', id)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then  -- WRONGTYPE: a hash
    local f = redis.call('HMGET', k, 'q', 's', 'e', 'b')
    if not f[1] then
      return nil
    end
    return f[1], f[2], f[3], f[4], true
  end
  if not v then
    return nil
  end
  local s, lq, le, p = string.match(v, '^([^,]*),(%d+),(%d+),()')
  if not s then
    return nil
  end
  lq, le = tonumber(lq), tonumber(le)
  return string.sub(v, p, p + lq - 1), s, string.sub(v, p + lq, p + lq + le - 1),
    string.sub(v, p + lq + le), false
end

-- Message `id`'s queue and score (and whether it is a hash) without reading its body.
local function read_head(id)
  local k = key('m', id)
  local v = redis.pcall('GETRANGE', k, 0, 127)
  if type(v) == 'table' then
    local f = redis.call('HMGET', k, 'q', 's')
    return f[1], f[2], true
  end
  local s, lq, p = string.match(v, '^([^,]*),(%d+),%d+,()')
  if not s then
    return nil  -- GETRANGE gives '' for a key that is gone
  end
  lq = tonumber(lq)
  if p + lq - 1 > #v then
    v = redis.call('GETRANGE', k, 0, p + lq - 2)
  end
  return string.sub(v, p, p + lq - 1), s, false
end

-- Count a hand-out of message `id` (`old`: a hash); returns the count.
local function count_out(id, old)
  if old then
    return redis.call('HINCRBY', key('m', id), 'n', 1)
  end
  return redis.call('HINCRBY', key('counts'), id, 1)
end

-- Take back message `id`'s last hand-out (a message given back unstarted).
local function uncount(id, old)
  if old then
    local k = key('m', id)
    if redis.call('HINCRBY', k, 'n', -1) < 0 then
      redis.call('HSET', k, 'n', 0)
    end
  elseif redis.call('HINCRBY', key('counts'), id, -1) <= 0 then
    redis.call('HDEL', key('counts'), id)
  end
end

-- Delete messages `ids` (a list, at least one): their values and their counts.
local function forget(ids)
  local keys = {}
  for i, id in ipairs(ids) do
    keys[i] = key('m', id)
  end
  redis.call('UNLINK', unpack(keys))
  redis.call('HDEL', key('counts'), unpack(ids))
end

-- Put message `id` back on its queue; `uncounted`: its last hand-out does not count.
-- Returns its queue, or false if the message no longer exists.
local function make_ready(id, uncounted)
  local q, s, old = read_head(id)
  if not q then
    return false
  end
  if uncounted then
    uncount(id, old)
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

-- Wake each consumer asleep on a touched queue with one token, taking them all out of its
-- idle set (SPOP: the set's members and its deletion in one call); a consumer registers
-- again with every fetch that comes back short. Every sleeper, not one per message: a
-- consumer stays registered after a short fetch even once it has no room left (its
-- children busy), and a token sent to it alone would leave the message waiting while
-- another worker idles. A bound keeps one call short; past it the rest wait for the next
-- publish, or their BLPOP's timeout.
local WAKE_AT_MOST = 1000

local function notify()
  for q in pairs(touched) do
    for _, c in ipairs(redis.call('SPOP', key('idle', q), WAKE_AT_MOST)) do
      local w = key('wake', c)
      redis.call('RPUSH', w, 1)
      redis.call('PEXPIRE', w, WAKE_TTL_MS)
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
  -- The head of the delay store: nothing is due unless it is (one call in the common case,
  -- where it also gives the reply's wait).
  local head = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if head[2] and tonumber(head[2]) <= now then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, PROMOTE_BATCH)) do
      redis.call('ZREM', delayed, id)
      local q = make_ready(id, false)
      if q then
        redis.call('SREM', key('dq', q), id)
      end
    end
    notify()
    head = nil  -- changed: read again below
  end

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
    local q, _, e, b, old = read_msg(id)
    if q then
      taken[#taken + 1] = id
      out[#out + 1] = id
      out[#out + 1] = q
      out[#out + 1] = count_out(id, old)
      out[#out + 1] = e
      out[#out + 1] = b
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
  head = head or redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if head[2] then
    out[1] = math.max(tonumber(head[2]) - now, 0)
  end
  return out
end

-- End of common.lua; the script itself follows.
