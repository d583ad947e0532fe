-- ack: delete messages the consumer handled. An id it no longer owns (its lease ran out
-- and the message went back to its queue) is left alone.
-- ARGV[2] consumer, [3..] ids. Returns how many were deleted.

local owned = key('owned', ARGV[2])
local done = 0
for i = 3, #ARGV do
  if redis.call('SREM', owned, ARGV[i]) == 1 then
    redis.call('UNLINK', key('m', ARGV[i]))
    done = done + 1
  end
end
return done
