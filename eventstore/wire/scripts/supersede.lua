-- supersede.lua: an operator's edit of a governed call waiting for a decision, atomically.
--
-- In one step the original is denied as superseded (Denied, ERROR APPROVAL_DENIED, linked
-- to the edited call) and the edited request is recorded as a new governed call of the
-- same run and tool (ApprovalRequested, linked back), waiting for an approval of its own;
-- or, when the original was decided first (or is not where the caller read it), nothing
-- is written at all. So a waiting edit never stands beside an approved original.
--
-- The edited call takes the original's place: it spends no budget (the original's
-- reservation stands for it) and it is recorded in a paused run too (a pause holds
-- dispatches, not decisions); the run must still be active, within its deadline, with
-- the tool still granted, and the new call id unused. Its record and stream get one
-- absolute expiry, set here, as create.lua sets one.
--
-- KEYS[1] record          the original's record hash
-- KEYS[2] stream          the original's event stream
-- KEYS[3] edited_record   the edited call's record hash
-- KEYS[4] edited_stream   the edited call's event stream
-- KEYS[5] feed            shard feed
-- KEYS[6] progress        run progress list
-- KEYS[7] run             run registry hash
-- ARGV[1] run_id          run id
-- ARGV[2] tool_call_id    the original's tool call id
-- ARGV[3] tool            tool name
-- ARGV[4] version         Denied's version
-- ARGV[5] event_id        Denied's event id
-- ARGV[6] prev_hash       Denied's previous hash
-- ARGV[7] event_hash      Denied's hash
-- ARGV[8] event           Denied, encoded
-- ARGV[9] edited_call_id  the edited call's tool call id
-- ARGV[10] edited_invocation_id  the edited call's invocation id
-- ARGV[11] edited_event_id  its ApprovalRequested's event id
-- ARGV[12] edited_event_hash  its hash
-- ARGV[13] edited_event   its ApprovalRequested, encoded
-- ARGV[14] at_ms          both events' time (ms)
-- ARGV[15] ttl_ms         the edited record's TTL (ms)
-- ARGV[16] retention_ms   feed retention (ms)
-- ARGV[17] denied_fields  how many ARGV after this one are Denied's fields and values
-- ARGV[18..] (field, value)...  Denied's record fields, then the edited call's (request
--                         included)
--
-- Reply: {original's version, expires_at_ms, edited expires_at_ms}   both written
--        {"refused", CODE, current version}   nothing written; CODE is one of
--        RECORD_EXPIRED, VERSION_CONFLICT, CHAIN_BROKEN, ILLEGAL_TRANSITION (the
--        original moved on: decided first), APPROVAL_EXPIRED, PROTECTED_FIELD, or for the
--        edited call RUN_INACTIVE, UNAUTHORIZED, RUN_DEADLINE_EXPIRED, DUPLICATE_TOOL_CALL
--        (its call id is taken)
-- @include lifecycle
-- @include field_scan
-- @include feed_trim

local record, stream, edited_record, edited_stream = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local feed, progress, run = KEYS[5], KEYS[6], KEYS[7]
local run_id, tool_call_id, tool, version_text = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local event_id, prev_hash, event_hash, event_data = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local edited_id, edited_invocation, edited_event_id = ARGV[9], ARGV[10], ARGV[11]
local edited_hash, edited_data, at_ms = ARGV[12], ARGV[13], ARGV[14]
local ttl_ms, retention_ms, denied_end = ARGV[15], ARGV[16], 17 + ARGV[17]

-- The original: still waiting, exactly where the caller read it.
local rec = redis.call('HMGET', record, 'stage', 'version', 'last_hash', 'approval_expires_at_ms',
  'expires_at_ms')
if not rec[1] or redis.call('EXISTS', stream) == 0 then return {'refused', 'RECORD_EXPIRED', 0} end
local function refused(code) return {'refused', code, tonumber(rec[2])} end
if rec[2] + 1 ~= tonumber(version_text) then return refused('VERSION_CONFLICT') end
if rec[3] ~= prev_hash then return refused('CHAIN_BROKEN') end
if rec[1] ~= 'AWAITING_APPROVAL' or next_stage(rec[1], 'Denied') ~= 'ERROR' then
  return refused('ILLEGAL_TRANSITION')
end
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
if not rec[4] or now_ms >= tonumber(rec[4]) then return refused('APPROVAL_EXPIRED') end

-- The edited call: the run's authority over the tool, and a free call id.
local r = redis.call('HMGET', run, 'active', 'deadline_ms', 'restricted', 'tool:' .. tool,
  'revoked:' .. tool, 'inv:' .. edited_invocation)
if r[1] ~= '1' then return refused('RUN_INACTIVE') end
if (r[3] == '1' and not r[4]) or r[5] then return refused('UNAUTHORIZED') end
if now_ms >= tonumber(r[2]) then return refused('RUN_DEADLINE_EXPIRED') end
if r[6] or redis.call('EXISTS', edited_record) == 1 then return refused('DUPLICATE_TOOL_CALL') end
local protected = scan_fields(18)
if protected then return refused('PROTECTED_FIELD') end
local edited_stage = next_stage('NEW', 'ApprovalRequested')

-- Written from here on: first the edited call, then the original's denial.
redis.call('HSET', run, 'inv:' .. edited_invocation, edited_id .. ' ' .. edited_event_id)
local expires_at = string.format('%d', now_ms + ttl_ms)
redis.call('HSET', edited_record, 'stage', edited_stage, 'status', status_of(edited_stage),
  'evidence_status', 'PENDING', 'version', '1', 'last_hash', edited_hash,
  'updated_at_ms', at_ms, 'expires_at_ms', expires_at, 'invocation_id', edited_invocation,
  'e1', edited_event_id, unpack(ARGV, denied_end + 1))
redis.call('PEXPIREAT', edited_record, expires_at)
redis.call('XADD', edited_stream, '*', 'e', edited_data)
redis.call('PEXPIREAT', edited_stream, expires_at)
local feed_id = redis.call('XADD', feed, '*', 'r', run_id, 'c', edited_id, 'v', '1',
  't', feed_type_code('ApprovalRequested'), 's', feed_status_code(edited_stage))

redis.call('XADD', stream, '*', 'e', event_data)
redis.call('HSET', record, 'stage', 'ERROR', 'status', status_of('ERROR'),
  'evidence_status', 'ERROR', 'version', version_text, 'last_hash', event_hash,
  'updated_at_ms', at_ms, 'e' .. version_text, event_id, unpack(ARGV, 18, denied_end))
-- One call waits in the other's place; the original has ended (append.lua does the same
-- for every denial: the progress list, created with the run's expiry, and the count).
if redis.call('RPUSH', progress, run_id .. ':' .. tool_call_id) == 1 then
  redis.call('PEXPIREAT', progress, redis.call('HGET', run, 'expires_at_ms') or rec[5])
end
redis.call('HINCRBY', run, 'failed:APPROVAL_DENIED', 1)
feed_id = redis.call('XADD', feed, '*', 'r', run_id, 'c', tool_call_id, 'v', version_text,
  't', feed_type_code('Denied'), 's', feed_status_code('ERROR'))
trim_feed(feed, feed_id, retention_ms)
return {tonumber(version_text), tonumber(rec[5]), tonumber(expires_at)}
