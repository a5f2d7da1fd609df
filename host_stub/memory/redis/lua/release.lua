-- KEYS: lease; ARGV: token -> 1 released, 0 not ours (any more)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
