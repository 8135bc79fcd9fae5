-- receipts_put.lua: materialize receipts and settle a batch of feed entries.
--
-- All in one atomic step: a receipt is written only above its stored version, so a
-- duplicate, replayed or out-of-order delivery never regresses it, and gets its record's
-- absolute expiry when created; every entry is counted, moves its shard's position and is
-- acknowledged exactly once (an entry no longer pending is answered "duplicate" and
-- changes nothing); an empty entry id writes the receipt alone (a rebuild from the records
-- settles no entry). A batch may span the shards of one server; on a cluster it holds one
-- shard (a script's keys share one slot). The loop is batch_put.lua's.
--
-- KEYS[1..2S] (position, feed)...     position hash and feed of the batch's shard s = 1 .. S
-- KEYS[2S+1..] (receipt, record)...   receipt hash of receipt i and its record hash
-- ARGV[1] group           consumer group
-- ARGV[2] now_ms          now (ms)
-- ARGV[3] shards          S, the number of shards in the batch
-- ARGV[4] items           n, the number of receipts
-- ARGV[5..] (shard, entry_id, version, receipt)...   of receipt i: shard number, entry id,
--                         record version, receipt JSON
-- ARGV[5+4n..] (shard, entry_id, counter)...   entries settled without output, counted
--                         under counter ("stale" | "expired")
--
-- Reply: for each receipt its outcome and version: "applied" (the receipt holds this
--        version), "stale" (the stored receipt is as new or newer; its version),
--        "expired" (the record is gone) or "duplicate" (already settled; nothing
--        changed); then for each settled entry "settled" or "duplicate" and 0.
-- @include helpers
-- @include batch_put

local function put(receipt, record, a, now_ms)
  local version, body = tonumber(ARGV[a]), ARGV[a + 1]
  local expires_at_ms = redis.call('HGET', record, 'expires_at_ms')
  if not expires_at_ms then return 'expired', 0 end
  local stored = redis.call('HGET', receipt, 'version')
  if stored and tonumber(stored) >= version then return 'stale', tonumber(stored) end
  redis.call('HSET', receipt, 'version', version, 'receipt', body, 'updated_at_ms', now_ms)
  if not stored then redis.call('PEXPIREAT', receipt, expires_at_ms) end
  return 'applied', version
end

return put_batch(4, put)
