-- KEYS: s, m, a, z, x, md, mk, fence; ARGV: session_id, namespace, expected_version, epoch,
-- archive_through_seq, record JSON, fence ('' = none) -> 1 won, 0 lost, -1 a newer holder took
-- the lease (nothing changed)
if ARGV[7] ~= '' and tonumber(redis.call('GET', KEYS[8]) or '0') ~= tonumber(ARGV[7]) then
  return -1
end
if md_version(KEYS[6], ARGV[1]) ~= tonumber(ARGV[3]) then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') ~= tonumber(ARGV[4]) then return 0 end
local picked = {}
for _, seq in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[5])) do
  local _, role, kind = head(redis.call('HGET', KEYS[2], seq))
  if not is_core(role, kind) then picked[#picked + 1] = seq end
end
-- every read (and every way to fail) is above: a script is not rolled back on an error
local now = now_ms()
md_write(KEYS[6], KEYS[7], ARGV[2], ARGV[1], ARGV[6], now)
archive(KEYS[1], KEYS[3], KEYS[4], KEYS[5], picked, 'summarized', now)
return 1
