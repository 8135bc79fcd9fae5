-- append.lua: append one event to an existing invocation and fold it into its record.
--
-- Checks, in order: the record still exists (an update never creates a key, so nothing
-- can become immortal), a retried event id is answered as applied, the expected version,
-- the hash chain, the lifecycle transition and the evidence rule. Then folds the event
-- into the record, appends it to the stream (field e only, as create.lua does) and one
-- entry to the shard feed, which it trims by age (feed_trim.lua). A terminal event also
-- appends the call's identity to the run's progress list, and a Failed one counts its
-- code in the run hash (failed:<code>). No TTL is touched except the progress list's,
-- set once when that list is created.
--
-- KEYS[1] record          record hash
-- KEYS[2] stream          event stream
-- KEYS[3] feed            shard feed
-- KEYS[4] progress        run progress list
-- KEYS[5] run             run registry hash
-- ARGV[1] event_type      event type
-- ARGV[2] version         event version
-- ARGV[3] event_id        event id
-- ARGV[4] prev_hash       previous event's hash
-- ARGV[5] event_hash      this event's hash
-- ARGV[6] event           encoded event
-- ARGV[7] at_ms           event time (ms)
-- ARGV[8] retention_ms    feed retention (ms)
-- ARGV[9] run_id          run id
-- ARGV[10] tool_call_id   tool call id
-- ARGV[11..] (field, value)...  the record fields the event sets (payloads included)
--
-- Reply: "<version> <feed entry id> <expires_at_ms>"   the event is in the journal
--        {"applied", version, "", expires_at_ms}
--        {"refused", CODE, current version}   CODE is one of RECORD_EXPIRED,
--        VERSION_CONFLICT, CHAIN_BROKEN, ILLEGAL_TRANSITION, INVALID_EVIDENCE_STATUS,
--        MISSING_ERROR_CODE, PROTECTED_FIELD; for a governed call's ApprovalAdded or
--        Approved also APPROVAL_EXPIRED (past its approval's expiry, by the server's
--        clock); for Dispatched always PERMIT_REQUIRED: the one dispatch permit is
--        granted by permit.lua, which reads the call's journal, and by no other script;
--        for TakenOver, Reconciled and Settled always LAPSE_REQUIRED: they take a call
--        from a holder whose lease lapsed, judged by lapsed.lua and by no other script
-- @include lifecycle
-- @include field_scan
-- @include feed_trim

local record, stream, feed, progress, run = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
-- Numbers only where they are compared: a Lua number sent to Redis is formatted as a float.
local event_type, version_text, event_id = ARGV[1], ARGV[2], ARGV[3]
local prev_hash, event_hash, event_data, at_ms = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local retention_ms, run_id, tool_call_id = ARGV[8], ARGV[9], ARGV[10]

local event_field = 'e' .. version_text  -- where the record keeps this version's event id
local rec = redis.call('HMGET', record, 'stage', 'version', 'last_hash', 'expires_at_ms',
  event_field)
if not rec[1] then return {'refused', 'RECORD_EXPIRED', 0} end

-- A record whose stream is gone counts as expired. The write below finds that out with
-- XADD NOMKSTREAM; the answers given before it ask the stream first.
local function refused(code)
  if redis.call('EXISTS', stream) == 0 then return {'refused', 'RECORD_EXPIRED', 0} end
  return {'refused', code, tonumber(rec[2])}
end
if rec[5] then
  if rec[5] ~= event_id then return refused('VERSION_CONFLICT') end
  if redis.call('EXISTS', stream) == 0 then return {'refused', 'RECORD_EXPIRED', 0} end
  return {'applied', tonumber(version_text), '', tonumber(rec[4])}
