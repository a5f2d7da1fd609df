-- KEYS: s, m, a, sessions, xd, xf, xo; ARGV: session_id, index base (xp:{session}:), n, context
-- span, context weight, n record tails (without the epoch), n index docs, n lent terms, n own
-- terms in order
local epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
local seq = tonumber(redis.call('HGET', KEYS[1], 'last_seq') or '0')
local n = tonumber(ARGV[3])
local now = now_ms()
local prev = ''
local last = tonumber(redis.call('HGET', KEYS[6], '#last') or '0')
if last > 0 and last > seq - tonumber(ARGV[4]) then
  prev = redis.call('HGET', KEYS[7], last) or ''
end
local w = tonumber(ARGV[5])
for i = 1, n do
  seq = seq + 1
  redis.call('HSET', KEYS[2], seq, '{"epoch":' .. epoch .. ',' .. ARGV[5 + i])
  redis.call('ZADD', KEYS[3], seq, seq)
  prev = index_doc(KEYS[5], KEYS[6], KEYS[7], ARGV[2], seq, ARGV[5 + n + i], ARGV[5 + 2 * n + i],
                   ARGV[5 + 3 * n + i], prev, w, now)
end
redis.call('HSET', KEYS[1], 'epoch', epoch, 'last_seq', seq, 'updated_at', now)
redis.call('SADD', KEYS[4], ARGV[1])
return {epoch, seq}
