-- read_snapshots.lua: read the receipt fields and the stream of several invocations.
--
-- One atomic read for a whole batch of one shard's invocations: a write can never land
-- between a record and its stream. Reads only; the field names come once per batch
-- instead of once per invocation.
--
-- KEYS[1..] (record, stream)...   record hash and event stream of invocation i
-- ARGV[1..] (field)...             the record fields to read
--
-- Reply: for each invocation, the HMGET values and the XRANGE entries.

local reply = {}
for i = 1, #KEYS, 2 do
  reply[#reply + 1] = redis.call('HMGET', KEYS[i], unpack(ARGV))
  reply[#reply + 1] = redis.call('XRANGE', KEYS[i + 1], '-', '+')
end
return reply
