-- receipts_put.lua: materialize receipts and settle a batch of feed entries.
--
-- All in one atomic step: a receipt is written only above its stored version, so a
-- duplicate, replayed or out-of-order delivery never regresses it, and gets its record's
-- absolute expiry when created; every entry is counted, moves its shard's position and is
-- acknowledged exactly once (an entry no longer pending is answered "duplicate" and
-- changes nothing); an empty entry id writes the receipt alone (a rebuild from the records
-- settles no entry). A batch may span the shards of one server; on a cluster it holds one
-- shard (a script's keys share one slot).
--
-- KEYS[2s - 1], KEYS[2s]  position hash and feed of the batch's shard s (s = 1 .. S)
-- KEYS[2S + 2i - 1]       receipt hash of receipt i    KEYS[2S + 2i] its record hash
-- ARGV[1] consumer group  ARGV[2] now (ms)  ARGV[3] S  ARGV[4] n, the number of receipts
-- ARGV[5 + 4(i - 1)] ..   shard number, entry id, record version, receipt JSON of receipt i
-- ARGV[5 + 4n] ..         then triples: shard number, entry id, counter ("stale" |
--                         "expired") of entries settled without output
--
-- Reply: for each receipt its outcome and version: "applied" (the receipt holds this
--        version), "stale" (the stored receipt is as new or newer; its version),
--        "expired" (the record is gone) or "duplicate" (already settled; nothing
--        changed); then for each settled entry "settled" or "duplicate" and 0.
-- @position-helpers

local group, now_ms = ARGV[1], ARGV[2]
local shards, n = tonumber(ARGV[3]), tonumber(ARGV[4])
local reply = {}

for i = 1, n do
  local receipt, record = KEYS[2 * shards + 2 * i - 1], KEYS[2 * shards + 2 * i]
  local base = 5 + 4 * (i - 1)
  local s = tonumber(ARGV[base])
  local position, feed = KEYS[2 * s - 1], KEYS[2 * s]
  local entry_id, version, body = ARGV[base + 1], tonumber(ARGV[base + 2]), ARGV[base + 3]
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
      settle_entry(position, feed, group, entry_id, outcome, now_ms)
    end
  end
  reply[#reply + 1] = outcome
  reply[#reply + 1] = reply_version
end

return settle_rest(group, now_ms, 5 + 4 * n, reply)
