-- data_key.lua: a run's one wrapped data key (payloads encrypted at rest), created once.
--
-- The first writer of a run's payloads offers a fresh data key wrapped by the current
-- master key; HSETNX keeps the first offer, and every writer reads back the one kept, so
-- concurrent first writers (any process) end up with the same key. Never on a run hash
-- that is gone (HSETNX would create one that never expires) nor on an erased run (its
-- payloads must stay unreadable: whatever is still written to it is sealed by a key
-- nobody keeps).
--
-- KEYS[1] run             run registry hash
-- ARGV[1] wrapped         a new data key, wrapped ("<master key id>:<nonce><sealed>")
--
-- Reply: the run's wrapped data key (the first one offered) | false: no run, or erased

local run = KEYS[1]
local r = redis.call('HMGET', run, 'data_key', 'erased_at_ms', 'deadline_ms')
if r[1] then return r[1] end
if r[2] or not r[3] then return false end
redis.call('HSETNX', run, 'data_key', ARGV[1])
return redis.call('HGET', run, 'data_key')
