"""SQL helpers of the store, each run inside a transaction or on one connection: indexing,
metadata writes, archiving and message reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...messages import ArchiveReason, Message
from ...services import (
    MetadataEntry,
)
from ..search_plan import (
    Indexed,
    doc_length,
    own_terms,
    with_context,
)
from .connection import _Connection
from .rows import _MESSAGE_COLUMNS, _NOW, _entry, _rows_to_messages
from .schema import _CONVERT_BATCH, _LEGACY_TSVECTOR
from .search import _blocks, _doc_terms, _document_frequencies, _legacy_entry, _signed, entry_of


class _Statements(_Connection):
    # -- SQL helpers (inside a transaction or on one connection) ------------------------------

    async def backfill_search(self, conn: Any) -> None:
        """Migration 1 -> 2: index what a search may find of the stored messages (the current
        epoch's, not cleared or deleted; what an earlier clear left archived stays out)."""
        rows = await conn.fetch(
            self.sql(
                "SELECT m.session_id, m.seq, m.epoch, m.role, m.kind, m.body, m.tokens,"
                " m.archived FROM {p}messages m JOIN {p}sessions s"
                " ON s.session_id = m.session_id AND s.epoch = m.epoch"
                " WHERE m.kind = 'message' AND (m.archived IS NULL OR m.archived NOT IN"
                " ('cleared', 'deleted'))"
            )
        )
        by_session: dict[str, list[Message]] = {}
        for r, message in zip(rows, _rows_to_messages(rows), strict=True):
            by_session.setdefault(r["session_id"], []).append(message)
        updates = []
        for session_id, messages in by_session.items():
            messages.sort(key=lambda m: m.seq or 0)
            terms = with_context([own_terms(m) for m in messages], None)
            for message, t in zip(messages, terms, strict=True):
                if t is not None:
                    updates.append((session_id, message.seq, " ".join(t[0]), " ".join(t[1])))
        await conn.executemany(
            self.sql(
                f"UPDATE {{p}}messages SET search = {_LEGACY_TSVECTOR.format(own='$3', lent='$4')}"
                " WHERE session_id = $1 AND seq = $2"
            ),
            updates,
        )

    async def _convert_search(self, conn: Any, *, legacy: bool) -> None:
        """Migrations to 5: the stored entries move to ``search_entries`` and
        ``search_postings`` (``legacy``: from schema 2-3's ``messages.search``, plain terms;
        otherwise from schema 4's ``search_docs``, terms under the session's key), the counts
        are counted again with the roles' terms, and the old column, table and GIN indexes
        go."""
        await conn.execute(self.sql("DELETE FROM {p}search_terms"))
        await conn.execute(self.sql("UPDATE {p}sessions SET search_docs = 0, search_length = 0"))
        source = self.sql(
            "SELECT seq, role, search::text AS v FROM {p}messages WHERE session_id = $1"
            " AND search IS NOT NULL AND seq > $2 ORDER BY seq LIMIT $3"
            if legacy
            else "SELECT seq, role, search::text AS v FROM {p}search_docs"
            " WHERE search_key = $1 AND seq > $2 ORDER BY seq LIMIT $3"
        )
        sessions = await conn.fetch(self.sql("SELECT session_id, search_key FROM {p}sessions"))
        for session in sessions:
            session_id, key, last = session["session_id"], int(session["search_key"]), 0
            while True:
                owner = session_id if legacy else key
                rows = await conn.fetch(source, owner, last, _CONVERT_BATCH)
                if not rows:
                    break
                docs = [
                    (
                        int(r["seq"]),
                        r["role"],
                        _legacy_entry(r["v"]) if legacy else entry_of(r["v"], key),
                    )
                    for r in rows
                ]
                await self._index(conn, session_id, key, docs)
                last = docs[-1][0]
        await conn.execute(self.sql("DROP TABLE IF EXISTS {p}search_docs"))
        await conn.execute(self.sql("DROP INDEX IF EXISTS {p}messages_search"))
        await conn.execute(self.sql("ALTER TABLE {p}messages DROP COLUMN IF EXISTS search"))
        # The planner's statistics now, not at autovacuum's next visit: without them it joins
        # the postings the slow way round.
        await conn.execute(
            self.sql("ANALYZE {p}search_postings, {p}search_terms, {p}search_entries")
        )

    async def _index(
        self, conn: Any, session_id: str, key: int, docs: Sequence[tuple[int, str, Indexed]]
    ) -> None:
        """Index ``(seq, role, entry)`` of the session with search key ``key``: its entries,
        the postings of their terms and roles, the counts. One statement (in the transaction
        that writes the messages, the session's row locked)."""
        if not docs:
            return
        dfs = _document_frequencies(docs)
        blocks = _blocks((term, seq) for seq, role, t in docs for term in _doc_terms(role, t))
        names = sorted(dfs)
        await conn.execute(
            self.sql(
                "WITH e AS (INSERT INTO {p}search_entries (search_key, seq, terms, context)"
                " SELECT $1, u.seq, u.terms, u.context"
                " FROM unnest($2::bigint[], $3::text[], $4::text[]) AS u(seq, terms, context)),"
                " t AS (INSERT INTO {p}search_terms AS x (search_key, term, df)"
                " SELECT $1, u.term, u.df FROM unnest($5::text[], $6::bigint[]) AS u(term, df)"
                " ON CONFLICT (search_key, term) DO UPDATE SET df = x.df + excluded.df"
                " RETURNING x.term, x.id),"
                " p AS (INSERT INTO {p}search_postings AS b (term_id, block, bits)"
                " SELECT t.id, u.block, u.bits"
                " FROM unnest($7::text[], $8::bigint[], $9::bigint[]) AS u(term, block, bits)"
                " JOIN t ON t.term = u.term"
                " ON CONFLICT (term_id, block) DO UPDATE SET bits = b.bits | excluded.bits)"
                " UPDATE {p}sessions SET search_docs = search_docs + $10,"
                " search_length = search_length + $11 WHERE session_id = $12"
            ),
            key,
            [seq for seq, _, _ in docs],
            [" ".join(own) for _, _, (own, _) in docs],
            [" ".join(lent) for _, _, (_, lent) in docs],
            names,
            [dfs[t] for t in names],
            [term for term, _ in blocks],
            [block for _, block in blocks],
            [_signed(bits) for bits in blocks.values()],
            len(docs),
            sum(doc_length(t) for _, _, t in docs),
            session_id,
        )

    async def _unindex(
        self, conn: Any, session_id: str, key: int, docs: Sequence[tuple[int, str, Indexed]]
    ) -> None:
        """Take ``(seq, role, entry)`` (their entries already deleted) out of the postings and
        the counts of the session with search key ``key`` (in the transaction that deletes
        them, the session's row locked)."""
        if not docs:
            return
        dfs = _document_frequencies(docs)
        blocks = _blocks((term, seq) for seq, role, t in docs for term in _doc_terms(role, t))
        names = sorted(dfs)
        # A block left without postings goes; the others lose the deleted seqs' bits.
        await conn.execute(
            self.sql(
                "WITH u AS (SELECT t.id, u.block, u.bits"
                " FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS u(term, block, bits)"
                " JOIN {p}search_terms t ON t.search_key = $1 AND t.term = u.term),"
                " d AS (DELETE FROM {p}search_postings b USING u"
                " WHERE b.term_id = u.id AND b.block = u.block AND b.bits & ~u.bits = 0)"
                " UPDATE {p}search_postings b SET bits = b.bits & ~u.bits FROM u"
                " WHERE b.term_id = u.id AND b.block = u.block AND b.bits & ~u.bits <> 0"
            ),
            key,
            [term for term, _ in blocks],
            [block for _, block in blocks],
            [_signed(bits) for bits in blocks.values()],
        )
        await conn.execute(
            self.sql(
                "WITH t AS (UPDATE {p}search_terms AS t SET df = t.df - u.df"
                " FROM unnest($2::text[], $3::bigint[]) AS u(term, df)"
                " WHERE t.search_key = $1 AND t.term = u.term)"
                " UPDATE {p}sessions SET search_docs = search_docs - $4,"
                " search_length = search_length - $5 WHERE session_id = $6"
            ),
            key,
            names,
            [dfs[t] for t in names],
            len(docs),
            sum(doc_length(t) for _, _, t in docs),
            session_id,
        )
        await conn.execute(
            self.sql(
                "DELETE FROM {p}search_terms WHERE search_key = $1"
                " AND term = ANY($2::text[]) AND df <= 0"
            ),
            key,
            names,
        )

    async def _drop_search(self, conn: Any, key: int) -> None:
        """Remove every entry, posting and count of the session with search key ``key`` (its
        row's totals are the caller's)."""
        # The ids as an array: with a subquery the planner may hash-join all the postings.
        await conn.execute(
            self.sql(
                "DELETE FROM {p}search_postings WHERE term_id ="
                " ANY(ARRAY(SELECT id FROM {p}search_terms WHERE search_key = $1))"
            ),
            key,
        )
        for table in ("search_entries", "search_terms"):
            await conn.execute(self.sql(f"DELETE FROM {{p}}{table} WHERE search_key = $1"), key)

    async def _epoch(self, conn: Any, session_id: str) -> int:
        epoch = await conn.fetchval(
            self.sql("SELECT epoch FROM {p}sessions WHERE session_id = $1"), session_id
        )
        return 0 if epoch is None else int(epoch)

    async def _metadata(self, conn: Any, namespace: str, key: str) -> MetadataEntry | None:
        row = await conn.fetchrow(
            self.sql(
                "SELECT namespace, key, value, version, deleted, updated_at FROM {p}metadata"
                " WHERE namespace = $1 AND key = $2"
            ),
            namespace,
            key,
        )
        return None if row is None else _entry(row)

    async def _write_metadata(
        self,
        conn: Any,
        namespace: str,
        key: str,
        value: str | None,
        expected_version: int | None,
    ) -> int | None:
        """Write the value (``None`` = tombstone) one version up and return the new version, or
        ``None`` if the entry is not at ``expected_version`` (0 = never written). The check and
        the write are one statement, so concurrent writers with the same expectation get one
        winner."""
        deleted = value is None
        if expected_version is None:
            sql = (
                "INSERT INTO {p}metadata AS m (namespace, key, value, version, deleted, updated_at)"
                f" VALUES ($1, $2, $3, 1, $4, {_NOW})"
                " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
                " version = m.version + 1, deleted = excluded.deleted,"
                " updated_at = excluded.updated_at"
                " RETURNING version"
            )
            args: tuple[Any, ...] = (namespace, key, value, deleted)
        elif expected_version == 0:
            sql = (
                "INSERT INTO {p}metadata (namespace, key, value, version, deleted, updated_at)"
                f" VALUES ($1, $2, $3, 1, $4, {_NOW})"
                " ON CONFLICT (namespace, key) DO NOTHING RETURNING version"
            )
            args = (namespace, key, value, deleted)
        else:
            sql = (
                "UPDATE {p}metadata SET value = $3, version = version + 1, deleted = $4,"
                f" updated_at = {_NOW}"
                " WHERE namespace = $1 AND key = $2 AND version = $5 RETURNING version"
            )
            args = (namespace, key, value, deleted, int(expected_version))
        version = await conn.fetchval(self.sql(sql), *args)
        return None if version is None else int(version)

    async def _archive(
        self, conn: Any, session_id: str, seqs: Sequence[int], reason: ArchiveReason
    ) -> None:
        if not seqs:
            return
        await conn.execute(
            self.sql(
                f"UPDATE {{p}}messages SET archived = $3, archived_at = {_NOW}"
                " WHERE session_id = $1 AND seq = ANY($2::bigint[])"
            ),
            session_id,
            list(seqs),
            reason,
        )
        await self._touch(conn, session_id)

    async def _touch(self, conn: Any, session_id: str) -> None:
        await conn.execute(
            self.sql(f"UPDATE {{p}}sessions SET updated_at = {_NOW} WHERE session_id = $1"),
            session_id,
        )

    async def _messages(
        self,
        conn: Any,
        session_id: str,
        *,
        archived: bool,
        epoch: int | None = None,
        limit: int | None = None,
    ) -> list[Message]:
        where = "session_id = $1 AND archived IS " + ("NOT NULL" if archived else "NULL")
        params: list[Any] = [session_id]
        if epoch is not None:
            params.append(int(epoch))
            where += f" AND epoch = ${len(params)}"
        if limit is None:
            sql = f"SELECT {_MESSAGE_COLUMNS} FROM {{p}}messages WHERE {where} ORDER BY seq"
        else:
            params.append(int(limit))
            sql = (
                f"SELECT * FROM (SELECT {_MESSAGE_COLUMNS} FROM {{p}}messages WHERE {where}"
                f" ORDER BY seq DESC LIMIT ${len(params)}) AS newest ORDER BY seq"
            )
        rows = await conn.fetch(self.sql(sql), *params)
        return _rows_to_messages(rows)
