-- compact_event.lua (included part): decode_event(bytes), one stored event as a Lua table.
--
-- Events are stored as one MessagePack array of scalars (machine/compact.py): ints, text,
-- bytes, nil. Redis's own cmsgpack reads no bin types (0xc4-0xc6), which the compact
-- encoding uses for digests and ids, so this reads the array itself. Returns the array
-- (1-based, a nil item left a hole), or nil when the bytes are anything else: a nested
-- value, a type the encoding never writes, trailing or missing bytes.
local decode_event
do
  local byte, sub = string.byte, string.sub
  local function uint(data, at, size)
    local value = 0
    for i = at, at + size - 1 do value = value * 256 + byte(data, i) end
    return value
  end
  local function int(data, at, size)
    local value = uint(data, at, size)
    local half = 2 ^ (size * 8 - 1)
    if value >= half then value = value - 2 * half end
    return value
  end
  -- Marker -> (kind, size of the length or the value that follows).
  local LENGTHS = {[0xc4] = 1, [0xc5] = 2, [0xc6] = 4, [0xd9] = 1, [0xda] = 2, [0xdb] = 4}
  local UINTS = {[0xcc] = 1, [0xcd] = 2, [0xce] = 4, [0xcf] = 8}
  local INTS = {[0xd0] = 1, [0xd1] = 2, [0xd2] = 4, [0xd3] = 8}
  decode_event = function(data)
    local size = #data
    if size == 0 then return nil end
    local marker, at, count = byte(data, 1), 2, nil
    if marker >= 0x90 and marker <= 0x9f then
      count = marker - 0x90
    elseif marker == 0xdc and size >= 3 then
      count, at = uint(data, 2, 2), 4
    else
      return nil
    end
    local items = {}
    for i = 1, count do
      if at > size then return nil end
      local m = byte(data, at)
      at = at + 1
      local length
      if m <= 0x7f then
        items[i] = m
      elseif m >= 0xe0 then
        items[i] = m - 0x100
      elseif m >= 0xa0 and m <= 0xbf then
        length = m - 0xa0
      elseif m == 0xc0 then
        items[i] = nil
      elseif m == 0xc2 or m == 0xc3 then
        items[i] = m == 0xc3
      elseif LENGTHS[m] then
        local width = LENGTHS[m]
        if at + width - 1 > size then return nil end
        length, at = uint(data, at, width), at + width
      elseif UINTS[m] or INTS[m] then
        local width = UINTS[m] or INTS[m]
        if at + width - 1 > size then return nil end
        items[i] = UINTS[m] and uint(data, at, width) or int(data, at, width)
        at = at + width
      else
        return nil
      end
      if length then
        if at + length - 1 > size then return nil end
        items[i], at = sub(data, at, at + length - 1), at + length
      end
    end
    if at ~= size + 1 then return nil end
    return items
  end
end
