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

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

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
from .common import (
    DecodedRows,
    StoreNotFound,
    TokenCounter,
    body_of,
    check_limit,
    check_ttl,
    copy_message,
    decode_row,
    dump_value,
    load_value,
    message_from_row,
    metadata_entry,
    new_lease_token,
    select_trim,
    to_datetime,
    tokens_of,
)
from .search_plan import (
    CONTEXT_SPAN,
    Candidate,
    Indexed,
    choose,
    distinct_terms,
    doc_length,
    lend_context,
    own_terms,
    plan_search,
    query_terms,
    rank,
    stored_counts,
    with_context,
)

__all__ = [
    "CHECKPOINT_INTERVAL_S",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "SQLiteMemory",
    "backfill_search",
    "message_rows",
]

log = logging.getLogger("host_stub.memory.sqlite")

#: Stored in ``PRAGMA user_version``; bump it and add a step to ``MIGRATIONS`` on schema changes.
SCHEMA_VERSION = 6

MIGRATIONS: dict[int, str] = {
    # from version 0 (empty file) to 1
    0: """
    CREATE TABLE IF NOT EXISTS sessions (
        session_id TEXT PRIMARY KEY,
        epoch      INTEGER NOT NULL DEFAULT 0,
        last_seq   INTEGER NOT NULL DEFAULT 0,
        updated_at REAL NOT NULL
    );
    CREATE TABLE IF NOT EXISTS messages (
        session_id  TEXT NOT NULL,
        seq         INTEGER NOT NULL,
        epoch       INTEGER NOT NULL,
        role        TEXT NOT NULL,
        kind        TEXT NOT NULL,
        body        TEXT NOT NULL,
        tokens      INTEGER NOT NULL,
        archived    TEXT NULL,
        archived_at REAL NULL,
        created_at  REAL NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS metadata (
        namespace  TEXT NOT NULL,
        key        TEXT NOT NULL,
        value      TEXT NULL,
        version    INTEGER NOT NULL,
        deleted    INTEGER NOT NULL DEFAULT 0,
        updated_at REAL NOT NULL,
        PRIMARY KEY (namespace, key)
    ) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS metadata_by_key ON metadata (key);
    CREATE TABLE IF NOT EXISTS leases (
        name       TEXT PRIMARY KEY,
        token      TEXT NOT NULL,
        expires_at REAL NOT NULL
    );
    """,
    # from 1 to 2: the search index (filled from the stored messages by backfill_search)
    1: """
    CREATE TABLE IF NOT EXISTS search_sessions (
        id         INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL UNIQUE
    );
    CREATE VIRTUAL TABLE IF NOT EXISTS search USING fts5(
        terms, context, tokenize = 'unicode61 remove_diacritics 0'
    );
    INSERT INTO search (search, rank) VALUES ('rank', 'bm25(1.0, 0.5)');
    """,
    # 2 -> 3: fencing tokens. A lease row stays after its release (token emptied) so the fence
    # of its next holder keeps growing.
    2: """
    ALTER TABLE leases ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;
    """,
    # 3 -> 4: the active history is read through an index of the active rows only, so a turn
    # late in a long chat does not walk every archived message of the session
    3: """
    CREATE INDEX IF NOT EXISTS messages_active ON messages (session_id, seq)
        WHERE archived IS NULL;
    """,
    # 4 -> 5: what a search ranks with, per session (filled by _backfill_stats): the number and
    # total length of its indexed messages, and each term's document frequency, so a search reads
    # only the postings it needs (see search_plan.plan_reads) instead of ranking every match
    4: """
    ALTER TABLE search_sessions ADD COLUMN docs INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE search_sessions ADD COLUMN length REAL NOT NULL DEFAULT 0;
    CREATE TABLE IF NOT EXISTS search_terms (
        session INTEGER NOT NULL,
        term    TEXT NOT NULL,
        df      INTEGER NOT NULL,
        PRIMARY KEY (session, term)
    ) WITHOUT ROWID;
    """,
    # 5 -> 6: appends no longer index: a session's messages after ``indexed_seq`` are indexed by
    # the next search, range read or archive (_catch_up); every stored message was indexed so far
    5: """
    ALTER TABLE sessions ADD COLUMN indexed_seq INTEGER NOT NULL DEFAULT 0;
    UPDATE sessions SET indexed_seq = last_seq;
    """,
}

#: Checkpoints after archives start at most this often (seconds); the archives that follow one
#: within this time share one checkpoint at its end (see the module's docstring).
CHECKPOINT_INTERVAL_S = 0.25

#: The search index's rowid of message ``seq`` of the session with key ``id`` is
#: ``id << _SEQ_BITS | seq``: a session's entries are one rowid range, which FTS5 seeks to.
_SEQ_BITS = 32
_SEQ_MASK = (1 << _SEQ_BITS) - 1

#: A message row: ``(seq, epoch, role, kind, body, tokens, archived)``.
_MESSAGE_COLUMNS = "seq, epoch, role, kind, body, tokens, archived"
_PREFIXED_COLUMNS = ", ".join(f"m.{c}" for c in _MESSAGE_COLUMNS.split(", "))
#: A metadata row: ``(namespace, key, value, version, deleted, updated_at)``.
_METADATA_COLUMNS = "namespace, key, value, version, deleted, updated_at"

_T = TypeVar("_T")
_Row = tuple[Any, ...]
#: What an append writes of one message: ``(role, kind, body, tokens)``.
_Given = tuple[str, str, str, int]
#: What a snapshot reads: the active rows, the record's row (if any), the epoch.
_SnapshotRows = tuple[list[_Row], "_Row | None", int]
#: A transaction's body: runs between ``BEGIN`` and ``COMMIT``, in the worker thread (or, for a
#: short one, on the calling thread: see ``_call``).
_Job = Callable[[sqlite3.Connection], _T]


