-- views_put.lua: fold invocations' statuses into their runs' progress views, atomically.
--
-- Each view keeps, per invocation, the last applied version, status and evidence status,
-- and counts by status and by evidence. A version at or below the stored one changes no
-- count, so duplicates never double count. Facts are replaced only by a list that covers
-- at least as many progress identities as the stored one. A view expires with its run.
-- Every entry is counted, moves the position and is acknowledged exactly once (an entry
-- no longer pending is answered "duplicate" and changes nothing); an empty entry id
-- writes the view alone (a rebuild from the records settles no entry). A batch may span
-- the shards of one server; on a cluster it holds one shard.
--
-- KEYS[2s - 1], KEYS[2s]  position hash and feed of the batch's shard s (s = 1 .. S)
-- KEYS[2S + 2i - 1]       progress view hash of item i    KEYS[2S + 2i] its run registry hash
-- ARGV[1] consumer group  ARGV[2] now (ms)  ARGV[3] S  ARGV[4] n, the number of items
-- ARGV[5 + 9(i - 1)] ..   shard number, entry id, tool call id, record version, public
--                         status, evidence status, record updated_at_ms, facts JSON (''
--                         when not recomputed), identities the facts cover; of item i
-- ARGV[5 + 9n] ..         then triples: shard number, entry id, counter ("stale" |
--                         "expired") of entries settled without output
--
-- Reply: for each item its outcome ("applied" | "stale" | "expired" | "duplicate") and
--        version, then for each settled entry "settled" or "duplicate" and 0.
-- @position-helpers

local function put(view, run, call, version, status, evidence, updated_ms, facts, covered)
  local run_expiry = redis.call('HGET', run, 'expires_at_ms')
  if not run_expiry then return 'expired', 0 end
  local outcome, reply_version = 'applied', version
  local created = redis.call('EXISTS', view) == 0
  local prev = redis.call('HMGET', view, 'v:' .. call, 's:' .. call, 'e:' .. call)
  if prev[1] and tonumber(prev[1]) >= version then
    outcome, reply_version = 'stale', tonumber(prev[1])
  else
    if prev[1] then
      redis.call('HINCRBY', view, 'status:' .. prev[2], -1)
      redis.call('HINCRBY', view, 'evidence:' .. prev[3], -1)
    else
      redis.call('HINCRBY', view, 'invocations', 1)
    end
    redis.call('HINCRBY', view, 'status:' .. status, 1)
    redis.call('HINCRBY', view, 'evidence:' .. evidence, 1)
    redis.call('HSET', view, 'v:' .. call, version, 's:' .. call, status, 'e:' .. call, evidence)
    local last = tonumber(redis.call('HGET', view, 'updated_at_ms') or '0')
    if tonumber(updated_ms) > last then redis.call('HSET', view, 'updated_at_ms', updated_ms) end
  end
  if facts ~= '' then
    local stored_cover = tonumber(redis.call('HGET', view, 'facts_covered') or '-1')
    if tonumber(covered) >= stored_cover then
      redis.call('HSET', view, 'facts', facts, 'facts_covered', covered)
    end
  end
  if created then redis.call('PEXPIREAT', view, run_expiry) end
  return outcome, reply_version
end

local group, now_ms = ARGV[1], ARGV[2]
local shards, n = tonumber(ARGV[3]), tonumber(ARGV[4])
local reply = {}

for i = 1, n do
  local a = 5 + 9 * (i - 1)
  local s = tonumber(ARGV[a])
  local position, feed = KEYS[2 * s - 1], KEYS[2 * s]
  local entry_id = ARGV[a + 1]
  local settles = entry_id ~= ''
  local outcome, reply_version = 'duplicate', 0
  if not settles or is_pending(feed, group, entry_id) then
    outcome, reply_version = put(KEYS[2 * shards + 2 * i - 1], KEYS[2 * shards + 2 * i],
      ARGV[a + 2], tonumber(ARGV[a + 3]), ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7],
      ARGV[a + 8])
    if settles then
      settle_entry(position, feed, group, entry_id, outcome, now_ms)
    end
  end
  reply[#reply + 1] = outcome
  reply[#reply + 1] = reply_version
end

return settle_rest(group, now_ms, 5 + 9 * n, reply)
