-- view_put.lua: fold one invocation's status into its run's progress view, atomically.
--
-- The view keeps, per invocation, the last applied version, status and evidence status,
-- and counts by status and by evidence. A version at or below the stored one changes no
-- count, so duplicates never double count. Facts are replaced only by a list that covers
-- at least as many progress identities as the stored one. The view expires with its run.
-- An empty entry id writes the view alone (a rebuild from the records settles no entry).
--
-- KEYS[1] run progress view hash   KEYS[2] run registry hash   KEYS[3] position hash
-- KEYS[4] shard feed
-- ARGV[1] consumer group   ARGV[2] feed entry id    ARGV[3] tool call id
-- ARGV[4] record version   ARGV[5] public status    ARGV[6] evidence status
-- ARGV[7] record updated_at_ms                      ARGV[8] now (ms)
-- ARGV[9] facts JSON ('' when not recomputed)       ARGV[10] identities the facts cover
--
-- Reply: {"applied", version} | {"stale", stored version} | {"expired", 0} (run gone)
--        | {"duplicate", 0} (the entry was already settled; nothing changed)
-- @position-helpers

local view, run, position, feed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, entry_id, call = ARGV[1], ARGV[2], ARGV[3]
local version, status, evidence = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local updated_ms, now_ms, facts, covered = ARGV[7], ARGV[8], ARGV[9], ARGV[10]

local settles = entry_id ~= ''
if settles and not is_pending(feed, group, entry_id) then return {'duplicate', 0} end

local outcome, reply_version = 'applied', version
local run_expiry = redis.call('HGET', run, 'expires_at_ms')
if not run_expiry then
  outcome, reply_version = 'expired', 0
else
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
end

if settles then
  advance(position, entry_id, outcome, now_ms)
  redis.call('XACK', feed, group, entry_id)
end
return {outcome, reply_version}
