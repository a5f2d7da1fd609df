"""Memory backends of the reference host, chosen by URL.

- ``memory://``: :class:`InMemoryMemory`, gone with the process (tests, demos).
- ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``: :class:`SQLiteMemory`, one
  file in WAL mode, safe for several processes on one machine.
- ``postgresql://user:password@host:5432/db`` (or ``postgres://``; ``?schema=name`` picks a
  PostgreSQL schema): :class:`~host_stub.memory.postgres.PostgresMemory`, on asyncpg (install
  the ``postgres`` extra), for several host processes on several machines.
- ``redis://[:password@]host:6379/0`` (or ``rediss://`` for TLS; ``?prefix=name:`` picks the key
  prefix, default ``hs:``): :class:`~host_stub.memory.redis.RedisMemory`, on redis-py asyncio
  (install the ``redis`` extra), for several host processes on several machines.

Plugins never import this package; they receive a :class:`~host_stub.services.MemoryService`.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote

from ..messages import Message
from ..services import MemoryService
from .common import StoreNotFound, redact_url
from .inmemory import InMemoryMemory
from .sqlite import SQLiteMemory

__all__ = ["InMemoryMemory", "SQLiteMemory", "StoreNotFound", "open_memory"]

SCHEMES = "memory://, sqlite:///, postgresql://, redis://"


def _install(extra: str, package: str) -> str:
    """How to install a backend's driver: the ``extra`` of the distribution that ships this
    package, or the driver's own ``package`` when that distribution is not known."""
    from importlib.metadata import packages_distributions

    shipped = packages_distributions().get(__name__.partition(".")[0]) or []
    return f"pip install '{shipped[0]}[{extra}]'" if shipped else f"pip install {package}"


def open_memory(
    url: str, token_counter: Callable[[Message], int], *, create: bool = True
) -> MemoryService:
    """The memory backend for ``url``; ``token_counter`` counts a message once, at append.

    Nothing is opened yet: a backend connects (and creates its schema) on first use. With
    ``create=False`` (a command that only reads, or changes what is there) SQLite and
    PostgreSQL open a store that exists only, and make nothing: a missing one is
    :class:`StoreNotFound` (Redis and ``memory://`` have nothing to make).
    Raises ``ValueError`` for a URL no backend understands.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(
            f"memory URL {redact_url(url)!r} has no scheme (expected one of {SCHEMES})"
        )
    scheme = scheme.lower()
    if scheme == "memory":
        return InMemoryMemory(token_counter)
    if scheme == "sqlite":
        return SQLiteMemory(_sqlite_path(url, rest), token_counter, create=create)
    if scheme in ("postgresql", "postgres"):
        try:
            from .postgres import PostgresMemory
        except ModuleNotFoundError as exc:
            if exc.name != "asyncpg":
                raise
            raise ModuleNotFoundError(
                f"the PostgreSQL memory backend needs asyncpg: {_install('postgres', 'asyncpg')}",
                name="asyncpg",
            ) from None
        return PostgresMemory(url, token_counter, create=create)
    if scheme in ("redis", "rediss"):
        try:
            from .redis import RedisMemory
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.partition(".")[0] != "redis":
                raise
            raise ModuleNotFoundError(
                f"the Redis memory backend needs redis-py: {_install('redis', 'redis')}",
                name="redis",
            ) from None
        return RedisMemory(url, token_counter)
    raise ValueError(
        f"memory URL {redact_url(url)!r} has an unknown scheme {scheme!r} "
        f"(expected one of {SCHEMES})"
    )


def _sqlite_path(url: str, rest: str) -> str:
    # sqlite:///db.sqlite -> rest "/db.sqlite" -> relative "db.sqlite";
    # sqlite:////abs/db.sqlite -> rest "//abs/db.sqlite" -> absolute "/abs/db.sqlite".
    if not rest.startswith("/"):
        raise ValueError(
            f"memory URL {url!r}: a SQLite URL has no host; write sqlite:///relative.db "
            "or sqlite:////absolute.db"
        )
    if "?" in rest:
        raise ValueError(f"memory URL {url!r}: SQLite URLs take no query parameters")
    path = unquote(rest[1:])
    if not path:
        raise ValueError(f"memory URL {url!r} names no database file")
    return path
