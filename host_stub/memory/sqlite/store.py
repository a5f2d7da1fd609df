"""The store: :class:`SQLiteMemory`, each operation one transaction on its worker thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...messages import ArchiveReason, Message
from ...services import (
    SUMMARY_NAMESPACE,
    LeaseToken,
    MetadataEntry,
    SearchHit,
    SessionInfo,
    Snapshot,
)
from ...session_ids import check_session_id
from ..common import (
    DecodedRows,
    StoreNotFound,
    TokenCounter,
    body_of,
    check_limit,
    check_ttl,
    copy_message,
    dump_value,
    message_from_row,
    new_lease_token,
    select_trim,
    to_datetime,
    tokens_of,
)
from ..search_plan import (
    query_terms,
)
from .rows import (
    _METADATA_COLUMNS,
    _PREFIXED_COLUMNS,
    _SEQ_BITS,
    _T,
    _entry,
    _Given,
    _Job,
    _messages,
    _Row,
    _SnapshotRows,
)
from .schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    _backfill_stats,
    _holds_store,
    _is_empty,
    backfill_search,
)
from .search import _catch_up, _search, _search_key, _unindex
from .statements import (
    _append_rows,
    _archive,
    _check_fence,
    _epoch,
    _metadata_row,
    _numbered,
    _one,
    _rows_written,
    _scalar,
    _version,
    _write_metadata,
    message_rows,
)
from .worker import _ActiveReads, _Busy, _Checkpointer, _is_busy

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
