-- KEYS: sessions; ARGV: prefix
-- -> flat list session_id, epoch, last_seq, updated_at, active, archived
local out = {}
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local s = redis.call('HMGET', ARGV[1] .. 's:' .. sid, 'epoch', 'last_seq', 'updated_at')
  out[#out + 1] = sid
  out[#out + 1] = s[1] or '0'
  out[#out + 1] = s[2] or '0'
  out[#out + 1] = s[3] or false
  out[#out + 1] = redis.call('ZCARD', ARGV[1] .. 'a:' .. sid)
  out[#out + 1] = redis.call('ZCARD', ARGV[1] .. 'z:' .. sid)
end
return out
