-- open_run.lua: register a run with its deadline, budgets and access-token hash.
--
-- The run hash expires when its last possible record does (deadline + record TTL), so
-- duplicate detection covers every record the run can own.
--
-- KEYS[1] run             run registry hash
-- ARGV[1] token_sha256    SHA-256 of the run's access token
-- ARGV[2] deadline_ms     deadline (ms since epoch)
-- ARGV[3] ttl_ms          record TTL (ms)
-- ARGV[4] budget          run budget ('' for none)
-- ARGV[5..] (tool, tool_budget)...  granted tools, each with its budget ('' for none)
--
-- Reply: {"ok", expires_at_ms} | {"refused", "RUN_EXISTS"} | {"refused", "DEADLINE_PASSED"}

local run = KEYS[1]
if redis.call('EXISTS', run) == 1 then return {'refused', 'RUN_EXISTS'} end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local deadline_ms = tonumber(ARGV[2])
if deadline_ms <= now_ms then return {'refused', 'DEADLINE_PASSED'} end
local expires_at_ms = deadline_ms + tonumber(ARGV[3])

redis.call('HSET', run, 'active', 1, 'token_sha256', ARGV[1], 'deadline_ms', deadline_ms,
  'created_at_ms', now_ms, 'expires_at_ms', expires_at_ms, 'used_total', 0)
if ARGV[4] ~= '' then redis.call('HSET', run, 'budget_total', ARGV[4]) end
-- A run opened with a tool list may call only those tools.
if #ARGV >= 5 then redis.call('HSET', run, 'restricted', 1) end
for i = 5, #ARGV, 2 do
  redis.call('HSET', run, 'tool:' .. ARGV[i], 1)
  if ARGV[i + 1] ~= '' then redis.call('HSET', run, 'budget:' .. ARGV[i], ARGV[i + 1]) end
end
redis.call('PEXPIREAT', run, expires_at_ms)
return {'ok', expires_at_ms}
