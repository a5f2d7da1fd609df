-- KEYS: lease, fence; ARGV: token, ttl (ms) -> the new fence, or false when the lease is held
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
