-- receipts_put.lua: settle one batch of a shard's feed entries for the receipt projection.
--
-- The same rules as receipt_put.lua and settle.lua, for many entries in one step: each
-- receipt is written only above its stored version and gets its record's expiry when
-- created; every entry is counted, moves the position and is acknowledged exactly once
-- (an entry no longer pending is answered "duplicate" and changes nothing).
--
-- KEYS[1] position hash    KEYS[2] shard feed
-- KEYS[2 + 2i - 1] receipt hash of receipt i    KEYS[2 + 2i] its record hash
-- ARGV[1] consumer group   ARGV[2] now (ms)     ARGV[3] n, the number of receipts
-- ARGV[4 + 3(i - 1)] ..    entry id, record version, receipt JSON of receipt i
-- ARGV[4 + 3n] ..          then pairs: entry id, counter ("stale" | "expired") of
--                          entries settled without output
--
-- Reply: for each receipt, its outcome and version (as receipt_put.lua answers), then
--        for each settled entry its outcome ("settled" or "duplicate") and 0.
-- @position-helpers

local position, feed = KEYS[1], KEYS[2]
local group, now_ms, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local reply = {}

for i = 1, n do
  local receipt, record = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  local base = 4 + 3 * (i - 1)
  local entry_id, version, body = ARGV[base], tonumber(ARGV[base + 1]), ARGV[base + 2]
  local outcome, reply_version = 'applied', version
  if not is_pending(feed, group, entry_id) then
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
    advance(position, entry_id, outcome, now_ms)
    redis.call('XACK', feed, group, entry_id)
  end
  reply[#reply + 1] = outcome
  reply[#reply + 1] = reply_version
end

for j = 4 + 3 * n, #ARGV, 2 do
  local entry_id, counter = ARGV[j], ARGV[j + 1]
  if is_pending(feed, group, entry_id) then
    advance(position, entry_id, counter, now_ms)
    redis.call('XACK', feed, group, entry_id)
    reply[#reply + 1] = 'settled'
  else
    reply[#reply + 1] = 'duplicate'
  end
  reply[#reply + 1] = 0
end
return reply
