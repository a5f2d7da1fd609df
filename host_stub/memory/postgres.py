"""PostgreSQL memory backend, on asyncpg: for several host processes on several machines.

Same semantics as :class:`~host_stub.memory.sqlite.SQLiteMemory`; what differs is how they are
kept when many connections write at once:

- Every write that touches a session's messages first locks that session's row in ``sessions``
  (``append`` and ``clear`` through an upsert, the others with ``SELECT ... FOR UPDATE``) and
  holds the lock until commit. ``append`` takes its seqs from ``sessions.last_seq`` under that
  lock, in the transaction that inserts the messages, so seqs are gapless and in commit order: the
  next appender waits for the commit and then reads the new counter. No sequence object, whose
  values are handed out outside the transaction, is involved.
- Writes on a session that may have no row yet (``clear``, ``forget``, a ``commit_compression``
  that found no row) also take a transaction-scoped advisory lock on the session, so they
  serialize even when there is no row to lock.
- Compare-and-set on metadata versions is decided by the writing statement itself (``INSERT ...
  ON CONFLICT DO NOTHING`` for "never written", ``UPDATE ... WHERE version = $n`` otherwise), so
  two writers with the same expected version cannot both win.
- ``commit_compression`` is one transaction: session lock, epoch check, version compare-and-set,
  archive.
- ``snapshot`` reads in one ``REPEATABLE READ`` read-only transaction.
- Leases are rows whose ``expires_at`` is taken from the server's clock, so hosts with skewed
  clocks agree on expiry; a crashed holder's lease simply runs out. A row outlives its releases:
  its ``fence`` grows by one on every acquisition, and a fenced write share-locks the row while it
  checks it, so no acquisition slips in before its commit.

- Search: a table of its own, ``search_docs`` (session key, seq, role, length, ``tsvector``),
  one row per indexed message, about half as wide as a message row: each posting a search reads
  costs a visit to its row (a GIN index holds no column), so those rows stay apart from the
  messages' bodies. A GIN index on the tsvector (no pending list: ``fastupdate`` off); its
  lexemes are ``<session key>_<term>`` (the key from ``sessions.search_key``), so a lexeme's
  posting list is one session's; positions carry the weight class (A a message's own term, B a
  lent one).
  ``search_terms`` (each term's document frequency per session key) and the session's
  ``search_docs``/``search_length`` are written in the transaction that indexes or unindexes,
  under the session's row lock. A search follows ``search_plan.plan_search`` in four or five
  statements: the counts; the newest postings of one term, if planned (from a widening window
  of the newest seqs); the other reads and the probes (one statement of ``@@`` reads, a
  conjunction intersected in the index); the chosen candidates'
  tsvectors (frequencies parsed from their text form); the messages found. A tsvector keeps at
  most 256 positions of a lexeme, so a term repeated more often in one message counts 256 times.

URL: ``postgresql://user:password@host:port/database`` (``postgres://`` too); the query string is
passed to asyncpg (``sslmode=...``, server settings), except ``schema=<name>``, which selects (and
creates) a PostgreSQL schema for the tables. The pool is created, and the schema created or
migrated (under an advisory lock, so processes starting together do not race), on first use.
JSON bodies are stored as ``text``, not ``jsonb``: ``jsonb`` refuses ``\\u0000`` in strings and
reorders keys, and a message must come back exactly as it went in.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import asyncpg

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
    TokenCounter,
    body_of,
    check_limit,
    check_ttl,
    dump_value,
    error_line,
    load_value,
    message_from_row,
    metadata_entry,
    new_lease_token,
    redact_url,
    select_trim,
    to_datetime,
    tokens_of,
)
from .search_plan import (
    CONTEXT_SPAN,
    CONTEXT_WEIGHT,
    Indexed,
    Plan,
    Read,
    choose,
    distinct_terms,
    doc_length,
    own_terms,
    plan_search,
    query_terms,
    score,
    top,
    with_context,
)

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresMemory", "entry_of", "redact_url"]

#: Stored in ``memory_schema_version``; bump it and add a step to ``MIGRATIONS`` on changes.
SCHEMA_VERSION = 4

#: Migration steps, from version ``n`` to ``n + 1``. ``{p}`` is the schema prefix.
MIGRATIONS: dict[int, list[str]] = {
    0: [
        """CREATE TABLE IF NOT EXISTS {p}sessions (
            session_id text PRIMARY KEY,
            epoch      bigint NOT NULL DEFAULT 0,
            last_seq   bigint NOT NULL DEFAULT 0,
            updated_at double precision NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS {p}messages (
            session_id  text NOT NULL,
            seq         bigint NOT NULL,
            epoch       bigint NOT NULL,
            role        text NOT NULL,
            kind        text NOT NULL,
            body        text NOT NULL,
            tokens      bigint NOT NULL,
            archived    text NULL,
            archived_at double precision NULL,
            created_at  double precision NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
        """CREATE TABLE IF NOT EXISTS {p}metadata (
            namespace  text NOT NULL,
            key        text NOT NULL,
            value      text NULL,
            version    bigint NOT NULL,
            deleted    boolean NOT NULL DEFAULT false,
            updated_at double precision NOT NULL,
            PRIMARY KEY (namespace, key)
        )""",
        "CREATE INDEX IF NOT EXISTS metadata_by_key ON {p}metadata (key)",
        """CREATE TABLE IF NOT EXISTS {p}leases (
            name       text PRIMARY KEY,
            token      text NOT NULL,
            expires_at double precision NOT NULL
        )""",
    ],
    # The search index: the message's terms as a tsvector (NULL: not searchable), filled for
    # the stored messages by ``backfill_search``.
    1: [
        "ALTER TABLE {p}messages ADD COLUMN IF NOT EXISTS search tsvector NULL",
        "CREATE INDEX IF NOT EXISTS messages_search ON {p}messages USING gin (search)",
    ],
    # 2 -> 3: fencing tokens. A lease row stays after its release (token emptied) so the fence
    # of its next holder keeps growing.
    2: ["ALTER TABLE {p}leases ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0"],
    # 3 -> 4: a search reads only the postings it needs (see search_plan.plan_search), from a table
    # of its own: ``search_docs``, one row per indexed message, without the message's body (a
    # search visits the row of each posting it reads). Each
    # session gets a key its lexemes start with ("<key>_<term>"), so the GIN index holds one
    # posting list per session and term; and what BM25 ranks with: the number and total length
    # of a session's indexed messages, each message's length, each term's document frequency.
    # ``_convert_search`` moves the stored tsvectors over and fills the counts.
    3: [
        "ALTER TABLE {p}sessions ADD COLUMN IF NOT EXISTS search_key bigserial",
        "ALTER TABLE {p}sessions ADD COLUMN IF NOT EXISTS search_docs bigint NOT NULL DEFAULT 0",
        "ALTER TABLE {p}sessions ADD COLUMN IF NOT EXISTS search_length double precision"
        " NOT NULL DEFAULT 0",
        """CREATE TABLE IF NOT EXISTS {p}search_docs (
            search_key bigint NOT NULL,
            seq        bigint NOT NULL,
            role       text NOT NULL,
            length     double precision NOT NULL,
            search     tsvector NOT NULL,
            PRIMARY KEY (search_key, seq)
        )""",
        # No pending list: every search reads several posting lists, none has to scan one (new
        # entries go straight into the index, at some cost to appends).
        "CREATE INDEX IF NOT EXISTS search_docs_search ON {p}search_docs USING gin (search)"
        " WITH (fastupdate = off)",
        """CREATE TABLE IF NOT EXISTS {p}search_terms (
            search_key bigint NOT NULL,
            term       text NOT NULL,
            df         bigint NOT NULL,
            PRIMARY KEY (search_key, term)
        )""",
    ],
}

