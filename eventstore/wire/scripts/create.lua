-- create.lua: create one invocation with its first event, atomically: Preflighted, or a
-- governed call's ApprovalRequested (its record then waits in AWAITING_APPROVAL).
--
-- Reserves the run and tool budgets, records the invocation in its run, writes the
-- canonical record with the complete request, sets ONE absolute expiry on record and
-- stream (the only place a TTL is ever set on them), appends the event to the stream and
-- one small entry to the shard feed (the outbox), which it trims by age (feed_trim.lua,
-- never past an entry a consumer group still needs). The stream entry holds the encoded
-- event only (field e): its hash becomes the record's last_hash and the next event's
-- previous hash, so storing it beside the event again would add nothing. A call that
-- starts running (Preflighted) gets its holder's lease in the same step: lease_version 1
-- (the event that granted it) and lease_until_ms, lease_ms from now by the server's clock
-- (renewed by lease.lua while the tool runs; lapsed.lua takes on a call past it).
--
-- KEYS[1] record          record hash
-- KEYS[2] stream          event stream
-- KEYS[3] feed            shard feed
-- KEYS[4] run             run registry hash
-- KEYS[5] control         shard control hash
-- KEYS[6] refusals        the run's refusal log (written only on a refusal)
-- ARGV[1] event_id        event id
-- ARGV[2] event_hash      event hash
-- ARGV[3] event           encoded event
-- ARGV[4] run_id          run id
-- ARGV[5] tool_call_id    tool call id
-- ARGV[6] tool            tool name
-- ARGV[7] invocation_id   invocation id
-- ARGV[8] at_ms           event time (ms)
-- ARGV[9] ttl_ms          record TTL (ms)
-- ARGV[10] retention_ms   feed retention (ms)
-- ARGV[11] version        event version (must be 1)
-- ARGV[12] prev_hash      previous hash (must be the genesis hash)
-- ARGV[13] refusals_kept  entries the run's refusal log keeps (the newest)
-- ARGV[14] log_refusals   which refusals go on the log: all, none, or not_duplicates
--                         (the caller answers a duplicate from its record)
-- ARGV[15] event_type     Preflighted or ApprovalRequested
-- ARGV[16] lease_ms       the holder's lease from now (ms), for a call that starts running
-- ARGV[17..] (field, value)...  the record fields the event sets (payloads included)
--
-- Reply: "1 <feed entry id> <expires_at_ms>"   the event is in the journal (version 1)
--        {"applied", 1, "", expires_at_ms}   the same event id was already applied
--        {"refused", CODE}   CODE is one of RECORD_EXPIRED (this event was applied and its
--        record has expired since: a resent creation), DUPLICATE_TOOL_CALL, VERSION_CONFLICT (version
--        is not 1), CHAIN_BROKEN (previous hash is not the genesis hash), RUN_INACTIVE,
--        UNAUTHORIZED, RUN_DEADLINE_EXPIRED, EXECUTION_PAUSED, RUN_PAUSED,
--        TOOL_BUDGET_EXHAUSTED, RUN_BUDGET_EXHAUSTED, PROTECTED_FIELD, ILLEGAL_TRANSITION
--        (an event type that creates nothing)
--
-- A refusal of the run's preflight (DUPLICATE_TOOL_CALL, RUN_INACTIVE, UNAUTHORIZED,
-- RUN_DEADLINE_EXPIRED, EXECUTION_PAUSED, RUN_PAUSED, TOOL_BUDGET_EXHAUSTED,
-- RUN_BUDGET_EXHAUSTED)
-- is recorded on the run's refusal log in this same step (refusal_log.lua), while the run
-- exists; a writer conflict (VERSION_CONFLICT, CHAIN_BROKEN, PROTECTED_FIELD) is not.
-- @include first_event
-- @include lifecycle
-- @include field_scan
-- @include feed_trim
-- @include refusal_log

local record, stream, feed, run, ctl = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local event_id, event_hash, event_data = ARGV[1], ARGV[2], ARGV[3]
local run_id, tool_call_id, tool, invocation_id = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local at_ms, ttl_ms, retention_ms = ARGV[8], ARGV[9], ARGV[10]
local version, prev_hash = ARGV[11], ARGV[12]

-- The run's preflight turned the call away: on record (unless the caller answers it).
local function refused(code)
  local mode = ARGV[14]
  if mode == 'all' or (mode == 'not_duplicates' and code ~= 'DUPLICATE_TOOL_CALL') then
    log_refusal(run, KEYS[6], tool, tool_call_id, '', code, ARGV[13])
  end
  return {'refused', code}
end

