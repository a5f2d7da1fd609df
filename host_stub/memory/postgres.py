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

- Search: an inverted index in tables of its own, read from primary keys alone. Each term of a
  session has a row in ``search_terms`` (session key, term, document frequency, ``id``); a
  term's postings are rows of ``search_postings`` (term id, ``block`` = seq >> 6, ``bits``: bit
  seq & 63 set for each message holding the term), primary key ``(term_id, block)`` with the
  bits included, so a term's postings are read newest or oldest first by an index-only scan
  (a few rows for a rare term, at most one per 64 messages for a common one) and two terms'
  are intersected block by block. A message's role is one more term (``" role:<role>"``, no
  query term holds a space), so a search for one role intersects with it. ``search_entries``
  (session key, seq, own terms, lent terms, each space-joined) is what each message is indexed
  under: the candidates' term frequencies and lengths are read from it, and a deleted
  message's postings found. Entries, postings, document frequencies and the session's
  ``search_docs``/``search_length`` are written in the transaction that indexes or unindexes,
  under the session's row lock (``archive`` leaves the index as it is). A search follows
  ``search_plan.plan_search`` in five statements: the counts and term ids; every read (a
  term's blocks, the newest first when only the newest count; a conjunction's and a role's
  joined block by block, a conjunction of three terms extending the one of its rarest two);
  the probes among the candidates (their blocks joined with each probed term's); the chosen
  candidates' entries with their messages' roles (and, for an assistant's, whether its body
  holds tool calls), ranked by ``search_plan.rank``; the messages found.
  Index-only scans need the visibility map, which autovacuum keeps (pages written since its
  last run cost a visit each).
  Before schema 5 the index was a ``tsvector`` per message with a GIN index: every posting
  read was a visit to a wide row, tens of milliseconds in a session of 500,000 messages.

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
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
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
    StoreNotFound,
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
    Candidate,
    Indexed,
    Plan,
    choose,
    distinct_terms,
    doc_length,
    own_terms,
    plan_search,
    query_terms,
    rank,
    stored_counts,
    with_context,
)

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresMemory", "entry_of", "redact_url"]

#: Stored in ``memory_schema_version``; bump it and add a step to ``MIGRATIONS`` on changes.
SCHEMA_VERSION = 5

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
    # 4 -> 5: an inverted index of our own instead of the GIN index (whose every posting read
    # cost a visit to a wide row): each term of a session gets an id, and ``search_postings``
    # holds its postings in blocks of 64 seqs (``block`` = seq >> 6, bit seq & 63 of ``bits``),
    # so a term's postings are read in order from the primary key alone (index-only scans), and
    # a message's role is one more term (see ``_role_term``). ``search_entries`` keeps what
    # each message is indexed under (its own terms, the lent ones; space-joined), for scoring
    # and for removing it. ``_convert_search`` moves the stored entries over; ``search_docs``
    # and the GIN index go. Index-only scans skip the heap only on pages the visibility map
    # marks all-visible, and every append rewrites the current block of each of its terms:
    # autovacuum visits the postings after 1% of them changed (by default 20%).
    4: [
        "ALTER TABLE {p}search_terms ADD COLUMN IF NOT EXISTS id bigserial",
        "CREATE UNIQUE INDEX IF NOT EXISTS search_terms_id ON {p}search_terms (id)",
        """CREATE TABLE IF NOT EXISTS {p}search_entries (
            search_key bigint NOT NULL,
            seq        bigint NOT NULL,
            terms      text NOT NULL,
            context    text NOT NULL,
            PRIMARY KEY (search_key, seq)
        )""",
        """CREATE TABLE IF NOT EXISTS {p}search_postings (
            term_id bigint NOT NULL,
            block   bigint NOT NULL,
            bits    bigint NOT NULL,
            PRIMARY KEY (term_id, block) INCLUDE (bits)
        ) WITH (autovacuum_vacuum_scale_factor = 0.01,
            autovacuum_vacuum_insert_scale_factor = 0.01)""",
    ],
}

