"""SQLite memory backend (the embedded default): one database file in WAL mode, via aiosqlite.

Every write is one ``BEGIN IMMEDIATE`` transaction, so it holds SQLite's single write lock from
its first read to its commit: sequence numbers, compare-and-set checks and leases are decided
under that lock and stay correct when several processes share the file. Reads that must agree
with each other (``snapshot``) run in one deferred ``BEGIN`` transaction, i.e. one WAL snapshot.

One instance owns one connection; an ``asyncio.Lock`` keeps its transactions from interleaving.
The connection is opened, and the schema created, on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from ..messages import ArchiveReason, Message
from ..services import (
    SUMMARY_NAMESPACE,
    LeaseToken,
    MetadataEntry,
    SessionInfo,
    Snapshot,
)
from ._common import (
    TokenCounter,
    body_of,
    check_limit,
    check_ttl,
    message_from_row,
    new_lease_token,
    select_trim,
    to_datetime,
    tokens_of,
)

__all__ = ["SCHEMA_VERSION", "SQLiteMemory"]

#: Stored in ``PRAGMA user_version``; bump it and add a step to ``_MIGRATIONS`` on schema changes.
SCHEMA_VERSION = 1

_MIGRATIONS: dict[int, str] = {
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
}

_MESSAGE_COLUMNS = "seq, epoch, role, kind, body, tokens, archived"


class SQLiteMemory:
    """A :class:`~host_stub.services.MemoryService` on one SQLite file.

    ``path`` may be ``":memory:"`` (private to this instance). ``busy_timeout_s`` is how long a
    transaction waits for another connection's write lock before failing with
    ``sqlite3.OperationalError: database is locked``.
    """

    def __init__(
        self,
        path: str | Path,
        token_counter: TokenCounter,
        *,
        busy_timeout_s: float = 10.0,
    ) -> None:
        self.path = str(path)
        self._count = token_counter
        self._busy_timeout_ms = max(0, int(busy_timeout_s * 1000))
        self._lock = asyncio.Lock()
        self._db: aiosqlite.Connection | None = None
        self._closed = False

    # -- connection and transactions ----------------------------------------------------------

    async def _connection(self) -> aiosqlite.Connection:
        if self._closed:
            raise RuntimeError(f"SQLiteMemory({self.path!r}) is closed")
        if self._db is not None:
            return self._db
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        db = await aiosqlite.connect(
            self.path, isolation_level=None, timeout=self._busy_timeout_ms / 1000
        )
        try:
            db.row_factory = sqlite3.Row
            await db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            await self._set_wal(db)
            await db.execute("PRAGMA synchronous = NORMAL")
            await self._migrate(db)
        except BaseException:
            await db.close()
            raise
        self._db = db
        return db

    async def _set_wal(self, db: aiosqlite.Connection) -> None:
        # Switching a fresh file to WAL takes an exclusive lock that may not wait on the busy
        # handler when several processes open the file at once; retry within the busy timeout.
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        while True:
            try:
                await db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.01)

    async def _migrate(self, db: aiosqlite.Connection) -> None:
        await db.execute("BEGIN IMMEDIATE")
        try:
            version = await _scalar(db, "PRAGMA user_version")
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path}: schema version {version} is newer than this code "
                    f"supports ({SCHEMA_VERSION})"
                )
            while version < SCHEMA_VERSION:
                for statement in _MIGRATIONS[version].split(";"):
                    if statement.strip():
                        await db.execute(statement)
                version += 1
            await db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            await db.rollback()
            raise
        await db.commit()

    @contextlib.asynccontextmanager
    async def _tx(self, *, write: bool) -> AsyncIterator[aiosqlite.Connection]:
        """One transaction: ``BEGIN IMMEDIATE`` for writes, a deferred ``BEGIN`` for reads."""
        async with self._lock:
            db = await self._connection()
            try:
                await db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                yield db
                await db.commit()
            except BaseException:
                # Also on cancellation: the worker thread runs statements in order, so this
                # rollback runs after whatever statement was still in flight and before the next
                # transaction's BEGIN (a no-op when no transaction is open).
                with contextlib.suppress(Exception):
                    await db.rollback()
                raise

    # -- messages -----------------------------------------------------------------------------

    async def append(self, session_id: str, messages: Sequence[Message]) -> list[Message]:
        if not messages:
            return []
        counted = [(m, tokens_of(m, self._count)) for m in messages]
        async with self._tx(write=True) as db:
            now = time.time()
            await db.execute(
                "INSERT OR IGNORE INTO sessions (session_id, epoch, last_seq, updated_at)"
                " VALUES (?, 0, 0, ?)",
                (session_id, now),
            )
            row = await _one(
                db, "SELECT epoch, last_seq FROM sessions WHERE session_id = ?", (session_id,)
            )
            assert row is not None
            epoch, seq = row["epoch"], row["last_seq"]
            out: list[Message] = []
            rows = []
            for message, tokens in counted:
                seq += 1
                body = body_of(message)
                rows.append((session_id, seq, epoch, message.role, message.kind, body, tokens, now))
                out.append(
                    message_from_row(
                        role=message.role,
                        kind=message.kind,
                        body=body,
                        seq=seq,
                        epoch=epoch,
                        tokens=tokens,
                        archived=None,
                    )
                )
            await db.executemany(
                "INSERT INTO messages (session_id, seq, epoch, role, kind, body, tokens,"
                " archived, archived_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?)",
                rows,
            )
            await db.execute(
                "UPDATE sessions SET last_seq = ?, updated_at = ? WHERE session_id = ?",
                (seq, now, session_id),
            )
        return out

    async def get_history(self, session_id: str, limit: int | None = None) -> list[Message]:
        check_limit(limit)
        async with self._tx(write=False) as db:
            return await _messages(db, session_id, archived=False, limit=limit)

    async def get_archived(
        self, session_id: str, *, epoch: int | None = None, limit: int | None = None
    ) -> list[Message]:
        check_limit(limit)
        async with self._tx(write=False) as db:
            return await _messages(db, session_id, archived=True, epoch=epoch, limit=limit)

    async def snapshot(self, session_id: str, namespace: str = SUMMARY_NAMESPACE) -> Snapshot:
        async with self._tx(write=False) as db:
            messages = await _messages(db, session_id, archived=False)
            record = await _metadata(db, namespace, session_id)
            epoch = await _epoch(db, session_id)
        return Snapshot(session_id=session_id, epoch=epoch, messages=messages, record=record)

    async def trim_history(
        self,
        session_id: str,
        keep_recent: int | None = None,
        up_to_seq: int | None = None,
        reason: ArchiveReason = "window",
    ) -> list[int]:
        select_trim([], keep_recent, up_to_seq)  # argument errors before any transaction
        async with self._tx(write=True) as db:
            rows = await db.execute_fetchall(
                "SELECT seq, kind, role FROM messages WHERE session_id = ? AND archived IS NULL"
                " ORDER BY seq",
                (session_id,),
            )
            seqs = select_trim(
                [(r["seq"], r["kind"], r["role"]) for r in rows], keep_recent, up_to_seq
            )
            await _archive(db, session_id, seqs, reason, time.time())
        return seqs

    async def commit_compression(
        self,
        session_id: str,
        record: dict[str, Any],
        expected_version: int,
        archive_through_seq: int,
        *,
        epoch: int,
        namespace: str = SUMMARY_NAMESPACE,
    ) -> bool:
        value = _dump_value(record)
        async with self._tx(write=True) as db:
            if await _version(db, namespace, session_id) != expected_version:
                return False
            if await _epoch(db, session_id) != epoch:
                return False
            now = time.time()
            await _write_metadata(db, namespace, session_id, value, now)
            rows = await db.execute_fetchall(
                "SELECT seq FROM messages WHERE session_id = ? AND archived IS NULL"
                " AND seq <= ? AND NOT (role = 'system' AND kind = 'message') ORDER BY seq",
                (session_id, archive_through_seq),
            )
            await _archive(db, session_id, [r["seq"] for r in rows], "summarized", now)
        return True

    # -- metadata -----------------------------------------------------------------------------

    async def get_metadata(self, namespace: str, key: str) -> MetadataEntry | None:
        async with self._tx(write=False) as db:
            return await _metadata(db, namespace, key)

    async def save_metadata(
        self,
        namespace: str,
        key: str,
        value: dict[str, Any],
        expected_version: int | None = None,
    ) -> int | None:
        if value is None:
            raise ValueError("save_metadata needs a value; use delete_metadata to delete")
        text = _dump_value(value)
        async with self._tx(write=True) as db:
            if expected_version is not None:
                if await _version(db, namespace, key) != expected_version:
                    return None
            return await _write_metadata(db, namespace, key, text, time.time())

    async def delete_metadata(
        self, namespace: str, key: str, expected_version: int | None = None
    ) -> int | None:
        async with self._tx(write=True) as db:
            if expected_version is not None:
                if await _version(db, namespace, key) != expected_version:
                    return None
            return await _write_metadata(db, namespace, key, None, time.time())

    async def list_metadata(self, namespace: str) -> list[MetadataEntry]:
        async with self._tx(write=False) as db:
            rows = await db.execute_fetchall(
                "SELECT namespace, key, value, version, deleted, updated_at FROM metadata"
                " WHERE namespace = ? AND deleted = 0 ORDER BY key",
                (namespace,),
            )
        return [_entry(r) for r in rows]

    # -- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, name: str, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        async with self._tx(write=True) as db:
            now = time.time()
            row = await _one(db, "SELECT expires_at FROM leases WHERE name = ?", (name,))
            if row is not None and row["expires_at"] > now:
                return None
            lease = LeaseToken(name=name, token=new_lease_token(), expires_at=now + ttl_s)
            await db.execute(
                "INSERT INTO leases (name, token, expires_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET token = excluded.token,"
                " expires_at = excluded.expires_at",
                (lease.name, lease.token, lease.expires_at),
            )
        return lease

    async def release_lease(self, lease: LeaseToken) -> bool:
        async with self._tx(write=True) as db:
            cursor = await db.execute(
                "DELETE FROM leases WHERE name = ? AND token = ?", (lease.name, lease.token)
            )
            return cursor.rowcount > 0

    # -- sessions -----------------------------------------------------------------------------

    async def get_epoch(self, session_id: str) -> int:
        async with self._tx(write=False) as db:
            return await _epoch(db, session_id)

    async def clear(self, session_id: str, types: Sequence[str] | None = None) -> int:
        async with self._tx(write=True) as db:
            now = time.time()
            await db.execute(
                "INSERT INTO sessions (session_id, epoch, last_seq, updated_at) VALUES (?, 1, 0, ?)"
                " ON CONFLICT (session_id) DO UPDATE SET epoch = epoch + 1,"
                " updated_at = excluded.updated_at",
                (session_id, now),
            )
            epoch = await _epoch(db, session_id)
            if types is None or "history" in types:
                await db.execute(
                    "UPDATE messages SET archived = 'cleared', archived_at = ?"
                    " WHERE session_id = ? AND archived IS NULL",
                    (now, session_id),
                )
            if types is None:
                rows = await db.execute_fetchall(
                    "SELECT namespace FROM metadata WHERE key = ? ORDER BY namespace",
                    (session_id,),
                )
                namespaces = [r["namespace"] for r in rows]
            else:
                namespaces = [t for t in dict.fromkeys(types) if t != "history"]
            for namespace in namespaces:
                await _write_metadata(db, namespace, session_id, None, now)
        return epoch

    async def delete_messages(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        async with self._tx(write=True) as db:
            wanted = sorted(set(seqs))
            rows = await db.execute_fetchall(
                "SELECT seq FROM messages WHERE session_id = ? AND archived IS NOT 'deleted'"
                f" AND seq IN ({','.join('?' * len(wanted))}) ORDER BY seq",
                (session_id, *wanted),
            ) if wanted else []
            found = [r["seq"] for r in rows]
            await _archive(db, session_id, found, "deleted", time.time())
        return found

    async def forget(self, session_id: str) -> None:
        async with self._tx(write=True) as db:
            await db.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            await db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            await db.execute("DELETE FROM metadata WHERE key = ?", (session_id,))

    async def list_sessions(self) -> list[SessionInfo]:
        async with self._tx(write=False) as db:
            rows = await db.execute_fetchall(
                "SELECT s.session_id, s.epoch, s.last_seq, s.updated_at,"
                " COUNT(m.seq) - COUNT(m.archived) AS active,"
                " COUNT(m.archived) AS archived"
                " FROM sessions s LEFT JOIN messages m ON m.session_id = s.session_id"
                " GROUP BY s.session_id ORDER BY s.session_id"
            )
        return [
            SessionInfo(
                session_id=r["session_id"],
                epoch=r["epoch"],
                active=r["active"],
                archived=r["archived"],
                last_seq=r["last_seq"],
                updated_at=to_datetime(r["updated_at"]),
            )
            for r in rows
        ]

    async def close(self) -> None:
        """Close the connection; later calls raise ``RuntimeError``. Safe to call twice."""
        async with self._lock:
            self._closed = True
            db, self._db = self._db, None
            if db is not None:
                await db.close()


# -- SQL helpers (inside a transaction) -------------------------------------------------------


async def _one(
    db: aiosqlite.Connection, sql: str, params: Iterable[Any] = ()
) -> sqlite3.Row | None:
    async with db.execute(sql, tuple(params)) as cursor:
        return await cursor.fetchone()


async def _scalar(db: aiosqlite.Connection, sql: str, params: Iterable[Any] = ()) -> Any:
    row = await _one(db, sql, params)
    return None if row is None else row[0]


async def _epoch(db: aiosqlite.Connection, session_id: str) -> int:
    epoch = await _scalar(db, "SELECT epoch FROM sessions WHERE session_id = ?", (session_id,))
    return 0 if epoch is None else int(epoch)


async def _version(db: aiosqlite.Connection, namespace: str, key: str) -> int:
    version = await _scalar(
        db, "SELECT version FROM metadata WHERE namespace = ? AND key = ?", (namespace, key)
    )
    return 0 if version is None else int(version)


async def _metadata(db: aiosqlite.Connection, namespace: str, key: str) -> MetadataEntry | None:
    row = await _one(
        db,
        "SELECT namespace, key, value, version, deleted, updated_at FROM metadata"
        " WHERE namespace = ? AND key = ?",
        (namespace, key),
    )
    return None if row is None else _entry(row)


async def _write_metadata(
    db: aiosqlite.Connection, namespace: str, key: str, value: str | None, now: float
) -> int:
    """Upsert the value (``None`` = tombstone), one version up; return the new version."""
    await db.execute(
        "INSERT INTO metadata (namespace, key, value, version, deleted, updated_at)"
        " VALUES (?, ?, ?, 1, ?, ?)"
        " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
        " version = version + 1, deleted = excluded.deleted, updated_at = excluded.updated_at",
        (namespace, key, value, int(value is None), now),
    )
    return await _version(db, namespace, key)


async def _archive(
    db: aiosqlite.Connection,
    session_id: str,
    seqs: Sequence[int],
    reason: ArchiveReason,
    now: float,
) -> None:
    if not seqs:
        return
    await db.executemany(
        "UPDATE messages SET archived = ?, archived_at = ? WHERE session_id = ? AND seq = ?",
        [(reason, now, session_id, seq) for seq in seqs],
    )
    await db.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (now, session_id))


async def _messages(
    db: aiosqlite.Connection,
    session_id: str,
    *,
    archived: bool,
    epoch: int | None = None,
    limit: int | None = None,
) -> list[Message]:
    where = "session_id = ? AND archived IS " + ("NOT NULL" if archived else "NULL")
    params: list[Any] = [session_id]
    if epoch is not None:
        where += " AND epoch = ?"
        params.append(epoch)
    if limit is None:
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE {where} ORDER BY seq"
    else:
        sql = (
            f"SELECT * FROM (SELECT {_MESSAGE_COLUMNS} FROM messages WHERE {where}"
            " ORDER BY seq DESC LIMIT ?) ORDER BY seq"
        )
        params.append(limit)
    rows = await db.execute_fetchall(sql, params)
    return [
        message_from_row(
            role=r["role"],
            kind=r["kind"],
            body=r["body"],
            seq=r["seq"],
            epoch=r["epoch"],
            tokens=r["tokens"],
            archived=r["archived"],
        )
        for r in rows
    ]


def _entry(row: sqlite3.Row) -> MetadataEntry:
    return MetadataEntry(
        namespace=row["namespace"],
        key=row["key"],
        value=None if row["value"] is None else json.loads(row["value"]),
        version=row["version"],
        deleted=bool(row["deleted"]),
        updated_at=to_datetime(row["updated_at"]),
    )


def _dump_value(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
