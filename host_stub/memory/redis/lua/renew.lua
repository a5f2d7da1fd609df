-- KEYS: lease; ARGV: token, ttl (ms) -> 1 renewed, 0 not ours (any more) or expired
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
