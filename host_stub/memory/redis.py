"""Redis memory backend (several host processes on several machines), on ``redis.asyncio``.

Every mutation that touches more than one key, and every read that must agree with itself, is
ONE Lua script (``EVALSHA`` through ``register_script``; a server that lost its script cache,
e.g. after ``SCRIPT FLUSH`` or a restart, gets the script again on ``NOSCRIPT``). A script runs
alone on the server, so it is the transaction: ``append`` takes its seqs from the session's
``last_seq`` inside the same script that writes the messages (gapless and in commit order, with
any number of processes), and ``commit_compression`` checks the record's version and the epoch,
writes the record and archives the covered messages in one step. Leases are ``SET NX PX`` keys
with a random token: a crashed holder's lease runs out by itself; renewal is compare-and-expire,
release is compare-and-delete. Each acquisition increments the lease's fence counter (a key that
never expires) in the same script; a fenced write checks it in its own script.

Keys, all under ``prefix`` (default ``hs:``; a ``?prefix=`` in the URL overrides it):

==============================  ================================================================
``{p}s:{session}``              hash: ``epoch``, ``last_seq``, ``updated_at`` (unix ms)
``{p}m:{session}``              hash: seq -> message record (JSON, see below); never rewritten
``{p}a:{session}``              sorted set of the active seqs (score = seq)
``{p}z:{session}``              sorted set of the archived seqs (score = seq)
``{p}x:{session}``              hash: archived seq -> archive reason
``{p}sessions``                 set of session ids
``{p}md:{namespace}``           hash: key -> metadata entry (JSON, see below)
``{p}mk:{key}``                 set of the namespaces holding an entry for ``key`` (for
                                ``clear(types=None)`` and ``forget``)
``{p}lease:{name}``             string: the holder's token, with the lease's expiry as TTL
``{p}xd:{session}``             hash: searchable seq -> ``"<terms> <stored at, ms> <term> ..."``
                                (its number of terms, when it was stored, its distinct terms:
                                its own and those the message before it lent)
``{p}xf:{session}``             hash: term -> number of searchable messages holding it; ``#len``
                                -> the terms of all of them (BM25's average length); ``#last``
                                -> the last seq indexed
``{p}xo:{session}``             hash: searchable seq -> ``"<term>:<tf> ..."``, the terms it lends
                                the message after it; ``o<seq>`` -> ``"<tool> <term> ..."``, its
                                own terms in order (``tool``: 1 for a tool's traffic, else 0),
                                what the ranking reads
``{p}xp:{session}:{term}``      sorted set: seq -> the term's frequency in that message
``{p}fence:{name}``             integer: the lease's last fencing token (never expires)
==============================  ================================================================

The search index (``xd``, ``xf``, ``xp``) is written by the same scripts that append, clear and
delete messages, so it never disagrees with the messages; the search itself is one script that
follows ``host_stub.memory.search_plan`` (its plan and estimate) and returns the chosen
candidates' frequencies, lengths and own terms, with the messages of those that can be among
the best by the ranking's first key; ``search_plan.rank`` orders them. Its posting sets are
ordered by frequency, not seq: the one term of which only the newest postings are read is read
whole and the newest taken in the script. Entries written before the own terms were kept (no
``o<seq>``) are ranked from their message, which the script returns instead.

A message record is ``{"epoch":E,"role":R,"kind":K,"tokens":N,"body":{...}}`` and a metadata
entry ``{"version":V,"deleted":B,"updated_at":MS,"value":{...}|null}``, always with the fields
in that order: the scripts read ``epoch``/``role``/``kind`` and ``version`` from that fixed head
without decoding the rest. Times are the Redis server's clock (``TIME``), so every host agrees.

The scripts compute some key names (other namespaces, other sessions) from the prefix, so this
backend needs a standalone Redis (or a single-shard setup), not Redis Cluster.

Commands are not retried on a connection error: a script whose reply was lost may have run, and
running ``append`` twice would store the messages twice. Callers see one-line errors:
``ConnectionError("redis://host:6379/0: cannot connect: ...")`` when the server is down or
refuses the credentials, ``TimeoutError`` after ``socket_timeout`` seconds, and ``ValueError``
at construction for a URL that cannot work. A password in the URL is never echoed.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..messages import ArchiveReason, Message
from ..services import (
    SUMMARY_NAMESPACE,
    LeaseLost,
    LeaseToken,
    MetadataEntry,
    SearchHit,
    SessionInfo,
    Snapshot,
)
from ..session_ids import check_session_id
from . import search_plan
from .common import (
    TokenCounter,
    body_of,
    check_limit,
    check_ttl,
    dump_value,
    message_from_row,
    metadata_entry,
    new_lease_token,
    one_line,
    redact_url,
    select_trim,
    to_datetime,
    tokens_of,
)
from .search_plan import (
    CONTEXT_SPAN,
    CONTEXT_WEIGHT,
    Candidate,
    context_of,
    own_terms,
    plan_search,
    query_terms,
    tool_message,
)

__all__ = ["RedisMemory", "redact_url"]

_SCHEMES = ("redis", "rediss", "unix")

# -- Lua --------------------------------------------------------------------------------------

#: Helpers every script starts with.
_LIB = r"""
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
"""

# KEYS: s, m, a, sessions, xd, xf, xo; ARGV: session_id, index base (xp:{session}:), n, context
# span, context weight, n record tails (without the epoch), n index docs, n lent terms, n own
# terms in order
_APPEND = r"""
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
"""

# KEYS: m, a or z, x; ARGV: limit (-1 = all), epoch ('' = any)
# -> flat list seq, record, reason (false when active), oldest first
_READ = r"""
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
"""

# KEYS: s, m, a, md; ARGV: session_id -> {epoch, entry or false, seq, record, ...}
_SNAPSHOT = r"""
local out = {tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0'),
             redis.call('HGET', KEYS[4], ARGV[1])}
