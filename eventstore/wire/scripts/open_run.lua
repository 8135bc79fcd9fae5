-- open_run.lua: register a run with its deadline, budgets and access-token hash.
--
-- The run hash expires when its last possible record does (deadline + record TTL), so
-- duplicate detection covers every record the run can own.
--
-- The shard's run index gets the run scored by its open time, in the same step: a run is
-- findable exactly when it exists. Each open trims the index entries older than the
-- longest run lifetime the shard has seen (kept in the control hash), so no entry outlives
-- its run by more than that, and the index itself expires with the shard's latest run.
--
-- KEYS[1] run             run registry hash
-- KEYS[2] runs            the shard's run index (sorted set, scored by open time)
-- KEYS[3] control         the shard's control hash (field run_lifetime_ms)
-- ARGV[1] token_sha256    SHA-256 of the run's access token
-- ARGV[2] deadline_ms     deadline (ms since epoch)
-- ARGV[3] ttl_ms          record TTL (ms)
-- ARGV[4] budget          run budget ('' for none)
-- ARGV[5] run_id          the run id (the index member)
-- ARGV[6..] (tool, tool_budget)...  granted tools, each with its budget ('' for none)
--
-- Reply: {"ok", expires_at_ms} | {"refused", "RUN_EXISTS"} | {"refused", "DEADLINE_PASSED"}

local run, runs, control = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', run) == 1 then return {'refused', 'RUN_EXISTS'} end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local deadline_ms = tonumber(ARGV[2])
if deadline_ms <= now_ms then return {'refused', 'DEADLINE_PASSED'} end
local expires_at_ms = deadline_ms + tonumber(ARGV[3])

-- failures_counted: append.lua counts this run's failed calls per code (failed:<code>),
-- which runs opened by earlier versions do not have.
redis.call('HSET', run, 'active', 1, 'token_sha256', ARGV[1], 'deadline_ms', deadline_ms,
  'created_at_ms', now_ms, 'expires_at_ms', expires_at_ms, 'used_total', 0,
  'failures_counted', 1)
if ARGV[4] ~= '' then redis.call('HSET', run, 'budget_total', ARGV[4]) end
-- A run opened with a tool list may call only those tools.
if #ARGV >= 6 then redis.call('HSET', run, 'restricted', 1) end
for i = 6, #ARGV, 2 do
  redis.call('HSET', run, 'tool:' .. ARGV[i], 1)
  if ARGV[i + 1] ~= '' then redis.call('HSET', run, 'budget:' .. ARGV[i], ARGV[i + 1]) end
end
redis.call('PEXPIREAT', run, expires_at_ms)

local lifetime_ms = expires_at_ms - now_ms
local longest_ms = tonumber(redis.call('HGET', control, 'run_lifetime_ms') or '0')
if lifetime_ms > longest_ms then
  longest_ms = lifetime_ms
  redis.call('HSET', control, 'run_lifetime_ms', longest_ms)
end
-- An entry opened before now - longest has outlived every run this shard ever held.
redis.call('ZREMRANGEBYSCORE', runs, '-inf', '(' .. (now_ms - longest_ms))
redis.call('ZADD', runs, now_ms, ARGV[5])
if redis.call('PTTL', runs) < lifetime_ms then redis.call('PEXPIREAT', runs, expires_at_ms) end
return {'ok', expires_at_ms}
