-- refuse.lua: record a refusal decided before any script ran (the boundary's preflight,
-- a replayed retry that nothing recorded answers), atomically.
--
-- The run's refusal log gets one entry and the run hash one more count of the code,
-- only while the run hash exists (never a key without expiry; see refusal_log.lua).
--
-- KEYS[1] run             run registry hash
-- KEYS[2] refusals        the run's refusal log
-- ARGV[1] tool            tool name ('' when the name sent is not a tool name)
-- ARGV[2] tool_call_id    tool call id ('' when it is not an acceptable id)
-- ARGV[3] tool_call_id_bytes  UTF-8 size of the tool call id sent
-- ARGV[4] code            error code
-- ARGV[5] refusals_kept   entries the log keeps (the newest)
--
-- Reply: 1 when recorded, 0 when the run does not exist (nothing was written).
-- @include refusal_log

return log_refusal(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
