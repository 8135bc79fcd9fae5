-- refusal_log.lua: pasted at "-- @include refusal_log" into the scripts that record a
-- refusal (create.lua, refuse.lua).
--
-- log_refusal(run, log, tool, call, call_bytes, code, kept) records one call turned away
-- before any record existed: one entry on the run's refusal log (at: server time in ms;
-- tool: the tool name, left out when ''; call: the tool call id, or call_bytes: its UTF-8
-- size when the id is not one a key may hold), trimmed to the newest kept entries, and one
-- more count of the code in the run hash (refused:<code>). The log expires at the run
-- hash's instant (its expires_at_ms field, else its PTTL from now: Redis 6.2 has no
-- PEXPIRETIME), set in the same step as the XADD that may create it. A run that is gone
-- (or, which never happens, has no expiry) gets nothing: no key is ever left without one.
-- Returns 1 when recorded, 0 when the run is gone. Runs only on a refusal: a call that
-- is not refused pays nothing for it.

local function log_refusal(run, log, tool, call, call_bytes, code, kept)
  local expires_at = redis.call('HGET', run, 'expires_at_ms')
  local now = redis.call('TIME')
  local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
  if not expires_at then
    local pttl = redis.call('PTTL', run)
    if pttl <= 0 then return 0 end
    expires_at = string.format('%d', now_ms + pttl)
  end
  local entry = {'at', string.format('%d', now_ms)}
  if tool ~= '' then entry[#entry + 1] = 'tool'; entry[#entry + 1] = tool end
  if call ~= '' then
    entry[#entry + 1] = 'call'; entry[#entry + 1] = call
  else
    entry[#entry + 1] = 'call_bytes'; entry[#entry + 1] = call_bytes
  end
  entry[#entry + 1] = 'code'; entry[#entry + 1] = code
  redis.call('XADD', log, 'MAXLEN', kept, '*', unpack(entry))
  redis.call('PEXPIREAT', log, expires_at)
  redis.call('HINCRBY', run, 'refused:' .. code, 1)
  return 1
end
