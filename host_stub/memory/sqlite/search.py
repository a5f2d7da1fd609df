"""The search index (FTS5): indexing, catching up, unindexing and the search itself."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..search_plan import (
    CONTEXT_SPAN,
    Candidate,
    Indexed,
    choose,
    distinct_terms,
    doc_length,
    lend_context,
    own_terms,
    plan_search,
    rank,
    stored_counts,
)
from .rows import _MESSAGE_COLUMNS, _SEQ_BITS, _SEQ_MASK, _messages, _Row
from .statements import _one, _scalar


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
