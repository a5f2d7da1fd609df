"""The SQLite store's schema: its version, the migration steps, and the data step that indexes the
messages a schema without the index held."""

from __future__ import annotations

import os
import sqlite3

from ...messages import Message
from ..search_plan import (
    Indexed,
    own_terms,
    with_context,
)
from .rows import _PREFIXED_COLUMNS, _SEQ_BITS, _SEQ_MASK, _messages
from .search import _count_terms, _index
from .statements import _scalar

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


def _holds_store(db: sqlite3.Connection) -> bool:
    """Whether the database is a store (of any schema version): its version is set by the
    first migration, in the transaction that makes the tables. Reads only."""
    return bool(_scalar(db, "PRAGMA user_version"))


def _is_empty(path: str) -> bool:
    try:
        return os.path.getsize(path) == 0
    except OSError:
        return False


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