class _ActiveReads:
    """What the last snapshot of each recent session read (its active rows, the record's row,
    the epoch), with the connection's ``PRAGMA data_version`` when it read them. That version
    changes when another connection commits; this connection's own writes do not change it, so
    every write of its own but an append drops what is kept (``clear``), and an append adds its
    rows (``appended``). While the version is unchanged a snapshot needs no ``SELECT``. Used by
    whoever holds ``_in_use``, inside the transaction; a transaction that fails drops all."""

    def __init__(self, sessions: int = 256) -> None:
        self._limit = sessions
        self._by_session: OrderedDict[str, dict[str, tuple[int, list[_Row], _Row | None, int]]]
        self._by_session = OrderedDict()

    def read(
        self, db: sqlite3.Connection, session_id: str, namespace: str, epoch: int | None = None
    ) -> _SnapshotRows:
        """A snapshot's rows: kept ones when no other connection committed since; else read
        (the version first, so what is kept is never older than its version says)."""
        version = int(_scalar(db, "PRAGMA data_version"))
        kept = self._by_session.get(session_id, {}).get(namespace)
        if kept is not None and kept[0] == version:
            self._by_session.move_to_end(session_id)
            return list(kept[1]), kept[2], kept[3]
        rows, record, epoch = _snapshot_rows(db, session_id, namespace, epoch)
        self._by_session.setdefault(session_id, {})[namespace] = (version, rows, record, epoch)
        self._by_session.move_to_end(session_id)
        while len(self._by_session) > self._limit:
            self._by_session.popitem(last=False)
        return list(rows), record, epoch

    def appended(self, session_id: str, epoch: int, rows: list[_Row]) -> None:
        """Rows this connection just added to the session (newest seqs, active)."""
        reads = self._by_session.get(session_id, {})
        for namespace, (_, kept, _, kept_epoch) in list(reads.items()):
            if kept_epoch == epoch:
                kept.extend(rows)
            else:  # another epoch than the one this transaction read: read again
                del reads[namespace]

    def clear(self) -> None:
        self._by_session.clear()


#: A ``sqlite3`` trace callback: gets each statement's SQL before it runs.
TraceCallback = Callable[[str], object]


