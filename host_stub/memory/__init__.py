"""Memory backends of the reference host, chosen by URL.

- ``memory://``: :class:`InMemoryMemory`, gone with the process (tests, demos).
- ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``: :class:`SQLiteMemory`, one
  file in WAL mode, safe for several processes on one machine.
- ``postgresql://``, ``redis://``: reserved for the multi-machine backends (not available yet).

Plugins never import this package; they receive a :class:`~host_stub.services.MemoryService`.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote

from ..messages import Message
from ..services import MemoryService
from .inmemory import InMemoryMemory
from .sqlite import SQLiteMemory

__all__ = ["InMemoryMemory", "SQLiteMemory", "open_memory"]

#: Schemes reserved for backends that are planned but not written yet.
_PLANNED = {
    "postgresql": "PostgreSQL",
    "postgres": "PostgreSQL",
    "redis": "Redis",
    "rediss": "Redis",
}


def open_memory(url: str, token_counter: Callable[[Message], int]) -> MemoryService:
    """The memory backend for ``url``; ``token_counter`` counts a message once, at append.

    Nothing is opened yet: a backend connects (and creates its schema) on first use.
    Raises ``ValueError`` for a URL no backend understands and ``NotImplementedError`` for a
    planned backend that is not available yet.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"memory URL {url!r} has no scheme (expected memory:// or sqlite:///)")
    scheme = scheme.lower()
    if scheme == "memory":
        return InMemoryMemory(token_counter)
    if scheme == "sqlite":
        return SQLiteMemory(_sqlite_path(url, rest), token_counter)
    # Multi-machine backends join here, e.g.:
    #   if scheme in ("postgresql", "postgres"): return PostgresMemory(url, token_counter)
    #   if scheme in ("redis", "rediss"): return RedisMemory(url, token_counter)
    if scheme in _PLANNED:
        raise NotImplementedError(
            f"memory URL {url!r}: the {_PLANNED[scheme]} backend is not available yet "
            "(use sqlite:/// or memory://)"
        )
    raise ValueError(
        f"memory URL {url!r} has an unknown scheme {scheme!r} (expected memory:// or sqlite:///)"
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
