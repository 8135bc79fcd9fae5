-- permit.lua: the one dispatch permit of an approved governed call, granted by its journal.
--
-- The call's own event stream decides, read here, in the step that writes the permit, so
-- nothing written to the record alone can make a call run: the chain links of the
-- journal are intact (each event's previous hash is the SHA-256 of the event before it,
-- the first follows the genesis hash), the record stands where the journal ends (same
-- version, same last hash, stage APPROVED), the journal opens with the call's
-- ApprovalRequested for this run, call and tool, its decisions after it are approvals by
-- distinct operators, none the requester, as many as the request froze, the last one an
-- Approved, and the request digest the resumer read is the one frozen there. Then the
-- approval's expiry (frozen in the journal, judged by the server's clock), the run's
-- authority (active, the tool still granted, the deadline not passed) and the pauses.
-- Only then is Dispatched appended and folded, and its feed entry written, as append.lua
-- does, and the resumer gets the call's lease (lease_version the permit's version,
-- lease_until_ms lease_ms from now, renewed by lease.lua while the tool runs); the reply
-- hands back the stored request, read in this same step, for the resumer to check
-- against the journal's digest before it runs anything.
--
-- A consistent rewrite of record and journal together (every hash recomputed) is beyond
-- what any script can tell from the store alone: the writer's documented limit.
--
-- KEYS[1] record          record hash
-- KEYS[2] stream          event stream
-- KEYS[3] feed            shard feed
-- KEYS[4] run             run registry hash
-- KEYS[5] control         shard control hash
-- ARGV[1] version         Dispatched's version
-- ARGV[2] event_id        Dispatched's event id
-- ARGV[3] prev_hash       Dispatched's previous hash
-- ARGV[4] event_hash      Dispatched's hash
-- ARGV[5] event           Dispatched, encoded
-- ARGV[6] at_ms           event time (ms)
-- ARGV[7] retention_ms    feed retention (ms)
-- ARGV[8] run_id          run id
-- ARGV[9] tool_call_id    tool call id
-- ARGV[10] tool           the tool the resumer would run
-- ARGV[11] request_sha256 the digest of the request the resumer read
-- ARGV[12] lease_ms       the resumer's lease from now (ms)
-- ARGV[13..] (field, value)...  the record fields Dispatched sets
--
-- Reply: {version, feed entry id, expires_at_ms, request}   the permit is this caller's
--        {"applied", version, "", expires_at_ms, request}   this very event was applied
--        {"refused", CODE, current version, why}   CODE is one of RECORD_EXPIRED,
--        VERSION_CONFLICT, CHAIN_BROKEN, ILLEGAL_TRANSITION, PROTECTED_FIELD (the record
--        moved on, or a writer erred), JOURNAL_MISMATCH (the record disagrees with its
--        journal, or the journal with itself: why says where), APPROVED_REQUEST_CHANGED,
--        APPROVAL_EXPIRED, RUN_ERASED, RUN_INACTIVE, UNAUTHORIZED, RUN_DEADLINE_EXPIRED,
--        EXECUTION_PAUSED, RUN_PAUSED
-- @include lifecycle
-- @include field_scan
-- @include feed_trim
-- @include sha256
-- @include compact_event
-- @include journal_layout

local record, stream, feed, run, ctl = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local version_text, event_id, prev_hash = ARGV[1], ARGV[2], ARGV[3]
local event_hash, event_data, at_ms, retention_ms = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local run_id, tool_call_id, tool, request_sha256 = ARGV[8], ARGV[9], ARGV[10], ARGV[11]

local event_field = 'e' .. version_text
local rec = redis.call('HMGET', record, 'stage', 'version', 'last_hash', 'expires_at_ms',
  event_field)
if not rec[1] or redis.call('EXISTS', stream) == 0 then
  return {'refused', 'RECORD_EXPIRED', 0, ''}
end
local function refused(code, why)
  return {'refused', code, tonumber(rec[2]), why or ''}
end
if rec[5] then
  if rec[5] ~= event_id then return refused('VERSION_CONFLICT') end
  return {'applied', tonumber(version_text), '', tonumber(rec[4]),
    redis.call('HGET', record, 'request')}
end
if rec[2] + 1 ~= tonumber(version_text) then return refused('VERSION_CONFLICT') end
if rec[3] ~= prev_hash then return refused('CHAIN_BROKEN') end
local dest = next_stage(rec[1], 'Dispatched')
if not dest then return refused('ILLEGAL_TRANSITION') end
if scan_fields(13) then return refused('PROTECTED_FIELD') end

-- The journal: every event of the call, in order.
local function hex(data)
  return (string.gsub(data, '.', function(c) return string.format('%02x', string.byte(c)) end))