end
-- The record's version is always a number: arithmetic converts it for less than
-- tonumber() costs. The event's may be anything a caller sent, so tonumber() (nil for
-- text that is no number, refused as a conflict, not a script error).
if rec[2] + 1 ~= tonumber(version_text) then return refused('VERSION_CONFLICT') end
if rec[3] ~= prev_hash then return refused('CHAIN_BROKEN') end
local dest = next_stage(rec[1], event_type)
if not dest then return refused('ILLEGAL_TRANSITION') end
-- A governed call's approval is given in time, by the server's clock, decided in the step
-- that writes it. Its dispatch permit is permit.lua's alone: it judges the journal.
if event_type == 'Dispatched' then return refused('PERMIT_REQUIRED') end
if taken_from_a_lapsed_holder(event_type) then return refused('LAPSE_REQUIRED') end
if event_type == 'Approved' or event_type == 'ApprovalAdded' then
  local now = redis.call('TIME')
  local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
  local expiry = redis.call('HGET', record, 'approval_expires_at_ms')
  if not expiry or now_ms >= tonumber(expiry) then return refused('APPROVAL_EXPIRED') end
end

local protected, evidence, error_code = scan_fields(11)
if protected then return refused('PROTECTED_FIELD') end
local named = evidence
if dest == 'ERROR' then
  if not error_code or error_code == '' then return refused('MISSING_ERROR_CODE') end
  evidence = 'ERROR'
elseif not evidence then
  evidence = 'PENDING'
end
if not evidence_allowed(dest, evidence) then return refused('INVALID_EVIDENCE_STATUS') end

-- NOMKSTREAM: a stream that is gone is not created again (it would never expire), and
-- nothing has been written yet when it answers nil.
if not redis.call('XADD', stream, 'NOMKSTREAM', '*', 'e', event_data) then
  return {'refused', 'RECORD_EXPIRED', 0}
end
-- The fields go to HSET straight from ARGV, after the lifecycle's: a named evidence
-- status is the one just checked, except on a Failed event, which is ERROR whatever it
-- names; only then are the fields copied without it.
local fields, first = ARGV, 11
if named and named ~= evidence then
  fields, first = {}, 1
  for i = 11, #ARGV, 2 do
    if ARGV[i] ~= 'evidence_status' then
      fields[#fields + 1], fields[#fields + 2] = ARGV[i], ARGV[i + 1]
    end
  end
end
-- A governed call leaving AWAITING_APPROVAL (decided, expired or failed) no longer waits:
-- its run counts it out, while the run hash exists (HINCRBY would create one that never
-- expires). One approval of several leaves it waiting. An approved call waits for its
-- resume: counted in here, out when it expires or fails (permit.lua counts a dispatch).
if rec[1] == 'AWAITING_APPROVAL' and dest ~= 'AWAITING_APPROVAL'
    and redis.call('EXISTS', run) == 1 then
  redis.call('HINCRBY', run, 'awaiting_approval', '-1')
  if dest == 'APPROVED' then redis.call('HINCRBY', run, 'approved', '1') end
elseif rec[1] == 'APPROVED' and redis.call('EXISTS', run) == 1 then
  redis.call('HINCRBY', run, 'approved', '-1')
end
redis.call('HSET', record, 'stage', dest, 'status', status_of(dest), 'evidence_status', evidence,
  'version', version_text, 'last_hash', event_hash, 'updated_at_ms', at_ms,
  event_field, event_id, unpack(fields, first))

if dest == 'READY' or dest == 'ERROR' then
  -- A list this push creates gets the run's expiry, once; every later push finds it set.
  if redis.call('RPUSH', progress, run_id .. ':' .. tool_call_id) == 1 then
    local run_expiry = redis.call('HGET', run, 'expires_at_ms') or rec[4]
    redis.call('PEXPIREAT', progress, run_expiry)
  end
  -- The run counts its failed calls per code, so a list of runs finds its errors in one
  -- hash (its ended calls are its progress list's length), never in every record. Only
  -- on a failure: a call that succeeds pays nothing for it. Only into a run hash that is
  -- still there: HINCRBY would create one that never expires.
  if dest == 'ERROR' and redis.call('EXISTS', run) == 1 then
    redis.call('HINCRBY', run, 'failed:' .. error_code, 1)
  end
end

local feed_id = redis.call('XADD', feed, '*',
  'r', run_id, 'c', tool_call_id, 'v', version_text, 't', feed_type_code(event_type),
  's', feed_status_code(dest))
trim_feed(feed, feed_id, retention_ms)
-- One string: a table reply costs Redis several times more to turn into its answer.
return version_text .. ' ' .. feed_id .. ' ' .. rec[4]
