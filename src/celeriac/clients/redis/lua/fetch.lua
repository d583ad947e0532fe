-- fetch: promote due delayed messages, renew the consumer's lease, and hand it up to
-- `limit` ready messages across its queues (fetch_ready in common.lua).
-- ARGV[2] consumer, [3] lease in ms, [4] limit, [5] "1": if nothing is ready, register as
-- idle on the queues (the caller is about to BLPOP its wake list), [6..] queues (distinct).
-- Returns {wait, id, queue, deliveries, envelope, body, id, ...}.

local queues = {}
for i = 6, #ARGV do
  queues[#queues + 1] = ARGV[i]
end
return fetch_ready(ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1', queues)
