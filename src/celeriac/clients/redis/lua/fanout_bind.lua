-- fanout_bind: bind queues to fanout groups until now + ARGV[2] ms (0: unbind them).
-- Then pairs: group, queue. Returns the count of pairs.

local ttl = tonumber(ARGV[2])
local until_ms = now_ms() + ttl
local n = 0
for i = 3, #ARGV - 1, 2 do
  local bound = key('fanout', ARGV[i])
  if ttl > 0 then
    redis.call('ZADD', bound, until_ms, ARGV[i + 1])
  else
    redis.call('ZREM', bound, ARGV[i + 1])
  end
  n = n + 1
end
return n