for _, seq in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  out[#out + 1] = seq
  out[#out + 1] = redis.call('HGET', KEYS[2], seq)
end
return out
"""

# KEYS: xd, m, x, xo; ARGV: index base, limit, role ('' = any), rescore, n terms, terms...,
# their idfs..., n reads, reads ("<limit, -1: all>:<term>,<term>...", 1-based)..., probes
# (1-based terms)... -> {the chosen candidates, one line each: "<seq> <length> <stored at, ms>
# <the weighted frequency of each term> ...<TAB><own terms: '<tool> <term> ...', or '?' when
# not stored>", then seq, record, reason of those that can be among the best}. Carries out a
# plan of host_stub/memory/search_plan.py (plan_search), then choose; search_plan.rank orders
# what it returns.
_SEARCH = r"""
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
"""

# KEYS: s, m, xd, x; ARGV: from_seq, to_seq -> flat list seq, record, reason, oldest first
_RANGE = r"""
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
"""

# KEYS: s, m, a, z, x, fence; ARGV: mode ('keep' | 'upto'), n, reason, fence ('' = none)
# -> archived seqs, or -1 when a newer holder took the lease (nothing changed)
_TRIM = r"""
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
"""

# KEYS: s, m, a, z, x, md, mk, fence; ARGV: session_id, namespace, expected_version, epoch,
# archive_through_seq, record JSON, fence ('' = none) -> 1 won, 0 lost, -1 a newer holder took
# the lease (nothing changed)
_COMMIT = r"""
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
"""

# KEYS: md, mk; ARGV: namespace, key, expected_version ('' = any), value JSON ('' = tombstone)
# -> new version, or nil when expected_version did not match
_SAVE_METADATA = r"""
if ARGV[3] ~= '' and md_version(KEYS[1], ARGV[2]) ~= tonumber(ARGV[3]) then return false end
local value = ARGV[4]
if value == '' then value = false end
return md_write(KEYS[1], KEYS[2], ARGV[1], ARGV[2], value, now_ms())
"""

# KEYS: lease, fence; ARGV: token, ttl (ms) -> the new fence, or false when the lease is held
_ACQUIRE = r"""
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
"""

# KEYS: lease; ARGV: token, ttl (ms) -> 1 renewed, 0 not ours (any more) or expired
_RENEW = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lease; ARGV: token -> 1 released, 0 not ours (any more)
_RELEASE = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# KEYS: s, a, z, x, sessions, mk, xd, xf, xo; ARGV: prefix, session_id, all ('1'/'0'), history
# ('1'/'0'), namespaces... -> the new epoch
_CLEAR = r"""
local now = now_ms()
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSETNX', KEYS[1], 'last_seq', 0)
redis.call('HSET', KEYS[1], 'updated_at', now)
redis.call('SADD', KEYS[5], ARGV[2])
if ARGV[4] == '1' then
  archive(KEYS[1], KEYS[2], KEYS[3], KEYS[4], redis.call('ZRANGE', KEYS[2], 0, -1), 'cleared',
          now)
  unindex_all(KEYS[7], KEYS[8], KEYS[9], ARGV[1] .. 'xp:' .. ARGV[2] .. ':')
end
local namespaces = {}
if ARGV[3] == '1' then
  namespaces = redis.call('SMEMBERS', KEYS[6])
  table.sort(namespaces)
else
  for i = 5, #ARGV do namespaces[#namespaces + 1] = ARGV[i] end
end
for _, ns in ipairs(namespaces) do
  md_write(ARGV[1] .. 'md:' .. ns, KEYS[6], ns, ARGV[2], false, now)
end
return epoch
"""

# KEYS: s, m, a, z, x, xd, xf, xo; ARGV: index base, seqs (sorted, unique) -> the seqs it
# changed
_DELETE_MESSAGES = r"""
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
"""

# KEYS: s, m, a, z, x, sessions, mk, xd, xf, xo; ARGV: prefix, session_id
_FORGET = r"""
unindex_all(KEYS[8], KEYS[9], KEYS[10], ARGV[1] .. 'xp:' .. ARGV[2] .. ':')
for _, ns in ipairs(redis.call('SMEMBERS', KEYS[7])) do
  redis.call('HDEL', ARGV[1] .. 'md:' .. ns, ARGV[2])
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7])
redis.call('SREM', KEYS[6], ARGV[2])
return 1
"""

# KEYS: sessions; ARGV: prefix
# -> flat list session_id, epoch, last_seq, updated_at, active, archived
_LIST_SESSIONS = r"""
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
"""

_SCRIPTS = {
    "append": _APPEND,
    "read": _READ,
    "snapshot": _SNAPSHOT,
    "search": _SEARCH,
    "range": _RANGE,
    "trim": _TRIM,
    "commit": _COMMIT,
    "save_metadata": _SAVE_METADATA,
    "acquire": _ACQUIRE,
    "renew": _RENEW,
    "release": _RELEASE,
    "clear": _CLEAR,
    "delete_messages": _DELETE_MESSAGES,
    "forget": _FORGET,
    "list_sessions": _LIST_SESSIONS,
}


def _ttl_ms(ttl_s: float) -> int:
    return max(1, math.ceil(ttl_s * 1000))


def _fence_arg(lease: LeaseToken | None) -> str | int:
    return "" if lease is None else int(lease.fence)


# -- URLs -------------------------------------------------------------------------------------


def _parse_url(url: str, shown: str) -> tuple[str, str | None]:
    """Validate ``url``; return it without our own ``prefix`` parameter, and that prefix."""

    def bad(reason: str) -> ValueError:
        return ValueError(f"memory URL {shown!r}: {reason}")

    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number or out of range
    except ValueError as exc:
        raise bad(str(exc)) from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise bad("a Redis URL starts with redis://, rediss:// or unix://")
    if scheme != "unix":
        if not parts.hostname:
            raise bad("names no host (write redis://host:6379/0)")
        if port == 0:
            raise bad("port 0 is not a port")
        db = unquote(parts.path).strip("/")
        if db and not db.isdigit():
            raise bad(f"the database {db!r} is not a number (write redis://host:6379/0)")
    elif not parts.path:
        raise bad("names no socket path (write unix:///path/to/redis.sock)")
    prefix = None
    query = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "prefix":
            if not value:
                raise bad("the key prefix must not be empty")
            prefix = value
        elif name in URL_QUERY_ARGUMENT_PARSERS:
            try:
                URL_QUERY_ARGUMENT_PARSERS[name](value)
            except (TypeError, ValueError):
                raise bad(f"bad value for {name!r}: {value!r}") from None
            query.append((name, value))
        else:
            known = ", ".join(["prefix", *sorted(URL_QUERY_ARGUMENT_PARSERS)])
            raise bad(f"unknown parameter {name!r} (known: {known})")
    return urlunsplit(parts._replace(query=urlencode(query))), prefix


# -- the backend ------------------------------------------------------------------------------


class RedisMemory:
    """A :class:`~host_stub.services.MemoryService` on a Redis server.

    ``url`` is ``redis://[[user]:password@]host[:port][/db][?options]`` (``rediss://`` for TLS,
    ``unix:///path.sock`` for a socket); options are redis-py's URL options (``socket_timeout``,
    ``max_connections``, ...) plus ``prefix`` for the key prefix. ``socket_timeout`` bounds every
    connect and every command; ``max_connections`` caps the pool (callers beyond it wait for a
    free connection up to ``pool_timeout`` seconds). Nothing connects before the first call.
    """

    def __init__(
        self,
        url: str,
        token_counter: TokenCounter,
        *,
        prefix: str = "hs:",
        socket_timeout: float = 5.0,
        max_connections: int = 50,
        pool_timeout: float = 20.0,
    ) -> None:
        #: The URL with its password hidden (for messages and logs).
        self.url = redact_url(url)
        try:
            password = urlsplit(url).password or ""
        except ValueError:
            password = url.partition("://")[2].rpartition("@")[0]
        self._secrets = sorted({password, unquote(password)} - {""}, key=len, reverse=True)
        plain_url, url_prefix = _parse_url(url, self.url)
        self.prefix = url_prefix or prefix
        if not self.prefix:
            raise ValueError(f"RedisMemory({self.url!r}): the key prefix must not be empty")
        if not socket_timeout > 0:
            raise ValueError(f"socket_timeout must be > 0, got {socket_timeout}")
        self.socket_timeout = socket_timeout
        self._count = token_counter
        try:
            pool = aioredis.BlockingConnectionPool.from_url(
                plain_url,
                decode_responses=True,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                max_connections=max_connections,
                timeout=pool_timeout,
                retry=Retry(NoBackoff(), 0),  # writes are not idempotent: never resend them
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"memory URL {self.url!r}: {self._scrub(exc)}") from None
        self._client = aioredis.Redis(connection_pool=pool)
        self._scripts = {
            name: self._client.register_script(_LIB + source) for name, source in _SCRIPTS.items()
        }
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisMemory({self.url!r}, prefix={self.prefix!r})"

    # -- keys and calls -----------------------------------------------------------------------

    def _session_keys(self, session_id: str) -> list[str]:
        """``s``, ``m``, ``a``, ``z``, ``x`` of a session."""
        p = self.prefix
        return [f"{p}{kind}:{session_id}" for kind in ("s", "m", "a", "z", "x")]

    def _index_keys(self, session_id: str) -> tuple[str, str, str, str]:
        """``xd``, ``xf``, ``xo`` and the posting keys' common start ``xp:{session}:``."""
        p = self.prefix
        return (
            f"{p}xd:{session_id}",
            f"{p}xf:{session_id}",
            f"{p}xo:{session_id}",
            f"{p}xp:{session_id}:",
        )

    def _md(self, namespace: str) -> str:
        return f"{self.prefix}md:{namespace}"

    def _mk(self, key: str) -> str:
        return f"{self.prefix}mk:{key}"

    @property
    def _sessions(self) -> str:
        return f"{self.prefix}sessions"

    def _scrub(self, exc: BaseException) -> str:
        text = one_line(str(exc)) or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Redis connection failures as one-line builtin errors naming the (redacted) URL."""
        if self._closed:
            raise RuntimeError(f"RedisMemory({self.url!r}) is closed")
        try:
            yield
        except redis_errors.AuthenticationError as exc:
            raise ConnectionError(
                f"{self.url}: cannot connect: authentication failed: {self._scrub(exc)}"
            ) from None
        except redis_errors.TimeoutError as exc:
            raise TimeoutError(
                f"{self.url}: no answer within {self.socket_timeout:g} s: {self._scrub(exc)}"
            ) from None
        except redis_errors.ConnectionError as exc:
            raise ConnectionError(f"{self.url}: cannot connect: {self._scrub(exc)}") from None

    async def _run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        with self._errors():
            return await self._scripts[script](keys=list(keys), args=list(args))

    # -- messages -----------------------------------------------------------------------------

    async def append(self, session_id: str, messages: Sequence[Message]) -> list[Message]:
        check_session_id(session_id)
        if not messages:
            return []
        rows = []
        tails = []
        for message in messages:
            tokens = tokens_of(message, self._count)
            body = body_of(message)
            rows.append((message, tokens, body))
            tails.append(
                f'"role":{json.dumps(message.role)},"kind":{json.dumps(message.kind)},'
                f'"tokens":{int(tokens)},"body":{body}}}'
            )
        owns = [own_terms(message) for message in messages]
        docs = [_index_doc(own) for own in owns]
        lent = [_pairs(context_of(own)) if own else "" for own in owns]
        ordered = [_own_entry(m, own) for m, own in zip(messages, owns, strict=True)]
        s, m, a, _, _ = self._session_keys(session_id)
        xd, xf, xo, base = self._index_keys(session_id)
        epoch, last = await self._run(
            "append",
            [s, m, a, self._sessions, xd, xf, xo],
            [
                session_id,
                base,
                len(tails),
                CONTEXT_SPAN,
                CONTEXT_WEIGHT,
                *tails,
                *docs,
                *lent,
                *ordered,
            ],
        )
        first = int(last) - len(rows) + 1
        return [
            message_from_row(
                role=message.role,
                kind=message.kind,
                body=body,
                seq=first + i,
                epoch=int(epoch),
                tokens=tokens,
                archived=None,
            )
            for i, (message, tokens, body) in enumerate(rows)
        ]

    async def get_history(self, session_id: str, limit: int | None = None) -> list[Message]:
        check_limit(limit)
        if limit == 0:
            return []
        _, m, a, _, x = self._session_keys(session_id)
        flat = await self._run("read", [m, a, x], [-1 if limit is None else limit, ""])
        return _messages(flat)

    async def get_archived(
        self, session_id: str, *, epoch: int | None = None, limit: int | None = None
    ) -> list[Message]:
        check_limit(limit)
        if limit == 0:
            return []
        _, m, _, z, x = self._session_keys(session_id)
        args = [-1 if limit is None else limit, "" if epoch is None else int(epoch)]
        return _messages(await self._run("read", [m, z, x], args))

    async def snapshot(self, session_id: str, namespace: str = SUMMARY_NAMESPACE) -> Snapshot:
        s, m, a, _, _ = self._session_keys(session_id)
        flat = await self._run("snapshot", [s, m, a, self._md(namespace)], [session_id])
        epoch, entry, rest = int(flat[0]), flat[1], flat[2:]
        messages = [_message(rest[i], rest[i + 1], None) for i in range(0, len(rest), 2)]
        record = None if entry is None else _entry(namespace, session_id, entry)
        return Snapshot(session_id=session_id, epoch=epoch, messages=messages, record=record)

    async def search(
        self, session_id: str, query: str, *, role: str | None = None, limit: int = 10
    ) -> list[SearchHit]:
        check_limit(limit)
        terms = query_terms(query)
        if not terms or not limit:
            return []
        _, m, _, _, x = self._session_keys(session_id)
        xd, xf, xo, base = self._index_keys(session_id)
        with self._errors():
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hlen(xd)
                pipe.hget(xf, "#len")
                pipe.hmget(xf, terms)
                n_docs, total, dfs = await pipe.execute()
        if not n_docs:
            return []
        plan = plan_search(
            terms, [int(df or 0) for df in dfs], int(n_docs), float(total or 0), limit=limit
        )
        if not plan.reads:
            return []
        reads = [
            f"{-1 if r.limit is None else r.limit}:{','.join(str(i + 1) for i in r.terms)}"
            for r in plan.reads
        ]
        args = [
            base,
            limit,
            role or "",
            search_plan.RESCORE,
            len(terms),
            *terms,
            *(repr(w) for w in plan.idfs),
            len(reads),
            *reads,
            *(i + 1 for i in plan.probes),
        ]
        flat = await self._run("search", [xd, m, x, xo], args)
        if not flat:
            return []
        records = {
            int(flat[i]): (_text(flat[i + 1]), flat[i + 2])
            for i in range(1, len(flat), 3)
            if flat[i + 1] is not None
        }
        candidates: list[Candidate] = []
        stored_at: dict[int, int] = {}
        for line in _text(flat[0]).split("\n"):
            head, _, own = line.partition("\t")
            seq_text, length, stored, *tfs = head.split(" ")
            seq = int(seq_text)
            stored_at[seq] = int(stored)
            if own == "?":  # indexed before the own terms were kept: read from its message
                if seq not in records:
                    continue
                message = _message(seq, records[seq][0], None)
                words, tool = " ".join(own_terms(message) or []), tool_message(message)
            else:
                flag, _, words = own.partition(" ")
                tool = flag == "1"
            candidates.append(Candidate(seq, [float(tf) for tf in tfs], float(length), words, tool))
        best = search_plan.rank(plan, candidates, limit)
        missing = [seq for seq, _ in best if seq not in records]
        if missing:  # the script returns them all; never read twice in practice
            with self._errors():
                async with self._client.pipeline(transaction=False) as pipe:
                    pipe.hmget(m, missing)
                    pipe.hmget(x, missing)
                    got, reasons = await pipe.execute()
            for seq, record, reason in zip(missing, got, reasons, strict=True):
                if record is not None:
                    records[seq] = (_text(record), reason)
        return [
            SearchHit(
                message=_message(seq, records[seq][0], records[seq][1]),
                score=value,
                stored_at=to_datetime(stored_at[seq] / 1000),
            )
            for seq, value in best
            if seq in records
        ]

    async def get_range(self, session_id: str, from_seq: int, to_seq: int) -> list[Message]:
        s, m, _, _, x = self._session_keys(session_id)
        xd, _, _, _ = self._index_keys(session_id)
        flat = await self._run("range", [s, m, xd, x], [int(from_seq), int(to_seq)])
        return _messages(flat)

    async def trim_history(
        self,
        session_id: str,
        keep_recent: int | None = None,
        up_to_seq: int | None = None,
        reason: ArchiveReason = "window",
        *,
        lease: LeaseToken | None = None,
    ) -> list[int]:
        select_trim([], keep_recent, up_to_seq)  # argument errors before touching the server
        if up_to_seq is not None:
            mode, n = "upto", int(up_to_seq)
        else:
            mode, n = "keep", int(keep_recent)  # type: ignore[arg-type]
        keys = [*self._session_keys(session_id), self._fence_key(lease)]
        seqs = await self._run("trim", keys, [mode, n, reason, _fence_arg(lease)])
        if seqs == -1:
            assert lease is not None
            raise LeaseLost(lease)
        return [int(seq) for seq in seqs]

    async def commit_compression(
        self,
        session_id: str,
        record: dict[str, Any],
        expected_version: int,
        archive_through_seq: int,
        *,
        epoch: int,
        namespace: str = SUMMARY_NAMESPACE,
        lease: LeaseToken | None = None,
    ) -> bool:
        keys = [
            *self._session_keys(session_id),
            self._md(namespace),
            self._mk(session_id),
            self._fence_key(lease),
        ]
        args = [
            session_id,
            namespace,
            int(expected_version),
            int(epoch),
            int(archive_through_seq),
            dump_value(record),
            _fence_arg(lease),
        ]
        won = await self._run("commit", keys, args)
        if won == -1:
            assert lease is not None
            raise LeaseLost(lease)
        return bool(won)

    # -- metadata -----------------------------------------------------------------------------

    async def get_metadata(self, namespace: str, key: str) -> MetadataEntry | None:
        with self._errors():
            raw = await self._client.hget(self._md(namespace), key)
        return None if raw is None else _entry(namespace, key, _text(raw))

    async def save_metadata(
        self,
        namespace: str,
        key: str,
        value: dict[str, Any],
        expected_version: int | None = None,
    ) -> int | None:
        check_session_id(key)
        if value is None:
            raise ValueError("save_metadata needs a value; use delete_metadata to delete")
        return await self._write_metadata(namespace, key, dump_value(value), expected_version)

    async def delete_metadata(
        self, namespace: str, key: str, expected_version: int | None = None
    ) -> int | None:
        return await self._write_metadata(namespace, key, "", expected_version)

    async def _write_metadata(
        self, namespace: str, key: str, value: str, expected_version: int | None
    ) -> int | None:
        expected = "" if expected_version is None else int(expected_version)
        version = await self._run(
            "save_metadata", [self._md(namespace), self._mk(key)], [namespace, key, expected, value]
        )
        return None if version is None else int(version)

    async def list_metadata(self, namespace: str) -> list[MetadataEntry]:
        with self._errors():
            raw = await self._client.hgetall(self._md(namespace))
        entries = [_entry(namespace, _text(k), _text(v)) for k, v in sorted(raw.items())]
        return [e for e in entries if not e.deleted]

    # -- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, name: str, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        token = new_lease_token()
        fence = await self._run(
            "acquire",
            [f"{self.prefix}lease:{name}", f"{self.prefix}fence:{name}"],
            [token, _ttl_ms(ttl_s)],
        )
        if fence is None:
            return None
        return LeaseToken(name=name, token=token, expires_at=time.time() + ttl_s, fence=int(fence))

    async def renew_lease(self, lease: LeaseToken, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        renewed = await self._run(
            "renew", [f"{self.prefix}lease:{lease.name}"], [lease.token, _ttl_ms(ttl_s)]
        )
        if not renewed:
            return None
        return lease.model_copy(update={"expires_at": time.time() + ttl_s})

    def _fence_key(self, lease: LeaseToken | None) -> str:
        # A key name is always passed (a script's key list is fixed); unused without a lease.
        return f"{self.prefix}fence:{lease.name if lease is not None else ''}"

    async def release_lease(self, lease: LeaseToken) -> bool:
        released = await self._run("release", [f"{self.prefix}lease:{lease.name}"], [lease.token])
        return bool(released)

    # -- sessions -----------------------------------------------------------------------------

    async def get_epoch(self, session_id: str) -> int:
        with self._errors():
            epoch = await self._client.hget(f"{self.prefix}s:{session_id}", "epoch")
        return 0 if epoch is None else int(epoch)

    async def clear(self, session_id: str, types: Sequence[str] | None = None) -> int:
        check_session_id(session_id)
        s, _, a, z, x = self._session_keys(session_id)
        if types is None:
            flags, namespaces = ["1", "1"], []
        else:
            history = "1" if "history" in types else "0"
            flags = ["0", history]
            namespaces = [t for t in dict.fromkeys(types) if t != "history"]
        xd, xf, xo, _ = self._index_keys(session_id)
        keys = [s, a, z, x, self._sessions, self._mk(session_id), xd, xf, xo]
        epoch = await self._run("clear", keys, [self.prefix, session_id, *flags, *namespaces])
        return int(epoch)

    async def delete_messages(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        wanted = sorted({int(seq) for seq in seqs})
        if not wanted:
            return []
        xd, xf, xo, base = self._index_keys(session_id)
        found = await self._run(
            "delete_messages", [*self._session_keys(session_id), xd, xf, xo], [base, *wanted]
        )
        return [int(seq) for seq in found]

    async def forget(self, session_id: str) -> None:
        xd, xf, xo, _ = self._index_keys(session_id)
        keys = [*self._session_keys(session_id), self._sessions, self._mk(session_id), xd, xf, xo]
        await self._run("forget", keys, [self.prefix, session_id])

    async def list_sessions(self) -> list[SessionInfo]:
        flat = await self._run("list_sessions", [self._sessions], [self.prefix])
        infos = [
            SessionInfo(
                session_id=flat[i],
                epoch=int(flat[i + 1]),
                last_seq=int(flat[i + 2]),
                updated_at=None if flat[i + 3] is None else to_datetime(int(flat[i + 3]) / 1000),
                active=int(flat[i + 4]),
                archived=int(flat[i + 5]),
            )
            for i in range(0, len(flat), 6)
        ]
        return sorted(infos, key=lambda info: info.session_id)

    async def close(self) -> None:
        """Close the pool's connections; later calls raise ``RuntimeError``. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await self._client.aclose(close_connection_pool=True)


