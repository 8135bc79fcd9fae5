-- update_run.lua: set fields on an existing run registry hash, never creating one.
--
-- Used to close a run and to revoke a tool. HSET on a missing key would create a run
-- without expiry, so the existence check and the write are one step.
--
-- KEYS[1] run             run registry hash
-- ARGV[1..] (field, value)...  the fields to set
--
-- Reply: 1 when updated, 0 when the run does not exist.

if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
