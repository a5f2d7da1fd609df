-- KEYS: s, m, a, z, x, sessions, mk, xd, xf, xo; ARGV: prefix, session_id
unindex_all(KEYS[8], KEYS[9], KEYS[10], ARGV[1] .. 'xp:' .. ARGV[2] .. ':')
for _, ns in ipairs(redis.call('SMEMBERS', KEYS[7])) do
  redis.call('HDEL', ARGV[1] .. 'md:' .. ns, ARGV[2])
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7])
redis.call('SREM', KEYS[6], ARGV[2])
return 1
