-- lapsed.lua: take on or end a call in flight whose holder's lease lapsed, atomically.
--
-- A call's process renews its lease while the tool runs (lease.lua); once the lease has
-- passed (and grace_ms more), by the server's clock, that process is taken to be gone and
-- one of three events may follow, each written here and by no other script (append.lua
-- refuses them): TakenOver (a retry of an ungoverned call runs its read-only tool again),
-- Reconciled (an attempted call found to have run: its raw response is recorded next) or
-- Settled (the call ends ERROR with the code it names). The lease check, the version and
-- chain checks and the write are one step, so a holder that renewed in time keeps its
-- call, and of two racing takers (a retry and the sweep, a reconcile and an operator) one
-- wins and the other is refused. A governed call is never taken over. A takeover needs
-- the run's authority as a new call does (active, the tool granted, the deadline, no
-- pause); a settlement does not (it runs nothing). TakenOver and Reconciled give the
-- writer the lease (lease_ms from now); the event is folded into the record, appended to
-- the stream and its feed entry written, as append.lua does; Settled, a terminal event,
-- also goes on the run's progress list and counts its code as a failure.
--
-- A record written before leases were kept has none: its lease is taken to end
-- DEFAULT_LEASE_MS after its last event. A journal has room for a bounded number of
-- events: past LAST_TAKEN_VERSION a call is no longer taken over or on (TOO_MANY_ATTEMPTS),
-- only settled.
--
-- KEYS[1] record          record hash
-- KEYS[2] stream          event stream
-- KEYS[3] feed            shard feed
-- KEYS[4] progress        run progress list
-- KEYS[5] run             run registry hash
-- KEYS[6] control         shard control hash
-- ARGV[1] event_type      TakenOver, Reconciled or Settled
-- ARGV[2] version         event version
-- ARGV[3] event_id        event id
-- ARGV[4] prev_hash       previous event's hash
-- ARGV[5] event_hash      this event's hash
-- ARGV[6] event           encoded event
-- ARGV[7] at_ms           event time (ms)
-- ARGV[8] retention_ms    feed retention (ms)
-- ARGV[9] run_id          run id
-- ARGV[10] tool_call_id   tool call id
-- ARGV[11] lease_ms       the writer's lease from now (ms), when the event gives it one
-- ARGV[12] grace_ms       how long past its end the lease must be
-- ARGV[13..] (field, value)...  the record fields the event sets (payloads included)
--
-- Reply: "<version> <feed entry id> <expires_at_ms>"   the event is in the journal
--        {"applied", version, "", expires_at_ms}   this very event was applied before
--        {"refused", CODE, current version, lease_until_ms}   CODE is one of
--        RECORD_EXPIRED, VERSION_CONFLICT, CHAIN_BROKEN, ILLEGAL_TRANSITION (not in
--        flight, another event type, or a takeover of a governed call), TOO_MANY_ATTEMPTS
--        (a TakenOver or Reconciled past LAST_TAKEN_VERSION), LEASE_HELD (its
--        holder's lease, or the grace after it, has not passed: lease_until_ms says
--        until when), PROTECTED_FIELD, MISSING_ERROR_CODE, and for TakenOver RUN_INACTIVE,
--        UNAUTHORIZED, RUN_DEADLINE_EXPIRED, EXECUTION_PAUSED, RUN_PAUSED
-- @include lifecycle
-- @include field_scan
-- @include feed_trim
-- @include lease_default

local record, stream, feed, progress, run, ctl = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5],
  KEYS[6]
local event_type, version_text, event_id = ARGV[1], ARGV[2], ARGV[3]
local prev_hash, event_hash, event_data, at_ms = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local retention_ms, run_id, tool_call_id = ARGV[8], ARGV[9], ARGV[10]
local lease_ms, grace_ms = ARGV[11], ARGV[12]

