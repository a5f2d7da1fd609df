"""SQL helpers (worker thread, inside a transaction): reads, writes and archiving of messages and
metadata."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ...messages import ArchiveReason, Message
from ...services import (
    LeaseLost,
    LeaseToken,
)
from .rows import _MESSAGE_COLUMNS, _METADATA_COLUMNS, _Given, _Row, _SnapshotRows


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
