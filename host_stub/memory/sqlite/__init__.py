"""SQLite memory backend (the embedded default): one database file in WAL mode, on the standard
library's ``sqlite3``, one worker thread per instance (and one that checkpoints the WAL).

Transactions. Every write is one ``BEGIN IMMEDIATE`` transaction, so it holds SQLite's single
write lock from its first read to its commit: sequence numbers, compare-and-set checks and leases
are decided under that lock and stay correct when several processes share the file. Reads that
must agree with each other (``snapshot``) run in one deferred ``BEGIN`` transaction, i.e. one WAL
snapshot. Any exception inside a transaction rolls it back.

One call, one thread hop at most. An instance owns one ``sqlite3`` connection and one worker
thread (a ``ThreadPoolExecutor`` with a single worker). Each public method hands the worker ONE
synchronous function that runs its whole transaction (``BEGIN`` ... ``COMMIT``) and returns plain
values, so a call costs one hop to the thread and back however many statements it runs. Rows
become ``Message`` and ``MetadataEntry`` objects on the event loop, after the transaction:
decoding them in the worker instead measured no faster (the GIL runs it one thread at a time
either way) and was slower in whole turns. The worker runs the jobs one after another in the
order they were submitted; other connections, in this process or another, are kept apart by
SQLite's locks, waited for up to ``busy_timeout_s``.

A turn's short transactions (``append``, ``snapshot``, ``append_snapshot``: a few statements)
run on the calling thread, the event loop's, with no hop: a hop to the worker and back cost
several times their SQL. They do so only when the connection is open and free at that moment
(a lock, ``_in_use``, that the worker holds for each of its jobs: the connection is used by one
thread at a time, never two), when no trace callback is installed, and with a busy timeout of
0: when another connection holds the lock they need they roll back at once and go to the
worker, which waits there. The event loop never waits for another connection. (The busy
timeout is switched when the other kind of call comes: to 0 before the first short transaction
after a worker's job, back before the worker's next job; not around every call.)

Snapshots while no other connection writes. The rows a snapshot read (the session's active
rows, the record's row, the epoch) are kept with the connection's ``PRAGMA data_version``,
which changes when another connection commits and not when this one does. A snapshot reads
that version first and, when it is unchanged, uses the kept rows instead of selecting them; an
append adds its rows to them in its own transaction, and every other write of this connection,
and any transaction that fails, drops what is kept (as does opening a new connection: the
version counts per connection). A chat's turns thus select no rows while one host writes.

Opening. Nothing is opened by the constructor. The first job opens the connection in the worker
thread (busy timeout, WAL, ``synchronous = NORMAL``) and creates or migrates the schema (``PRAGMA
user_version``), then runs its own transaction. If opening fails the call raises and the next call
tries again.

Cancellation. A job cannot be interrupted once the worker has started it. Cancelling the caller
while its job still waits in the worker's queue withdraws the job: it never runs and the store is
untouched. Cancelling it while the job runs only drops the result: the job commits (or, on an
error, rolls back) on its own, and the next job starts after it has finished. Either way a
transaction is applied whole or not at all, never in part, and the instance stays usable; a
cancelled ``append`` may thus have been stored without its caller learning the seqs.

Closing. ``close()`` marks the instance closed (every later call raises ``RuntimeError``), queues
the closing of the connection behind the jobs already submitted, which still run, and lets the
worker thread end once it is done. It waits for that; cancelling ``close()`` does not stop it.
Calling ``close()`` again is harmless.

Leases. A lease row outlives its releases (its token is emptied): its ``fence`` grows by one on
every acquisition, and a fenced write checks it inside its own transaction. Expiry is read from
``clock`` (``time.time`` unless a test injects one); every process on the file must share it.

Search. An FTS5 table (``search``: a message's own terms and the terms it is lent, each column
space-joined) holds a session's entries as one rowid range (``key << 32 | seq``); next to it,
``search_sessions`` (each session's key, number and total length of entries) and
``search_terms`` (each term's document frequency in each session), written in the transactions
that write the entries. An append does not index (the turn waits for appends): the session's
messages after ``sessions.indexed_seq`` are indexed by ``_catch_up``, run by a search or range
read first (its own write transaction, only when something waits) and inside the transactions
that archive (``commit_compression``, ``trim_history``: background work) or delete. A search
follows ``search_plan.plan_search``: it reads the planned lists and conjunctions
(``group_concat`` of the rowids; ``ORDER BY rowid DESC LIMIT k`` for the newest of one term; an
``AND`` query read whole, its newest kept, as FTS5 walks those backwards slowly), probes the
other terms with FTS5 ``AND`` queries, and ranks the candidates ``search_plan.choose`` picks
with ``search_plan.rank``, from FTS5's content table (``search_content``) and each one's role
(and, for an assistant's, whether its body holds tool calls). FTS5's own ``bm25`` is not used:
it ranks every match and takes its statistics from every session of the file.

Checkpoints. SQLite's automatic checkpoint (copying the WAL into the database file, every
thousand pages) is run by the commit that takes the WAL past that mark; with a turn's appends
on the event loop's thread, a turn now and then paid it (several milliseconds). After each
archive (``commit_compression``, ``trim_history``: every few turns of a chat), a second
connection, in a thread of its own, checkpoints the WAL (``PASSIVE``: it waits for no reader or
writer, and the store's connection goes on meanwhile), so the WAL rarely reaches the mark. A
checkpoint competes with the next turn for the CPU: they start at most every
``CHECKPOINT_INTERVAL_S`` (a host that trims at every turn got one per turn), the first
archive's at once, the ones that follow within the interval sharing one at its end. The
automatic checkpoint stays on for a store that never archives. ``close()`` cancels a checkpoint
put off and ends the thread.

Tracing. :meth:`SQLiteMemory.set_trace_callback` installs a ``sqlite3`` trace callback on the
connection. It runs in the worker thread just before each statement (``BEGIN`` and ``COMMIT``
included), so a callback that blocks holds the transaction it is in; the crash tests stop a
process at such points.
"""

from .schema import MIGRATIONS, SCHEMA_VERSION, backfill_search
from .statements import message_rows
from .store import SQLiteMemory
from .store import TraceCallback as TraceCallback
from .worker import CHECKPOINT_INTERVAL_S

__all__ = [
    "CHECKPOINT_INTERVAL_S",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SQLiteMemory",
    "backfill_search",
    "message_rows",
]
