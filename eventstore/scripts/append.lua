-- append.lua: append one event to an existing invocation and fold it into its record.
--
-- Checks, in order: the record still exists (an update never creates a key, so nothing
-- can become immortal), a retried event id is answered as applied, the expected version,
-- the hash chain, the lifecycle transition and the evidence rule. Then folds the event
-- into the record, appends it to the stream (field e only, as create.lua does) and one
-- entry to the shard feed, which it trims by age (feed_trim.lua). A terminal event also
-- appends the call's identity to the run's progress list. No TTL is touched except the progress list's, set once when that list
-- is created.
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
-- Reply: {"ok", version, feed entry id, expires_at_ms}
--        {"applied", version, "", expires_at_ms}
--        {"refused", CODE, current version}   CODE is one of RECORD_EXPIRED,
--        VERSION_CONFLICT, CHAIN_BROKEN, ILLEGAL_TRANSITION, INVALID_EVIDENCE_STATUS,
--        MISSING_ERROR_CODE, PROTECTED_FIELD
-- @include lifecycle_tables
-- @include feed_trim

local record, stream, feed, progress, run = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
-- Numbers only where they are compared: a Lua number sent to Redis is formatted as a float.
local event_type, version_text, event_id = ARGV[1], ARGV[2], ARGV[3]
local version = tonumber(version_text)
local prev_hash, event_hash, event_data, at_ms = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local retention_ms, run_id, tool_call_id = tonumber(ARGV[8]), ARGV[9], ARGV[10]

local rec = redis.call('HMGET', record, 'stage', 'version', 'last_hash', 'expires_at_ms',
  'e' .. version_text)
if not rec[1] or redis.call('EXISTS', stream) == 0 then
  return {'refused', 'RECORD_EXPIRED', 0}
end
local current = tonumber(rec[2])
if rec[5] then
  if rec[5] == event_id then return {'applied', version, '', tonumber(rec[4])} end
  return {'refused', 'VERSION_CONFLICT', current}
end
if current + 1 ~= version then return {'refused', 'VERSION_CONFLICT', current} end
if rec[3] ~= prev_hash then return {'refused', 'CHAIN_BROKEN', current} end
local dest = TRANSITIONS[rec[1] .. '|' .. event_type]
if not dest then return {'refused', 'ILLEGAL_TRANSITION', current} end

local fields, evidence, error_code = {}, nil, nil
for i = 11, #ARGV, 2 do
  local name, value = ARGV[i], ARGV[i + 1]
  if PROTECTED[name] or string.match(name, '^e%d+$') then
    return {'refused', 'PROTECTED_FIELD', current}
  end
  if name == 'evidence_status' then evidence = value
  else
    if name == 'error_code' then error_code = value end
    fields[#fields + 1] = name
    fields[#fields + 1] = value
  end
end
if dest == 'ERROR' then
  if not error_code or error_code == '' then return {'refused', 'MISSING_ERROR_CODE', current} end
  evidence = 'ERROR'
elseif not evidence then
  evidence = 'PENDING'
end
if not EVIDENCE_ALLOWED[dest .. '|' .. evidence] then
  return {'refused', 'INVALID_EVIDENCE_STATUS', current}
end

redis.call('HSET', record, 'stage', dest, 'status', STATUS_OF[dest], 'evidence_status', evidence,
  'version', version_text, 'last_hash', event_hash, 'updated_at_ms', at_ms,
  'e' .. version_text, event_id, unpack(fields))
redis.call('XADD', stream, '*', 'e', event_data)

if dest == 'READY' or dest == 'ERROR' then
  redis.call('RPUSH', progress, run_id .. ':' .. tool_call_id)
  if redis.call('PTTL', progress) == -1 then
    local run_expiry = redis.call('HGET', run, 'expires_at_ms') or rec[4]
    redis.call('PEXPIREAT', progress, run_expiry)
  end
end

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local feed_id = redis.call('XADD', feed, '*',
  'r', run_id, 'c', tool_call_id, 'v', version_text, 't', FEED_TYPE_CODE[event_type],
  's', FEED_STATUS_CODE[dest])
trim_feed(feed, now_ms, retention_ms)
return {'ok', version, feed_id, tonumber(rec[4])}
