-- settle.lua: acknowledge an entry that produces no output, counting why.
--
-- Used for entries whose record has expired or whose stream entry was trimmed away, and
-- for entries older than what the projection already materialized (counted as stale).
--
-- KEYS[1] position        position hash
-- KEYS[2] feed            shard feed
-- ARGV[1] group           consumer group
-- ARGV[2] entry_id        feed entry id
-- ARGV[3] counter         counter name
-- ARGV[4] now_ms          now (ms)
--
-- Reply: {"settled", 0} | {"duplicate", 0} (the entry was already settled; nothing changed)
-- @include helpers

local position, feed = KEYS[1], KEYS[2]
local group, entry_id, counter, now_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if not is_pending(feed, group, entry_id) then return {'duplicate', 0} end
settle_entry(position, feed, group, entry_id, counter, now_ms)
return {'settled', 0}
