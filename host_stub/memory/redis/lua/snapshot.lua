-- KEYS: s, m, a, md; ARGV: session_id -> {epoch, entry or false, seq, record, ...}
local out = {tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0'),
             redis.call('HGET', KEYS[4], ARGV[1])}
for _, seq in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  out[#out + 1] = seq
  out[#out + 1] = redis.call('HGET', KEYS[2], seq)
end
return out
