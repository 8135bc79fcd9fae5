-- views_put.lua: fold invocations' statuses into their runs' progress views, atomically.
--
-- Each view keeps, per invocation, the last applied version, status and evidence status,
-- and counts by status and by evidence. A version at or below the stored one changes no
-- count, so duplicates never double count. Facts are replaced only by a list that covers
-- at least as many progress identities as the stored one. A view expires with its run.
-- Every entry is counted, moves the position and is acknowledged exactly once (an entry
-- no longer pending is answered "duplicate" and changes nothing); an empty entry id
-- writes the view alone (a rebuild from the records settles no entry). A batch may span
-- the shards of one server; on a cluster it holds one shard. The loop is batch_put.lua's.
--
-- KEYS[1..2S] (position, feed)...   position hash and feed of the batch's shard s = 1 .. S
-- KEYS[2S+1..] (view, run)...       progress view hash of item i and its run registry hash
-- ARGV[1] group           consumer group
-- ARGV[2] now_ms          now (ms)
-- ARGV[3] shards          S, the number of shards in the batch
-- ARGV[4] items           n, the number of items
-- ARGV[5..] (shard, entry_id, tool_call_id, version, status, evidence_status,
--           updated_at_ms, facts, covered)...
--                         of item i: shard number, entry id, tool call id, record version,
--                         public status, evidence status, record updated_at_ms, facts JSON
--                         ('' when not recomputed), identities the facts cover
-- ARGV[5+9n..] (shard, entry_id, counter)...   entries settled without output, counted
--                         under counter ("stale" | "expired")
--
-- Reply: for each item its outcome ("applied" | "stale" | "expired" | "duplicate") and
--        version, then for each settled entry "settled" or "duplicate" and 0.
-- @include helpers
-- @include batch_put

local function put(view, run, a)
  local call, version, status, evidence = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3]
  local updated_ms, facts, covered = ARGV[a + 4], ARGV[a + 5], ARGV[a + 6]
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

return put_batch(9, put)
