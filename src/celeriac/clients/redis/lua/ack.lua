-- ack: delete messages the consumer handled. An id it no longer owns (its lease ran out
-- and the message went back to its queue) is left alone.
-- ARGV[2] consumer, [3..] ids. Returns how many were deleted.

local owned = key('owned', ARGV[2])
local ids = {}
for i = 3, #ARGV do
  if redis.call('SREM', owned, ARGV[i]) == 1 then
    ids[#ids + 1] = ARGV[i]
  end
end
if #ids > 0 then
  forget(ids)
end
return #ids
