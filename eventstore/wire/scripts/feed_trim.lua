-- feed_trim.lua: pasted at "-- @include feed_trim" into the scripts that add shard feed entries.
--
-- trim_feed(feed, feed_id, retention_ms) removes entries older than the retention, but
-- never one that some consumer group still needs: the bound is the smallest, over the
-- feed's groups, of the group's oldest pending entry and the entry after its last
-- delivered one (the watermark of projections.worker.lag.trim_feeds; Redis 6.2 and 7.x cannot
-- trim by acknowledgement). Call it right after the XADD that returned feed_id.
--
-- Only the first entry of each millisecond of a feed (sequence 0) looks: its id's time
-- is the server's clock (a later entry of the same millisecond, or one after the clock
-- stepped back, continues the last id instead), and a feed so busy that it gets several
-- entries a millisecond still looks up to a thousand times a second. Looking is one
-- XRANGE that finds nothing until the oldest entry is past the retention by
-- TRIM_SLACK_MS; reading the groups costs a few commands, so a busy feed pays for that
-- about once a minute. "~" removes whole stream nodes only.

local TRIM_SLACK_MS = 60000

local function trim_feed(feed, feed_id, retention_ms)
  -- "-0": the last two bytes of the id, compared without making a string.
  if string.byte(feed_id, -1) ~= 48 or string.byte(feed_id, -2) ~= 45 then return end
  -- Arithmetic converts the strings itself, for less than tonumber() costs.
  local horizon = string.sub(feed_id, 1, -3) - retention_ms
  -- Asks only for an entry made before horizon - TRIM_SLACK_MS: on a feed with none,
  -- the usual case, the answer is empty and costs next to nothing.
  local due_before = horizon - TRIM_SLACK_MS
  if due_before <= 0 then return end
  if not redis.call('XRANGE', feed, '-', string.format('%d', due_before - 1), 'COUNT', 1)[1] then
    return
  end
  -- Defined here, past the early returns: a function costs an allocation where it is defined.
  local function parse_entry_id(entry_id)
    local ms, seq = string.match(entry_id, '^(%d+)-(%d+)$')
    return tonumber(ms), tonumber(seq)
  end
  local bound_ms, bound_seq = horizon, 0
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', feed)) do
    local info = {}
    for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
    local ms, seq
    if tonumber(info['pending']) > 0 then
      ms, seq = parse_entry_id(redis.call('XPENDING', feed, info['name'])[2])
    else
      ms, seq = parse_entry_id(info['last-delivered-id'])
      seq = seq + 1
    end
    if ms < bound_ms or (ms == bound_ms and seq < bound_seq) then
      bound_ms, bound_seq = ms, seq
    end
  end
  if bound_ms > 0 then
    redis.call('XTRIM', feed, 'MINID', '~', string.format('%d-%d', bound_ms, bound_seq))
  end
end
