-- dead_letter.lua: move an entry that failed too often to the shard's dead-letter stream.
--
-- The dead letter names the entry, the projection, the reason, the last error type, the
-- delivery count and copies the entry's fields (prefixed "f:"); then the entry is acked,
-- so it is never retried again. The dead-letter stream is capped by length.
--
-- KEYS[1] dead_letters    dead-letter stream
-- KEYS[2] position        position hash
-- KEYS[3] feed            shard feed
-- ARGV[1] group           consumer group
-- ARGV[2] entry_id        feed entry id
-- ARGV[3] reason          why the entry is dead-lettered
-- ARGV[4] error_type      last error type
-- ARGV[5] deliveries      how often the entry was delivered
-- ARGV[6] now_ms          now (ms)
-- ARGV[7] cap             dead-letter cap (entries)
-- ARGV[8..] (field, value)...  the entry's fields, names already prefixed
--
-- Reply: {"dead", dead-letter entry id} | {"duplicate", 0} (already settled; nothing changed)
-- @include helpers

local dead, position, feed = KEYS[1], KEYS[2], KEYS[3]
local group, entry_id, reason, error_type = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local deliveries, now_ms, cap = ARGV[5], ARGV[6], ARGV[7]

if not is_pending(feed, group, entry_id) then return {'duplicate', 0} end
local copied = {}
for i = 8, #ARGV do copied[#copied + 1] = ARGV[i] end
local dead_id = redis.call('XADD', dead, 'MAXLEN', '~', cap, '*', 'entry_id', entry_id,
  'projection', group, 'reason', reason, 'error', error_type, 'deliveries', deliveries,
  'at_ms', now_ms, unpack(copied))
settle_entry(position, feed, group, entry_id, 'dead', now_ms)
return {'dead', dead_id}
