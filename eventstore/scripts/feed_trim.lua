-- feed_trim.lua: pasted at "-- @include feed_trim" into the scripts that add shard feed entries.
--
-- trim_feed(feed, now_ms, retention_ms) removes entries older than the retention, but
-- never one that some consumer group still needs: the bound is the smallest, over the
-- feed's groups, of the group's oldest pending entry and the entry after its last
-- delivered one (the watermark of projections.lag.trim_feeds; Redis 6.2 and 7.x cannot
-- trim by acknowledgement). Call it after the XADD, so the feed exists.
--
-- Reading the groups costs a few commands, so it is done only once the oldest entry is
-- past the retention by TRIM_SLACK_MS: a busy feed pays for it about once a minute, and
-- every other write pays one XRANGE that finds nothing. "~" removes whole stream nodes
-- only.

local TRIM_SLACK_MS = 60000

local function parse_entry_id(entry_id)
  local ms, seq = string.match(entry_id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

local function trim_feed(feed, now_ms, retention_ms)
  local horizon = now_ms - retention_ms
  -- Asks only for an entry made before horizon - TRIM_SLACK_MS: on a feed with none,
  -- the usual case, the answer is empty and costs next to nothing.
  local due_before = horizon - TRIM_SLACK_MS
  if due_before <= 0 then return end
  if not redis.call('XRANGE', feed, '-', string.format('%d', due_before - 1), 'COUNT', 1)[1] then
    return
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
