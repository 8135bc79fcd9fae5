-- erase.lua: erase a run's payloads in one step, leaving a tombstone and every digest.
--
-- The run is closed first, whatever follows (no new call may start, so no new payload
-- comes). Then, unless refused, every record passed loses its payload fields and is
-- marked erased_at_ms, and the run hash keeps the tombstone: erased_at_ms, erased_by,
-- erased_reason (the first erasure's; a second one erases again and keeps it), and its
-- wrapped data key (payloads encrypted at rest) is deleted: every copy of its payloads,
-- in the AOF, a backup or an archive, is unreadable from then on. Events, digests, sizes
-- and the chain stay as they are, so the journal still verifies.
--
-- Refused, erasing nothing: a run that does not exist; a run that names more calls than
-- the records passed (a call was created after the caller read the run: read it again);
-- a record of a call in flight (stage EXECUTING or PROJECTING: its executor or projector
-- may still write a payload), unless forced.
--
-- KEYS[1] run             run registry hash
-- KEYS[2..] (record)...   the records of the calls the run names
-- ARGV[1] by              who erases
-- ARGV[2] reason          why
-- ARGV[3] at_ms           when (ms; the first erasure's time is kept)
-- ARGV[4] calls           how many calls the caller found in the run hash
-- ARGV[5] force           '1' to erase calls in flight too
-- ARGV[6..] (field)...    the record fields that hold payloads
--
-- Reply: {"erased", erased_at_ms, records erased} | {"refused", "RUN_NOT_FOUND"} |
--        {"refused", "RUN_CHANGED"} | {"refused", "CALLS_IN_FLIGHT"}

local run = KEYS[1]
if redis.call('EXISTS', run) == 0 then return {'refused', 'RUN_NOT_FOUND'} end
redis.call('HSET', run, 'active', '0')

local named = 0
local fields = redis.call('HKEYS', run)
for i = 1, #fields do
  if string.sub(fields[i], 1, 4) == 'inv:' then named = named + 1 end
end
if named ~= tonumber(ARGV[4]) or named ~= #KEYS - 1 then return {'refused', 'RUN_CHANGED'} end

if ARGV[5] ~= '1' then
  for i = 2, #KEYS do
    local stage = redis.call('HGET', KEYS[i], 'stage')
    if stage == 'EXECUTING' or stage == 'PROJECTING' then
      return {'refused', 'CALLS_IN_FLIGHT'}
    end
  end
end

local erased_at = redis.call('HGET', run, 'erased_at_ms')
if not erased_at then
  erased_at = ARGV[3]
  redis.call('HSET', run, 'erased_at_ms', erased_at, 'erased_by', ARGV[1],
    'erased_reason', ARGV[2])
end
redis.call('HDEL', run, 'data_key')
local erased = 0
for i = 2, #KEYS do
  -- An expired record is gone already; HSET on it would create a key without expiry.
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('HDEL', KEYS[i], unpack(ARGV, 6))
    redis.call('HSET', KEYS[i], 'erased_at_ms', erased_at)
    erased = erased + 1
  end
end
return {'erased', tonumber(erased_at), erased}
