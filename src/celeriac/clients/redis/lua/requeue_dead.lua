-- requeue_dead: put dead letters back on their queues as new messages: a new id (the back
-- of the queue), delivery count 0, stored as published (store_msg). ARGV[2..] ids.
-- Returns how many were found and moved.

local moved = 0
for i = 2, #ARGV do
  if redis.call('ZREM', key('dead'), ARGV[i]) == 1 then
    local q, s, e, b = read_msg(ARGV[i])
    forget({ARGV[i]})
    if q then
      local id = new_id()
      store_msg(id, q, s, e or '', b or '')
      make_ready(id, false)
      moved = moved + 1
    end
  end
end
notify()
return moved
