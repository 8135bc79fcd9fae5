-- helpers.lua: shared by the projection scripts; pasted at "-- @include helpers".
--
-- is_pending(feed, group, entry_id)  true while the entry waits for an ack in the group.
-- settle_entry(position, feed, group, entry_id, counter, now_ms)
--   moves the projection's per-shard position to the highest entry id seen, counts the
--   entry once under ``counter`` and acknowledges it. Callers check is_pending first, so
--   an entry is counted exactly once however often it is delivered.

local function id_after(a, b)
  local a_ms, a_seq = string.match(a, '^(%d+)-(%d+)$')
  local b_ms, b_seq = string.match(b or '', '^(%d+)-(%d+)$')
  if not b_ms then return true end
  a_ms, a_seq, b_ms, b_seq = tonumber(a_ms), tonumber(a_seq), tonumber(b_ms), tonumber(b_seq)
  return a_ms > b_ms or (a_ms == b_ms and a_seq > b_seq)
end

local function is_pending(feed, group, entry_id)
  return #redis.call('XPENDING', feed, group, entry_id, entry_id, 1) > 0
end

local function settle_entry(position, feed, group, entry_id, counter, now_ms)
  local last = redis.call('HGET', position, 'last_entry_id')
  if id_after(entry_id, last) then
    redis.call('HSET', position, 'last_entry_id', entry_id)
  end
  redis.call('HINCRBY', position, counter, 1)
  redis.call('HSET', position, 'updated_at_ms', now_ms)
  redis.call('XACK', feed, group, entry_id)
end

-- settle_rest(group, now_ms, first, reply)
--   settles the entries named by ARGV[first], ARGV[first + 1] ... as triples of shard
--   number s, entry id and counter (shard s's position hash and feed are KEYS[2s - 1] and
--   KEYS[2s], as in every batch script), appending "settled" (or "duplicate" when no
--   longer pending) and 0 to ``reply`` for each.
local function settle_rest(group, now_ms, first, reply)
  for j = first, #ARGV, 3 do
    local s, entry_id, counter = tonumber(ARGV[j]), ARGV[j + 1], ARGV[j + 2]
    local position, feed = KEYS[2 * s - 1], KEYS[2 * s]
    if is_pending(feed, group, entry_id) then
      settle_entry(position, feed, group, entry_id, counter, now_ms)
      reply[#reply + 1] = 'settled'
    else
      reply[#reply + 1] = 'duplicate'
    end
    reply[#reply + 1] = 0
  end
  return reply
end