#: Schema 2-3's tsvector of a message (its own terms in weight class A, the lent ones in B, no
#: session key): what the migration to schema 2 fills in, and the migration to 5 converts.
_LEGACY_TSVECTOR = (
    "setweight(to_tsvector('simple', {own}), 'A') || setweight(to_tsvector('simple', {lent}), 'B')"
)
#: A lexeme in a tsvector's text form: ``'<lexeme>':<positions>``.
_LEXEME = re.compile(r"'((?:[^']|'')*)'(?::([0-9A-D,]+))?")
#: Seqs per block of postings: a block's postings are the bits of one ``bigint``.
_BLOCK_BITS = 6
_BLOCK_MASK = (1 << _BLOCK_BITS) - 1
_WORD = (1 << 64) - 1
#: Entries converted per statement by the migration to schema 5.
_CONVERT_BATCH = 5000

#: A search's first statement: the session's key, its number and total length of indexed
#: messages, and the document frequency and id of each term asked for (0 and 0: not indexed).
_SEARCH_STATS = """
SELECT s.search_key, s.search_docs, s.search_length, q.dfs, q.ids
FROM {p}sessions s, LATERAL (
    SELECT array_agg(coalesce(t.df, 0) ORDER BY q.i) AS dfs,
        array_agg(coalesce(t.id, 0) ORDER BY q.i) AS ids
    FROM unnest($2::text[]) WITH ORDINALITY AS q(term, i)
    LEFT JOIN {p}search_terms t ON t.search_key = s.search_key AND t.term = q.term) q
WHERE s.session_id = $1
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
    ``connect_timeout``: seconds to open one connection. With ``create=False`` only a store that
    exists is opened (migrated if older): a missing schema, or one without the store's tables,
    is :class:`~host_stub.memory.common.StoreNotFound` at first use, and nothing is made.

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
        create: bool = True,
    ) -> None:
        self.url = redact_url(url)
        self._create = create
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
                if not exists and not self._create:
                    raise StoreNotFound(self.url, f"schema {self.schema!r} does not exist")
                if not exists:
                    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_ident(self.schema)}")
            if not self._create and not await conn.fetchval(
                "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relname = 'memory_schema_version'"
                " AND n.nspname = coalesce($1::text, current_schema())",
                self.schema,
            ):
                where = "schema " + repr(self.schema) if self.schema else "its default schema"
                raise StoreNotFound(self.url, f"{where} holds no store (no memory tables)")
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
            start = version
            while version < SCHEMA_VERSION:
                for statement in MIGRATIONS[version]:
                    await conn.execute(self.sql(statement))
                if version == 1:
                    await self.backfill_search(conn)
                version += 1
            # The entries stored by schemas 2-4 move to schema 5's tables (a new database has
            # none: the old tables it was given on the way go).
            await self._convert_search(conn, legacy=start <= 3)
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


# -- the search index: terms, blocks of postings, the statements of a search -----------------


def _role_term(role: str) -> str:
    """The term every indexed message of ``role`` is filed under: a role filter is one more
    term of a read. It holds a space, so no query term is ever equal to it."""
    return f" role:{role}"


def _doc_terms(role: str, indexed: Indexed) -> set[str]:
    """The terms a message's postings are filed under: those it is found by, and its role's."""
    return distinct_terms(indexed) | {_role_term(role)}


def _document_frequencies(docs: Sequence[tuple[int, str, Indexed]]) -> dict[str, int]:
    """How many of ``(seq, role, entry)`` each term (roles' included) is filed under."""
    dfs: dict[str, int] = {}
    for _, role, indexed in docs:
        for term in _doc_terms(role, indexed):
            dfs[term] = dfs.get(term, 0) + 1
    return dfs


def _blocks(postings: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """``(term, seq)`` postings as blocks: ``(term, seq >> 6)`` -> the seqs' bits (bit
    ``seq & 63``)."""
    blocks: dict[tuple[str, int], int] = {}
    for term, seq in postings:
        at = (term, seq >> _BLOCK_BITS)
        blocks[at] = blocks.get(at, 0) | 1 << (seq & _BLOCK_MASK)
    return blocks


def _block_arrays(seqs: Iterable[int]) -> tuple[list[int], list[int]]:
    """Seqs as two arrays for a statement: their blocks, in order, and each block's bits."""
    blocks = sorted((block, bits) for (_, block), bits in _blocks(("", s) for s in seqs).items())
    return [block for block, _ in blocks], [_signed(bits) for _, bits in blocks]


def _signed(bits: int) -> int:
    """64 bits as the ``bigint`` that holds them."""
    return bits - (1 << 64) if bits >> 63 else bits


def _seqs(blocks: Sequence[int] | None, bits: Sequence[int] | None) -> set[int]:
    """The seqs of blocks of postings (``None``: no block)."""
    seqs: set[int] = set()
    for block, word in zip(blocks or (), bits or (), strict=True):
        base, word = block << _BLOCK_BITS, word & _WORD
        while word:
            low = word & -word
            seqs.add(base + low.bit_length() - 1)
            word ^= low
    return seqs


def _newest(seqs: set[int], limit: int | None) -> set[int]:
    """The ``limit`` newest of ``seqs`` (``None``: all of them): a read of the newest gets
    whole blocks, some of them older than what it asked for."""
    if limit is None or len(seqs) <= limit:
        return seqs
    return set(sorted(seqs)[-limit:])


def _gathered(
    plan: Plan, got: Sequence[set[int]]
) -> tuple[dict[int, set[int]], set[int], set[int]]:
    """From what each read of ``plan`` found: which candidates hold each term, all the
    candidates, and those the probes look among. Those are the candidates found by a read of
    one term (read whole, or the newest): a candidate of a conjunction holding a term read whole
    is found by that term's read, one holding the term read newest first and not older than its
    oldest read is found by that read, and one holding neither is not probed (as on every
    store: a conjunction's terms are known)."""
    holders: dict[int, set[int]] = {}
    found: set[int] = set()
    probed: set[int] = set()
    for read, seqs in zip(plan.reads, got, strict=True):
        found |= seqs
        if len(read.terms) == 1:
            probed |= seqs
        for i in read.terms:
            holders.setdefault(i, set()).update(seqs)
    return holders, found, probed


def _reads_sql(plan: Plan, ids: Sequence[int], role_id: int | None) -> tuple[str, list[Any]]:
    """The statement that reads a plan's postings (``""`` when there is nothing to read) and
    its arguments: rows ``(n, blocks, bits)``, the blocks read n found, each the postings
    (``bits``) that hold every term of the read, and the role (``role_id``: the role's term)
    if one is asked for. A read of the newest reads as many blocks, newest first, as postings
    asked for (each block holds at least one). ``ids``: the query terms' ids.

    A conjunction is a query of its own (a ``WITH`` query): its rarest two terms' blocks joined
    (and the role's), each further term's looked up in the blocks found so far. A conjunction
    of three terms is the one of its rarest two (the plan's conjunctions share their terms)
    with the third: the rarest two's lists are read once for both."""
    args: list[Any] = []

    def param(value: int) -> str:
        args.append(value)
        return f"${len(args)}"

    def joined(tables: Sequence[tuple[str, int]]) -> tuple[str, str]:
        """``FROM`` the first table's blocks, each other's joined by block; and their bits."""
        (first, first_id), rest = tables[0], tables[1:]
        joins = "".join(
            f" JOIN {{p}}search_postings {t} ON {t}.term_id = {param(term_id)}"
            f" AND {t}.block = {first}.block"
            for t, term_id in rest
        )
        bits = " & ".join(f"{t}.bits" for t, _ in tables)
        where = f"{first}.term_id = {param(first_id)}" + (f" AND ({bits}) <> 0" if rest else "")
        return f"{{p}}search_postings {first}{joins} WHERE {where}", bits

    role = [("r", role_id)] if role_id is not None else []
    queries: dict[tuple[int, ...], str] = {}  # the terms of a conjunction -> its WITH query
    defined: list[str] = []

    def conjunction(terms: tuple[int, ...]) -> str:
        if terms not in queries:
            if len(terms) == 2:
                source, bits = joined([("a", ids[terms[0]]), ("b", ids[terms[1]]), *role])
                body = f"SELECT a.block, {bits} AS bits FROM {source}"
            else:
                found = conjunction(terms[:-1])
                body = (
                    f"SELECT c.block, c.bits & x.bits AS bits FROM {found} c"
                    f" JOIN {{p}}search_postings x ON x.term_id = {param(ids[terms[-1]])}"
                    " AND x.block = c.block WHERE (c.bits & x.bits) <> 0"
                )
            queries[terms] = f"c{len(queries)}"
            defined.append(f"{queries[terms]} AS ({body})")
        return queries[terms]

    parts: list[str] = []
    for n, read in enumerate(plan.reads):
        terms = tuple(sorted(read.terms, key=lambda i: (plan.dfs[i], i)))
        if len(terms) == 1:
            source, bits = joined([("t", ids[terms[0]]), *role])
            rows = f"SELECT t.block, {bits} AS bits FROM {source}"
            order = "t.block"
        else:
            rows, order = f"SELECT block, bits FROM {conjunction(terms)}", "block"
        if read.limit is not None:
            rows += f" ORDER BY {order} DESC LIMIT {param(read.limit)}"
        parts.append(
            f"SELECT {n} AS n, array_agg(x.block) AS blocks, array_agg(x.bits) AS bits"
            f" FROM ({rows}) x"
        )
    if not parts:
        return "", []
    head = f"WITH {', '.join(defined)} " if defined else ""
    return head + " UNION ALL ".join(parts), args


def _probes_sql(plan: Plan, ids: Sequence[int], among: Iterable[int]) -> tuple[str, list[Any]]:
    """The statement that probes a plan's probe terms among the seqs ``among`` (``""``: nothing
    to probe) and its arguments: rows ``(i, blocks, bits)``, the blocks of ``among`` holding
    query term i and which of their seqs do. ``ids``: the query terms' ids."""
    blocks, bits = _block_arrays(among)
    if not blocks or not plan.probes:
        return "", []
    args: list[Any] = [blocks, bits]
    parts = []
    for i in plan.probes:
        args.append(ids[i])
        parts.append(
            f"SELECT {i} AS i, array_agg(c.block) AS blocks, array_agg(p.bits & c.bits) AS bits"
            " FROM unnest($1::bigint[], $2::bigint[]) AS c(block, bits)"
            f" JOIN {{p}}search_postings p ON p.term_id = ${len(args)} AND p.block = c.block"
            " WHERE p.bits & c.bits <> 0"
        )
    return " UNION ALL ".join(parts), args


def _entry_of_text(terms: str, context: str) -> Indexed:
    """An entry as ``search_entries`` stores it: its own terms and the lent ones, each
    space-joined."""
    return terms.split(), context.split()


# -- schemas 2-4's tsvectors (read by the migration to schema 5) ---------------------------------


def _unquote(text: str) -> str:
    """A lexeme as PostgreSQL's output quotes it, without the quotes."""
    return re.sub(r"''|\\(.)", lambda m: m.group(1) or "'", text)


def entry_of(vector: str, key: int) -> Indexed:
    """An entry's terms (own, lent, repeats kept, each in the order of their positions: the
    ranking reads the own terms' order) from its schema 4 tsvector's text form (each lexeme
    ``<key>_<term>``)."""
    prefix = f"{key}_"
    return _positioned(
        (lexeme[len(prefix) :] if lexeme.startswith(prefix) else lexeme, positions)
        for lexeme, positions in _lexemes(vector)
    )


def _legacy_entry(vector: str) -> Indexed:
    """:func:`entry_of` for a schema 2-3 tsvector (no session key; own terms weight A)."""
    return _positioned(_lexemes(vector))


def _lexemes(vector: str) -> Iterator[tuple[str, str]]:
    """``(lexeme, positions)`` of a tsvector's text form (positions ``"1"`` when it has none)."""
    for match in _LEXEME.finditer(vector):
        yield _unquote(match.group(1)), match.group(2) or "1"


def _positioned(lexemes: Iterable[tuple[str, str]]) -> Indexed:
    """Own (weight A) and lent terms, each in the order of their positions."""
    placed: list[tuple[int, bool, str]] = []
    for term, positions in lexemes:
        for position in positions.split(","):
            placed.append((int(position.rstrip("ABCD")), position.endswith("A"), term))
    placed.sort(key=lambda item: item[0])  # stable: a lexeme's own order on equal positions
    own = [term for _, is_own, term in placed if is_own]
    lent = [term for _, is_own, term in placed if not is_own]
    return own, lent


#: Settings of the pool's connections, each unless the URL sets it. Every statement here is
#: small: starting parallel workers cost a search more than they saved, and JIT compiling cost a
#: search about 12 ms (the planner could not tell how rare a session's GIN lexemes were, so its
#: estimates passed ``jit_above_cost``; it cannot tell how many postings a term has either).
SERVER_SETTINGS = {"max_parallel_workers_per_gather": "0", "jit": "off"}


def server_settings(dsn: str) -> dict[str, str]:
    """:data:`SERVER_SETTINGS` less those the URL ``dsn`` sets itself."""
    given = {name for name, _ in parse_qsl(urlsplit(dsn).query)}
    return {name: value for name, value in SERVER_SETTINGS.items() if name not in given}
