-- broadcast: PUBLISH on <ns>:bc:<channel>. A script only so that it goes over the lean
-- connection (_resp.py) like publish and exchange: the events sender thread sends a batch
-- this way at a fraction of redis-py's per-command cost, which the worker's loop shares
-- the GIL with.
-- ARGV[2] channel, ARGV[3] payload. Returns the number of subscribers that got it.
return redis.call('PUBLISH', ARGV[1] .. ':bc:' .. ARGV[2], ARGV[3])