class SQLiteMemory:
    """A :class:`~host_stub.services.MemoryService` on one SQLite file.

    ``path`` may be ``":memory:"`` (private to this instance). ``busy_timeout_s`` is how long a
    transaction waits for another connection's write lock before failing with
    ``sqlite3.OperationalError: database is locked``. With ``create=False`` only a store that
    exists is opened (migrated if older): a missing file, or one that holds no store (an empty
    file, say), is :class:`~host_stub.memory.common.StoreNotFound`, and nothing is written or
    made. A file or folder that cannot be opened or made is ``ConnectionError("<path>: cannot
    open: <reason>")``.
    """

    def __init__(
        self,
        path: str | Path,
        token_counter: TokenCounter,
        *,
        busy_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        create: bool = True,
    ) -> None:
        self.path = str(path)
        self._create = create
        self._count = token_counter
        #: Lease expiry is read from this clock (unix seconds), under the write lock; every
        #: process on the file must use the same clock (tests may pass their own).
        self._clock = clock
        self._busy_timeout_ms = max(0, int(busy_timeout_s * 1000))
        self._executor: ThreadPoolExecutor | None = None  # created on first use
        self._closed = False
        self._closing: Future[None] | None = None  # the job that closes the connection
        #: Checkpoints the WAL after each archive (not for ``:memory:``, which has none).
        self._checkpoints = _Checkpointer(self.path) if self.path != ":memory:" else None
        # Used by the thread that holds ``_in_use``:
        self._db: sqlite3.Connection | None = None
        self._trace: TraceCallback | None = None
        #: The active rows of recently read sessions, decoded (on the event loop's side).
        self._decoded = DecodedRows()
        #: The rows recent snapshots read, while no other connection has written.
        self._reads = _ActiveReads()
        #: Held by whoever uses the connection: the worker thread for each of its jobs, the
        #: event loop's thread for a short transaction it runs itself (see ``_call``).
        self._in_use = threading.Lock()
        #: Whether the connection waits for other connections' locks (its busy timeout is
        #: ``busy_timeout_s``) or fails at once (0, as the loop's short transactions need);
        #: switched only when the other kind of call comes, not around each one.
        self._waits = True

    # -- the worker thread --------------------------------------------------------------------

    async def _call(
        self, job: _Job[_T], *, write: bool, short: bool = False, appends: bool = False
    ) -> _T:
        """Run ``job`` as one transaction in the worker thread (one hop); return its result.

        ``short``: a transaction of a few statements on a turn's path (an append, a snapshot).
        It runs on the event loop's thread, which a hop to the worker and back cost several
        times over, when the connection is open and free at once and no other process holds
        the write lock (it never waits for one: the busy timeout is 0 meanwhile); otherwise, or
        when a trace callback is installed, it goes to the worker as any job."""
        if short and self._trace is None and self._in_use.acquire(blocking=False):
            try:
                db = self._db
                if db is not None and not self._closed:
                    return self._at_once(db, job, write, appends)
            except _Busy:
                pass  # rolled back; the worker waits for the lock as any job does
            finally:
                self._in_use.release()
        return await self._in_worker(self._transaction, job, write, appends)

    def _at_once(self, db: sqlite3.Connection, job: _Job[_T], write: bool, appends: bool) -> _T:
        """``job`` as a transaction on the calling thread, failing at once (:class:`_Busy`,
        nothing written) where it would wait for another connection's lock."""
        if self._waits:
            db.execute("PRAGMA busy_timeout = 0")
            self._waits = False
        try:
            return self._transaction(job, write, appends=appends)
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise _Busy from exc
            raise

    async def _in_worker(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise RuntimeError(f"SQLiteMemory({self.path!r}) is closed")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-memory")
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._holding, fn, *args
        )

    def _holding(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Worker thread: ``fn(*args)`` with the connection held, waiting for other
        connections' locks up to the busy timeout."""
        with self._in_use:
            if not self._waits and self._db is not None:
                self._db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
                self._waits = True
            return fn(*args)

    def _connection(self) -> sqlite3.Connection:
        """Worker thread: the connection, opened on first use."""
        return self._db if self._db is not None else self._open()

    def _transaction(self, job: _Job[_T], write: bool, appends: bool = False) -> _T:
        """Worker thread: ``BEGIN`` ... ``COMMIT`` around ``job``, rolled back on any
        exception. A write that may change what a snapshot reads (any but ``appends``, which
        keep the snapshot reads up to date themselves) or a failed transaction drops the
        snapshot reads kept."""
        db = self._connection()
        if write and not appends:
            self._reads.clear()
        db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = job(db)
            db.execute("COMMIT")
        except BaseException:
            self._reads.clear()
            self._rollback(db)
            raise
        return result

    def _indexed_then(self, session_id: str, job: _Job[_T]) -> _T:
        """Worker thread: index what the session stored since its last catch-up (a write
        transaction, only when something is waiting), then run ``job`` as a read transaction."""
        db = self._connection()
        row = _one(
            db, "SELECT indexed_seq < last_seq FROM sessions WHERE session_id = ?", (session_id,)
        )
        if row is not None and row[0]:
            self._transaction(lambda db: _catch_up(db, session_id), True)
        return self._transaction(job, False)

    def _rollback(self, db: sqlite3.Connection) -> None:
        try:
            if db.in_transaction:
                db.execute("ROLLBACK")
            return
        except Exception:
            pass
        # The transaction could not be rolled back: drop the connection (closing it rolls back)
        # and let the next job open a fresh one.
        self._db = None
        with contextlib.suppress(Exception):
            db.close()

    def _open(self) -> sqlite3.Connection:
        """Worker thread: connect, set the pragmas, create or migrate the schema (without
        ``create``: migrate a store that exists, make nothing)."""
        create = self._create or self.path == ":memory:"
        if create and self.path != ":memory:":
            folder = Path(self.path).parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConnectionError(
                    f"{self.path}: cannot open: cannot make its folder {str(folder)!r} "
                    f"({exc.strerror or exc})"
                ) from None
        try:
            # Used by one thread at a time (``_in_use``), not always the one that opened it.
            db = sqlite3.connect(
                self.path if create else Path(self.path).absolute().as_uri() + "?mode=rw",
                isolation_level=None,
                timeout=self._busy_timeout_ms / 1000,
                check_same_thread=False,
                uri=not create,
            )
        except sqlite3.OperationalError as exc:
            if not create and not os.path.lexists(self.path):
                raise StoreNotFound(f"sqlite:///{self.path}", "no such file") from None
            raise ConnectionError(f"{self.path}: cannot open: {exc}") from None
        try:
            if not create and not _holds_store(db):
                raise StoreNotFound(
                    f"sqlite:///{self.path}",
                    "the file is empty" if _is_empty(self.path) else "the file holds no store",
                )
            db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            self._waits = True
            self._reads.clear()  # data_version counts per connection
            self._set_wal(db)
            db.execute("PRAGMA synchronous = NORMAL")
            self._migrate(db)
            if self._trace is not None:
                db.set_trace_callback(self._trace)
        except sqlite3.DatabaseError as exc:
            db.close()
            if type(exc) is sqlite3.DatabaseError:  # "file is not a database": not ours to fix
                raise ConnectionError(
                    f"{self.path}: cannot open: not a SQLite database ({exc})"
                ) from None
            raise
        except BaseException:
            db.close()
            raise
        self._db = db
        return db

    def _set_wal(self, db: sqlite3.Connection) -> None:
        # Switching a fresh file to WAL takes an exclusive lock that may not wait on the busy
        # handler when several processes open the file at once; retry within the busy timeout.
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        while True:
            try:
                db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _migrate(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            version = _scalar(db, "PRAGMA user_version")
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path}: schema version {version} is newer than this code "
                    f"supports ({SCHEMA_VERSION})"
                )
            while version < SCHEMA_VERSION:
                for statement in MIGRATIONS[version].split(";"):
                    if statement.strip():
                        db.execute(statement)
                if version == 1:
                    backfill_search(db)
                if version == 4:
                    _backfill_stats(db)
                version += 1
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                db.execute("ROLLBACK")
            raise

    def _close_connection(self) -> None:
        """Worker thread: the last job."""
        db, self._db = self._db, None
        if db is not None:
            db.close()

    async def open(self) -> None:
        """Open the connection now (see :class:`~host_stub.services.OpensAtStart`): the file,
        WAL and the schema, in the worker; nothing when it is open."""
        await self._in_worker(self._connection)

    async def set_trace_callback(self, callback: TraceCallback | None) -> None:
        """Install (``None``: remove) a ``sqlite3`` trace callback on this instance's connection,
        opening it if it is not open yet (the opening's own statements are not traced).

        The callback gets each statement's SQL (parameters expanded) in the worker thread (while
        one is installed every call runs there, the short ones too), just before the statement
        runs, inside the transaction; the transaction waits while it runs.
        ``BEGIN``, ``COMMIT`` and ``ROLLBACK`` are statements too. Exceptions it raises are
        ignored by ``sqlite3``. For tests and diagnostics.
        """

        def install() -> None:
            self._connection().set_trace_callback(callback)
            self._trace = callback  # kept for a reopened connection

        await self._in_worker(install)

    # -- messages -----------------------------------------------------------------------------

    async def append(self, session_id: str, messages: Sequence[Message]) -> list[Message]:
        check_session_id(session_id)
        if not messages:
            return []
        given, out = self._given(messages)
        epoch, last_seq = await self._call(
            lambda db: self._append_rows(db, session_id, given),
            write=True,
            short=True,
            appends=True,
        )
        return self._appended(session_id, given, out, epoch, last_seq)

    async def append_snapshot(
        self, session_id: str, messages: Sequence[Message], namespace: str = SUMMARY_NAMESPACE
    ) -> tuple[list[Message], Snapshot]:
        check_session_id(session_id)
        given, out = self._given(messages)

        def job(db: sqlite3.Connection) -> tuple[tuple[int, int], _SnapshotRows]:
            if not given:
                return (0, 0), self._reads.read(db, session_id, namespace)
            numbers = self._append_rows(db, session_id, given)
            return numbers, self._reads.read(db, session_id, namespace, epoch=numbers[0])

        (epoch, last_seq), rows = await self._call(job, write=bool(given), short=True, appends=True)
        stored = self._appended(session_id, given, out, epoch, last_seq) if given else []
        return stored, self._snapshot(session_id, rows)

    def _append_rows(
        self, db: sqlite3.Connection, session_id: str, given: list[_Given]
    ) -> tuple[int, int]:
        """:func:`_append_rows`, the rows added to the snapshot reads kept."""
        epoch, last_seq = _append_rows(db, session_id, given)
        self._reads.appended(session_id, epoch, _rows_written(given, epoch, last_seq))
        return epoch, last_seq

    def _appended(
        self, session_id: str, given: list[_Given], out: list[Message], epoch: int, last_seq: int
    ) -> list[Message]:
        """The copies an append hands back, numbered; the rows it wrote go to the decoded rows
        (each with a copy of its own), so the next snapshot does not decode them again."""
        _numbered(out, epoch, last_seq)
        rows = _rows_written(given, epoch, last_seq)
        self._decoded.add(
            session_id, [(row, copy_message(m)) for row, m in zip(rows, out, strict=True)]
        )
        return out

    def _given(self, messages: Sequence[Message]) -> tuple[list[_Given], list[Message]]:
        """What an append writes (role, kind, body, tokens per message) and the copies it hands
        back, built (and validated) before anything is written; the store fills in their seq
        and epoch."""
        given: list[_Given] = [
            (m.role, m.kind, body_of(m), tokens_of(m, self._count)) for m in messages
        ]
        out = [
            message_from_row(
                role=role, kind=kind, body=body, seq=0, epoch=0, tokens=tokens, archived=None
            )
            for role, kind, body, tokens in given
        ]
        return given, out

    async def get_history(self, session_id: str, limit: int | None = None) -> list[Message]:
        check_limit(limit)
        rows = await self._call(
            lambda db: message_rows(db, session_id, archived=False, limit=limit), write=False
        )
        return _messages(rows)

    async def get_archived(
        self, session_id: str, *, epoch: int | None = None, limit: int | None = None
    ) -> list[Message]:
        check_limit(limit)
        rows = await self._call(
            lambda db: message_rows(db, session_id, archived=True, epoch=epoch, limit=limit),
            write=False,
        )
        return _messages(rows)

    async def snapshot(self, session_id: str, namespace: str = SUMMARY_NAMESPACE) -> Snapshot:
        rows = await self._call(
            lambda db: self._reads.read(db, session_id, namespace), write=False, short=True
        )
        return self._snapshot(session_id, rows)

    def _snapshot(self, session_id: str, read: _SnapshotRows) -> Snapshot:
        rows, record, epoch = read
        return Snapshot(
            session_id=session_id,
            epoch=epoch,
            messages=self._decoded.messages(session_id, rows),
            record=None if record is None else _entry(record),
        )

    async def search(
        self, session_id: str, query: str, *, role: str | None = None, limit: int = 10
    ) -> list[SearchHit]:
        check_limit(limit)
        terms = query_terms(query)
        if not terms or not limit:
            return []

        def job(db: sqlite3.Connection) -> list[tuple[_Row, float]]:
            return _search(db, session_id, terms, role, limit)

        found = await self._in_worker(self._indexed_then, session_id, job)
        return [
            SearchHit(message=message, score=value, stored_at=to_datetime(row[-1]))
            for message, (row, value) in zip(
                _messages(row[:-1] for row, _ in found), found, strict=True
            )
        ]

    async def get_range(self, session_id: str, from_seq: int, to_seq: int) -> list[Message]:
        def job(db: sqlite3.Connection) -> list[_Row]:
            key = _search_key(db, session_id, create=False)
            if key is None:
                return []
            return db.execute(
                f"SELECT {_PREFIXED_COLUMNS} FROM messages m WHERE m.session_id = ?"
                " AND m.seq BETWEEN ? AND ?"
                " AND EXISTS (SELECT 1 FROM search s WHERE s.rowid = ? + m.seq) ORDER BY m.seq",
                (session_id, from_seq, to_seq, key << _SEQ_BITS),
            ).fetchall()

        return _messages(await self._in_worker(self._indexed_then, session_id, job))

    async def trim_history(
        self,
        session_id: str,
        keep_recent: int | None = None,
        up_to_seq: int | None = None,
        reason: ArchiveReason = "window",
        *,
        lease: LeaseToken | None = None,
    ) -> list[int]:
        select_trim([], keep_recent, up_to_seq)  # argument errors before any transaction

        def job(db: sqlite3.Connection) -> list[int]:
            _check_fence(db, lease)
            rows = db.execute(
                "SELECT seq, kind, role FROM messages INDEXED BY messages_active"
                " WHERE session_id = ? AND archived IS NULL"
                " ORDER BY seq",
                (session_id,),
            ).fetchall()
            seqs = select_trim(rows, keep_recent, up_to_seq)
            if seqs:
                _catch_up(db, session_id)  # background work: the index catches up here
            _archive(db, session_id, seqs, reason, time.time())
            return seqs

        done = await self._call(job, write=True)
        self._checkpoint_soon()
        return done

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
        value = dump_value(record)

        def job(db: sqlite3.Connection) -> bool:
            _check_fence(db, lease)
            if _version(db, namespace, session_id) != expected_version:
                return False
            if _epoch(db, session_id) != epoch:
                return False
            now = time.time()
            _write_metadata(db, namespace, session_id, value, now)
            _catch_up(db, session_id)  # background work: the index catches up here
            rows = db.execute(
                "SELECT seq FROM messages INDEXED BY messages_active"
                " WHERE session_id = ? AND archived IS NULL"
                " AND seq <= ? AND NOT (role = 'system' AND kind = 'message') ORDER BY seq",
                (session_id, archive_through_seq),
            ).fetchall()
            _archive(db, session_id, [seq for (seq,) in rows], "summarized", now)
            return True

        done = await self._call(job, write=True)
        self._checkpoint_soon()
        return done

    def _checkpoint_soon(self) -> None:
        """After an archive (background work, every few turns of a chat): checkpoint the WAL
        beside the store's connection (see the module's docstring)."""
        if self._checkpoints is not None and not self._closed:
            self._checkpoints.soon()

    # -- metadata -----------------------------------------------------------------------------

    async def get_metadata(self, namespace: str, key: str) -> MetadataEntry | None:
        row = await self._call(lambda db: _metadata_row(db, namespace, key), write=False)
        return None if row is None else _entry(row)

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
        text = dump_value(value)

        def job(db: sqlite3.Connection) -> int | None:
            if expected_version is not None:
                if _version(db, namespace, key) != expected_version:
                    return None
            return _write_metadata(db, namespace, key, text, time.time())

        return await self._call(job, write=True)

    async def delete_metadata(
        self, namespace: str, key: str, expected_version: int | None = None
    ) -> int | None:
        def job(db: sqlite3.Connection) -> int | None:
            if expected_version is not None:
                if _version(db, namespace, key) != expected_version:
                    return None
            return _write_metadata(db, namespace, key, None, time.time())

        return await self._call(job, write=True)

    async def list_metadata(self, namespace: str) -> list[MetadataEntry]:
        rows = await self._call(
            lambda db: db.execute(
                f"SELECT {_METADATA_COLUMNS} FROM metadata"
                " WHERE namespace = ? AND deleted = 0 ORDER BY key",
                (namespace,),
            ).fetchall(),
            write=False,
        )
        return [_entry(r) for r in rows]

    # -- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, name: str, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)

        def job(db: sqlite3.Connection) -> LeaseToken | None:
            now = self._clock()  # under the write lock
            row = _one(db, "SELECT expires_at, fence FROM leases WHERE name = ?", (name,))
            if row is not None and row[0] > now:
                return None
            fence = (row[1] if row is not None else 0) + 1
            lease = LeaseToken(
                name=name, token=new_lease_token(), expires_at=now + ttl_s, fence=fence
            )
            db.execute(
                "INSERT INTO leases (name, token, expires_at, fence) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET token = excluded.token,"
                " expires_at = excluded.expires_at, fence = excluded.fence",
                (lease.name, lease.token, lease.expires_at, lease.fence),
            )
            return lease

        return await self._call(job, write=True)

    async def renew_lease(self, lease: LeaseToken, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)

        def job(db: sqlite3.Connection) -> LeaseToken | None:
            now = self._clock()  # under the write lock
            renewed = db.execute(
                "UPDATE leases SET expires_at = ? WHERE name = ? AND token = ? AND expires_at > ?",
                (now + ttl_s, lease.name, lease.token, now),
            ).rowcount
            return lease.model_copy(update={"expires_at": now + ttl_s}) if renewed else None

        return await self._call(job, write=True)

    async def release_lease(self, lease: LeaseToken) -> bool:
        name, token = lease.name, lease.token
        # The row stays (its fence is the next holder's base); only the holder is removed.
        return await self._call(
            lambda db: (
                db.execute(
                    "UPDATE leases SET token = '', expires_at = 0 WHERE name = ? AND token = ?",
                    (name, token),
                ).rowcount
                > 0
            ),
            write=True,
        )

    # -- sessions -----------------------------------------------------------------------------

    async def get_epoch(self, session_id: str) -> int:
        return await self._call(lambda db: _epoch(db, session_id), write=False)

    async def clear(self, session_id: str, types: Sequence[str] | None = None) -> int:
        check_session_id(session_id)

        def job(db: sqlite3.Connection) -> int:
            now = time.time()
            db.execute(
                "INSERT INTO sessions (session_id, epoch, last_seq, updated_at) VALUES (?, 1, 0, ?)"
                " ON CONFLICT (session_id) DO UPDATE SET epoch = epoch + 1,"
                " updated_at = excluded.updated_at",
                (session_id, now),
            )
            epoch = _epoch(db, session_id)
            if types is None or "history" in types:
                db.execute(
                    "UPDATE messages SET archived = 'cleared', archived_at = ?"
                    " WHERE session_id = ? AND archived IS NULL",
                    (now, session_id),
                )
                _unindex(db, session_id, None)
                # what was not indexed yet never will be: cleared messages are not searched
                db.execute(
                    "UPDATE sessions SET indexed_seq = last_seq WHERE session_id = ?",
                    (session_id,),
                )
            if types is None:
                rows = db.execute(
                    "SELECT namespace FROM metadata WHERE key = ? ORDER BY namespace",
                    (session_id,),
                ).fetchall()
                namespaces = [namespace for (namespace,) in rows]
            else:
                namespaces = [t for t in dict.fromkeys(types) if t != "history"]
            for namespace in namespaces:
                _write_metadata(db, namespace, session_id, None, now)
            return epoch

        return await self._call(job, write=True)

    async def delete_messages(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        wanted = sorted(set(seqs))

        def job(db: sqlite3.Connection) -> list[int]:
            rows = (
                db.execute(
                    "SELECT seq FROM messages WHERE session_id = ? AND archived IS NOT 'deleted'"
                    f" AND seq IN ({','.join('?' * len(wanted))}) ORDER BY seq",
                    (session_id, *wanted),
                ).fetchall()
                if wanted
                else []
            )
            found = [seq for (seq,) in rows]
            if found:
                _catch_up(db, session_id)  # the messages after them were lent their terms
            _archive(db, session_id, found, "deleted", time.time())
            _unindex(db, session_id, found)
            return found

        return await self._call(job, write=True)

    async def forget(self, session_id: str) -> None:
        def job(db: sqlite3.Connection) -> None:
            _unindex(db, session_id, None)
            db.execute("DELETE FROM search_sessions WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM metadata WHERE key = ?", (session_id,))

        await self._call(job, write=True)

    async def list_sessions(self) -> list[SessionInfo]:
        rows = await self._call(
            lambda db: db.execute(
                "SELECT s.session_id, s.epoch, s.last_seq, s.updated_at,"
                " COUNT(m.seq) - COUNT(m.archived) AS active,"
                " COUNT(m.archived) AS archived"
                " FROM sessions s LEFT JOIN messages m ON m.session_id = s.session_id"
                " GROUP BY s.session_id ORDER BY s.session_id"
            ).fetchall(),
            write=False,
        )
        return [
            SessionInfo(
                session_id=session_id,
                epoch=epoch,
                active=active,
                archived=archived,
                last_seq=last_seq,
                updated_at=to_datetime(updated_at),
            )
            for session_id, epoch, last_seq, updated_at, active, archived in rows
        ]

    async def close(self) -> None:
        """Close the connection once the calls already made have finished; later calls raise
        ``RuntimeError``. Safe to call twice; cancelling it does not stop the closing."""
        if not self._closed:
            self._closed = True
            executor, self._executor = self._executor, None
            if executor is not None:
                self._closing = executor.submit(self._holding, self._close_connection)
                executor.shutdown(wait=False)  # the worker ends after the jobs already queued
        if self._closing is not None:
            await asyncio.shield(asyncio.wrap_future(self._closing))
        if self._checkpoints is not None:
            await self._checkpoints.close()


def _holds_store(db: sqlite3.Connection) -> bool:
    """Whether the database is a store (of any schema version): its version is set by the
    first migration, in the transaction that makes the tables. Reads only."""
    return bool(_scalar(db, "PRAGMA user_version"))


def _is_empty(path: str) -> bool:
    try:
        return os.path.getsize(path) == 0
    except OSError:
        return False


class _Checkpointer:
    """Checkpoints of a database's WAL on a connection and a thread of their own (see the
    module's docstring): ``PASSIVE``, so they wait for no reader or writer, and the store's
    connection goes on with its transactions meanwhile. At most one starts every
    :data:`CHECKPOINT_INTERVAL_S`; one asked for sooner is put off to the interval's end (one
    at a time: the archives in between share it)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None  # used by the checkpoint thread only
        self._running: Future[None] | None = None
        self._started = -CHECKPOINT_INTERVAL_S  # monotonic time of the last start
        #: A checkpoint put off: the loop its timer is on and the timer.
        self._deferred: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None

    def soon(self) -> None:
        """Checkpoint after an archive: now, or at the end of the current interval when a
        checkpoint started less than :data:`CHECKPOINT_INTERVAL_S` ago or still runs (on the
        running event loop; nothing more when one is put off already on that loop)."""
        loop = asyncio.get_running_loop()
        if self._deferred is not None:
            if self._deferred[0] is loop:
                return
            self._deferred[1].cancel()  # put off on a loop that has ended: start again here
            self._deferred = None
        wait = self._started + CHECKPOINT_INTERVAL_S - time.monotonic()
        running = self._running is not None and not self._running.done()
        if wait <= 0 and not running:
            self._start()
            return
        delay = max(wait, CHECKPOINT_INTERVAL_S if running else 0.0)
        self._deferred = (loop, loop.call_later(delay, self._put_off_done))

    def _put_off_done(self) -> None:
        self._deferred = None
        self.soon()

    def _start(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="sqlite-checkpoint"
            )
        self._started = time.monotonic()
        self._running = self._executor.submit(self._checkpoint)

    def _checkpoint(self) -> None:
        try:
            if self._db is None:
                self._db = sqlite3.connect(
                    self._path, isolation_level=None, timeout=0, check_same_thread=False
                )
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # the automatic checkpoint still runs: nothing is lost
            log.debug("checkpoint of %s failed: %s", self._path, exc)
            self._close_connection()

    def _close_connection(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()

    async def close(self) -> None:
        """Cancel a checkpoint put off; wait for a running one, then close the connection and
        end the thread."""
        if self._deferred is not None:
            self._deferred[1].cancel()
            self._deferred = None
        executor, self._executor = self._executor, None
        if executor is not None:
            closing = executor.submit(self._close_connection)
            executor.shutdown(wait=False)
            await asyncio.shield(asyncio.wrap_future(closing))


class _Busy(Exception):
    """A transaction run at once met another connection's lock; it was rolled back."""


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds what the statement needs."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


# -- SQL helpers (worker thread, inside a transaction) -----------------------------------------


def _one(db: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> _Row | None:
    row: _Row | None = db.execute(sql, tuple(params)).fetchone()
    return row


def _scalar(db: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> Any:
    row = _one(db, sql, params)
    return None if row is None else row[0]


def _check_fence(db: sqlite3.Connection, lease: LeaseToken | None) -> None:
    """Raise :class:`LeaseLost` if a newer holder took ``lease`` (in the write's transaction)."""
    if lease is None:
        return
    row = _one(db, "SELECT fence FROM leases WHERE name = ?", (lease.name,))
    if (row[0] if row is not None else 0) != lease.fence:
        raise LeaseLost(lease)


def _epoch(db: sqlite3.Connection, session_id: str) -> int:
    epoch = _scalar(db, "SELECT epoch FROM sessions WHERE session_id = ?", (session_id,))
    return 0 if epoch is None else int(epoch)


def _version(db: sqlite3.Connection, namespace: str, key: str) -> int:
    version = _scalar(
        db, "SELECT version FROM metadata WHERE namespace = ? AND key = ?", (namespace, key)
    )
    return 0 if version is None else int(version)


def _metadata_row(db: sqlite3.Connection, namespace: str, key: str) -> _Row | None:
    return _one(
        db,
        f"SELECT {_METADATA_COLUMNS} FROM metadata WHERE namespace = ? AND key = ?",
        (namespace, key),
    )


def _write_metadata(
    db: sqlite3.Connection, namespace: str, key: str, value: str | None, now: float
) -> int:
    """Upsert the value (``None`` = tombstone), one version up; return the new version."""
    db.execute(
        "INSERT INTO metadata (namespace, key, value, version, deleted, updated_at)"
        " VALUES (?, ?, ?, 1, ?, ?)"
        " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
        " version = version + 1, deleted = excluded.deleted, updated_at = excluded.updated_at",
        (namespace, key, value, int(value is None), now),
    )
    return _version(db, namespace, key)


def _archive(
    db: sqlite3.Connection,
    session_id: str,
    seqs: Sequence[int],
    reason: ArchiveReason,
    now: float,
) -> None:
    if not seqs:
        return
    db.executemany(
        "UPDATE messages SET archived = ?, archived_at = ? WHERE session_id = ? AND seq = ?",
        [(reason, now, session_id, seq) for seq in seqs],
    )
    db.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (now, session_id))


def _append_rows(db: sqlite3.Connection, session_id: str, given: list[_Given]) -> tuple[int, int]:
    """Inside a write transaction: store ``given`` after the session's last message (creating
    the session); return its epoch and the seq before them. The search index waits for the
    next catch-up (a search, an archive)."""
    now, n = time.time(), len(given)
    moved = db.execute(
        "UPDATE sessions SET last_seq = last_seq + ?, updated_at = ? WHERE session_id = ?",
        (n, now, session_id),
    )
    if moved.rowcount == 0:  # the session's first message
        db.execute(
            "INSERT INTO sessions (session_id, epoch, last_seq, updated_at) VALUES (?, 0, ?, ?)",
            (session_id, n, now),
        )
    row = _one(db, "SELECT epoch, last_seq FROM sessions WHERE session_id = ?", (session_id,))
    assert row is not None
    epoch, last_seq = row[0], row[1] - n
    db.executemany(
        "INSERT INTO messages (session_id, seq, epoch, role, kind, body, tokens,"
        " archived, archived_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?)",
        [
            (session_id, last_seq + i, epoch, role, kind, body, tokens, now)
            for i, (role, kind, body, tokens) in enumerate(given, 1)
        ],
    )
    return epoch, last_seq


def _rows_written(given: list[_Given], epoch: int, last_seq: int) -> list[_Row]:
    """The rows :func:`_append_rows` wrote, as a read of the active rows returns them."""
    return [
        (last_seq + i, epoch, role, kind, body, tokens, None)
        for i, (role, kind, body, tokens) in enumerate(given, 1)
    ]


def _numbered(out: list[Message], epoch: int, last_seq: int) -> list[Message]:
    """The copies an append hands back, with the seqs and epoch it got."""
    for i, message in enumerate(out, 1):
        message.seq = last_seq + i
        message.epoch = epoch
    return out


def _snapshot_rows(
    db: sqlite3.Connection, session_id: str, namespace: str, epoch: int | None = None
) -> _SnapshotRows:
    """A snapshot's reads: the active rows, the record's row, the epoch (read unless the
    transaction already knows it)."""
    return (
        message_rows(db, session_id, archived=False),
        _metadata_row(db, namespace, session_id),
        _epoch(db, session_id) if epoch is None else epoch,
    )


def message_rows(
    db: sqlite3.Connection,
    session_id: str,
    *,
    archived: bool,
    epoch: int | None = None,
    limit: int | None = None,
) -> list[_Row]:
    where = "session_id = ? AND archived IS " + ("NOT NULL" if archived else "NULL")
    # The active rows through their own index (a long chat is mostly archived rows).
    table = "messages" if archived else "messages INDEXED BY messages_active"
    params: list[Any] = [session_id]
    if epoch is not None:
        where += " AND epoch = ?"
        params.append(epoch)
    if limit is None:
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM {table} WHERE {where} ORDER BY seq"
    else:
        sql = (
            f"SELECT * FROM (SELECT {_MESSAGE_COLUMNS} FROM {table} WHERE {where}"
            " ORDER BY seq DESC LIMIT ?) ORDER BY seq"
        )
        params.append(limit)
    return db.execute(sql, params).fetchall()


def _previous_terms(
    db: sqlite3.Connection, session_id: str, first_seq: int
) -> tuple[int, list[str]] | None:
    """``(seq, own terms)`` of the searchable message that messages from ``first_seq`` on follow
    (at most ``CONTEXT_SPAN`` seqs back), if any, as the index holds them."""
    key = _search_key(db, session_id, create=False)
    if key is None or first_seq <= 1:
        return None
    low = key << _SEQ_BITS
    row = _one(
        db,
        "SELECT rowid, terms FROM search WHERE rowid BETWEEN ? AND ? ORDER BY rowid DESC LIMIT 1",
        (low | max(1, first_seq - CONTEXT_SPAN), low | (first_seq - 1)),
    )
    return None if row is None else (int(row[0]) & _SEQ_MASK, str(row[1]).split())


def _catch_up(db: sqlite3.Connection, session_id: str) -> None:
    """Index the session's messages stored after ``indexed_seq`` (appends do not index: the
    turn does not wait for it); a search or range read runs this first, an archive with it."""
    row = _one(db, "SELECT indexed_seq, last_seq FROM sessions WHERE session_id = ?", (session_id,))
    if row is None or row[0] >= row[1]:
        return
    indexed_seq, last_seq = row
    messages = _messages(
        db.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND seq > ?"
            " ORDER BY seq",
            (session_id, indexed_seq),
        ).fetchall()
    )
    docs = [(m.seq or 0, own_terms(m)) for m in messages]
    terms = lend_context(docs, _previous_terms(db, session_id, indexed_seq + 1))
    _index(
        db, session_id, [(seq, t) for (seq, _), t in zip(docs, terms, strict=True) if t is not None]
    )
    db.execute("UPDATE sessions SET indexed_seq = ? WHERE session_id = ?", (last_seq, session_id))


def _search_key(db: sqlite3.Connection, session_id: str, *, create: bool) -> int | None:
    """The session's key in the search index (``None``: it has none and ``create`` is off)."""
    key = _scalar(db, "SELECT id FROM search_sessions WHERE session_id = ?", (session_id,))
    if key is None and create:
        key = db.execute(
            "INSERT INTO search_sessions (session_id) VALUES (?)", (session_id,)
        ).lastrowid
    return None if key is None else int(key)


def _index(
    db: sqlite3.Connection,
    session_id: str,
    docs: Sequence[tuple[int, Indexed]],
    *,
    stats: bool = True,
) -> None:
    """Add ``(seq, (own terms, lent terms))`` entries to the search index (the lent terms in
    a column of their own) and, unless ``stats`` is off, to the session's counts (number of
    entries, total length, each term's document frequency)."""
    if not docs:
        return
    key = _search_key(db, session_id, create=True)
    assert key is not None
    db.executemany(
        "INSERT INTO search (rowid, terms, context) VALUES (?, ?, ?)",
        [((key << _SEQ_BITS) | seq, " ".join(own), " ".join(ctx)) for seq, (own, ctx) in docs],
    )
    if stats:
        _count_terms(db, key, [indexed for _, indexed in docs], 1)


def _count_terms(db: sqlite3.Connection, key: int, docs: Sequence[Indexed], sign: int) -> None:
    """Add (``sign`` 1) or remove (-1) entries in the session's counts."""
    dfs: dict[str, int] = {}
    for indexed in docs:
        for term in distinct_terms(indexed):
            dfs[term] = dfs.get(term, 0) + 1
    length = sum(doc_length(indexed) for indexed in docs)
    db.execute(
        "UPDATE search_sessions SET docs = docs + ?, length = length + ? WHERE id = ?",
        (sign * len(docs), sign * length, key),
    )
    if sign > 0:
        db.executemany(
            "INSERT INTO search_terms (session, term, df) VALUES (?, ?, ?)"
            " ON CONFLICT (session, term) DO UPDATE SET df = df + excluded.df",
            [(key, term, df) for term, df in dfs.items()],
        )
    else:
        db.executemany(
            "UPDATE search_terms SET df = df - ? WHERE session = ? AND term = ?",
            [(df, key, term) for term, df in dfs.items()],
        )
        db.execute("DELETE FROM search_terms WHERE session = ? AND df <= 0", (key,))


def _unindex(db: sqlite3.Connection, session_id: str, seqs: Sequence[int] | None) -> None:
    """Remove the session's entries (``seqs`` ``None``: all of them) from the search index and
    its counts."""
    key = _search_key(db, session_id, create=False)
    if key is None:
        return
    low = key << _SEQ_BITS
    if seqs is None:
        db.execute("DELETE FROM search WHERE rowid BETWEEN ? AND ?", (low, low | _SEQ_MASK))
        db.execute("DELETE FROM search_terms WHERE session = ?", (key,))
        db.execute("UPDATE search_sessions SET docs = 0, length = 0 WHERE id = ?", (key,))
        return
    gone: list[Indexed] = []
    for seq in seqs:
        row = _one(db, "SELECT terms, context FROM search WHERE rowid = ?", (low | seq,))
        if row is not None:
            gone.append((row[0].split(), row[1].split()))
            db.execute("DELETE FROM search WHERE rowid = ?", (low | seq,))
    if gone:
        _count_terms(db, key, gone, -1)


def _search(
    db: sqlite3.Connection, session_id: str, terms: list[str], role: str | None, limit: int
) -> list[tuple[_Row, float]]:
    """The ``limit`` best matches of the session for ``terms``: (message row + stored at, score),
    best first, found and ranked as ``search_plan.plan_search`` and ``choose`` say."""
    row = _one(
        db, "SELECT id, docs, length FROM search_sessions WHERE session_id = ?", (session_id,)
    )
    if row is None or not row[1]:
        return []
    key, n_docs, total = int(row[0]), int(row[1]), float(row[2])
    low, high = key << _SEQ_BITS, (key << _SEQ_BITS) | _SEQ_MASK
    known = dict(
        db.execute(
            f"SELECT term, df FROM search_terms WHERE session = ?"
            f" AND term IN ({','.join('?' * len(terms))})",
            (key, *terms),
        ).fetchall()
    )
    plan = plan_search(terms, [int(known.get(t, 0)) for t in terms], n_docs, total, limit=limit)
    quoted = [f'"{t}"' for t in terms]

    def match(query: str, *, since: int = 0, newest: int | None = None, roles: bool) -> set[int]:
        """The rowids (of this session's entries, from seq ``since`` on) that match ``query``."""
        sql = "SELECT s.rowid AS id FROM search s"
        args: list[Any] = []
        if roles and role is not None:
            sql += " JOIN messages m ON m.session_id = ? AND m.seq = s.rowid - ? AND m.role = ?"
            args += [session_id, low, role]
        sql += " WHERE s.search MATCH ? AND s.rowid BETWEEN ? AND ?"
        args += [query, low | since, high]
        if newest is not None:
            sql += " ORDER BY s.rowid DESC LIMIT ?"
            args.append(newest)
        # One string per list: far cheaper than a Python row per posting.
        (ids,) = db.execute(f"SELECT group_concat(id) FROM ({sql})", args).fetchone()
        return set(map(int, ids.split(","))) if ids else set()

    holders: dict[int, set[int]] = {}
    found: list[set[int]] = []  # rowids, per read
    for read in plan.reads:
        query = " AND ".join(quoted[i] for i in read.terms)
        if len(read.terms) == 1:
            got = match(query, newest=read.limit, roles=True)
        else:
            # An intersection read whole is small, and FTS5 walks it backwards slowly.
            got = match(query, roles=True)
            if read.limit is not None and len(got) > read.limit:
                got = set(sorted(got)[-read.limit :])
        found.append(got)
        for i in read.terms:
            holders.setdefault(i, set()).update(got)
    candidates: set[int] = set().union(*found)
    if not candidates:
        return []
    # Which candidates hold the terms not read whole: FTS5 intersects the lists (the whole lists
    # over the session, the newest of one term from its oldest message read on). Those found
    # by a conjunction are not probed: the conjunctions of more terms, read first, found them.
    any_whole = " OR ".join(quoted[i] for i in plan.whole)
    newest = [(r, got) for r, got in zip(plan.reads, found, strict=True) if r.limit and got]
    for i in plan.probes:
        hold: set[int] = set()
        if any_whole:
            hold |= match(f"{quoted[i]} AND ({any_whole})", roles=False)
        for r, got in newest:
            if len(r.terms) == 1 and i not in r.terms:
                query = f"{quoted[i]} AND {quoted[r.terms[0]]}"
                hold |= match(query, since=min(got) & _SEQ_MASK, roles=False)
        holders.setdefault(i, set()).update(hold & candidates)
    chosen = choose(plan, holders, limit)  # rowids: in one session, in the order of the seqs
    # Each entry with whether its message is a tool's traffic (search_plan.tool_message).
    entries = _rows_in(
        db,
        "SELECT c.id, c.c0, c.c1, CASE m.role WHEN 'tool' THEN 1"
        " WHEN 'assistant' THEN json_extract(m.body, '$.tool_calls[0]') IS NOT NULL ELSE 0 END"
        " FROM search_content c JOIN messages m ON m.session_id = ? AND m.seq = c.id - ?"
        " WHERE c.id IN ({})",
        (session_id, low),
        chosen,
    )
    index = {t: i for i, t in enumerate(terms)}
    best = rank(
        plan,
        (
            Candidate(int(rowid) & _SEQ_MASK, *stored_counts(index, own, context), own, bool(tool))
            for rowid, own, context, tool in entries
        ),
        limit,
    )
    if not best:
        return []
    sql = (
        f"SELECT {_MESSAGE_COLUMNS}, created_at FROM messages"
        " WHERE session_id = ? AND seq IN ({})"
    )
    rows = {r[0]: r for r in _rows_in(db, sql, (session_id,), [seq for seq, _ in best])}
    return [(rows[seq], value) for seq, value in best if seq in rows]


def _rows_in(
    db: sqlite3.Connection, sql: str, args: Sequence[Any], values: Sequence[int]
) -> list[_Row]:
    """``sql`` (its ``IN ({})`` filled with placeholders) run for ``values`` in slices that stay
    under SQLite's limit on parameters."""
    out: list[_Row] = []
    for i in range(0, len(values), 500):
        part = values[i : i + 500]
        out += db.execute(sql.format(",".join("?" * len(part))), (*args, *part)).fetchall()
    return out


def backfill_search(db: sqlite3.Connection) -> None:
    """Migration 1 -> 2: index what a search may find of the stored messages (the current
    epoch's, not cleared or deleted; what an earlier clear left archived is not brought back).
    The counts come with migration 4 -> 5 (:func:`_backfill_stats`)."""
    rows = db.execute(
        f"SELECT m.session_id, {_PREFIXED_COLUMNS} FROM messages m"
        " JOIN sessions s ON s.session_id = m.session_id AND s.epoch = m.epoch"
        " WHERE m.kind = 'message' AND (m.archived IS NULL OR m.archived NOT IN"
        " ('cleared', 'deleted')) ORDER BY m.session_id, m.seq"
    ).fetchall()
    by_session: dict[str, list[Message]] = {}
    for session_id, *row in rows:
        by_session.setdefault(session_id, []).extend(_messages([tuple(row)]))
    for session_id, messages in by_session.items():
        terms = with_context([own_terms(m) for m in messages], None)
        docs = [(m.seq or 0, t) for m, t in zip(messages, terms, strict=True) if t is not None]
        _index(db, session_id, docs, stats=False)


def _backfill_stats(db: sqlite3.Connection) -> None:
    """Migration 4 -> 5: each session's counts, from the entries in the search index."""
    keys = [int(k) for (k,) in db.execute("SELECT id FROM search_sessions ORDER BY id")]
    for key in keys:
        low = key << _SEQ_BITS
        docs: list[Indexed] = [
            (own.split(), context.split())
            for own, context in db.execute(
                "SELECT terms, context FROM search WHERE rowid BETWEEN ? AND ?",
                (low, low | _SEQ_MASK),
            )
        ]
        if docs:
            _count_terms(db, key, docs, 1)


# -- decoding (on the event loop, after the transaction) ----------------------------------------


def _messages(rows: Iterable[_Row]) -> list[Message]:
    return [decode_row(row) for row in rows]


def _entry(row: _Row) -> MetadataEntry:
    namespace, key, value, version, deleted, updated_at = row
    return metadata_entry(
        namespace,
        key,
        value=load_value(value),
        version=version,
        deleted=deleted,
        updated_at=updated_at,
    )
