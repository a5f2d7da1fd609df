-- KEYS: s, a, z, x, sessions, mk, xd, xf, xo; ARGV: prefix, session_id, all ('1'/'0'), history
-- ('1'/'0'), namespaces... -> the new epoch
local now = now_ms()
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSETNX', KEYS[1], 'last_seq', 0)
redis.call('HSET', KEYS[1], 'updated_at', now)
redis.call('SADD', KEYS[5], ARGV[2])
if ARGV[4] == '1' then
  archive(KEYS[1], KEYS[2], KEYS[3], KEYS[4], redis.call('ZRANGE', KEYS[2], 0, -1), 'cleared',
          now)
  unindex_all(KEYS[7], KEYS[8], KEYS[9], ARGV[1] .. 'xp:' .. ARGV[2] .. ':')
end
local namespaces = {}
if ARGV[3] == '1' then
  namespaces = redis.call('SMEMBERS', KEYS[6])
  table.sort(namespaces)
else
  for i = 5, #ARGV do namespaces[#namespaces + 1] = ARGV[i] end
end
for _, ns in ipairs(namespaces) do
  md_write(ARGV[1] .. 'md:' .. ns, KEYS[6], ns, ARGV[2], false, now)
end
return epoch
