-- requeue_dead: put dead letters back on their queues as new messages: a new id (the back
-- of the queue), delivery count 0. ARGV[2..] ids. Returns how many were found and moved.

local moved = 0
for i = 2, #ARGV do
  local old = key('m', ARGV[i])
  if redis.call('ZREM', key('dead'), ARGV[i]) == 1 and redis.call('EXISTS', old) == 1 then
    local id = new_id()
    local k = key('m', id)
    redis.call('RENAME', old, k)
    redis.call('HDEL', k, 'r', 't')
    redis.call('HSET', k, 'n', 0)
    make_ready(id, false)
    moved = moved + 1
  end
end
notify()
return moved
