-- purge: delete the ready and the delayed messages of one queue (not owned ones).
-- ARGV[2] queue. Returns how many.

local q = ARGV[2]
local n = 0
local ready = key('q', q)
for _, id in ipairs(redis.call('ZRANGE', ready, 0, -1)) do
  forget({id})
  n = n + 1
end
local dq = key('dq', q)
for _, id in ipairs(redis.call('SMEMBERS', dq)) do
  redis.call('ZREM', key('delayed'), id)
  forget({id})
  n = n + 1
end
redis.call('DEL', ready, dq)
return n
