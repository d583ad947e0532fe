-- publish: store messages and make them ready (or delayed), waking idle consumers.
-- ARGV[2] count, then five per message: queue, score (9 - priority), delay in ms (0: ready
-- now), envelope, body. Returns the count.

local count = tonumber(ARGV[2])
local first = redis.call('INCRBY', key('seq'), count) - count + 1
local now = nil
for i = 0, count - 1 do
  local a = 3 + i * 5
  local q, s, delay = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local id = string.format('%016d', first + i)
  -- No 'n' yet: the first hand-out's HINCRBY makes it 1.
  redis.call('HSET', key('m', id), 'q', q, 's', s, 'e', ARGV[a + 3], 'b', ARGV[a + 4])
  if delay > 0 then
    now = now or now_ms()
    put_delayed(id, q, now + delay)
  else
    redis.call('ZADD', key('q', q), s, id)
    touched[q] = true
  end
end
notify()
return count