# -- records ----------------------------------------------------------------------------------


def _message(seq: str | int, raw: str, archived: str | None) -> Message:
    # raw = {"epoch":E,"role":R,"kind":K,"tokens":N,"body":{...}}; the head holds no strings
    # but the role and kind literals, so the first ',"body":' ends it.
    cut = raw.index(',"body":')
    head = json.loads(raw[:cut] + "}")
    return message_from_row(
        role=head["role"],
        kind=head["kind"],
        body=raw[cut + len(',"body":') : -1],
        seq=int(seq),
        epoch=head["epoch"],
        tokens=head["tokens"],
        archived=archived,
    )


def _messages(flat: list[Any]) -> list[Message]:
    return [_message(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]


def _text(value: str | bytes) -> str:
    """A value the client returns: text already (``decode_responses``), typed as either."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _entry(namespace: str, key: str, raw: str) -> MetadataEntry:
    data = json.loads(raw)
    return metadata_entry(
        namespace,
        key,
        value=data["value"],
        version=data["version"],
        deleted=data["deleted"],
        updated_at=data["updated_at"] / 1000,
    )


def _pairs(terms: Sequence[str]) -> str:
    """Terms as the scripts read them: ``"<term>:<count> ..."``."""
    counts: dict[str, int] = {}
    for term in terms:
        counts[term] = counts.get(term, 0) + 1
    return " ".join(f"{term}:{tf}" for term, tf in counts.items())


def _own_entry(message: Message, own: list[str] | None) -> str:
    """What the ranking reads of a message: ``"<tool> <term> ..."``, its own terms in order
    (``tool`` 1 for a tool's traffic, else 0); ``""`` for a message that is not indexed."""
    if own is None:
        return ""
    return " ".join([str(int(tool_message(message))), *own])


def _index_doc(own: list[str] | None) -> str:
    """A message's own entry for the append script: ``"<terms> <term>:<tf> ..."``; ``""`` for
    a message that is not indexed."""
    if own is None:
        return ""
    return f"{len(own)} {_pairs(own)}".rstrip()
