-- lease.lua: renew the lease of a call in flight, only for the holder that has it.
--
-- A call that runs holds a lease (lease_version: the version of the event that granted
-- it, Preflighted, Dispatched, TakenOver or Reconciled; lease_until_ms: when it ends, by
-- the server's clock). Its process renews it while the tool runs, so that no retry takes
-- the call over and no reconcile settles it while that process lives. Only the record's
-- current holder renews (the same lease_version), only while the call is in flight, and
-- never on a record that is gone (HSET would create one that never expires).
--
-- KEYS[1] record          record hash
-- ARGV[1] lease_version   the version of the event that granted the caller its lease
-- ARGV[2] lease_ms        the renewed lease from now (ms)
--
-- Reply: the new lease_until_ms when renewed; 0 when the caller no longer holds the call
--        (the record is gone, ended, or taken over since)

local rec = redis.call('HMGET', KEYS[1], 'stage', 'lease_version')
if (rec[1] ~= 'EXECUTING' and rec[1] ~= 'PROJECTING') or rec[2] ~= ARGV[1] then return 0 end
local now = redis.call('TIME')
local until_ms = now[1] * 1000 + math.floor(now[2] / 1000) + ARGV[2]
redis.call('HSET', KEYS[1], 'lease_until_ms', string.format('%d', until_ms))
return until_ms
