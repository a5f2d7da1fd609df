"""URL parsing, the connection pool, migrations on first use, and transactions."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import asyncpg

from ..common import (
    StoreNotFound,
    TokenCounter,
    error_line,
    redact_url,
)
from .schema import MIGRATIONS, SCHEMA_VERSION

_SCHEMES = ("postgresql", "postgres")
#: Errors that mean "could not reach or log in to the server".
_CONNECT_ERRORS = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lock_key(*parts: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``parts``."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


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


#: Settings of the pool's connections, each unless the URL sets it. Every statement here is
#: small: starting parallel workers cost a search more than they saved, and JIT compiling cost a
#: search about 12 ms (the planner could not tell how rare a session's GIN lexemes were, so its
#: estimates passed ``jit_above_cost``; it cannot tell how many postings a term has either).
SERVER_SETTINGS = {"max_parallel_workers_per_gather": "0", "jit": "off"}


def server_settings(dsn: str) -> dict[str, str]:
    """:data:`SERVER_SETTINGS` less those the URL ``dsn`` sets itself."""
    given = {name for name, _ in parse_qsl(urlsplit(dsn).query)}
    return {name: value for name, value in SERVER_SETTINGS.items() if name not in given}


class _Connection:
    """What every operation of :class:`~host_stub.memory.postgres.PostgresMemory` stands on."""

    if TYPE_CHECKING:  # the migrations' data steps, in ``statements.py``

        async def backfill_search(self, conn: Any) -> None: ...

        async def _convert_search(self, conn: Any, *, legacy: bool) -> None: ...

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
