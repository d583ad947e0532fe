-- fetch: promote due delayed messages, renew the consumer's lease, and hand it up to
-- `limit` ready messages across its queues: highest priority first, then oldest.
-- ARGV[2] consumer, [3] lease in ms, [4] limit, [5] "1": if nothing is ready, register as
-- idle on the queues (the caller is about to BLPOP its wake list), [6..] queues (distinct).
-- Returns {wait, id, queue, deliveries, envelope, body, id, ...}: wait is the ms until the
-- next delayed message is due (0: due now, fetch again; -1: none is delayed).

local me, lease, limit = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local register = ARGV[5] == '1'
local queues = {}
for i = 6, #ARGV do
  queues[#queues + 1] = ARGV[i]
end
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
local owned = key('owned', me)
for _, id in ipairs(picked) do
  local k = key('m', id)
  local f = redis.call('HMGET', k, 'q', 'e', 'b')
  if f[1] then
    local n = redis.call('HINCRBY', k, 'n', 1)
    redis.call('SADD', owned, id)
    out[#out + 1] = id
    out[#out + 1] = f[1]
    out[#out + 1] = n
    out[#out + 1] = f[2]
    out[#out + 1] = f[3]
  end
end

if #out == 1 and register then
  for _, q in ipairs(queues) do
    redis.call('SADD', key('idle', q), me)
  end
end
local next_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
if next_due[2] then
  out[1] = math.max(tonumber(next_due[2]) - now, 0)
end
return out
