"""The store: :class:`RedisMemory`, each of its operations one script (``scripts.py``)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ...messages import ArchiveReason, Message
from ...services import (
    SUMMARY_NAMESPACE,
    LeaseLost,
    LeaseToken,
    MetadataEntry,
    SearchHit,
    SessionInfo,
    Snapshot,
)
from ...session_ids import check_session_id
from .. import search_plan
from ..common import (
    TokenCounter,
    body_of,
    check_limit,
    check_ttl,
    dump_value,
    message_from_row,
    new_lease_token,
    one_line,
    redact_url,
    select_trim,
    to_datetime,
    tokens_of,
)
from ..search_plan import (
    CONTEXT_SPAN,
    CONTEXT_WEIGHT,
    Candidate,
    context_of,
    own_terms,
    plan_search,
    query_terms,
    tool_message,
)
from .connection import _fence_arg, _parse_url, _ttl_ms
from .rows import _entry, _index_doc, _message, _messages, _own_entry, _pairs, _text
from .scripts import _LIB, _SCRIPTS


class RedisMemory:
    """A :class:`~host_stub.services.MemoryService` on a Redis server.

    ``url`` is ``redis://[[user]:password@]host[:port][/db][?options]`` (``rediss://`` for TLS,
    ``unix:///path.sock`` for a socket); options are redis-py's URL options (``socket_timeout``,
    ``max_connections``, ...) plus ``prefix`` for the key prefix. ``socket_timeout`` bounds every
    connect and every command; ``max_connections`` caps the pool (callers beyond it wait for a
    free connection up to ``pool_timeout`` seconds). Nothing connects before the first call.
    """

    def __init__(
        self,
        url: str,
        token_counter: TokenCounter,
        *,
        prefix: str = "hs:",
        socket_timeout: float = 5.0,
        max_connections: int = 50,
        pool_timeout: float = 20.0,
    ) -> None:
        #: The URL with its password hidden (for messages and logs).
        self.url = redact_url(url)
        try:
            password = urlsplit(url).password or ""
        except ValueError:
            password = url.partition("://")[2].rpartition("@")[0]
        self._secrets = sorted({password, unquote(password)} - {""}, key=len, reverse=True)
        plain_url, url_prefix = _parse_url(url, self.url)
        self.prefix = url_prefix or prefix
        if not self.prefix:
            raise ValueError(f"RedisMemory({self.url!r}): the key prefix must not be empty")
        if not socket_timeout > 0:
            raise ValueError(f"socket_timeout must be > 0, got {socket_timeout}")
        self.socket_timeout = socket_timeout
        self._count = token_counter
        try:
            pool = aioredis.BlockingConnectionPool.from_url(
                plain_url,
                decode_responses=True,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                max_connections=max_connections,
                timeout=pool_timeout,
                retry=Retry(NoBackoff(), 0),  # writes are not idempotent: never resend them
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"memory URL {self.url!r}: {self._scrub(exc)}") from None
        self._client = aioredis.Redis(connection_pool=pool)
        self._scripts = {
            name: self._client.register_script(_LIB + source) for name, source in _SCRIPTS.items()
        }
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisMemory({self.url!r}, prefix={self.prefix!r})"

    # -- keys and calls -----------------------------------------------------------------------

    def _session_keys(self, session_id: str) -> list[str]:
        """``s``, ``m``, ``a``, ``z``, ``x`` of a session."""
        p = self.prefix
        return [f"{p}{kind}:{session_id}" for kind in ("s", "m", "a", "z", "x")]

    def _index_keys(self, session_id: str) -> tuple[str, str, str, str]:
        """``xd``, ``xf``, ``xo`` and the posting keys' common start ``xp:{session}:``."""
        p = self.prefix
        return (
            f"{p}xd:{session_id}",
            f"{p}xf:{session_id}",
            f"{p}xo:{session_id}",
            f"{p}xp:{session_id}:",
        )

    def _md(self, namespace: str) -> str:
        return f"{self.prefix}md:{namespace}"

    def _mk(self, key: str) -> str:
        return f"{self.prefix}mk:{key}"

    @property
    def _sessions(self) -> str:
        return f"{self.prefix}sessions"

    def _scrub(self, exc: BaseException) -> str:
        text = one_line(str(exc)) or type(exc).__name__
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Redis connection failures as one-line builtin errors naming the (redacted) URL."""
        if self._closed:
            raise RuntimeError(f"RedisMemory({self.url!r}) is closed")
        try:
            yield
        except redis_errors.AuthenticationError as exc:
            raise ConnectionError(
                f"{self.url}: cannot connect: authentication failed: {self._scrub(exc)}"
            ) from None
        except redis_errors.TimeoutError as exc:
            raise TimeoutError(
                f"{self.url}: no answer within {self.socket_timeout:g} s: {self._scrub(exc)}"
            ) from None
        except redis_errors.ConnectionError as exc:
            raise ConnectionError(f"{self.url}: cannot connect: {self._scrub(exc)}") from None

    async def _run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        with self._errors():
            return await self._scripts[script](keys=list(keys), args=list(args))

    # -- messages -----------------------------------------------------------------------------

    async def append(self, session_id: str, messages: Sequence[Message]) -> list[Message]:
        check_session_id(session_id)
        if not messages:
            return []
        rows = []
        tails = []
        for message in messages:
            tokens = tokens_of(message, self._count)
            body = body_of(message)
            rows.append((message, tokens, body))
            tails.append(
                f'"role":{json.dumps(message.role)},"kind":{json.dumps(message.kind)},'
                f'"tokens":{int(tokens)},"body":{body}}}'
            )
        owns = [own_terms(message) for message in messages]
        docs = [_index_doc(own) for own in owns]
        lent = [_pairs(context_of(own)) if own else "" for own in owns]
        ordered = [_own_entry(m, own) for m, own in zip(messages, owns, strict=True)]
        s, m, a, _, _ = self._session_keys(session_id)
        xd, xf, xo, base = self._index_keys(session_id)
        epoch, last = await self._run(
            "append",
            [s, m, a, self._sessions, xd, xf, xo],
            [
                session_id,
                base,
                len(tails),
                CONTEXT_SPAN,
                CONTEXT_WEIGHT,
                *tails,
                *docs,
                *lent,
                *ordered,
            ],
        )
        first = int(last) - len(rows) + 1
        return [
            message_from_row(
                role=message.role,
                kind=message.kind,
                body=body,
                seq=first + i,
                epoch=int(epoch),
                tokens=tokens,
                archived=None,
            )
            for i, (message, tokens, body) in enumerate(rows)
        ]

    async def get_history(self, session_id: str, limit: int | None = None) -> list[Message]:
        check_limit(limit)
        if limit == 0:
            return []
        _, m, a, _, x = self._session_keys(session_id)
        flat = await self._run("read", [m, a, x], [-1 if limit is None else limit, ""])
        return _messages(flat)

    async def get_archived(
        self, session_id: str, *, epoch: int | None = None, limit: int | None = None
    ) -> list[Message]:
        check_limit(limit)
        if limit == 0:
            return []
        _, m, _, z, x = self._session_keys(session_id)
        args = [-1 if limit is None else limit, "" if epoch is None else int(epoch)]
        return _messages(await self._run("read", [m, z, x], args))

    async def snapshot(self, session_id: str, namespace: str = SUMMARY_NAMESPACE) -> Snapshot:
        s, m, a, _, _ = self._session_keys(session_id)
        flat = await self._run("snapshot", [s, m, a, self._md(namespace)], [session_id])
        epoch, entry, rest = int(flat[0]), flat[1], flat[2:]
        messages = [_message(rest[i], rest[i + 1], None) for i in range(0, len(rest), 2)]
        record = None if entry is None else _entry(namespace, session_id, entry)
        return Snapshot(session_id=session_id, epoch=epoch, messages=messages, record=record)

    async def search(
        self, session_id: str, query: str, *, role: str | None = None, limit: int = 10
    ) -> list[SearchHit]:
        check_limit(limit)
        terms = query_terms(query)
        if not terms or not limit:
            return []
        _, m, _, _, x = self._session_keys(session_id)
        xd, xf, xo, base = self._index_keys(session_id)
        with self._errors():
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hlen(xd)
                pipe.hget(xf, "#len")
                pipe.hmget(xf, terms)
                n_docs, total, dfs = await pipe.execute()
        if not n_docs:
            return []
        plan = plan_search(
            terms, [int(df or 0) for df in dfs], int(n_docs), float(total or 0), limit=limit
        )
        if not plan.reads:
            return []
        reads = [
            f"{-1 if r.limit is None else r.limit}:{','.join(str(i + 1) for i in r.terms)}"
            for r in plan.reads
        ]
        args = [
            base,
            limit,
            role or "",
            search_plan.RESCORE,
            len(terms),
            *terms,
            *(repr(w) for w in plan.idfs),
            len(reads),
            *reads,
            *(i + 1 for i in plan.probes),
        ]
        flat = await self._run("search", [xd, m, x, xo], args)
        if not flat:
            return []
        records = {
            int(flat[i]): (_text(flat[i + 1]), flat[i + 2])
            for i in range(1, len(flat), 3)
            if flat[i + 1] is not None
        }
        candidates: list[Candidate] = []
        stored_at: dict[int, int] = {}
        for line in _text(flat[0]).split("\n"):
            head, _, own = line.partition("\t")
            seq_text, length, stored, *tfs = head.split(" ")
            seq = int(seq_text)
            stored_at[seq] = int(stored)
            if own == "?":  # indexed before the own terms were kept: read from its message
                if seq not in records:
                    continue
                message = _message(seq, records[seq][0], None)
                words, tool = " ".join(own_terms(message) or []), tool_message(message)
            else:
                flag, _, words = own.partition(" ")
                tool = flag == "1"
            candidates.append(Candidate(seq, [float(tf) for tf in tfs], float(length), words, tool))
        best = search_plan.rank(plan, candidates, limit)
        missing = [seq for seq, _ in best if seq not in records]
        if missing:  # the script returns them all; never read twice in practice
            with self._errors():
                async with self._client.pipeline(transaction=False) as pipe:
                    pipe.hmget(m, missing)
                    pipe.hmget(x, missing)
                    got, reasons = await pipe.execute()
            for seq, record, reason in zip(missing, got, reasons, strict=True):
                if record is not None:
                    records[seq] = (_text(record), reason)
        return [
            SearchHit(
                message=_message(seq, records[seq][0], records[seq][1]),
                score=value,
                stored_at=to_datetime(stored_at[seq] / 1000),
            )
            for seq, value in best
            if seq in records
        ]

    async def get_range(self, session_id: str, from_seq: int, to_seq: int) -> list[Message]:
        s, m, _, _, x = self._session_keys(session_id)
        xd, _, _, _ = self._index_keys(session_id)
        flat = await self._run("range", [s, m, xd, x], [int(from_seq), int(to_seq)])
        return _messages(flat)

    async def trim_history(
        self,
        session_id: str,
        keep_recent: int | None = None,
        up_to_seq: int | None = None,
        reason: ArchiveReason = "window",
        *,
        lease: LeaseToken | None = None,
    ) -> list[int]:
        select_trim([], keep_recent, up_to_seq)  # argument errors before touching the server
        if up_to_seq is not None:
            mode, n = "upto", int(up_to_seq)
        else:
            mode, n = "keep", int(keep_recent)  # type: ignore[arg-type]
        keys = [*self._session_keys(session_id), self._fence_key(lease)]
        seqs = await self._run("trim", keys, [mode, n, reason, _fence_arg(lease)])
        if seqs == -1:
            assert lease is not None
            raise LeaseLost(lease)
        return [int(seq) for seq in seqs]

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
        keys = [
            *self._session_keys(session_id),
            self._md(namespace),
            self._mk(session_id),
            self._fence_key(lease),
        ]
        args = [
            session_id,
            namespace,
            int(expected_version),
            int(epoch),
            int(archive_through_seq),
            dump_value(record),
            _fence_arg(lease),
        ]
        won = await self._run("commit", keys, args)
        if won == -1:
            assert lease is not None
            raise LeaseLost(lease)
        return bool(won)

    # -- metadata -----------------------------------------------------------------------------

    async def get_metadata(self, namespace: str, key: str) -> MetadataEntry | None:
        with self._errors():
            raw = await self._client.hget(self._md(namespace), key)
        return None if raw is None else _entry(namespace, key, _text(raw))

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
        return await self._write_metadata(namespace, key, dump_value(value), expected_version)

    async def delete_metadata(
        self, namespace: str, key: str, expected_version: int | None = None
    ) -> int | None:
        return await self._write_metadata(namespace, key, "", expected_version)

    async def _write_metadata(
        self, namespace: str, key: str, value: str, expected_version: int | None
    ) -> int | None:
        expected = "" if expected_version is None else int(expected_version)
        version = await self._run(
            "save_metadata", [self._md(namespace), self._mk(key)], [namespace, key, expected, value]
        )
        return None if version is None else int(version)

    async def list_metadata(self, namespace: str) -> list[MetadataEntry]:
        with self._errors():
            raw = await self._client.hgetall(self._md(namespace))
        entries = [_entry(namespace, _text(k), _text(v)) for k, v in sorted(raw.items())]
        return [e for e in entries if not e.deleted]

    # -- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, name: str, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        token = new_lease_token()
        fence = await self._run(
            "acquire",
            [f"{self.prefix}lease:{name}", f"{self.prefix}fence:{name}"],
            [token, _ttl_ms(ttl_s)],
        )
        if fence is None:
            return None
        return LeaseToken(name=name, token=token, expires_at=time.time() + ttl_s, fence=int(fence))

    async def renew_lease(self, lease: LeaseToken, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        renewed = await self._run(
            "renew", [f"{self.prefix}lease:{lease.name}"], [lease.token, _ttl_ms(ttl_s)]
        )
        if not renewed:
            return None
        return lease.model_copy(update={"expires_at": time.time() + ttl_s})

    def _fence_key(self, lease: LeaseToken | None) -> str:
        # A key name is always passed (a script's key list is fixed); unused without a lease.
        return f"{self.prefix}fence:{lease.name if lease is not None else ''}"

    async def release_lease(self, lease: LeaseToken) -> bool:
        released = await self._run("release", [f"{self.prefix}lease:{lease.name}"], [lease.token])
        return bool(released)

    # -- sessions -----------------------------------------------------------------------------

    async def get_epoch(self, session_id: str) -> int:
        with self._errors():
            epoch = await self._client.hget(f"{self.prefix}s:{session_id}", "epoch")
        return 0 if epoch is None else int(epoch)

    async def clear(self, session_id: str, types: Sequence[str] | None = None) -> int:
        check_session_id(session_id)
        s, _, a, z, x = self._session_keys(session_id)
        if types is None:
            flags, namespaces = ["1", "1"], []
        else:
            history = "1" if "history" in types else "0"
            flags = ["0", history]
            namespaces = [t for t in dict.fromkeys(types) if t != "history"]
        xd, xf, xo, _ = self._index_keys(session_id)
        keys = [s, a, z, x, self._sessions, self._mk(session_id), xd, xf, xo]
        epoch = await self._run("clear", keys, [self.prefix, session_id, *flags, *namespaces])
        return int(epoch)

    async def delete_messages(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        wanted = sorted({int(seq) for seq in seqs})
        if not wanted:
            return []
        xd, xf, xo, base = self._index_keys(session_id)
        found = await self._run(
            "delete_messages", [*self._session_keys(session_id), xd, xf, xo], [base, *wanted]
        )
        return [int(seq) for seq in found]

    async def forget(self, session_id: str) -> None:
        xd, xf, xo, _ = self._index_keys(session_id)
        keys = [*self._session_keys(session_id), self._sessions, self._mk(session_id), xd, xf, xo]
        await self._run("forget", keys, [self.prefix, session_id])

    async def list_sessions(self) -> list[SessionInfo]:
        flat = await self._run("list_sessions", [self._sessions], [self.prefix])
        infos = [
            SessionInfo(
                session_id=flat[i],
                epoch=int(flat[i + 1]),
                last_seq=int(flat[i + 2]),
                updated_at=None if flat[i + 3] is None else to_datetime(int(flat[i + 3]) / 1000),
                active=int(flat[i + 4]),
                archived=int(flat[i + 5]),
            )
            for i in range(0, len(flat), 6)
        ]
        return sorted(infos, key=lambda info: info.session_id)

    async def close(self) -> None:
        """Close the pool's connections; later calls raise ``RuntimeError``. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await self._client.aclose(close_connection_pool=True)