#: Schema 2-3's tsvector of a message (its own terms in weight class A, the lent ones in B, no
#: session key): what the migration to schema 2 fills in, and the migration to 4 converts.
_LEGACY_TSVECTOR = (
    "setweight(to_tsvector('simple', {own}), 'A') || setweight(to_tsvector('simple', {lent}), 'B')"
)
#: A lexeme in a tsvector's text form: ``'<lexeme>':<positions>``.
_LEXEME = re.compile(r"'((?:[^']|'')*)'(?::([0-9A-D,]+))?")
#: What a tsvector keeps at most: positions per lexeme, and the largest position.
_MAX_POSITIONS = 256
_MAX_POSITION = 16383

#: A search's first statement: the session's key, its number and total length of indexed
#: messages, and the document frequency of each query term.
_SEARCH_STATS = """
SELECT s.search_key, s.search_docs, s.search_length, s.last_seq,
    ARRAY(SELECT coalesce(t.df, 0) FROM unnest($2::text[]) WITH ORDINALITY AS q(term, i)
          LEFT JOIN {p}search_terms t ON t.search_key = s.search_key AND t.term = q.term
          ORDER BY q.i) AS dfs
FROM {p}sessions s WHERE s.session_id = $1
"""

#: Transaction time (one value for every write of a transaction) and wall time, as unix seconds,
#: both from the server's clock.
_NOW = "extract(epoch FROM now())::float8"
_CLOCK = "extract(epoch FROM clock_timestamp())::float8"

