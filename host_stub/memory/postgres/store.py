"""The store: :class:`PostgresMemory`, its messages and sessions."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ...messages import ArchiveReason, Message
from ...services import (
    SUMMARY_NAMESPACE,
    LeaseToken,
    SearchHit,
    SessionInfo,
    Snapshot,
)
from ...session_ids import check_session_id
from ..common import (
    body_of,
    check_limit,
    dump_value,
    message_from_row,
    select_trim,
    to_datetime,
    tokens_of,
)
from ..search_plan import (
    CONTEXT_SPAN,
    Candidate,
    choose,
    own_terms,
    plan_search,
    query_terms,
    rank,
    stored_counts,
    with_context,
)
from .connection import _CONNECT_ERRORS
from .metadata import _MetadataAndLeases
from .rows import _MESSAGE_COLUMNS, _NOW, _PREFIXED_COLUMNS, _rows_to_messages
from .search import (
    _SEARCH_STATS,
    _entry_of_text,
    _gathered,
    _newest,
    _probes_sql,
    _reads_sql,
    _role_term,
    _seqs,
)


class PostgresMemory(_MetadataAndLeases):
    """A :class:`~host_stub.services.MemoryService` on a PostgreSQL database.

    ``schema``: the PostgreSQL schema holding the tables (created if missing); also settable as
    ``?schema=`` in the URL; ``None`` = the connection's default (usually ``public``).
    ``pool_min`` / ``pool_max``: connection pool size. ``command_timeout``: seconds any statement
    (a lock wait included) or a wait for a free pooled connection may take.
    ``connect_timeout``: seconds to open one connection. With ``create=False`` only a store that
    exists is opened (migrated if older): a missing schema, or one without the store's tables,
    is :class:`~host_stub.memory.common.StoreNotFound` at first use, and nothing is made.

    Raises ``ValueError`` for a malformed URL (here, or at first use for what only asyncpg
    checks) and ``ConnectionError("<url>: cannot connect: <reason>")`` when the server cannot be
    reached or refuses the login; the password never appears in either.
    """

    def __repr__(self) -> str:
        return f"PostgresMemory({self.url!r}, schema={self.schema!r})"

    # -- messages -----------------------------------------------------------------------------

    async def append(self, session_id: str, messages: Sequence[Message]) -> list[Message]:
        check_session_id(session_id)
        if not messages:
            return []
        counted = [(m, tokens_of(m, self._count), body_of(m)) for m in messages]
        owns = [own_terms(m) for m in messages]
        n = len(counted)
        async with self._tx() as conn:
            # The upsert locks the session's row until commit: the counter is taken, and the
            # messages inserted, while no other append on this session can commit.
            row = await conn.fetchrow(
                self.sql(
                    "INSERT INTO {p}sessions AS s (session_id, epoch, last_seq, updated_at)"
                    f" VALUES ($1, 0, $2, {_NOW})"
                    " ON CONFLICT (session_id) DO UPDATE"
                    " SET last_seq = s.last_seq + excluded.last_seq,"
                    " updated_at = excluded.updated_at"
                    " RETURNING epoch, last_seq, search_key"
                ),
                session_id,
                n,
            )
            epoch, first = int(row["epoch"]), int(row["last_seq"]) - n + 1
            key = int(row["search_key"])
            previous = None
            if first > 1 and any(own is not None for own in owns):
                prev = await conn.fetch(
                    self.sql(
                        f"SELECT {_PREFIXED_COLUMNS} FROM {{p}}messages m"
                        " WHERE m.session_id = $1 AND m.seq = (SELECT max(d.seq)"
                        " FROM {p}search_entries d WHERE d.search_key = $4"
                        " AND d.seq BETWEEN $2 AND $3)"
                    ),
                    session_id,
                    max(1, first - CONTEXT_SPAN),
                    first - 1,
                    key,
                )
                previous = own_terms(_rows_to_messages(prev)[0]) if prev else None
            indexed = with_context(owns, previous)
            await conn.execute(
                self.sql(
                    "INSERT INTO {p}messages (session_id, seq, epoch, role, kind, body, tokens,"
                    " archived, archived_at, created_at)"
                    f" SELECT $1, t.seq, $2, t.role, t.kind, t.body, t.tokens, NULL, NULL, {_NOW}"
                    " FROM unnest($3::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[])"
                    " AS t(seq, role, kind, body, tokens)"
                ),
                session_id,
                epoch,
                list(range(first, first + n)),
                [m.role for m, _, _ in counted],
                [m.kind for m, _, _ in counted],
                [body for _, _, body in counted],
                [tokens for _, tokens, _ in counted],
            )
            docs = [
                (first + i, m.role, t)
                for i, ((m, _, _), t) in enumerate(zip(counted, indexed, strict=True))
                if t is not None
            ]
            await self._index(conn, session_id, key, docs)
        return [
            message_from_row(
                role=m.role,
                kind=m.kind,
                body=body,
                seq=first + i,
                epoch=epoch,
                tokens=tokens,
                archived=None,
            )
            for i, (m, tokens, body) in enumerate(counted)
        ]

    async def get_history(self, session_id: str, limit: int | None = None) -> list[Message]:
        check_limit(limit)
        async with self._conn() as conn:
            return await self._messages(conn, session_id, archived=False, limit=limit)

    async def get_archived(
        self, session_id: str, *, epoch: int | None = None, limit: int | None = None
    ) -> list[Message]:
        check_limit(limit)
        async with self._conn() as conn:
            return await self._messages(conn, session_id, archived=True, epoch=epoch, limit=limit)

    async def snapshot(self, session_id: str, namespace: str = SUMMARY_NAMESPACE) -> Snapshot:
        async with self._tx(snapshot=True) as conn:
            messages = await self._messages(conn, session_id, archived=False)
            record = await self._metadata(conn, namespace, session_id)
            epoch = await self._epoch(conn, session_id)
        return Snapshot(session_id=session_id, epoch=epoch, messages=messages, record=record)

    async def search(
        self, session_id: str, query: str, *, role: str | None = None, limit: int = 10
    ) -> list[SearchHit]:
        check_limit(limit)
        terms = query_terms(query)
        if not terms or not limit:
            return []
        asked = terms if role is None else [*terms, _role_term(role)]
        async with self._conn() as conn:
            stats = await conn.fetchrow(self.sql(_SEARCH_STATS), session_id, asked)
            if stats is None or not stats["search_docs"]:
                return []
            dfs, ids = [int(df) for df in stats["dfs"]], [int(i) for i in stats["ids"]]
            role_id = ids[len(terms)] if role is not None else None
            if role_id == 0:
                return []  # no message of that role is indexed
            key = int(stats["search_key"])
            plan = plan_search(
                terms,
                dfs[: len(terms)],
                int(stats["search_docs"]),
                float(stats["search_length"]),
                limit=limit,
            )
            sql, args = _reads_sql(plan, ids, role_id)
            got: list[set[int]] = [set() for _ in plan.reads]
            for r in await conn.fetch(self.sql(sql), *args) if sql else []:
                n = int(r["n"])
                got[n] = _newest(_seqs(r["blocks"], r["bits"]), plan.reads[n].limit)
            holders, found, probed = _gathered(plan, got)
            if not found:
                return []
            sql, args = _probes_sql(plan, ids, probed)
            for r in await conn.fetch(self.sql(sql), *args) if sql else []:
                holders.setdefault(int(r["i"]), set()).update(_seqs(r["blocks"], r["bits"]))
            chosen = choose(plan, holders, limit)
            # Each entry with whether its message is a tool's traffic (tool_message).
            entries = await conn.fetch(
                self.sql(
                    "SELECT e.seq, e.terms, e.context, CASE m.role WHEN 'tool' THEN true"
                    " WHEN 'assistant' THEN (m.body::json -> 'tool_calls' -> 0) IS NOT NULL"
                    " ELSE false END AS tool FROM {p}search_entries e"
                    " JOIN {p}messages m ON m.session_id = $3 AND m.seq = e.seq"
                    " WHERE e.search_key = $1 AND e.seq = ANY($2::bigint[])"
                ),
                key,
                chosen,
                session_id,
            )
            index = {t: i for i, t in enumerate(terms)}
            best = rank(
                plan,
                (
                    Candidate(
                        int(e["seq"]),
                        *stored_counts(index, e["terms"], e["context"]),
                        e["terms"],
                        bool(e["tool"]),
                    )
                    for e in entries
                ),
                limit,
            )
            if not best:
                return []
            rows = await conn.fetch(
                self.sql(
                    f"SELECT {_MESSAGE_COLUMNS}, created_at FROM {{p}}messages"
                    " WHERE session_id = $1 AND seq = ANY($2::bigint[])"
                ),
                session_id,
                [seq for seq, _ in best],
            )
        by_seq = {int(r["seq"]): r for r in rows}
        hits = [(by_seq[seq], value) for seq, value in best if seq in by_seq]
        return [
            SearchHit(message=message, score=value, stored_at=to_datetime(r["created_at"]))
            for message, (r, value) in zip(
                _rows_to_messages([r for r, _ in hits]), hits, strict=True
            )
        ]

    async def get_range(self, session_id: str, from_seq: int, to_seq: int) -> list[Message]:
        async with self._conn() as conn:
            rows = await conn.fetch(
                self.sql(
                    f"SELECT {_PREFIXED_COLUMNS} FROM {{p}}messages m"
                    " JOIN {p}sessions s ON s.session_id = m.session_id"
                    " JOIN {p}search_entries d ON d.search_key = s.search_key AND d.seq = m.seq"
                    " WHERE m.session_id = $1 AND m.seq BETWEEN $2 AND $3 ORDER BY m.seq"
                ),
                session_id,
                from_seq,
                to_seq,
            )
        return _rows_to_messages(rows)

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
        async with self._tx() as conn:
            await self._check_fence(conn, lease)
            if await self._locked_epoch(conn, session_id) is None:
                return []  # no row, no messages
            rows = await conn.fetch(
                self.sql(
                    "SELECT seq, kind, role FROM {p}messages"
                    " WHERE session_id = $1 AND archived IS NULL ORDER BY seq"
                ),
                session_id,
            )
            seqs = select_trim(
                [(int(r["seq"]), r["kind"], r["role"]) for r in rows], keep_recent, up_to_seq
            )
            await self._archive(conn, session_id, seqs, reason)
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
        lease: LeaseToken | None = None,
    ) -> bool:
        value = dump_value(record)
        async with self._tx() as conn:
            await self._check_fence(conn, lease)
            current = await self._locked_epoch(conn, session_id)
            if current is None:
                # No row to lock: take the session lock a concurrent clear also takes, then look
                # again (a clear that created the row meanwhile has committed by now).
                await self._lock_session(conn, session_id)
                current = await self._locked_epoch(conn, session_id)
            if (current or 0) != epoch:
                return False
            version = await self._write_metadata(
                conn, namespace, session_id, value, expected_version
            )
            if version is None:
                return False  # compare-and-set lost: nothing was written
            rows = await conn.fetch(
                self.sql(
                    "SELECT seq FROM {p}messages WHERE session_id = $1 AND archived IS NULL"
                    " AND seq <= $2 AND NOT (role = 'system' AND kind = 'message') ORDER BY seq"
                ),
                session_id,
                archive_through_seq,
            )
            await self._archive(conn, session_id, [int(r["seq"]) for r in rows], "summarized")
        return True

    # -- sessions -----------------------------------------------------------------------------

    async def get_epoch(self, session_id: str) -> int:
        async with self._conn() as conn:
            return await self._epoch(conn, session_id)

    async def clear(self, session_id: str, types: Sequence[str] | None = None) -> int:
        check_session_id(session_id)
        async with self._tx() as conn:
            await self._lock_session(conn, session_id)
            epoch = await conn.fetchval(
                self.sql(
                    "INSERT INTO {p}sessions AS s (session_id, epoch, last_seq, updated_at)"
                    f" VALUES ($1, 1, 0, {_NOW})"
                    " ON CONFLICT (session_id) DO UPDATE"
                    " SET epoch = s.epoch + 1, updated_at = excluded.updated_at"
                    " RETURNING epoch"
                ),
                session_id,
            )
            if types is None or "history" in types:
                await conn.execute(
                    self.sql(
                        f"UPDATE {{p}}messages SET archived = 'cleared', archived_at = {_NOW}"
                        " WHERE session_id = $1 AND archived IS NULL"
                    ),
                    session_id,
                )
                key = await conn.fetchval(
                    self.sql("SELECT search_key FROM {p}sessions WHERE session_id = $1"),
                    session_id,
                )
                await self._drop_search(conn, int(key))
                await conn.execute(
                    self.sql(
                        "UPDATE {p}sessions SET search_docs = 0, search_length = 0"
                        " WHERE session_id = $1"
                    ),
                    session_id,
                )
            if types is None:
                await conn.execute(
                    self.sql(
                        "UPDATE {p}metadata SET value = NULL, version = version + 1,"
                        f" deleted = true, updated_at = {_NOW} WHERE key = $1"
                    ),
                    session_id,
                )
            else:
                for namespace in dict.fromkeys(types):
                    if namespace != "history":
                        await self._write_metadata(conn, namespace, session_id, None, None)
        return int(epoch)

    async def delete_messages(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        wanted = sorted({int(s) for s in seqs})
        if not wanted:
            return []
        async with self._tx() as conn:
            if await self._locked_epoch(conn, session_id) is None:
                return []
            rows = await conn.fetch(
                self.sql(
                    f"UPDATE {{p}}messages SET archived = 'deleted', archived_at = {_NOW}"
                    " WHERE session_id = $1 AND seq = ANY($2::bigint[])"
                    " AND archived IS DISTINCT FROM 'deleted' RETURNING seq, role"
                ),
                session_id,
                wanted,
            )
            found = sorted(int(r["seq"]) for r in rows)
            if found:
                await self._touch(conn, session_id)
                roles = {int(r["seq"]): r["role"] for r in rows}
                key = int(
                    await conn.fetchval(
                        self.sql("SELECT search_key FROM {p}sessions WHERE session_id = $1"),
                        session_id,
                    )
                )
                gone = await conn.fetch(
                    self.sql(
                        "DELETE FROM {p}search_entries WHERE search_key = $1"
                        " AND seq = ANY($2::bigint[]) RETURNING seq, terms, context"
                    ),
                    key,
                    found,
                )
                docs = [
                    (int(r["seq"]), roles[int(r["seq"])], _entry_of_text(r["terms"], r["context"]))
                    for r in gone
                ]
                await self._unindex(conn, session_id, key, docs)
        return found

    async def forget(self, session_id: str) -> None:
        async with self._tx() as conn:
            await self._lock_session(conn, session_id)
            # The row first: this waits for an append holding it, so the messages deleted next
            # include that append's.
            key = await conn.fetchval(
                self.sql("DELETE FROM {p}sessions WHERE session_id = $1 RETURNING search_key"),
                session_id,
            )
            await conn.execute(
                self.sql("DELETE FROM {p}messages WHERE session_id = $1"), session_id
            )
            if key is not None:
                await self._drop_search(conn, int(key))
            await conn.execute(self.sql("DELETE FROM {p}metadata WHERE key = $1"), session_id)

    async def list_sessions(self) -> list[SessionInfo]:
        async with self._conn() as conn:
            rows = await conn.fetch(
                self.sql(
                    "SELECT s.session_id, s.epoch, s.last_seq, s.updated_at,"
                    " COUNT(m.seq) - COUNT(m.archived) AS active,"
                    " COUNT(m.archived) AS archived"
                    " FROM {p}sessions s LEFT JOIN {p}messages m ON m.session_id = s.session_id"
                    ' GROUP BY s.session_id ORDER BY s.session_id COLLATE "C"'
                )
            )
        return [
            SessionInfo(
                session_id=r["session_id"],
                epoch=int(r["epoch"]),
                active=int(r["active"]),
                archived=int(r["archived"]),
                last_seq=int(r["last_seq"]),
                updated_at=to_datetime(r["updated_at"]),
            )
            for r in rows
        ]

    async def close(self) -> None:
        """Close the pool (waiting up to ``command_timeout`` for busy connections, then cutting
        them); later calls raise ``RuntimeError``. Safe to call twice."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=self._command_timeout)
            except (TimeoutError, *_CONNECT_ERRORS):
                pool.terminate()
        # A pool still being opened is closed by ``_opened``; wait for that and other releases.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._command_timeout + self._connect_timeout
        while self._opening is not None or self._background:
            pending = [f for f in (self._opening, *self._background) if f is not None]
            if loop.time() >= deadline:
                break
            await asyncio.wait(pending, timeout=deadline - loop.time())
