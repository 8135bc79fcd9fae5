-- receipts_put.lua: materialize receipts and settle a batch of one shard's feed entries.
--
-- All in one atomic step: a receipt is written only above its stored version, so a
-- duplicate, replayed or out-of-order delivery never regresses it, and gets its record's
-- absolute expiry when created; every entry is counted, moves the position and is
-- acknowledged exactly once
-- (an entry no longer pending is answered "duplicate" and changes nothing); an empty
-- entry id writes the receipt alone (a rebuild from the records settles no entry).
--
-- KEYS[1] position hash    KEYS[2] shard feed
-- KEYS[2 + 2i - 1] receipt hash of receipt i    KEYS[2 + 2i] its record hash
-- ARGV[1] consumer group   ARGV[2] now (ms)     ARGV[3] n, the number of receipts
-- ARGV[4 + 3(i - 1)] ..    entry id, record version, receipt JSON of receipt i
-- ARGV[4 + 3n] ..          then pairs: entry id, counter ("stale" | "expired") of
--                          entries settled without output
--
-- Reply: for each receipt its outcome and version: "applied" (the receipt holds this
--        version), "stale" (the stored receipt is as new or newer; its version),
--        "expired" (the record is gone) or "duplicate" (already settled; nothing
--        changed); then for each settled entry "settled" or "duplicate" and 0.
-- @position-helpers

local position, feed = KEYS[1], KEYS[2]
local group, now_ms, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local reply = {}

for i = 1, n do
  local receipt, record = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  local base = 4 + 3 * (i - 1)
  local entry_id, version, body = ARGV[base], tonumber(ARGV[base + 1]), ARGV[base + 2]
  local outcome, reply_version = 'applied', version
  local settles = entry_id ~= ''
  if settles and not is_pending(feed, group, entry_id) then
    outcome, reply_version = 'duplicate', 0
  else
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
  end
  reply[#reply + 1] = outcome
  reply[#reply + 1] = reply_version
end

return settle_pairs(position, feed, group, now_ms, 4 + 3 * n, reply)
