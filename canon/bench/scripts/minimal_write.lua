-- minimal_write.lua: the benchmark's minimal floor, the writes of one event and nothing else.
--
-- Writes what create.lua or append.lua writes for one event, to the same keys and with
-- the same bytes: the record's fields, the event in the invocation's stream, one entry
-- in the shard feed and, for a first event, the one expiry of record and stream. It reads
-- nothing and checks nothing (no version, chain, lifecycle, budget or run), reserves no
-- budget, indexes nothing in the run and does not trim the feed: the caller builds every
-- record field, the lifecycle's included, and the expiry. What Redis cannot do faster
-- for one invocation with these keys and these bytes in three calls.
--
-- KEYS[1] record          record hash
-- KEYS[2] stream          event stream
-- KEYS[3] feed            shard feed
-- ARGV[1] event           encoded event
-- ARGV[2] expires_at_ms   absolute expiry of record and stream ("" after the first event)
-- ARGV[3] run_id          run id
-- ARGV[4] tool_call_id    tool call id
-- ARGV[5] version         event version
-- ARGV[6] type_code       the event type's feed code
-- ARGV[7] status_code     the feed code of the status the event leads to
-- ARGV[8..] (field, value)...  every record field the event sets
--
-- Reply: the feed entry id

local record, stream, feed = KEYS[1], KEYS[2], KEYS[3]
local expires_at_ms = ARGV[2]

redis.call('HSET', record, unpack(ARGV, 8))
if expires_at_ms ~= '' then redis.call('PEXPIREAT', record, expires_at_ms) end
redis.call('XADD', stream, '*', 'e', ARGV[1])
if expires_at_ms ~= '' then redis.call('PEXPIREAT', stream, expires_at_ms) end
return redis.call('XADD', feed, '*',
  'r', ARGV[3], 'c', ARGV[4], 'v', ARGV[5], 't', ARGV[6], 's', ARGV[7])