end
local entries = redis.call('XRANGE', stream, '-', '+')
if #entries ~= rec[2] + 0 then return refused('JOURNAL_MISMATCH', 'record version') end
local last = GENESIS_HASH
local opened
local approvers, approvals, decided = {}, 0, false
for i, entry in ipairs(entries) do
  -- An entry holds its event in field e (create.lua, append.lua); anything else is no event.
  local fields = entry[2]
  if #fields ~= 2 or fields[1] ~= 'e' then return refused('JOURNAL_MISMATCH', 'entry') end
  local data = fields[2]
  local event = decode_event(data)
  if not event then return refused('JOURNAL_MISMATCH', 'event') end
  local prev = event[EVENT_PREV_HASH]
  if event[EVENT_VERSION] ~= i or type(prev) ~= 'string' then
    return refused('JOURNAL_MISMATCH', 'event')
  end
  if (prev == '' and GENESIS_HASH or hex(prev)) ~= last then
    return refused('JOURNAL_MISMATCH', 'chain')
  end
  last = sha256_hex(data)
  local kind = event[EVENT_TYPE]
  if i == 1 then
    if kind ~= TYPE_APPROVAL_REQUESTED or event[AR_RUN_ID] ~= run_id
        or event[AR_TOOL_CALL_ID] ~= tool_call_id or type(event[AR_TOOL]) ~= 'string'
        or type(event[AR_REQUEST_SHA256]) ~= 'string'
        or type(event[AR_APPROVAL_EXPIRES_AT_MS]) ~= 'number' then
      return refused('JOURNAL_MISMATCH', 'request')
    end
    opened = event
  elseif (kind == TYPE_APPROVAL_ADDED or kind == TYPE_APPROVED) and not decided then
    local by = event[DECIDED_BY]
    if type(by) ~= 'string' or approvers[by] or by == opened[AR_REQUESTED_BY] then
      return refused('JOURNAL_MISMATCH', 'approvers')
    end
    approvers[by] = true
    approvals = approvals + 1
    decided = kind == TYPE_APPROVED
  else
    return refused('JOURNAL_MISMATCH', 'decisions')
  end
end
if not decided or approvals < (opened[AR_APPROVALS_REQUIRED] or 1) then
  return refused('JOURNAL_MISMATCH', 'decisions')
end
if last ~= rec[3] or rec[1] ~= 'APPROVED' then return refused('JOURNAL_MISMATCH', 'record') end
if opened[AR_TOOL] ~= tool then return refused('JOURNAL_MISMATCH', 'tool') end
if hex(opened[AR_REQUEST_SHA256]) ~= request_sha256 then
  return refused('APPROVED_REQUEST_CHANGED')
end

-- What the journal approved may still not run: expired, the run's authority gone, paused.
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
if now_ms >= opened[AR_APPROVAL_EXPIRES_AT_MS] then return refused('APPROVAL_EXPIRED') end
local r = redis.call('HMGET', run, 'active', 'deadline_ms', 'restricted', 'tool:' .. tool,
  'revoked:' .. tool, 'paused', 'erased_at_ms')
-- An erased run's frozen requests are gone: none of its calls may run.
if r[7] then return refused('RUN_ERASED') end
if r[1] ~= '1' then return refused('RUN_INACTIVE') end
if (r[3] == '1' and not r[4]) or r[5] then return refused('UNAUTHORIZED') end
if now_ms >= tonumber(r[2]) then return refused('RUN_DEADLINE_EXPIRED') end
if redis.call('HGET', ctl, 'paused') == '1' then return refused('EXECUTION_PAUSED') end
if r[6] == '1' then return refused('RUN_PAUSED') end

-- The permit: Dispatched appended and folded, as append.lua does (EXECUTING, PENDING).
redis.call('XADD', stream, '*', 'e', event_data)
redis.call('HSET', record, 'stage', dest, 'status', status_of(dest),
  'evidence_status', 'PENDING', 'version', version_text, 'last_hash', event_hash,
  'updated_at_ms', at_ms, event_field, event_id, 'lease_version', version_text,
  'lease_until_ms', string.format('%d', now_ms + ARGV[12]), unpack(ARGV, 13))
-- It no longer waits for its resume: its run counts it out (while the run hash exists).
if redis.call('EXISTS', run) == 1 then redis.call('HINCRBY', run, 'approved', '-1') end
local feed_id = redis.call('XADD', feed, '*',
  'r', run_id, 'c', tool_call_id, 'v', version_text, 't', feed_type_code('Dispatched'),
  's', feed_status_code(dest))
trim_feed(feed, feed_id, retention_ms)
return {tonumber(version_text), feed_id, tonumber(rec[4]), redis.call('HGET', record, 'request')}
