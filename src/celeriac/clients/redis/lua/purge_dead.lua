-- purge_dead: delete dead letters. ARGV[2] "ids" then the ids, or "oldest" then a count
-- (the caller repeats until fewer come back, so one call never holds Redis for long).
-- Returns how many were deleted.

local dead = key('dead')
local ids = {}
if ARGV[2] == 'oldest' then
  ids = redis.call('ZRANGE', dead, 0, tonumber(ARGV[3]) - 1)
else
  for i = 3, #ARGV do
    ids[#ids + 1] = ARGV[i]
  end
end
local n = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', dead, id) == 1 then
    forget({id})
    n = n + 1
  end
end
return n
