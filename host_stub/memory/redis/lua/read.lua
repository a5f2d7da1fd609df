-- KEYS: m, a or z, x; ARGV: limit (-1 = all), epoch ('' = any)
-- -> flat list seq, record, reason (false when active), oldest first
local limit = tonumber(ARGV[1])
local out = {}
local seqs
if ARGV[2] == '' then
  if limit < 0 then
    seqs = redis.call('ZRANGE', KEYS[2], 0, -1)
  else
    seqs = redis.call('ZRANGE', KEYS[2], -limit, -1)
  end
else
  local want = tonumber(ARGV[2])
  local newest = redis.call('ZREVRANGE', KEYS[2], 0, -1)
  local picked = {}
  for _, seq in ipairs(newest) do
    if limit >= 0 and #picked >= limit then break end
    local e = head(redis.call('HGET', KEYS[1], seq))
    if e == want then picked[#picked + 1] = seq end
  end
  seqs = {}
  for i = #picked, 1, -1 do seqs[#seqs + 1] = picked[i] end
end
for _, seq in ipairs(seqs) do
  out[#out + 1] = seq
  out[#out + 1] = redis.call('HGET', KEYS[1], seq)
  out[#out + 1] = redis.call('HGET', KEYS[3], seq)
end
return out
