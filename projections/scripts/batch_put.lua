-- batch_put.lua: the loop of the batch scripts; pasted at "-- @include batch_put", after
-- helpers.lua.
--
-- put_batch(width, put) reads the batch layout every batch script shares: ARGV[1] group,
-- ARGV[2] now (ms), ARGV[3] S shards, ARGV[4] n items, then n items of ``width``
-- arguments each (shard number and entry id first), then the triples settle_rest reads;
-- KEYS[2s - 1], KEYS[2s] are shard s's position hash and feed, KEYS[2S + 2i - 1] and
-- KEYS[2S + 2i] item i's two keys. For each item still pending (or with an empty entry
-- id: a rebuild's, which settles nothing) it calls
-- put(first_key, second_key, a, now_ms) -> outcome, version, where ARGV[a] is the item's
-- first argument after its entry id, then settles the entry under the outcome; an item
-- no longer pending is answered "duplicate" and 0. Returns the reply: each item's outcome
-- and version, then settle_rest's.

local function put_batch(width, put)
  local group, now_ms = ARGV[1], ARGV[2]
  local shards, n = tonumber(ARGV[3]), tonumber(ARGV[4])
  local reply = {}
  for i = 1, n do
    local a = 5 + width * (i - 1)
    local s = tonumber(ARGV[a])
    local position, feed = KEYS[2 * s - 1], KEYS[2 * s]
    local entry_id = ARGV[a + 1]
    local settles = entry_id ~= ''
    local outcome, reply_version = 'duplicate', 0
    if not settles or is_pending(feed, group, entry_id) then
      outcome, reply_version = put(KEYS[2 * shards + 2 * i - 1], KEYS[2 * shards + 2 * i], a + 2,
        now_ms)
      if settles then
        settle_entry(position, feed, group, entry_id, outcome, now_ms)
      end
    end
    reply[#reply + 1] = outcome
    reply[#reply + 1] = reply_version
  end
  return settle_rest(group, now_ms, 5 + width * n, reply)
end
