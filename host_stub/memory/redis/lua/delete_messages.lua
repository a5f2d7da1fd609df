-- KEYS: s, m, a, z, x, xd, xf, xo; ARGV: index base, seqs (sorted, unique) -> the seqs it
-- changed
local found = {}
for i = 2, #ARGV do
  local seq = ARGV[i]
  if redis.call('HEXISTS', KEYS[2], seq) == 1 and redis.call('HGET', KEYS[5], seq) ~= 'deleted' then
    found[#found + 1] = tonumber(seq)
  end
end
archive(KEYS[1], KEYS[3], KEYS[4], KEYS[5], found, 'deleted', now_ms())
for _, seq in ipairs(found) do unindex_doc(KEYS[6], KEYS[7], KEYS[8], ARGV[1], seq) end
return found
