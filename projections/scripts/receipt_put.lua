-- receipt_put.lua: materialize one receipt, move the position and ack the entry, atomically.
--
-- The receipt is written only when its version is above the stored one, so a duplicate,
-- replayed or out-of-order delivery never regresses it. Its expiry is the record's own
-- absolute expiry, set once when the receipt is created. Output, position and ack are one
-- step: a redelivered entry finds itself no longer pending and changes nothing. An empty
-- entry id writes the receipt alone (a rebuild from the records settles no entry).
--
-- KEYS[1] receipt hash      KEYS[2] record hash      KEYS[3] position hash
-- KEYS[4] shard feed
-- ARGV[1] consumer group    ARGV[2] feed entry id    ARGV[3] record version
-- ARGV[4] receipt JSON      ARGV[5] now (ms)
--
-- Reply: {"applied", version}          the receipt now holds this version
--        {"stale", stored version}     the stored receipt is as new or newer; entry acked
--        {"expired", 0}                the record is gone; entry acked and counted
--        {"duplicate", 0}              the entry was already settled; nothing changed
-- @position-helpers

local receipt, record, position, feed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, entry_id, version = ARGV[1], ARGV[2], tonumber(ARGV[3])
local body, now_ms = ARGV[4], ARGV[5]

local settles = entry_id ~= ''
if settles and not is_pending(feed, group, entry_id) then return {'duplicate', 0} end

local outcome, reply_version = 'applied', version
local expires_at_ms = redis.call('HGET', record, 'expires_at_ms')
if not expires_at_ms then
  outcome, reply_version = 'expired', 0
else
  local stored = redis.call('HGET', receipt, 'version')
  if stored and tonumber(stored) >= version then
    outcome, reply_version = 'stale', tonumber(stored)
  else
    redis.call('HSET', receipt, 'version', version, 'receipt', body, 'updated_at_ms', now_ms)
    if not stored then redis.call('PEXPIREAT', receipt, expires_at_ms) end
  end
end

if settles then
  advance(position, entry_id, outcome, now_ms)
  redis.call('XACK', feed, group, entry_id)
end
return {outcome, reply_version}
