-- pause_run.lua: pause or unpause one run, keeping who, when and why, atomically.
--
-- A run is paused only while it is open: a closed run, or one past its deadline, runs
-- nothing anyway, and pausing it is refused (CLOSED). A run paused already stays paused
-- as it was (its who, when and why are kept and answered, not overwritten); the same for
-- a run that is not paused being unpaused. Only an existing run hash is written (HSET
-- would create one that never expires).
--
-- KEYS[1] run             run registry hash
-- ARGV[1] paused          1 to pause, 0 to unpause
-- ARGV[2] by              who
-- ARGV[3] reason          why
-- ARGV[4] at_ms           when (the writer's clock)
--
-- Reply: {"done"}   the switch was set now
--        {"already", by, reason, at_ms}   it was so already (by whom, why, since when;
--        empty strings when the run never recorded them)
--        {"closed"}   pausing a run that is closed or past its deadline: nothing written
--        {"unknown"}   no such run (or it expired): nothing written

local run = KEYS[1]
local want, by, reason, at_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local r = redis.call('HMGET', run, 'active', 'deadline_ms', 'paused')
if not r[1] then return {'unknown'} end
local word = want == '1' and 'paused' or 'unpaused'
local paused = r[3] == '1' and '1' or '0'
if paused == want then
  local who = redis.call('HMGET', run, word .. '_by', word .. '_reason', word .. '_at_ms')
  return {'already', who[1] or '', who[2] or '', who[3] or ''}
end
if want == '1' then
  local now = redis.call('TIME')
  local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
  if r[1] ~= '1' or now_ms >= tonumber(r[2]) then return {'closed'} end
end
redis.call('HSET', run, 'paused', want, word .. '_by', by, word .. '_reason', reason,
  word .. '_at_ms', at_ms)
return {'done'}
