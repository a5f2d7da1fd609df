-- KEYS: xd, m, x, xo; ARGV: index base, limit, role ('' = any), rescore, n terms, terms...,
-- their idfs..., n reads, reads ("<limit, -1: all>:<term>,<term>...", 1-based)..., probes
-- (1-based terms)... -> {the chosen candidates, one line each: "<seq> <length> <stored at, ms>
-- <the weighted frequency of each term> ...<TAB><own terms: '<tool> <term> ...', or '?' when
-- not stored>", then seq, record, reason of those that can be among the best}. Carries out a
-- plan of host_stub/memory/search_plan.py (plan_search), then choose; search_plan.rank orders
-- what it returns.
local base, limit, role = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local more = tonumber(ARGV[4])
local rescore = math.max(more, limit)
local nt = tonumber(ARGV[5])
local terms, idfs = {}, {}
for t = 1, nt do
  terms[t] = ARGV[5 + t]
  idfs[t] = tonumber(ARGV[5 + nt + t])
end
local at = 6 + 2 * nt
local nr = tonumber(ARGV[at])
local reads = {}
for r = 1, nr do
  local cap, list = string.match(ARGV[at + r], '^(-?%d+):(.*)$')
  local ts = {}
  for t in string.gmatch(list, '%d+') do ts[#ts + 1] = tonumber(t) end
  reads[r] = {tonumber(cap), ts}
end
local probes = {}
for j = at + nr + 1, #ARGV do probes[#probes + 1] = tonumber(ARGV[j]) end
local roles = {}
local function wanted(seq)
  if role == '' then return true end
  local r = roles[seq]
  if r == nil then
    local _, got = head(redis.call('HGET', KEYS[2], seq))
    r = got == role
    roles[seq] = r
  end
  return r
end
-- holders[t]: seq -> the term's frequency, for the candidates known to hold term t (all of
-- them, complete[t], for the terms read whole)
local holders, complete, seen, cands = {}, {}, {}, {}
for t = 1, nt do holders[t] = {} end
local function hold(t, seq, tf)
  if holders[t][seq] then return end
  holders[t][seq] = tf
  if not seen[seq] then
    seen[seq] = true
    cands[#cands + 1] = seq
  end
end
local windows = {}  -- the newest of one term: {term, oldest seq read}
for _, read in ipairs(reads) do
  local cap, ts = read[1], read[2]
  -- the smallest posting set, newest first; the others looked up (the sets are ordered by
  -- frequency, not seq)
  local first = ts[1]
  for _, t in ipairs(ts) do
    if redis.call('ZCARD', base .. terms[t]) < redis.call('ZCARD', base .. terms[first]) then
      first = t
    end
  end
  local post = redis.call('ZRANGE', base .. terms[first], 0, -1, 'WITHSCORES')
  local items = {}
  for j = 1, #post, 2 do items[#items + 1] = {tonumber(post[j]), tonumber(post[j + 1])} end
  if cap >= 0 then table.sort(items, function(a, b) return a[1] > b[1] end) end
  local taken, oldest = 0, nil
  for _, item in ipairs(items) do
    if cap >= 0 and taken >= cap then break end
    local seq = item[1]
    local tfs, all = {}, true
    for _, t in ipairs(ts) do
      if t == first then
        tfs[t] = item[2]
      else
        local tf = redis.call('ZSCORE', base .. terms[t], seq)
        if not tf then
          all = false
          break
        end
        tfs[t] = tonumber(tf)
      end
    end
    if all and wanted(seq) then
      for _, t in ipairs(ts) do hold(t, seq, tfs[t]) end
      taken = taken + 1
      oldest = seq
    end
  end
  if cap < 0 then complete[ts[1]] = true end
  if cap >= 0 and #ts == 1 and oldest then windows[#windows + 1] = {ts[1], oldest} end
end
if #cands == 0 then return {} end
-- the probes look among the candidates holding a term read whole, and those from the oldest
-- of the newest of one term on holding that term (as the SQL stores do)
local found = #cands
for _, u in ipairs(probes) do
  for j = 1, found do
    local seq = cands[j]
    local look = false
    for t in pairs(complete) do
      if holders[t][seq] then
        look = true
        break
      end
    end
    if not look then
      for _, w in ipairs(windows) do
        if w[1] ~= u and seq >= w[2] and holders[w[1]][seq] then
          look = true
          break
        end
      end
    end
    if look then
      local tf = redis.call('ZSCORE', base .. terms[u], seq)
      if tf then hold(u, seq, tonumber(tf)) end
    end
  end
end
-- choose: the best by the summed idf of the terms known held (summed in the terms' order, as
-- search_plan.choose does), ties to the newer, and the rest of a tie with the last of them if it
-- fits in `more` more
local chosen = cands
if #cands > rescore then
  local est = {}
  for _, seq in ipairs(cands) do
    local e = 0
    for t = 1, nt do
      if holders[t][seq] then e = e + idfs[t] end
    end
    est[seq] = e
  end
  table.sort(cands, function(p, q)
    if est[p] ~= est[q] then return est[p] > est[q] end
    return p > q
  end)
  local last = rescore
  while last < #cands and est[cands[last + 1]] == est[cands[rescore]] do last = last + 1 end
  if last > rescore + more then last = rescore end
  chosen = {}
  for j = 1, last do chosen[j] = cands[j] end
end
local lines, found, legacy = {}, {}, {}
for _, seq in ipairs(chosen) do
  local raw = redis.call('HGET', KEYS[1], seq)
  local head = {seq, string.match(raw, '^(%S+) (%d+)')}
  local f = 0
  for t = 1, nt do
    local tf = holders[t][seq]
    if tf == nil and not complete[t] and idfs[t] > 0 then
      tf = tonumber(redis.call('ZSCORE', base .. terms[t], seq) or '0')
    end
    tf = tf or 0
    if idfs[t] > 0 and tf > 0 then f = f + idfs[t] end
    head[#head + 1] = string.format('%.17g', tf)
  end
  local own = redis.call('HGET', KEYS[4], 'o' .. seq)
  if not own then
    own = '?'
    legacy[seq] = true
  end
  lines[#lines + 1] = table.concat(head, ' ') .. '\t' .. own
  found[#found + 1] = {seq, f}
end
local out = {table.concat(lines, '\n')}
-- the records of the candidates that can be among the best by the ranking's first key (the
-- summed idf of the terms found, in the terms' order: search_plan.rank cuts the same way), and
-- of those whose own terms are not stored
local sums = {}
for _, item in ipairs(found) do
  if item[2] > 0 then sums[#sums + 1] = item[2] end
end
local cut = 0
if #sums > limit then
  table.sort(sums, function(a, b) return a > b end)
  cut = sums[limit]
end
for _, item in ipairs(found) do
  local seq = item[1]
  if (item[2] > 0 and item[2] >= cut) or legacy[seq] then
    out[#out + 1] = seq
    out[#out + 1] = redis.call('HGET', KEYS[2], seq)
    out[#out + 1] = redis.call('HGET', KEYS[3], seq)
  end
end
return out
