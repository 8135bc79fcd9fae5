-- rewrap_key.lua: replace a run's wrapped data key by the same key wrapped anew.
--
-- Only when the run still holds the wrapped key the caller unwrapped (compare and set):
-- a run erased meanwhile (its data key deleted) is never given one back, and of two
-- rewraps at once the second finds the key changed and reads it again. The payloads are
-- not touched: the data key itself is the same.
--
-- KEYS[1] run             run registry hash
-- ARGV[1] expected        the wrapped data key the caller read
-- ARGV[2] wrapped         the same data key, wrapped by the current master key
--
-- Reply: 1 replaced | 0 the run holds another wrapped key, or none

local run = KEYS[1]
if redis.call('HGET', run, 'data_key') ~= ARGV[1] then return 0 end
redis.call('HSET', run, 'data_key', ARGV[2])
return 1
