"""The URL a :class:`~host_stub.memory.redis.RedisMemory` is given, and the arguments its
scripts take for a lease's time to live and fence."""

from __future__ import annotations

import math
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS

from ...services import (
    LeaseToken,
)

_SCHEMES = ("redis", "rediss", "unix")


def _ttl_ms(ttl_s: float) -> int:
    return max(1, math.ceil(ttl_s * 1000))


def _fence_arg(lease: LeaseToken | None) -> str | int:
    return "" if lease is None else int(lease.fence)


# -- URLs -------------------------------------------------------------------------------------


def _parse_url(url: str, shown: str) -> tuple[str, str | None]:
    """Validate ``url``; return it without our own ``prefix`` parameter, and that prefix."""

    def bad(reason: str) -> ValueError:
        return ValueError(f"memory URL {shown!r}: {reason}")

    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number or out of range
    except ValueError as exc:
        raise bad(str(exc)) from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise bad("a Redis URL starts with redis://, rediss:// or unix://")
    if scheme != "unix":
        if not parts.hostname:
            raise bad("names no host (write redis://host:6379/0)")
        if port == 0:
            raise bad("port 0 is not a port")
        db = unquote(parts.path).strip("/")
        if db and not db.isdigit():
            raise bad(f"the database {db!r} is not a number (write redis://host:6379/0)")
    elif not parts.path:
        raise bad("names no socket path (write unix:///path/to/redis.sock)")
    prefix = None
    query = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "prefix":
            if not value:
                raise bad("the key prefix must not be empty")
            prefix = value
        elif name in URL_QUERY_ARGUMENT_PARSERS:
            try:
                URL_QUERY_ARGUMENT_PARSERS[name](value)
            except (TypeError, ValueError):
                raise bad(f"bad value for {name!r}: {value!r}") from None
            query.append((name, value))
        else:
            known = ", ".join(["prefix", *sorted(URL_QUERY_ARGUMENT_PARSERS)])
            raise bad(f"unknown parameter {name!r} (known: {known})")
    return urlunsplit(parts._replace(query=urlencode(query))), prefix
