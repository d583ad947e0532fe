-- settle_and_fetch: the worker's hot path in one call. Store the results of finished tasks (as
-- celeriac/backends/redis.py does), acknowledge messages, then fetch up to `limit` more
-- (fetch_ready in common.lua). Results go first: in one script, no ack is ever visible
-- without its result.
-- ARGV[2] consumer, [3] lease in ms, [4] limit (0: fetch nothing), [5] the result
-- backend's namespace, [6] result count, [7] ack count, [8] the change feed's length
-- (backends/redis.py FEED_LENGTH, its one owner), then four per result (task id,
-- value, expiry in ms from now or 0: never, expiry as unix seconds), then the ids to ack,
-- then the queues (distinct). A fetch that finds fewer than `limit` registers the
-- consumer as idle (fetch_ready): it waits on its wake list next. Returns as fetch.lua
-- ({-1} when nothing was fetched).

local me, limit = ARGV[2], tonumber(ARGV[4])
local nresults, nacks = tonumber(ARGV[6]), tonumber(ARGV[7])
local FEED_LENGTH = ARGV[8]
local a = 9

if nresults > 0 then
  -- Batched: one ZADD and one XADD for all the results (the feed entry lists their ids
  -- as fields t0, t1, ...; backends/redis.py reads every field).
  local rns = ARGV[5]
  local expiring, zadd, zrem, feed = rns .. ':expiring', {}, {}, {}
  for i = 0, nresults - 1 do
    local id, value, px = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
    if px > 0 then
      redis.call('SET', rns .. ':r:' .. id, value, 'PX', px)
      zadd[#zadd + 1] = ARGV[a + 3]
      zadd[#zadd + 1] = id
    else
      redis.call('SET', rns .. ':r:' .. id, value)
      zrem[#zrem + 1] = id
    end
    feed[#feed + 1] = 't' .. i
    feed[#feed + 1] = id
    a = a + 4
  end
  if #zadd > 0 then
    redis.call('ZADD', expiring, unpack(zadd))
  end
  if #zrem > 0 then
    redis.call('ZREM', expiring, unpack(zrem))
  end
  redis.call('XADD', rns .. ':changes', 'MAXLEN', '~', FEED_LENGTH, '*', unpack(feed))
end

if nacks > 0 then
  -- Only ids this consumer still owns (its lease may have run out and the message gone
  -- to another consumer): those are deleted, the rest left alone.
  local owned = key('owned', me)
  if nacks == 1 then
    -- A lone ack (an idle worker's task, settled by its pool child): SREM tells.
    if redis.call('SREM', owned, ARGV[a]) == 1 then
      forget({ARGV[a]})
    end
  else
    local ids = {}
    for i = a, a + nacks - 1 do
      ids[#ids + 1] = ARGV[i]
    end
    local mine = redis.call('SMISMEMBER', owned, unpack(ids))
    local done = {}
    for i, m in ipairs(mine) do
      if m == 1 then
        done[#done + 1] = ids[i]
      end
    end
    if #done > 0 then
      redis.call('SREM', owned, unpack(done))
      forget(done)
    end
  end
  a = a + nacks
end

if limit <= 0 then
  return {-1}
end
local queues = {}
for i = a, #ARGV do
  queues[#queues + 1] = ARGV[i]
end
return fetch_ready(me, tonumber(ARGV[3]), limit, true, queues)