local event_field = 'e' .. version_text
local rec = redis.call('HMGET', record, 'stage', 'version', 'last_hash', 'expires_at_ms',
  event_field, 'lease_until_ms', 'updated_at_ms', 'approval_id', 'tool')
if not rec[1] or redis.call('EXISTS', stream) == 0 then
  return {'refused', 'RECORD_EXPIRED', 0, 0}
end
local function refused(code, lease_until)
  return {'refused', code, tonumber(rec[2]), lease_until or 0}
end
if rec[5] then
  if rec[5] ~= event_id then return refused('VERSION_CONFLICT') end
  return {'applied', tonumber(version_text), '', tonumber(rec[4])}
end
if rec[2] + 1 ~= tonumber(version_text) then return refused('VERSION_CONFLICT') end
if rec[3] ~= prev_hash then return refused('CHAIN_BROKEN') end
local dest = next_stage(rec[1], event_type)
if not dest or not taken_from_a_lapsed_holder(event_type) then
  return refused('ILLEGAL_TRANSITION')
end
-- Nothing dispatches a governed call again by itself.
if event_type == 'TakenOver' and rec[8] then return refused('ILLEGAL_TRANSITION') end
if dest ~= 'ERROR' and tonumber(version_text) > LAST_TAKEN_VERSION then
  return refused('TOO_MANY_ATTEMPTS')
end

local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local lease_until = tonumber(rec[6]) or (tonumber(rec[7]) + DEFAULT_LEASE_MS)
if now_ms < lease_until + grace_ms then return refused('LEASE_HELD', lease_until) end

if event_type == 'TakenOver' then
  -- The tool runs again: the run must still allow a call of it, as create.lua checks.
  local tool = rec[9]
  local r = redis.call('HMGET', run, 'active', 'deadline_ms', 'restricted', 'tool:' .. tool,
    'revoked:' .. tool, 'paused')
  if r[1] ~= '1' then return refused('RUN_INACTIVE') end
  if (r[3] == '1' and not r[4]) or r[5] then return refused('UNAUTHORIZED') end
  if now_ms >= tonumber(r[2]) then return refused('RUN_DEADLINE_EXPIRED') end
  if redis.call('HGET', ctl, 'paused') == '1' then return refused('EXECUTION_PAUSED') end
  if r[6] == '1' then return refused('RUN_PAUSED') end
end

local protected, evidence, error_code = scan_fields(13)
if protected or evidence then return refused('PROTECTED_FIELD') end
local evidence_status = 'PENDING'
if dest == 'ERROR' then
  if not error_code or error_code == '' then return refused('MISSING_ERROR_CODE') end
  evidence_status = 'ERROR'
end

redis.call('XADD', stream, '*', 'e', event_data)
redis.call('HSET', record, 'stage', dest, 'status', status_of(dest),
  'evidence_status', evidence_status, 'version', version_text, 'last_hash', event_hash,
  'updated_at_ms', at_ms, event_field, event_id, unpack(ARGV, 13))
if dest ~= 'ERROR' then
  -- The writer runs (or records) the call now: it holds the lease from this event on.
  redis.call('HSET', record, 'lease_version', version_text,
    'lease_until_ms', string.format('%d', now_ms + lease_ms))
else
  -- A list this push creates gets the run's expiry, once, as append.lua does.
  if redis.call('RPUSH', progress, run_id .. ':' .. tool_call_id) == 1 then
    redis.call('PEXPIREAT', progress, redis.call('HGET', run, 'expires_at_ms') or rec[4])
  end
  if redis.call('EXISTS', run) == 1 then
    redis.call('HINCRBY', run, 'failed:' .. error_code, 1)
  end
end

local feed_id = redis.call('XADD', feed, '*',
  'r', run_id, 'c', tool_call_id, 'v', version_text, 't', feed_type_code(event_type),
  's', feed_status_code(dest))
trim_feed(feed, feed_id, retention_ms)
return version_text .. ' ' .. feed_id .. ' ' .. rec[4]
