-- switch_generation.lua: make a rebuilt generation the one readers and workers use.
--
-- One HSET on the namespace metadata switches every reader at once. It happens only if
-- the rebuild that asks still holds the projection's rebuild claim, so a rebuild that
-- was taken over can never switch to its half-built generation.
--
-- KEYS[1] meta            namespace metadata hash
-- ARGV[1] projection      the projection
-- ARGV[2] token           the rebuild's claim token
-- ARGV[3] generation      the new generation
--
-- Reply: {"switched", previous generation} | {"lost", 0} (the claim is not ours)

local meta = KEYS[1]
local projection, token, generation = ARGV[1], ARGV[2], ARGV[3]

if redis.call('HGET', meta, 'rebuilding:' .. projection) ~= token then return {'lost', 0} end
local previous = redis.call('HGET', meta, 'generation:' .. projection) or '1'
redis.call('HSET', meta, 'generation:' .. projection, generation)
redis.call('HDEL', meta, 'rebuilding:' .. projection)
return {'switched', tonumber(previous)}
