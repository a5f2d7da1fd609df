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

from ..common import redact_url
from .store import RedisMemory

__all__ = ["RedisMemory", "redact_url"]
