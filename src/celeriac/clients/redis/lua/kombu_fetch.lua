-- ARGV: unacked, unacked_index, delayed, delayed messages, limit, now (unix s, the
-- client's clock as kombu's), our id counter, then pairs (list key, queue) in pop order.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', ARGV[3], '-inf', now_ms, 'LIMIT', 0, 1000)
for _, id in ipairs(due) do
  local v = redis.call('HGET', ARGV[4], id)
  redis.call('ZREM', ARGV[3], id)
  redis.call('HDEL', ARGV[4], id)
  if v then
    local nl = string.find(v, '\n', 1, true)
    redis.call('RPUSH', string.sub(v, 1, nl - 1), string.sub(v, nl + 1))
  end
end
local out = {}
local n, limit = 0, tonumber(ARGV[5])
for i = 8, #ARGV, 2 do
  while n < limit do
    local item = redis.call('RPOP', ARGV[i])
    if not item then break end
    local ok, msg = pcall(cjson.decode, item)
    local tag
    if ok and type(msg) == 'table' and type(msg.properties) == 'table' then
      tag = msg.properties.delivery_tag
    end
    if type(tag) ~= 'string' then
      tag = 'celeriac-untagged-' .. redis.call('INCR', ARGV[7])
    end
    -- Restored through the anonymous exchange to the queue it was popped from: kombu
    -- would look a topic message's exchange up again and copy it into every queue
    -- whose pattern matches, running it again where it already ran.
    local entry = '[' .. item .. ',"",' .. cjson.encode(ARGV[i + 1]) .. ']'
    redis.call('HSET', ARGV[1], tag, entry)
    redis.call('ZADD', ARGV[2], ARGV[6], tag)
    n = n + 1
    out[#out + 1] = ARGV[i]
    out[#out + 1] = item
    out[#out + 1] = tag
  end
  if n >= limit then break end
end
return out