local existing = redis.call('HMGET', record, 'e1', 'expires_at_ms')
if existing[1] then
  -- The Head of a retried event names that event (version 1), as append.lua does.
  if existing[1] == event_id then return {'applied', 1, '', tonumber(existing[2])} end
  return refused('DUPLICATE_TOOL_CALL')
end
-- The record's version and last_hash come from this event, so it must be a first event.
if version ~= '1' then return {'refused', 'VERSION_CONFLICT'} end
if prev_hash ~= GENESIS_HASH then return {'refused', 'CHAIN_BROKEN'} end
-- Nearly every creation is a Preflighted event, whose stage and codes are constants; a
-- governed call's ApprovalRequested looks them up in the table.
local event_type = ARGV[15]
local first_stage, first_status = FIRST_STAGE, FIRST_STATUS
local type_code, status_code = FIRST_TYPE_CODE, FIRST_STATUS_CODE
if event_type ~= FIRST_TYPE then
  first_stage = next_stage('NEW', event_type)
  if not first_stage then return {'refused', 'ILLEGAL_TRANSITION'} end
  first_status, status_code = status_of(first_stage), feed_status_code(first_stage)
  type_code = feed_type_code(event_type)
end

local now = redis.call('TIME')
-- Arithmetic converts the two strings itself, for less than tonumber() costs.
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)

local used_field = 'used:' .. tool
local r = redis.call('HMGET', run, 'active', 'deadline_ms', 'budget_total', 'used_total',
  'budget:' .. tool, used_field, 'inv:' .. invocation_id, 'restricted', 'tool:' .. tool,
  'revoked:' .. tool, 'paused')
-- The run names each call by its id and its first event's id: this very event, resent
-- (a retried write whose first try committed) after its record expired, finds it there.
local entry = tool_call_id .. ' ' .. event_id
if r[7] == entry then return {'refused', 'RECORD_EXPIRED'} end
if r[1] ~= '1' then return refused('RUN_INACTIVE') end
if (r[8] == '1' and not r[9]) or r[10] then return refused('UNAUTHORIZED') end
if now_ms >= tonumber(r[2]) then return refused('RUN_DEADLINE_EXPIRED') end
if redis.call('HGET', ctl, 'paused') == '1' then return refused('EXECUTION_PAUSED') end
if r[11] == '1' then return refused('RUN_PAUSED') end
-- The run remembers every call id for its whole life, so a call whose record already
-- expired is still a duplicate.
if r[7] then return refused('DUPLICATE_TOOL_CALL') end
if r[5] and tonumber(r[6] or '0') >= tonumber(r[5]) then
  return refused('TOOL_BUDGET_EXHAUSTED')
end
if r[3] and tonumber(r[4] or '0') >= tonumber(r[3]) then
  return refused('RUN_BUDGET_EXHAUSTED')
end

-- The fields go to HSET straight from ARGV, once none of them is one only we write: the
-- first event's evidence status is PENDING, whatever it names.
local protected, evidence = scan_fields(17)
if protected or evidence then return {'refused', 'PROTECTED_FIELD'} end

redis.call('HINCRBY', run, 'used_total', '1')
redis.call('HINCRBY', run, used_field, '1')
-- The run counts its governed calls waiting for a decision (append.lua counts them out),
-- so the calls waiting across runs are found from the run index, never by a SCAN.
if first_stage ~= FIRST_STAGE then redis.call('HINCRBY', run, 'awaiting_approval', '1') end
redis.call('HSET', run, 'inv:' .. invocation_id, entry)

-- Formatted once as an integer: a Lua number sent to Redis is formatted as a float.
local expires_at = string.format('%d', now_ms + ttl_ms)
redis.call('HSET', record, 'stage', first_stage, 'status', first_status,
  'evidence_status', 'PENDING', 'version', '1', 'last_hash', event_hash,
  'updated_at_ms', at_ms, 'expires_at_ms', expires_at, 'invocation_id', invocation_id,
  'e1', event_id, unpack(ARGV, 17))
if first_stage == FIRST_STAGE then
  -- The caller runs the tool now: it holds the call's lease from this event on.
  redis.call('HSET', record, 'lease_version', '1',
    'lease_until_ms', string.format('%d', now_ms + ARGV[16]))
end
redis.call('PEXPIREAT', record, expires_at)
redis.call('XADD', stream, '*', 'e', event_data)
redis.call('PEXPIREAT', stream, expires_at)

local feed_id = redis.call('XADD', feed, '*',
  'r', run_id, 'c', tool_call_id, 'v', '1', 't', type_code, 's', status_code)
trim_feed(feed, feed_id, retention_ms)
-- One string: a table reply costs Redis several times more to turn into its answer.
return '1 ' .. feed_id .. ' ' .. expires_at
