-- KEYS: s, m, a, z, x, fence; ARGV: mode ('keep' | 'upto'), n, reason, fence ('' = none)
-- -> archived seqs, or -1 when a newer holder took the lease (nothing changed)
if ARGV[4] ~= '' and tonumber(redis.call('GET', KEYS[6]) or '0') ~= tonumber(ARGV[4]) then
  return -1
end
local n = tonumber(ARGV[2])
local movable = {}
for _, seq in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local _, role, kind = head(redis.call('HGET', KEYS[2], seq))
  if not is_core(role, kind) then movable[#movable + 1] = {tonumber(seq), kind} end
end
local picked = {}
if ARGV[1] == 'upto' then
  for _, mv in ipairs(movable) do
    if mv[1] <= n then picked[#picked + 1] = mv[1] end
  end
elseif n == 0 then
  for _, mv in ipairs(movable) do picked[#picked + 1] = mv[1] end
else
  local real = {}
  for _, mv in ipairs(movable) do
    if mv[2] == 'message' then real[#real + 1] = mv[1] end
  end
  if #real > n then
    local cutoff = real[#real - n + 1]
    for _, mv in ipairs(movable) do
      if mv[1] < cutoff then picked[#picked + 1] = mv[1] end
    end
  end
end
archive(KEYS[1], KEYS[3], KEYS[4], KEYS[5], picked, ARGV[3], now_ms())
return picked