_MESSAGE_COLUMNS = "seq, epoch, role, kind, body, tokens, archived"
_PREFIXED_COLUMNS = ", ".join(f"m.{c}" for c in _MESSAGE_COLUMNS.split(", "))
_SCHEMES = ("postgresql", "postgres")
#: Errors that mean "could not reach or log in to the server".
_CONNECT_ERRORS = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lock_key(*parts: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``parts``."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresMemory:
    """A :class:`~host_stub.services.MemoryService` on a PostgreSQL database.

    ``schema``: the PostgreSQL schema holding the tables (created if missing); also settable as
    ``?schema=`` in the URL; ``None`` = the connection's default (usually ``public``).
    ``pool_min`` / ``pool_max``: connection pool size. ``command_timeout``: seconds any statement
    (a lock wait included) or a wait for a free pooled connection may take.
    ``connect_timeout``: seconds to open one connection.

    Raises ``ValueError`` for a malformed URL (here, or at first use for what only asyncpg
    checks) and ``ConnectionError("<url>: cannot connect: <reason>")`` when the server cannot be
    reached or refuses the login; the password never appears in either.
    """

    def __init__(
        self,
        url: str,
        token_counter: TokenCounter,
        *,
        schema: str | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        command_timeout: float = 10.0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.url = redact_url(url)
        self._dsn, url_schema = _parse_url(url, self.url)
        if schema is not None and url_schema is not None and schema != url_schema:
            raise ValueError(
                f"memory URL {self.url!r} names schema {url_schema!r} but schema={schema!r} "
                "was also given"
            )
        schema = schema if schema is not None else url_schema
        if schema is not None and not (0 < len(schema.encode()) <= 63 and "\0" not in schema):
            raise ValueError(f"PostgreSQL schema name {schema!r} must be 1-63 bytes, no NUL")
        if not 0 <= pool_min <= pool_max or pool_max < 1:
            raise ValueError(
                f"need 0 <= pool_min <= pool_max and pool_max >= 1, got {pool_min}, {pool_max}"
            )
        if not command_timeout > 0 or not connect_timeout > 0:
            raise ValueError("command_timeout and connect_timeout must be > 0")
        self.schema = schema
        self._p = "" if schema is None else _quote_ident(schema) + "."
        self._count = token_counter
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._command_timeout = command_timeout
        self._connect_timeout = connect_timeout
        self._pool: Any = None
        self._opening: asyncio.Future[Any] | None = None
        self._closed = False
        self._background: set[asyncio.Future[Any]] = set()

    def __repr__(self) -> str:
        return f"PostgresMemory({self.url!r}, schema={self.schema!r})"

    # -- pool, schema and transactions --------------------------------------------------------

    def sql(self, text: str) -> str:
        return text.replace("{p}", self._p)

    def _cannot_connect(self, exc: BaseException) -> ConnectionError:
        return ConnectionError(f"{self.url}: cannot connect: {error_line(exc)}")

    async def _get_pool(self) -> Any:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._pool is not None:
            return self._pool
        # One opening at a time, shared by every caller and shielded from their cancellation
        # (asyncpg cancelled half-way through connecting leaves a broken connection behind);
        # after a failure the next call tries again.
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open_pool())
            self._opening.add_done_callback(self._opened)
        return await asyncio.shield(self._opening)

    def _opened(self, opening: asyncio.Future[Any]) -> None:
        if self._opening is opening:
            self._opening = None
        if opening.cancelled() or opening.exception() is not None:
            return  # the callers got the error; the next call tries again
        if self._closed:
            self._later(opening.result().close())  # closed while it was being opened
        else:
            self._pool = opening.result()

    def _later(self, coro: Any) -> None:
        """Run ``coro`` in the background, held by a strong reference until it ends."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _open_pool(self) -> Any:
        try:
            pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self._pool_min,
                max_size=self._pool_max,
                command_timeout=self._command_timeout,
                timeout=self._connect_timeout,
                server_settings=server_settings(self._dsn),
            )
        except ValueError as exc:  # asyncpg's ClientConfigurationError is one
            raise ValueError(f"memory URL {self.url!r}: {error_line(exc)}") from None
        except _CONNECT_ERRORS as exc:
            raise self._cannot_connect(exc) from None
        try:
            async with pool.acquire(timeout=self._command_timeout) as conn:
                await self._migrate(conn)
        except BaseException:
            pool.terminate()
            raise
        return pool

    async def _migrate(self, conn: Any) -> None:
        async with conn.transaction():
            # One migrator per database and schema at a time; the others wait, then find the
            # schema current and do nothing.
            await conn.execute(
                "SELECT pg_advisory_xact_lock($1)",
                _lock_key("host_stub.memory:migrate", self.schema or ""),
            )
            if self.schema is not None:
                exists = await conn.fetchval(
                    "SELECT 1 FROM pg_namespace WHERE nspname = $1", self.schema
                )
                if not exists:
                    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_ident(self.schema)}")
            await conn.execute(
                self.sql(
                    "CREATE TABLE IF NOT EXISTS {p}memory_schema_version ("
                    " id integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),"
                    " version integer NOT NULL)"
                )
            )
            version = await conn.fetchval(
                self.sql("SELECT version FROM {p}memory_schema_version WHERE id = 1")
            )
            version = 0 if version is None else int(version)
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.url} (schema {self.schema or 'default'}): schema version {version} "
                    f"is newer than this code supports ({SCHEMA_VERSION})"
                )
            if version == SCHEMA_VERSION:
                return
            while version < SCHEMA_VERSION:
                for statement in MIGRATIONS[version]:
                    await conn.execute(self.sql(statement))
                if version == 1:
                    await self.backfill_search(conn)
                if version == 3:
                    await self._convert_search(conn)
                version += 1
            await conn.execute(
                self.sql(
                    "INSERT INTO {p}memory_schema_version (id, version) VALUES (1, $1)"
                    " ON CONFLICT (id) DO UPDATE SET version = excluded.version"
                ),
                SCHEMA_VERSION,
            )

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        """A pooled connection (no transaction: each statement commits on its own)."""
        pool = await self._get_pool()
        # Shielded: cancelling asyncpg while it opens a new pooled connection abandons that
        # connection half-made; instead the acquire finishes and the connection goes back.
        acquiring = asyncio.ensure_future(pool.acquire(timeout=self._command_timeout))
        try:
            conn = await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            acquiring.add_done_callback(lambda done: self._give_back(pool, done))
            raise
        except TimeoutError:
            raise TimeoutError(
                f"{self.url}: no pooled connection within {self._command_timeout} s "
                f"(all {self._pool_max} busy, or the server stopped answering)"
            ) from None
        except _CONNECT_ERRORS as exc:
            raise self._cannot_connect(exc) from None
        try:
            yield conn
        finally:
            await pool.release(conn)

    def _give_back(self, pool: Any, acquired: asyncio.Future[Any]) -> None:
        """Release a connection whose acquirer was cancelled while it was being acquired."""
        if acquired.cancelled() or acquired.exception() is not None:
            return  # nothing acquired (the exception is retrieved: no "never retrieved" noise)
        self._later(pool.release(acquired.result()))

    @contextlib.asynccontextmanager
    async def _tx(self, *, snapshot: bool = False) -> AsyncIterator[Any]:
        """One transaction: ``READ COMMITTED`` for writes (they lock what they decide on),
        ``REPEATABLE READ`` read-only for a consistent multi-statement read."""
        async with self._conn() as conn:
            if snapshot:
                tx = conn.transaction(isolation="repeatable_read", readonly=True)
            else:
                tx = conn.transaction()
            async with tx:
                yield conn

    async def _lock_session(self, conn: Any, session_id: str) -> None:
        """A transaction-scoped lock on the session that exists before its row does."""
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1)",
            _lock_key("host_stub.memory:session", self.schema or "", session_id),
        )

    async def _locked_epoch(self, conn: Any, session_id: str) -> int | None:
        """Lock the session's row and return its epoch; ``None`` (nothing locked) if no row."""
        return await conn.fetchval(
            self.sql("SELECT epoch FROM {p}sessions WHERE session_id = $1 FOR UPDATE"),
            session_id,
        )

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
                        " FROM {p}search_docs d WHERE d.search_key = $4"
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
        async with self._conn() as conn:
            stats = await conn.fetchrow(self.sql(_SEARCH_STATS), session_id, terms)
            if stats is None or not stats["search_docs"]:
                return []
            key = int(stats["search_key"])
            plan = plan_search(
                terms,
                [int(df) for df in stats["dfs"]],
                int(stats["search_docs"]),
                float(stats["search_length"]),
                limit=limit,
            )
            # The newest of one term first: the probes among them start at the oldest found.
            newest: dict[int, list[int]] = {}
            for n, read in enumerate(plan.reads):
                if read.limit is not None and len(read.terms) == 1:
                    newest[n] = await self._newest(
                        conn, plan, read, key, role, int(stats["last_seq"])
                    )
            sql, args = _reads_sql(plan, key, role, newest)
            tagged: dict[str, set[int]] = {}
            for r in await conn.fetch(self.sql(sql), key, *args) if sql else []:
                tagged[r["tag"]] = set(r["seqs"])
            holders: dict[int, set[int]] = {}
            found: set[int] = set()
            for n, read in enumerate(plan.reads):
                got = set(newest[n]) if n in newest else tagged.get(f"r{n}", set())
                if read.limit is not None and len(got) > read.limit:
                    got = set(sorted(got)[-read.limit :])  # a conjunction's newest
                found |= got
                for i in read.terms:
                    holders.setdefault(i, set()).update(got)
            if not found:
                return []
            for i in plan.probes:
                holders.setdefault(i, set()).update(tagged.get(f"p{i}", set()) & found)
            chosen = choose(plan, holders, limit)
            entries = await conn.fetch(
                self.sql(
                    "SELECT seq, search::text AS v, length FROM {p}search_docs"
                    " WHERE search_key = $1 AND seq = ANY($2::bigint[])"
                ),
                key,
                chosen,
            )
            lexemes = [_quote_lexeme(_lexeme(key, t)) + ":" for t in terms]
            best = top(
                score(
                    plan,
                    (
                        (int(e["seq"]), _frequencies(e["v"], lexemes), float(e["length"]))
                        for e in entries
                    ),
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

    async def _newest(
        self, conn: Any, plan: Plan, read: Read, key: int, role: str | None, last_seq: int
    ) -> list[int]:
        """The seqs of the newest postings of the one term of ``read`` (as many as its limit,
        fewer if the session has fewer). Looked for among the newest seqs: first in a window
        half as long again as should hold them (the term's density in the session taken as
        even), the window four times longer each time it held too few, so the primary key bounds
        the rows visited."""
        [i], k = read.terms, read.limit or 0
        span = (3 * k * last_seq) // (2 * max(1, plan.dfs[i])) + 1
        query = _quote_lexeme(_lexeme(key, plan.terms[i]))
        role_sql = " AND role = $5" if role is not None else ""
        sql = self.sql(
            "SELECT seq FROM {p}search_docs WHERE search_key = $1 AND seq >= $2"
            f" AND search @@ $3::tsquery{role_sql} ORDER BY seq DESC LIMIT $4"
        )
        while True:
            since = max(1, last_seq - span)
            rows = await conn.fetch(sql, key, since, query, k, *([role] if role else []))
            if len(rows) >= k or since == 1:
                return [int(r["seq"]) for r in rows]
            span *= 4

    async def get_range(self, session_id: str, from_seq: int, to_seq: int) -> list[Message]:
        async with self._conn() as conn:
            rows = await conn.fetch(
                self.sql(
                    f"SELECT {_PREFIXED_COLUMNS} FROM {{p}}messages m"
                    " JOIN {p}sessions s ON s.session_id = m.session_id"
                    " JOIN {p}search_docs d ON d.search_key = s.search_key AND d.seq = m.seq"
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

    # -- metadata -----------------------------------------------------------------------------

    async def get_metadata(self, namespace: str, key: str) -> MetadataEntry | None:
        async with self._conn() as conn:
            return await self._metadata(conn, namespace, key)

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
        async with self._conn() as conn:
            return await self._write_metadata(conn, namespace, key, text, expected_version)

    async def delete_metadata(
        self, namespace: str, key: str, expected_version: int | None = None
    ) -> int | None:
        async with self._conn() as conn:
            return await self._write_metadata(conn, namespace, key, None, expected_version)

    async def list_metadata(self, namespace: str) -> list[MetadataEntry]:
        async with self._conn() as conn:
            rows = await conn.fetch(
                self.sql(
                    "SELECT namespace, key, value, version, deleted, updated_at FROM {p}metadata"
                    ' WHERE namespace = $1 AND NOT deleted ORDER BY key COLLATE "C"'
                ),
                namespace,
            )
        return [_entry(r) for r in rows]

    # -- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, name: str, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        token = new_lease_token()
        async with self._conn() as conn:
            # Taken when free or expired (by the server's clock); a live lease is left alone. A
            # concurrent taker waits for the row lock, then sees the new expiry and gets nothing.
            # The row outlives releases, so its fence only grows.
            row = await conn.fetchrow(
                self.sql(
                    "INSERT INTO {p}leases AS l (name, token, expires_at, fence)"
                    f" VALUES ($1, $2, {_CLOCK} + $3::float8, 1)"
                    " ON CONFLICT (name) DO UPDATE"
                    " SET token = excluded.token, expires_at = excluded.expires_at,"
                    " fence = l.fence + 1"
                    f" WHERE l.expires_at <= {_CLOCK}"
                    " RETURNING expires_at, fence"
                ),
                name,
                token,
                float(ttl_s),
            )
        if row is None:
            return None
        return LeaseToken(
            name=name, token=token, expires_at=float(row["expires_at"]), fence=int(row["fence"])
        )

    async def renew_lease(self, lease: LeaseToken, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        async with self._conn() as conn:
            expires_at = await conn.fetchval(
                self.sql(
                    f"UPDATE {{p}}leases SET expires_at = {_CLOCK} + $3::float8"
                    f" WHERE name = $1 AND token = $2 AND expires_at > {_CLOCK}"
                    " RETURNING expires_at"
                ),
                lease.name,
                lease.token,
                float(ttl_s),
            )
        if expires_at is None:
            return None
        return lease.model_copy(update={"expires_at": float(expires_at)})

    async def release_lease(self, lease: LeaseToken) -> bool:
        async with self._conn() as conn:
            # The row stays (its fence is the next holder's base); only the holder is removed.
            gone = await conn.fetchval(
                self.sql(
                    "UPDATE {p}leases SET token = '', expires_at = 0"
                    " WHERE name = $1 AND token = $2 RETURNING 1"
                ),
                lease.name,
                lease.token,
            )
        return gone is not None

    async def _check_fence(self, conn: Any, lease: LeaseToken | None) -> None:
        """In a write's transaction: raise :class:`LeaseLost` if a newer holder took ``lease``.
        The row stays share-locked to the commit, so no acquisition can slip in between."""
        if lease is None:
            return
        fence = await conn.fetchval(
            self.sql("SELECT fence FROM {p}leases WHERE name = $1 FOR SHARE"), lease.name
        )
        if (fence or 0) != lease.fence:
            raise LeaseLost(lease)

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
                for table in ("search_docs", "search_terms"):
                    await conn.execute(
                        self.sql(
                            f"DELETE FROM {{p}}{table} WHERE search_key ="
                            " (SELECT search_key FROM {p}sessions WHERE session_id = $1)"
                        ),
                        session_id,
                    )
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
                    " AND archived IS DISTINCT FROM 'deleted' RETURNING seq"
                ),
                session_id,
                wanted,
            )
            found = sorted(int(r["seq"]) for r in rows)
            if found:
                await self._touch(conn, session_id)
                key = int(
                    await conn.fetchval(
                        self.sql("SELECT search_key FROM {p}sessions WHERE session_id = $1"),
                        session_id,
                    )
                )
                gone = await conn.fetch(
                    self.sql(
                        "DELETE FROM {p}search_docs WHERE search_key = $1"
                        " AND seq = ANY($2::bigint[]) RETURNING search::text AS v"
                    ),
                    key,
                    found,
                )
                await self._count_terms(
                    conn, session_id, key, [entry_of(r["v"], key) for r in gone], -1
                )
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
                for table in ("search_docs", "search_terms"):
                    await conn.execute(
                        self.sql(f"DELETE FROM {{p}}{table} WHERE search_key = $1"), key
                    )
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

    async def _convert_search(self, conn: Any) -> None:
        """Migration 3 -> 4: the stored tsvectors (``messages.search``) move to ``search_docs``,
        their lexemes under their session's key; each session's counts are filled in; the old
        column and its index go."""
        rows = await conn.fetch(
            self.sql(
                "SELECT m.session_id, m.seq, m.role, m.search::text AS v, s.search_key"
                " FROM {p}messages m JOIN {p}sessions s ON s.session_id = m.session_id"
                " WHERE m.search IS NOT NULL ORDER BY m.session_id, m.seq"
            )
        )
        by_session: dict[str, tuple[int, list[tuple[int, str, Indexed]]]] = {}
        for r in rows:
            key = int(r["search_key"])
            entry = (int(r["seq"]), r["role"], _legacy_entry(r["v"]))
            by_session.setdefault(r["session_id"], (key, []))[1].append(entry)
        for session_id, (key, docs) in by_session.items():
            await self._index(conn, session_id, key, docs)
        await conn.execute(self.sql("DROP INDEX IF EXISTS {p}messages_search"))
        await conn.execute(self.sql("ALTER TABLE {p}messages DROP COLUMN IF EXISTS search"))

    async def _index(
        self, conn: Any, session_id: str, key: int, docs: Sequence[tuple[int, str, Indexed]]
    ) -> None:
        """Index ``(seq, role, entry)`` of the session with search key ``key`` and add them to
        its counts: one statement (in the transaction that writes them, the session's row
        locked)."""
        if not docs:
            return
        dfs: dict[str, int] = {}
        for _, _, indexed in docs:
            for term in distinct_terms(indexed):
                dfs[term] = dfs.get(term, 0) + 1
        names = sorted(dfs)
        lengths = [doc_length(t) for _, _, t in docs]
        await conn.execute(
            self.sql(
                "WITH d AS (INSERT INTO {p}search_docs (search_key, seq, role, length, search)"
                " SELECT $1, t.seq, t.role, t.length, t.search::tsvector"
                " FROM unnest($2::bigint[], $3::text[], $4::float8[], $5::text[])"
                " AS t(seq, role, length, search)),"
                " c AS (INSERT INTO {p}search_terms AS x (search_key, term, df)"
                " SELECT $1, u.term, u.df FROM unnest($6::text[], $7::bigint[]) AS u(term, df)"
                " ON CONFLICT (search_key, term) DO UPDATE SET df = x.df + excluded.df)"
                " UPDATE {p}sessions SET search_docs = search_docs + $8,"
                " search_length = search_length + $9 WHERE session_id = $10"
            ),
            key,
            [seq for seq, _, _ in docs],
            [role for _, role, _ in docs],
            lengths,
            [_tsvector(key, t) for _, _, t in docs],
            names,
            [dfs[t] for t in names],
            len(docs),
            sum(lengths),
            session_id,
        )

    async def _count_terms(
        self, conn: Any, session_id: str, key: int, entries: Sequence[Indexed], sign: int
    ) -> None:
        """Add (``sign`` 1) or remove (-1) entries in the session's search counts (in the
        transaction that writes them, the session's row locked; :meth:`_index` adds its own)."""
        if not entries:
            return
        dfs: dict[str, int] = {}
        for indexed in entries:
            for term in distinct_terms(indexed):
                dfs[term] = dfs.get(term, 0) + 1
        await conn.execute(
            self.sql(
                "UPDATE {p}sessions SET search_docs = search_docs + $2,"
                " search_length = search_length + $3 WHERE session_id = $1"
            ),
            session_id,
            sign * len(entries),
            sign * sum(doc_length(t) for t in entries),
        )
        names = sorted(dfs)
        if sign > 0:
            await conn.execute(
                self.sql(
                    "INSERT INTO {p}search_terms AS t (search_key, term, df)"
                    " SELECT $1, u.term, u.df FROM unnest($2::text[], $3::bigint[]) AS u(term, df)"
                    " ON CONFLICT (search_key, term) DO UPDATE SET df = t.df + excluded.df"
                ),
                key,
                names,
                [dfs[t] for t in names],
            )
        else:
            await conn.execute(
                self.sql(
                    "UPDATE {p}search_terms AS t SET df = t.df - u.df"
                    " FROM unnest($2::text[], $3::bigint[]) AS u(term, df)"
                    " WHERE t.search_key = $1 AND t.term = u.term"
                ),
                key,
                names,
                [dfs[t] for t in names],
            )
            await conn.execute(
                self.sql(
                    "DELETE FROM {p}search_terms WHERE search_key = $1"
                    " AND term = ANY($2::text[]) AND df <= 0"
                ),
                key,
                names,
            )

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
        return [
            message_from_row(
                role=r["role"],
                kind=r["kind"],
                body=r["body"],
                seq=int(r["seq"]),
                epoch=int(r["epoch"]),
                tokens=int(r["tokens"]),
                archived=r["archived"],
            )
            for r in rows
        ]


# -- module helpers ---------------------------------------------------------------------------


def _parse_url(url: str, shown: str) -> tuple[str, str | None]:
    """Check ``url`` and split off ``schema=``: return (the DSN for asyncpg, the schema)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"memory URL {shown!r} is malformed: {exc}") from None
    if parts.scheme.lower() not in _SCHEMES:
        raise ValueError(f"memory URL {shown!r} is not a postgresql:// URL")
    if parts.fragment:
        raise ValueError(f"memory URL {shown!r}: a PostgreSQL URL takes no #fragment")
    schema: str | None = None
    kept: list[str] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "schema":
            if not value:
                raise ValueError(f"memory URL {shown!r}: schema= needs a name")
            schema = value
        else:
            kept.append(f"{quote(name, safe='')}={quote(value, safe='')}")
    dsn = urlunsplit(("postgresql", parts.netloc, parts.path, "&".join(kept), ""))
    return dsn, schema


def _entry(row: Any) -> MetadataEntry:
    return metadata_entry(
        row["namespace"],
        row["key"],
        value=load_value(row["value"]),
        version=row["version"],
        deleted=row["deleted"],
        updated_at=row["updated_at"],
    )


def _rows_to_messages(rows: Sequence[Any]) -> list[Message]:
    return [
        message_from_row(
            role=r["role"],
            kind=r["kind"],
            body=r["body"],
            seq=int(r["seq"]),
            epoch=int(r["epoch"]),
            tokens=int(r["tokens"]),
            archived=r["archived"],
        )
        for r in rows
    ]


# -- the search index's tsvectors ---------------------------------------------------------------


def _lexeme(key: int, term: str) -> str:
    """A term's lexeme in the tsvector of a message of the session with search key ``key``."""
    return f"{key}_{term}"


def _quote_lexeme(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _unquote(text: str) -> str:
    """A lexeme as :func:`_quote_lexeme` (and PostgreSQL's output) quoted it, without the
    quotes."""
    return re.sub(r"''|\\(.)", lambda m: m.group(1) or "'", text)


def _tsvector(key: int, indexed: Indexed) -> str:
    """The text form of an entry's tsvector: each term under the session's key, at its positions
    (own terms in weight class A, the lent ones in B; at most 256 positions a term, as
    PostgreSQL keeps)."""
    positions: dict[str, list[str]] = {}
    own, lent = indexed
    for pos, (term, weight) in enumerate([*((t, "A") for t in own), *((t, "B") for t in lent)], 1):
        kept = positions.setdefault(term, [])
        if len(kept) < _MAX_POSITIONS:
            kept.append(f"{min(pos, _MAX_POSITION)}{weight}")
    return " ".join(
        f"{_quote_lexeme(_lexeme(key, term))}:{','.join(p)}" for term, p in positions.items()
    )


def _frequencies(vector: str, lexemes: Sequence[str]) -> list[float]:
    """The weighted frequency (weight A 1, B ``CONTEXT_WEIGHT``) of each of ``lexemes`` (quoted,
    with the colon: ``'<key>_<term>':``) in a tsvector's text form."""
    out: list[float] = []
    for lexeme in lexemes:
        at = vector.find(lexeme)
        if at < 0:
            out.append(0.0)
            continue
        start = at + len(lexeme)
        end = vector.find(" ", start)
        positions = vector[start : end if end >= 0 else len(vector)]
        own = positions.count("A")
        out.append(own + CONTEXT_WEIGHT * (positions.count(",") + 1 - own))
    return out


def entry_of(vector: str, key: int) -> Indexed:
    """An entry's terms (own, lent, repeats kept) from its tsvector's text form."""
    prefix = f"{key}_"
    own: list[str] = []
    lent: list[str] = []
    for match in _LEXEME.finditer(vector):
        lexeme = _unquote(match.group(1))
        term = lexeme[len(prefix) :] if lexeme.startswith(prefix) else lexeme
        for position in (match.group(2) or "1").split(","):
            (own if position.endswith("A") else lent).append(term)
    return own, lent


def _legacy_entry(vector: str) -> Indexed:
    """:func:`entry_of` for a schema 2-3 tsvector (no session key; own terms weight A)."""
    own: list[str] = []
    lent: list[str] = []
    for match in _LEXEME.finditer(vector):
        term = _unquote(match.group(1))
        for position in (match.group(2) or "1").split(","):
            (own if position.endswith("A") else lent).append(term)
    return own, lent


def _reads_sql(
    plan: Plan, key: int, role: str | None, newest: Mapping[int, Sequence[int]]
) -> tuple[str, list[Any]]:
    """The statement that reads a plan's postings and probes (``$1`` the session's key, the
    returned arguments after it; ``""`` when there is nothing to read): rows ``(tag, seqs)``,
    the seqs of read n (``r<n>``: all of a conjunction, its newest taken after) and those probe
    term i found (``p<i>``: among the messages holding a term read whole, or from the oldest of
    ``newest`` on, the newest of one term read before: read n -> its seqs).

    The lexemes carry the session's key, so a term's GIN posting list is this session's alone,
    and a conjunction is intersected inside the index."""
    args: list[Any] = []

    def param(value: Any) -> str:
        args.append(value)
        return f"${len(args) + 1}"

    quoted = [_quote_lexeme(_lexeme(key, t)) for t in plan.terms]
    role_sql = f" AND role = {param(role)}" if role is not None else ""
    where = "FROM {p}search_docs WHERE search @@ "
    parts: list[str] = []
    for n, read in enumerate(plan.reads):
        if n not in newest:
            query = " & ".join(quoted[i] for i in read.terms)
            parts.append(f"SELECT 'r{n}' AS tag, seq {where}{param(query)}::tsquery{role_sql}")
    any_whole = " | ".join(quoted[i] for i in plan.whole)
    for i in plan.probes:
        if any_whole:
            query = f"{quoted[i]} & ({any_whole})"
            parts.append(f"SELECT 'p{i}' AS tag, seq {where}{param(query)}::tsquery{role_sql}")
        for n, seqs in newest.items():
            [term] = plan.reads[n].terms
            if seqs and term != i:
                query = f"{quoted[i]} & {quoted[term]}"
                parts.append(
                    f"SELECT 'p{i}' AS tag, seq FROM {{p}}search_docs WHERE search_key = $1"
                    f" AND seq >= {param(min(seqs))} AND search @@ {param(query)}::tsquery"
                    f"{role_sql}"
                )
    if not parts:
        return "", []
    # The statement takes the session's key as $1 whether or not a part reads it.
    parts[0] += " AND $1::bigint IS NOT NULL"
    sql = f"SELECT tag, array_agg(seq) AS seqs FROM ({' UNION ALL '.join(parts)}) r GROUP BY tag"
    return sql, args


#: Settings of the pool's connections, each unless the URL sets it. Every statement here is
#: small: starting parallel workers cost a search more than they saved, and JIT compiling cost a
#: search about 12 ms (the planner cannot tell how rare a session's lexemes are, so its estimates
#: pass ``jit_above_cost``).
SERVER_SETTINGS = {"max_parallel_workers_per_gather": "0", "jit": "off"}


def server_settings(dsn: str) -> dict[str, str]:
    """:data:`SERVER_SETTINGS` less those the URL ``dsn`` sets itself."""
    given = {name for name, _ in parse_qsl(urlsplit(dsn).query)}
    return {name: value for name, value in SERVER_SETTINGS.items() if name not in given}
