-- dead_letters: the oldest dead letters first.
-- ARGV[2] limit. Returns {id, queue, reason, deliveries, dead at, envelope, body, id, ...}.

local out = {}
for _, id in ipairs(redis.call('ZRANGE', key('dead'), 0, tonumber(ARGV[2]) - 1)) do
  local f = redis.call('HMGET', key('m', id), 'q', 'r', 'n', 't', 'e', 'b')
  if f[1] then
    out[#out + 1] = id
    for i = 1, 6 do
      out[#out + 1] = f[i]
    end
  end
end
return out
