-- KEYS: s, m, xd, x; ARGV: from_seq, to_seq -> flat list seq, record, reason, oldest first
local last = tonumber(redis.call('HGET', KEYS[1], 'last_seq') or '0')
local out = {}
for seq = math.max(1, tonumber(ARGV[1])), math.min(last, tonumber(ARGV[2])) do
  if redis.call('HEXISTS', KEYS[3], seq) == 1 then
    out[#out + 1] = seq
    out[#out + 1] = redis.call('HGET', KEYS[2], seq)
    out[#out + 1] = redis.call('HGET', KEYS[4], seq)
  end
end
return out
