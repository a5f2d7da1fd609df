-- Helpers every script starts with.
local function now_ms()
  local t = redis.call('TIME')
  return t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
end

-- epoch, role, kind of a stored message record (its fixed head)
local function head(raw)
  local e, r, k = string.match(raw, '^{"epoch":(%d+),"role":"([^"]*)","kind":"([^"]*)"')
  if not e then error({err = 'corrupt message record'}) end
  return tonumber(e), r, k
end

-- system messages are core memory: trims and compressions never archive them
local function is_core(role, kind)
  return role == 'system' and kind == 'message'
end

-- move seqs from the active to the archived set with a reason (s, a, z, x: session keys)
local function archive(s, a, z, x, seqs, reason, now)
  if #seqs == 0 then return end
  for _, seq in ipairs(seqs) do
    redis.call('ZREM', a, seq)
    redis.call('ZADD', z, seq, seq)
    redis.call('HSET', x, seq, reason)
  end
  redis.call('HSET', s, 'updated_at', now)
end

-- search index: add message seq under its own terms (doc: "<len> <term>:<tf> ...", '' = not
-- indexed) and, weighted w, those the message before it lends (prev: "<term>:<tf> ..."); remember
-- what this one lends the next (lend) and its own terms in order (own); return lend
local function index_doc(xd, xf, xo, base, seq, doc, lend, own, prev, w, now)
  if doc == '' then return prev end
  local counts, names = {}, {}
  local len = tonumber(string.match(doc, '^(%d+)'))
  for i, part in ipairs({doc, prev}) do
    local weight = 1
    if i == 2 then weight = w end
    for term, tf in string.gmatch(part, '(%S+):(%d+)') do
      if not counts[term] then
        counts[term] = 0
        names[#names + 1] = term
      end
      counts[term] = counts[term] + weight * tonumber(tf)
      if i == 2 then len = len + weight * tonumber(tf) end
    end
  end
  for _, term in ipairs(names) do
    redis.call('ZADD', base .. term, counts[term], seq)
    redis.call('HINCRBY', xf, term, 1)
  end
  redis.call('HINCRBYFLOAT', xf, '#len', len)
  redis.call('HSET', xf, '#last', seq)
  redis.call('HSET', xd, seq, len .. ' ' .. now .. ' ' .. table.concat(names, ' '))
  redis.call('HSET', xo, seq, lend, 'o' .. seq, own)
  return lend
end

local function unindex_doc(xd, xf, xo, base, seq)
  local raw = redis.call('HGET', xd, seq)
  if not raw then return end
  local len, rest = string.match(raw, '^(%S+) %d+ ?(.*)$')
  for term in string.gmatch(rest, '%S+') do
    redis.call('ZREM', base .. term, seq)
    if redis.call('HINCRBY', xf, term, -1) <= 0 then redis.call('HDEL', xf, term) end
  end
  redis.call('HINCRBYFLOAT', xf, '#len', -tonumber(len))
  redis.call('HDEL', xd, seq)
  redis.call('HDEL', xo, seq, 'o' .. seq)
end

local function unindex_all(xd, xf, xo, base)
  for _, term in ipairs(redis.call('HKEYS', xf)) do
    if string.sub(term, 1, 1) ~= '#' then redis.call('DEL', base .. term) end
  end
  redis.call('DEL', xd, xf, xo)
end

local function md_version(md, key)
  local raw = redis.call('HGET', md, key)
  if not raw then return 0 end
  return tonumber(string.match(raw, '^{"version":(%d+),'))
end

-- upsert a metadata entry one version up (value: JSON text, or false for a tombstone)
local function md_write(md, mk, namespace, key, value, now)
  local version = md_version(md, key) + 1
  local entry
  if value then
    entry = '{"version":' .. version .. ',"deleted":false,"updated_at":' .. now
      .. ',"value":' .. value .. '}'
  else
    entry = '{"version":' .. version .. ',"deleted":true,"updated_at":' .. now
      .. ',"value":null}'
  end
  redis.call('HSET', md, key, entry)
  redis.call('SADD', mk, namespace)
  return version
end
