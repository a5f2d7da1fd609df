"""The MemoryService contract, run against every backend.

A new backend joins by adding an entry to ``BACKENDS`` (its URL for a test; a server-backed one
should skip when its server is not configured). Tests that need several connections on the same
storage ask the ``stores`` factory for more handles. The SQLite-only tests at the end check the
file format and the cross-process guarantees (seqs and leases with several OS processes); the
PostgreSQL tests after them check the same guarantees on the server, plus its URL and error
handling. PostgreSQL runs against ``MEMORY_SUMMARY_PG_URL`` (default: the local server's ``test``
database), one fresh schema per test, dropped afterwards; with no server the PostgreSQL tests skip,
except when ``CI=true``, where they fail. Redis likewise runs against ``MEMORY_SUMMARY_REDIS_URL``
(default ``redis://127.0.0.1:6379/0``), one fresh key prefix per test, its keys deleted afterwards;
the Redis tests at the very end check its cross-process guarantees, URLs, errors and scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest

from host_stub.memory import InMemoryMemory, SQLiteMemory, open_memory
from host_stub.memory.sqlite import SCHEMA_VERSION
from host_stub.messages import Message, ToolCall, ToolCallFunction, text_of
from host_stub.services import (
    LeaseLost,
    LeaseToken,
    MemoryService,
    OpensAtStart,
    Snapshot,
    SnapshotOnAppend,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def count_tokens(message: Message) -> int:
    """Deterministic stand-in for a tokenizer."""
    return len(text_of(message.content)) // 4 + 1


def user(text: str, **fields: object) -> Message:
    return Message(role="user", content=text, **fields)


def assistant(text: str, **fields: object) -> Message:
    return Message(role="assistant", content=text, **fields)


def marker(text: str = "[summarized earlier turns]") -> Message:
    return Message(role="assistant", content=text, kind="event-marker")


def seqs_of(messages: list[Message]) -> list[int]:
    return [m.seq for m in messages]  # type: ignore[misc]


# -- PostgreSQL test storage ------------------------------------------------------------------

PG_URL = os.environ.get("MEMORY_SUMMARY_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
_pg_unavailable: list[str | None] = []  # the probe's verdict, once per test run


def _unavailable(reason: str) -> NoReturn:
    """Skip; but under CI=true a backend that cannot be tested fails the run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def _pg_probe() -> str | None:
    """Why PostgreSQL cannot be tested, or ``None`` if it can."""
    try:
        import asyncpg
    except ModuleNotFoundError:
        return "asyncpg is not installed (pip install 'plugin-memory-summary[postgres]')"
    from host_stub.memory.postgres import redact_url

    async def connect() -> None:
        conn = await asyncpg.connect(PG_URL, timeout=3)
        await conn.close()

    try:  # in a thread of its own: the caller may be inside a running event loop
        with ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, connect()).result()
    except Exception as exc:
        return f"no PostgreSQL server at {redact_url(PG_URL)} (set MEMORY_SUMMARY_PG_URL): {exc}"
    return None


def pg_url() -> str:
    """``PG_URL`` with a fresh schema of its own (created on first use); skips without a server."""
    if not _pg_unavailable:
        _pg_unavailable.append(_pg_probe())
    if _pg_unavailable[0] is not None:
        _unavailable(_pg_unavailable[0])
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema=mst_{uuid.uuid4().hex[:16]}"


async def pg_drop(url: str) -> None:
    """Drop the schema a ``pg_url()`` names."""
    import asyncpg

    [schema] = parse_qs(urlsplit(url).query)["schema"]
    conn = await asyncpg.connect(PG_URL, timeout=5)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def pg() -> AsyncIterator[str]:
    """A PostgreSQL URL with a fresh schema, dropped after the test."""
    url = pg_url()
    yield url
    await pg_drop(url)


# -- Redis test storage -----------------------------------------------------------------------

REDIS_URL = os.environ.get("MEMORY_SUMMARY_REDIS_URL", "redis://127.0.0.1:6379/0")
_redis_unavailable: list[str | None] = []  # the probe's verdict, once per test run


def _redis_probe() -> str | None:
    """Why Redis cannot be tested, or ``None`` if it can."""
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ModuleNotFoundError:
        return "redis-py is not installed (pip install 'plugin-memory-summary[redis]')"
    from host_stub.memory.redis import redact_url

    try:
        client = redis.Redis.from_url(
            REDIS_URL, socket_connect_timeout=3, socket_timeout=3, retry=Retry(NoBackoff(), 0)
        )
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        where = redact_url(REDIS_URL)
        return f"no Redis server at {where} (set MEMORY_SUMMARY_REDIS_URL): {exc}"
    return None


def redis_url() -> str:
    """``REDIS_URL`` with a fresh key prefix of its own; skips without a server."""
    if not _redis_unavailable:
        _redis_unavailable.append(_redis_probe())
    if _redis_unavailable[0] is not None:
        _unavailable(_redis_unavailable[0])
    return f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix=mst-{uuid.uuid4().hex[:16]}:"


def redis_drop_now(url: str) -> None:
    """Delete every key under the prefix a ``redis_url()`` names (found with SCAN)."""
    import redis

    prefix = parse_qs(urlsplit(url).query)["prefix"][-1]
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.unlink(*keys[start : start + 500])
    finally:
        client.close()


async def redis_drop(url: str) -> None:
    redis_drop_now(url)


@pytest.fixture
def rds() -> Iterator[str]:
    """A Redis URL with a fresh key prefix, its keys deleted after the test."""
    url = redis_url()
    yield url
    redis_drop_now(url)


# -- backends ---------------------------------------------------------------------------------

#: name -> URL of a fresh, empty storage for one test (given the test's directory). A
#: server-backed backend skips when its server is unreachable (fails when CI=true).
BACKENDS: dict[str, Callable[[Path], str]] = {
    "memory": lambda tmp: "memory://",
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'memory.db'}",
    "postgres": lambda tmp: pg_url(),
    "redis": lambda tmp: redis_url(),
}
#: name -> what removes a test's storage afterwards, given its URL.
CLEANUP: dict[str, Callable[[str], Awaitable[None]]] = {
    "postgres": pg_drop,
    "redis": redis_drop,
}
#: Backends whose storage lives in the object itself: a "second handle" is the same object.
IN_PROCESS = {"memory"}

StoreFactory = Callable[[], MemoryService]


@pytest.fixture(params=sorted(BACKENDS))
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """Opens handles on one fresh storage of the backend; closes them all afterwards."""
    url = BACKENDS[request.param](tmp_path)
    opened: list[MemoryService] = []

    def make() -> MemoryService:
        if request.param in IN_PROCESS and opened:
            return opened[0]
        store = open_memory(url, count_tokens)
        opened.append(store)
        return store

    yield make
    try:
        for store in opened:
            await store.close()
    finally:
        if request.param in CLEANUP:
            await CLEANUP[request.param](url)


@pytest.fixture
def memory(stores: StoreFactory) -> MemoryService:
    return stores()


async def fill(memory: MemoryService, session_id: str, n: int, start: int = 1) -> list[Message]:
    return await memory.append(session_id, [user(f"message {i}") for i in range(start, start + n)])


# -- append and reads -------------------------------------------------------------------------


async def test_backend_satisfies_protocol(memory: MemoryService) -> None:
    assert isinstance(memory, MemoryService)


async def test_append_assigns_seq_epoch_and_tokens(memory: MemoryService) -> None:
    given = [user("x" * 28), assistant("x", tokens=99)]
    out = await memory.append("s", given)
    assert seqs_of(out) == [1, 2]
    assert [m.epoch for m in out] == [0, 0]
    assert [m.tokens for m in out] == [count_tokens(given[0]), 99]
    assert out[0].tokens == 8
    assert all(m.archived is None for m in out)
    # The caller's objects are left alone.
    assert [m.seq for m in given] == [None, None]
    assert given[0].tokens is None

    more = await memory.append("s", [user("third")])
    assert seqs_of(more) == [3]
    other = await memory.append("other", [user("first of another session")])
    assert seqs_of(other) == [1]
    assert await memory.append("s", []) == []
    assert seqs_of(await memory.get_history("s")) == [1, 2, 3]


#: The backends with the optional ``append_snapshot`` (the others: ``append``, then ``snapshot``).
SNAPSHOT_ON_APPEND = {"memory", "sqlite"}
#: The backends with the optional ``open`` (the others open on first use).
OPENS_AT_START = {"sqlite"}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
async def test_the_backends_that_read_with_an_append(backend: str, tmp_path: Path) -> None:
    url = BACKENDS[backend](tmp_path)
    store = open_memory(url, count_tokens)
    try:
        assert isinstance(store, SnapshotOnAppend) == (backend in SNAPSHOT_ON_APPEND)
        assert isinstance(store, OpensAtStart) == (backend in OPENS_AT_START)
    finally:
        await store.close()
        if backend in CLEANUP:
            await CLEANUP[backend](url)


@pytest.mark.parametrize("backend", sorted(SNAPSHOT_ON_APPEND))
async def test_append_snapshot_is_an_append_then_a_snapshot(backend: str, tmp_path: Path) -> None:
    """A store with the optional ``append_snapshot`` gives what ``append`` then ``snapshot``
    give on a twin session fed the same calls: the same messages back and the same snapshot,
    an empty append included (a read alone), across a compression and a clear."""
    memory = open_memory(BACKENDS[backend](tmp_path), count_tokens)
    assert isinstance(memory, SnapshotOnAppend)
    try:
        await _same_as_append_then_snapshot(memory)
    finally:
        await memory.close()


async def _same_as_append_then_snapshot(memory: Any) -> None:
    call = ToolCall(id="c1", function=ToolCallFunction(name="lookup", arguments="{}"))
    steps: list[list[Message]] = [
        [user("hello"), assistant("hi")],
        [],
        [
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="c1", content="ok"),
        ],
        [user("again")],
    ]

    def same(snap: Snapshot) -> dict[str, object]:
        record = snap.record
        return {
            "epoch": snap.epoch,
            "messages": [m.model_dump() for m in snap.messages],
            "record": None if record is None else (record.value, record.version, record.deleted),
        }

    for i, batch in enumerate(steps):
        got, snap = await memory.append_snapshot("fused", batch)
        want = await memory.append("plain", batch)
        assert got == want and same(snap) == same(await memory.snapshot("plain"))
        if i == 1:
            for session in ("fused", "plain"):
                assert await memory.commit_compression(session, {"summary": "s"}, 0, 1, epoch=0)
        if i == 2:
            for session in ("fused", "plain"):
                await memory.clear(session)


async def test_append_ignores_store_fields_given_by_caller(memory: MemoryService) -> None:
    stale = user("copied from elsewhere", seq=41, epoch=7, archived="window")
    [out] = await memory.append("s", [stale])
    assert (out.seq, out.epoch, out.archived) == (1, 0, None)
    assert seqs_of(await memory.get_history("s")) == [1]


async def test_messages_round_trip_every_field(memory: MemoryService) -> None:
    call = ToolCall(
        id="call_1",
        function=ToolCallFunction(name="lookup", arguments='{"q": "天气"}'),
        index=0,  # extra provider field survives
    )
    given = [
        Message(role="system", content="be brief"),
        Message(
            role="user",
            content=[
                {"type": "text", "text": "what is in this picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
            name="alice",
            metadata={"lang": "en", "nested": {"list": [1, 2.5, None, "é"]}},
        ),
        Message(role="assistant", content=None, tool_calls=[call]),
        Message(role="tool", content='{"temp": 21}', tool_call_id="call_1", name="lookup"),
        Message(role="assistant", content="[summary updated]", kind="event-marker"),
    ]
    out = await memory.append("s", given)
    history = await memory.get_history("s")
    store_fields = {"seq", "epoch", "tokens", "archived"}
    for original, returned, stored in zip(given, out, history, strict=True):
        assert stored.model_dump(exclude=store_fields) == original.model_dump(exclude=store_fields)
        assert returned == stored
    assert history[2].tool_calls is not None
    assert history[2].tool_calls[0].model_dump()["index"] == 0
    assert history[4].is_marker


async def test_reads_return_copies(memory: MemoryService) -> None:
    await memory.append("s", [user("original", metadata={"k": "v"})])
    [first] = await memory.get_history("s")
    first.content = "mutated"
    first.metadata["k"] = "mutated"
    [again] = await memory.get_history("s")
    assert again.content == "original"
    assert again.metadata == {"k": "v"}

    value = {"summary": "original", "facts": ["a"]}
    await memory.save_metadata("ns", "k", value)
    value["facts"].append("b")
    entry = await memory.get_metadata("ns", "k")
    assert entry is not None and entry.value == {"summary": "original", "facts": ["a"]}
    entry.value["facts"].append("c")  # type: ignore[index]
    entry = await memory.get_metadata("ns", "k")
    assert entry is not None and entry.value == {"summary": "original", "facts": ["a"]}


async def test_concurrent_appends_are_gapless(stores: StoreFactory) -> None:
    handles = [stores() for _ in range(4)]  # separate connections where the backend has them

    async def worker(n: int) -> list[list[int]]:
        store = handles[n % len(handles)]
        batches = []
        for i in range(5):
            out = await store.append("s", [user(f"{n}-{i}-a"), user(f"{n}-{i}-b")])
            batches.append(seqs_of(out))
        return batches

    results = await asyncio.gather(*(worker(n) for n in range(20)))
    batches = [batch for per_task in results for batch in per_task]
    everything = sorted(seq for batch in batches for seq in batch)
    assert everything == list(range(1, 201))
    for batch in batches:  # a batch is one transaction: consecutive seqs
        assert batch[1] == batch[0] + 1
    for per_task in results:  # a task's later append commits later
        firsts = [batch[0] for batch in per_task]
        assert firsts == sorted(firsts)
    history = await handles[0].get_history("s")
    assert seqs_of(history) == list(range(1, 201))
    assert len({m.content for m in history}) == 200


async def test_cancelled_append_leaves_store_usable(memory: MemoryService) -> None:
    await fill(memory, "s", 3)
    for _ in range(5):
        task = asyncio.create_task(memory.append("s", [user("maybe"), user("maybe too")]))
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    out = await fill(memory, "s", 2, start=100)
    history = await memory.get_history("s")
    assert seqs_of(history) == list(range(1, len(history) + 1))
    assert seqs_of(out) == seqs_of(history)[-2:]


async def test_get_history_limit(memory: MemoryService) -> None:
    assert await memory.get_history("unknown") == []
    await fill(memory, "s", 5)
    assert seqs_of(await memory.get_history("s", limit=2)) == [4, 5]
    assert seqs_of(await memory.get_history("s", limit=10)) == [1, 2, 3, 4, 5]
    assert await memory.get_history("s", limit=0) == []
    await memory.trim_history("s", up_to_seq=4)
    assert seqs_of(await memory.get_history("s", limit=2)) == [5]
    with pytest.raises(ValueError):
        await memory.get_history("s", limit=-1)


async def test_get_archived_reasons_epoch_and_limit(memory: MemoryService) -> None:
    assert await memory.get_archived("unknown") == []
    await fill(memory, "s", 4)
    await memory.trim_history("s", up_to_seq=2)
    assert await memory.clear("s", types=["history"]) == 1
    await fill(memory, "s", 2, start=5)  # seqs 5, 6 in epoch 1
    await memory.trim_history("s", up_to_seq=5, reason="fallback-trim")

    archived = await memory.get_archived("s")
    assert [(m.seq, m.archived, m.epoch) for m in archived] == [
        (1, "window", 0),
        (2, "window", 0),
        (3, "cleared", 0),
        (4, "cleared", 0),
        (5, "fallback-trim", 1),
    ]
    assert seqs_of(await memory.get_archived("s", epoch=1)) == [5]
    assert seqs_of(await memory.get_archived("s", epoch=0, limit=2)) == [3, 4]
    assert seqs_of(await memory.get_archived("s", limit=1)) == [5]
    assert seqs_of(await memory.get_history("s")) == [6]


# -- trim -------------------------------------------------------------------------------------


async def test_trim_keep_recent_does_not_count_markers(memory: MemoryService) -> None:
    await memory.append(
        "s",
        [user("u1"), marker(), user("u3"), assistant("a4"), marker(), user("u6"), assistant("a7")],
    )
    # The newest 3 real messages are 4, 6, 7; the marker 5 inside that window stays, the
    # marker 2 before it goes with 1 and 3.
    assert await memory.trim_history("s", keep_recent=3) == [1, 2, 3]
    assert seqs_of(await memory.get_history("s")) == [4, 5, 6, 7]
    assert {m.archived for m in await memory.get_archived("s")} == {"window"}
    assert await memory.trim_history("s", keep_recent=3) == []
    assert await memory.trim_history("s", keep_recent=10) == []

    assert await memory.trim_history("s", keep_recent=0, reason="fallback-trim") == [4, 5, 6, 7]
    assert await memory.get_history("s") == []
    archived = await memory.get_archived("s")
    assert [m.archived for m in archived] == ["window"] * 3 + ["fallback-trim"] * 4


async def test_trim_up_to_seq(memory: MemoryService) -> None:
    await memory.append("s", [user("u1"), marker(), user("u3"), user("u4")])
    assert await memory.trim_history("s", up_to_seq=3, reason="deleted") == [1, 2, 3]
    assert await memory.trim_history("s", up_to_seq=3) == []
    assert seqs_of(await memory.get_history("s")) == [4]
    archived = await memory.get_archived("s")
    assert [(m.seq, m.archived) for m in archived] == [
        (1, "deleted"),
        (2, "deleted"),
        (3, "deleted"),
    ]
    assert await memory.trim_history("unknown", up_to_seq=10) == []


async def test_trim_needs_exactly_one_bound(memory: MemoryService) -> None:
    await fill(memory, "s", 3)
    with pytest.raises(ValueError):
        await memory.trim_history("s")
    with pytest.raises(ValueError):
        await memory.trim_history("s", keep_recent=1, up_to_seq=1)
    with pytest.raises(ValueError):
        await memory.trim_history("s", keep_recent=-1)
    assert seqs_of(await memory.get_history("s")) == [1, 2, 3]


# -- commit_compression -----------------------------------------------------------------------


async def test_commit_compression_wins(memory: MemoryService) -> None:
    await fill(memory, "s", 5)
    snap = await memory.snapshot("s")
    assert snap.record is None and snap.epoch == 0
    won = await memory.commit_compression(
        "s", {"summary": "first three"}, 0, archive_through_seq=3, epoch=snap.epoch
    )
    assert won is True
    entry = await memory.get_metadata("summary", "s")
    assert entry is not None
    assert (entry.value, entry.version, entry.deleted) == ({"summary": "first three"}, 1, False)
    assert seqs_of(await memory.get_history("s")) == [4, 5]
    archived = await memory.get_archived("s")
    assert [(m.seq, m.archived) for m in archived] == [
        (1, "summarized"),
        (2, "summarized"),
        (3, "summarized"),
    ]

    assert await memory.commit_compression("s", {"summary": "all"}, 1, 5, epoch=0) is True
    entry = await memory.get_metadata("summary", "s")
    assert entry is not None and (entry.value, entry.version) == ({"summary": "all"}, 2)
    assert await memory.get_history("s") == []


async def test_system_messages_are_never_archived_by_trim_or_compression(
    memory: MemoryService,
) -> None:
    await memory.append("s", [Message(role="system", content="policy")])
    await fill(memory, "s", 4, start=2)
    await memory.append("s", [Message(role="system", content="late policy")])
    await fill(memory, "s", 2, start=7)
    assert await memory.commit_compression("s", {"text": "S"}, 0, 4, epoch=0)
    assert await memory.trim_history("s", keep_recent=1, reason="window") == [5, 7]
    active = await memory.get_history("s")
    assert [(m.seq, m.role) for m in active] == [(1, "system"), (6, "system"), (8, "user")]
    reasons = {m.seq: m.archived for m in await memory.get_archived("s")}
    assert reasons == {2: "summarized", 3: "summarized", 4: "summarized", 5: "window", 7: "window"}


async def test_delete_messages_marks_active_and_archived(memory: MemoryService) -> None:
    await fill(memory, "s", 5)
    assert await memory.commit_compression("s", {"text": "S"}, 0, 2, epoch=0)
    assert await memory.delete_messages("s", [2, 4, 99]) == [2, 4]
    assert await memory.delete_messages("s", [2]) == []  # already deleted
    assert seqs_of(await memory.get_history("s")) == [3, 5]
    reasons = {m.seq: m.archived for m in await memory.get_archived("s")}
    assert reasons == {1: "summarized", 2: "deleted", 4: "deleted"}
    assert await memory.delete_messages("unknown", [1]) == []


async def test_commit_compression_custom_namespace(memory: MemoryService) -> None:
    await fill(memory, "s", 2)
    assert await memory.commit_compression("s", {"x": 1}, 0, 1, epoch=0, namespace="digest")
    assert await memory.get_metadata("summary", "s") is None
    entry = await memory.get_metadata("digest", "s")
    assert entry is not None and entry.value == {"x": 1}
    assert (await memory.snapshot("s", namespace="digest")).record == entry


async def test_commit_compression_loses_on_version_and_changes_nothing(
    memory: MemoryService,
) -> None:
    await fill(memory, "s", 5)
    assert await memory.save_metadata("summary", "s", {"summary": "someone else"}) == 1
    for stale in (0, 2):
        won = await memory.commit_compression("s", {"summary": "mine"}, stale, 3, epoch=0)
        assert won is False
    entry = await memory.get_metadata("summary", "s")
    assert entry is not None and (entry.value, entry.version) == ({"summary": "someone else"}, 1)
    assert seqs_of(await memory.get_history("s")) == [1, 2, 3, 4, 5]
    assert await memory.get_archived("s") == []


async def test_commit_compression_loses_after_clear(memory: MemoryService) -> None:
    await fill(memory, "s", 5)
    snap = await memory.snapshot("s")
    # A clear that keeps the history but bumps the epoch (and tombstones the summary).
    assert await memory.clear("s", types=["summary"]) == 1
    entry = await memory.get_metadata("summary", "s")
    assert entry is not None and entry.deleted and entry.version == 1
    # Even with the current version, the old epoch loses and archives nothing.
    won = await memory.commit_compression("s", {"summary": "late"}, 1, 3, epoch=snap.epoch)
    assert won is False
    assert seqs_of(await memory.get_history("s")) == [1, 2, 3, 4, 5]
    assert await memory.get_archived("s") == []
    entry = await memory.get_metadata("summary", "s")
    assert entry is not None and entry.deleted and entry.value is None and entry.version == 1

    assert await memory.commit_compression("s", {"summary": "fresh"}, 1, 3, epoch=1) is True
    assert seqs_of(await memory.get_history("s")) == [4, 5]


async def test_commit_compression_over_tombstone_needs_its_version(memory: MemoryService) -> None:
    await fill(memory, "s", 2)
    assert await memory.delete_metadata("summary", "s") == 1
    assert await memory.commit_compression("s", {"s": 1}, 0, 2, epoch=0) is False
    assert seqs_of(await memory.get_history("s")) == [1, 2]
    assert await memory.commit_compression("s", {"s": 1}, 1, 2, epoch=0) is True
    entry = await memory.get_metadata("summary", "s")
    assert entry is not None and (entry.version, entry.deleted, entry.value) == (2, False, {"s": 1})


async def test_concurrent_commit_compression_has_one_winner(stores: StoreFactory) -> None:
    handles = [stores() for _ in range(3)]
    await fill(handles[0], "s", 10)
    results = await asyncio.gather(
        *(handles[i % 3].commit_compression("s", {"by": i}, 0, 2 + i, epoch=0) for i in range(6))
    )
    assert results.count(True) == 1
    winner = results.index(True)
    entry = await handles[0].get_metadata("summary", "s")
    assert entry is not None and entry.value == {"by": winner} and entry.version == 1
    assert seqs_of(await handles[0].get_archived("s")) == list(range(1, 3 + winner))


# -- metadata ---------------------------------------------------------------------------------


async def test_metadata_never_written_versus_deleted(memory: MemoryService) -> None:
    assert await memory.get_metadata("ns", "k") is None
    assert await memory.save_metadata("ns", "k", {"v": 1}) == 1
    entry = await memory.get_metadata("ns", "k")
    assert entry is not None
    assert (entry.namespace, entry.key, entry.value, entry.version, entry.deleted) == (
        "ns",
        "k",
        {"v": 1},
        1,
        False,
    )
    assert entry.updated_at is not None and entry.updated_at.tzinfo is not None
    assert await memory.save_metadata("ns", "k", {"v": 2}) == 2

    assert await memory.delete_metadata("ns", "k") == 3
    entry = await memory.get_metadata("ns", "k")
    assert entry is not None
    assert (entry.value, entry.deleted, entry.version) == (None, True, 3)
    assert await memory.list_metadata("ns") == []
    # The tombstone keeps its version: "must not exist yet" fails, its version wins.
    assert await memory.save_metadata("ns", "k", {"v": 3}, expected_version=0) is None
    assert await memory.save_metadata("ns", "k", {"v": 3}, expected_version=3) == 4
    entry = await memory.get_metadata("ns", "k")
    assert entry is not None and (entry.value, entry.deleted) == ({"v": 3}, False)


async def test_save_metadata_compare_and_set(memory: MemoryService) -> None:
    assert await memory.save_metadata("ns", "k", {"v": "a"}, expected_version=0) == 1
    assert await memory.save_metadata("ns", "k", {"v": "b"}, expected_version=0) is None
    assert await memory.save_metadata("ns", "k", {"v": "b"}, expected_version=2) is None
    entry = await memory.get_metadata("ns", "k")
    assert entry is not None and (entry.value, entry.version) == ({"v": "a"}, 1)
    assert await memory.save_metadata("ns", "k", {"v": "b"}, expected_version=1) == 2
    assert await memory.save_metadata("ns", "k", {"v": "c"}, expected_version=1) is None
    assert await memory.save_metadata("ns", "k", {"v": "c"}) == 3
    assert await memory.save_metadata("ns", "new", {"v": 1}, expected_version=5) is None
    assert await memory.get_metadata("ns", "new") is None


async def test_delete_metadata_compare_and_set(memory: MemoryService) -> None:
    assert await memory.save_metadata("ns", "k", {"v": 1}) == 1
    assert await memory.delete_metadata("ns", "k", expected_version=0) is None
    assert await memory.delete_metadata("ns", "k", expected_version=2) is None
    entry = await memory.get_metadata("ns", "k")
    assert entry is not None and not entry.deleted and entry.version == 1
    assert await memory.delete_metadata("ns", "k", expected_version=1) == 2
    # Deleting again still bumps the version; deleting a never-written key leaves a tombstone.
    assert await memory.delete_metadata("ns", "k") == 3
    assert await memory.delete_metadata("ns", "ghost", expected_version=0) == 1
    ghost = await memory.get_metadata("ns", "ghost")
    assert ghost is not None and ghost.deleted and ghost.version == 1


async def test_list_metadata(memory: MemoryService) -> None:
    assert await memory.list_metadata("ns") == []
    await memory.save_metadata("ns", "b", {"n": 2})
    await memory.save_metadata("ns", "a", {"n": 1})
    await memory.save_metadata("ns", "gone", {"n": 0})
    await memory.delete_metadata("ns", "gone")
    await memory.save_metadata("other", "a", {"n": 9})
    listed = await memory.list_metadata("ns")
    assert sorted((e.key, e.value, e.namespace) for e in listed) == [
        ("a", {"n": 1}, "ns"),
        ("b", {"n": 2}, "ns"),
    ]
    assert [e.key for e in await memory.list_metadata("other")] == ["a"]


# -- leases -----------------------------------------------------------------------------------


async def test_lease_is_exclusive_until_released(stores: StoreFactory) -> None:
    one, two = stores(), stores()
    before = time.time()
    lease = await one.acquire_lease("compress:s", 30)
    assert lease is not None
    assert lease.name == "compress:s"
    assert before + 30 <= lease.expires_at <= time.time() + 30
    assert await one.acquire_lease("compress:s", 30) is None
    assert await two.acquire_lease("compress:s", 30) is None
    other = await two.acquire_lease("compress:t", 30)  # names are independent
    assert other is not None

    forged = LeaseToken(name="compress:s", token="not-the-token", expires_at=lease.expires_at)
    assert await two.release_lease(forged) is False
    assert await two.acquire_lease("compress:s", 30) is None  # still held

    assert await one.release_lease(lease) is True
    assert await one.release_lease(lease) is False
    again = await two.acquire_lease("compress:s", 30)
    assert again is not None and again.token != lease.token
    assert await two.release_lease(again) is True
    assert await two.release_lease(other) is True


async def _take_over(store: MemoryService, name: str, ttl_s: float) -> LeaseToken:
    """Poll until ``store`` gets the lease ``name`` (a real clock, any load: no upper bound but
    the test's own timeout)."""
    while (lease := await store.acquire_lease(name, ttl_s)) is None:
        await asyncio.sleep(0.02)
    return lease


async def test_expired_lease_is_taken_over(stores: StoreFactory) -> None:
    """With the store's own clock (a server's, for PostgreSQL and Redis): a lease runs out after
    its TTL and not before. Only lower bounds are checked, so a slow machine cannot fail it; the
    exact boundaries are checked with an injected clock below."""
    one, two = stores(), stores()
    started = time.monotonic()
    crashed = await one.acquire_lease("L", 0.3)
    assert crashed is not None
    taken = await _take_over(two, "L", 30)
    assert time.monotonic() - started >= 0.3 - 0.02  # the server's clock may tick a bit apart
    assert taken.token != crashed.token and taken.fence > crashed.fence
    # The old holder's late release or renewal must not free or extend the new holder's lease.
    assert await one.release_lease(crashed) is False
    assert await one.renew_lease(crashed, 30) is None
    assert await one.acquire_lease("L", 5) is None
    assert await two.release_lease(taken) is True


async def test_p1_fences_grow_and_a_newer_holder_refuses_the_old_holders_writes(
    stores: StoreFactory,
) -> None:
    """Issue 14 point 1: each acquisition carries a larger fencing token than every earlier one
    of its name (releases included), and a write made under a lease is refused, changing
    nothing, once a newer holder took the lease."""
    one, two = stores(), stores()
    await fill(one, "s", 6)
    old = await one.acquire_lease("compress:s", 30)
    assert old is not None
    # The holder stalled, its lease went (released here; an expiry in the test above and below)
    # and another process took it.
    assert await one.release_lease(old) is True
    new = await two.acquire_lease("compress:s", 30)
    assert new is not None and new.fence > old.fence
    with pytest.raises(LeaseLost):
        await one.commit_compression("s", {"summary": "late"}, 0, 3, epoch=0, lease=old)
    with pytest.raises(LeaseLost):
        await one.trim_history("s", up_to_seq=3, reason="fallback-trim", lease=old)
    assert await two.get_metadata("summary", "s") is None
    assert seqs_of(await two.get_history("s")) == [1, 2, 3, 4, 5, 6]
    # The current holder's writes go through; other lease names do not matter.
    other = await one.acquire_lease("compress:t", 30)
    assert other is not None
    assert await two.trim_history("s", up_to_seq=1, lease=new) == [1]
    assert await two.commit_compression("s", {"summary": "new"}, 0, 3, epoch=0, lease=new)
    assert seqs_of(await two.get_history("s")) == [4, 5, 6]
    # Without a lease nothing is fenced (rebuilds and tools that hold none).
    assert await one.commit_compression("s", {"summary": "unfenced"}, 1, 4, epoch=0)
    # Fences keep growing across releases.
    assert await two.release_lease(new) is True
    again = await one.acquire_lease("compress:s", 30)
    assert again is not None and again.fence > new.fence
    assert await one.release_lease(again) and await one.release_lease(other)


async def test_p1_renewal_extends_only_a_live_lease_of_its_holder(stores: StoreFactory) -> None:
    one, two = stores(), stores()
    lease = await one.acquire_lease("L", 5)
    assert lease is not None
    renewed = await one.renew_lease(lease, 30)
    assert renewed is not None
    assert (renewed.name, renewed.token, renewed.fence) == (lease.name, lease.token, lease.fence)
    assert renewed.expires_at >= lease.expires_at
    forged = lease.model_copy(update={"token": "not-the-token"})
    assert await two.renew_lease(forged, 30) is None
    assert await two.acquire_lease("L", 5) is None  # still held
    with pytest.raises(ValueError, match="ttl_s"):
        await one.renew_lease(lease, 0)
    assert await one.release_lease(renewed) is True
    assert await one.renew_lease(renewed, 30) is None  # released: renewal cannot revive it


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_lease_expiry_and_renewal_follow_an_injected_clock(
    backend: str, tmp_path: Path
) -> None:
    """The backends that read the clock themselves take it injected: every boundary exactly,
    with no sleep and no dependency on the machine's speed."""
    now = [1000.0]

    def clock() -> float:
        return now[0]

    if backend == "memory":
        store: MemoryService = InMemoryMemory(count_tokens, clock=clock)
        other = store
    else:
        store = SQLiteMemory(tmp_path / "m.db", count_tokens, clock=clock)
        other = SQLiteMemory(tmp_path / "m.db", count_tokens, clock=clock)
    try:
        await fill(store, "s", 3)
        lease = await store.acquire_lease("L", 5)
        assert lease is not None and lease.expires_at == 1005.0
        now[0] = 1004.9
        assert await other.acquire_lease("L", 5) is None
        renewed = await store.renew_lease(lease, 5)  # the heartbeat, before expiry
        assert renewed is not None and renewed.expires_at == 1009.9
        now[0] = 1009.0  # past the first expiry: the renewal keeps it
        assert await other.acquire_lease("L", 5) is None
        now[0] = 1009.9  # expired (at the instant, not after)
        assert await store.renew_lease(renewed, 5) is None  # too late to renew
        taken = await other.acquire_lease("L", 5)
        assert taken is not None and taken.fence == lease.fence + 1
        with pytest.raises(LeaseLost):
            await store.commit_compression("s", {"x": 1}, 0, 2, epoch=0, lease=renewed)
        assert await other.commit_compression("s", {"x": 2}, 0, 2, epoch=0, lease=taken)
    finally:
        await store.close()
        if other is not store:
            await other.close()


async def test_lease_ttl_must_be_positive(memory: MemoryService) -> None:
    with pytest.raises(ValueError):
        await memory.acquire_lease("L", 0)
    assert await memory.acquire_lease("L", 1) is not None


# -- epoch, clear, forget, sessions -----------------------------------------------------------


async def test_clear_everything(memory: MemoryService) -> None:
    assert await memory.get_epoch("s") == 0
    await fill(memory, "s", 3)
    await memory.save_metadata("summary", "s", {"summary": "x"})
    await memory.save_metadata("facts", "s", {"facts": ["y"]})
    await memory.save_metadata("summary", "t", {"summary": "other session"})
    await fill(memory, "t", 2)

    assert await memory.clear("s") == 1
    assert await memory.get_epoch("s") == 1
    assert await memory.get_history("s") == []
    assert [(m.seq, m.archived) for m in await memory.get_archived("s")] == [
        (1, "cleared"),
        (2, "cleared"),
        (3, "cleared"),
    ]
    for namespace, version in (("summary", 2), ("facts", 2)):
        entry = await memory.get_metadata(namespace, "s")
        assert entry is not None and entry.deleted and entry.version == version
    # Other sessions are untouched.
    assert await memory.get_epoch("t") == 0
    assert seqs_of(await memory.get_history("t")) == [1, 2]
    entry = await memory.get_metadata("summary", "t")
    assert entry is not None and not entry.deleted and entry.version == 1

    # Seqs continue; new messages belong to the new epoch.
    [after] = await memory.append("s", [user("after clear")])
    assert (after.seq, after.epoch) == (4, 1)
    assert await memory.clear("s") == 2
    assert seqs_of(await memory.get_archived("s", epoch=1)) == [4]


async def test_clear_selected_types(memory: MemoryService) -> None:
    await fill(memory, "s", 3)
    await memory.save_metadata("summary", "s", {"summary": "x"})
    await memory.save_metadata("facts", "s", {"facts": ["y"]})

    assert await memory.clear("s", types=["summary"]) == 1
    assert seqs_of(await memory.get_history("s")) == [1, 2, 3]
    summary = await memory.get_metadata("summary", "s")
    assert summary is not None and summary.deleted and summary.version == 2
    facts = await memory.get_metadata("facts", "s")
    assert facts is not None and not facts.deleted and facts.version == 1

    assert await memory.clear("s", types=["history"]) == 2
    assert await memory.get_history("s") == []
    assert {m.archived for m in await memory.get_archived("s")} == {"cleared"}
    facts = await memory.get_metadata("facts", "s")
    assert facts is not None and not facts.deleted and facts.version == 1

    assert await memory.clear("s", types=[]) == 3  # the epoch alone
    facts = await memory.get_metadata("facts", "s")
    assert facts is not None and not facts.deleted

    # A named type that was never written gets a tombstone; an unknown session is created.
    assert await memory.clear("new", types=["summary"]) == 1
    tomb = await memory.get_metadata("summary", "new")
    assert tomb is not None and tomb.deleted and tomb.version == 1
    assert "new" in {info.session_id for info in await memory.list_sessions()}


async def test_forget(memory: MemoryService) -> None:
    await fill(memory, "s", 4)
    await memory.trim_history("s", up_to_seq=2)
    await memory.save_metadata("summary", "s", {"summary": "x"})
    await memory.save_metadata("facts", "s", {"facts": []})
    await memory.clear("s", types=["facts"])
    await fill(memory, "t", 1)
    await memory.save_metadata("summary", "t", {"summary": "keep"})

    await memory.forget("s")
    assert await memory.get_history("s") == []
    assert await memory.get_archived("s") == []
    assert await memory.get_epoch("s") == 0
    assert await memory.get_metadata("summary", "s") is None
    assert await memory.get_metadata("facts", "s") is None
    snap = await memory.snapshot("s")
    assert (snap.epoch, snap.messages, snap.record) == (0, [], None)
    assert [info.session_id for info in await memory.list_sessions()] == ["t"]
    assert seqs_of(await memory.get_history("t")) == [1]
    kept = await memory.get_metadata("summary", "t")
    assert kept is not None and kept.value == {"summary": "keep"}

    [fresh] = await memory.append("s", [user("a new start")])
    assert (fresh.seq, fresh.epoch) == (1, 0)
    await memory.forget("never-existed")


async def test_list_sessions(memory: MemoryService) -> None:
    assert await memory.list_sessions() == []
    await fill(memory, "a", 5)
    await memory.trim_history("a", up_to_seq=2)
    await memory.clear("b", types=["history"])
    await fill(memory, "c", 1)
    infos = {info.session_id: info for info in await memory.list_sessions()}
    assert sorted(infos) == ["a", "b", "c"]
    summary = {sid: (i.active, i.archived, i.last_seq, i.epoch) for sid, i in infos.items()}
    assert summary == {"a": (3, 2, 5, 0), "b": (0, 0, 0, 1), "c": (1, 0, 1, 0)}
    assert infos["a"].updated_at is not None


# -- search -----------------------------------------------------------------------------------


async def _search_seqs(
    memory: MemoryService, session_id: str, query: str, **kwargs: object
) -> list[int]:
    return [hit.message.seq for hit in await memory.search(session_id, query, **kwargs)]  # type: ignore[arg-type, misc]


async def test_search_ranks_any_word_matches_of_this_session_only(memory: MemoryService) -> None:
    await memory.append(
        "a",
        [
            user("We booked the ryokan in Kyoto for three nights"),
            assistant("The ryokan booking reference is K7XQ2M"),
            user("What about dinner in Osaka?"),
            assistant("Dinner is at eight, near Dotonbori"),
        ],
    )
    await memory.append("b", [user("Kyoto ryokan K7XQ2M dinner in session b")])
    # Any word matches (OR), messages holding more of the rare words come first.
    assert (await _search_seqs(memory, "a", "ryokan reference K7XQ2M"))[0] == 2
    # (each message is also found, lower, by the words of the one before it)
    assert set(await _search_seqs(memory, "a", "Kyoto dinner")) == {1, 2, 3, 4}
    assert await _search_seqs(memory, "a", "Osaka") == [3, 4]
    # Case, punctuation and English endings do not matter: "booking" finds "booked".
    assert set((await _search_seqs(memory, "a", "BOOKED?!"))[:2]) == {1, 2}
    assert set((await _search_seqs(memory, "a", "bookings"))[:2]) == {1, 2}
    assert await _search_seqs(memory, "a", "k7xq2m") == [2, 3]
    # Only this session's messages, whatever the query.
    for query in ("session b", "Kyoto ryokan K7XQ2M dinner in session b", "b"):
        hits = await memory.search("a", query)
        assert all(h.message.content != "Kyoto ryokan K7XQ2M dinner in session b" for h in hits)
    assert await _search_seqs(memory, "b", "Osaka Dotonbori") == []
    assert await _search_seqs(memory, "nobody", "Kyoto") == []
    # A query of only function words or punctuation looks for nothing.
    assert await memory.search("a", "the and of ?!") == []
    assert await memory.search("a", "") == []


async def test_search_in_a_session_larger_than_its_budget_reads_what_the_plan_says(
    memory: MemoryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search reads at most ``MAX_POSTINGS`` postings and scores at most ``RESCORE``
    candidates in full (``search_plan.plan_search``, ``choose``): the same hits on every store."""

    from host_stub.memory import search_plan

    monkeypatch.setattr(search_plan, "MAX_POSTINGS", 6)
    monkeypatch.setattr(search_plan, "RESCORE", 4)
    # 30 messages, each holding "lantern"; "harbor" and "violet" in 5 and 19, "violet" in 12.
    # Each also lends its words to the next (so "harbor" is found in 4 messages, "violet" in 6).
    # Roles alternate: odd seqs are the user's.
    texts = []
    for seq in range(1, 31):
        words = ["lantern", f"filler{seq}"]
        if seq in (5, 19):
            words += ["harbor", "violet"]
        if seq == 12:
            words.append("violet")
        texts.append(" ".join(words))
    await memory.append("s", [(user if i % 2 == 0 else assistant)(t) for i, t in enumerate(texts)])
    # Another session holding the same words, found by none of the searches on "s".
    await memory.append("t", [user("lantern harbor violet"), user("lantern harbor violet")])
    # "harbor" is read whole (5, 6, 19, 20), then the newest 2 of "violet" (20, 19): no room
    # for "lantern". "violet" and "lantern" are probed among those candidates: all four hold
    # both. Best: the two holding the words themselves, then those they lent them to.
    assert await _search_seqs(memory, "s", "lantern harbor violet", limit=4) == [19, 5, 20, 6]
    # Only RESCORE candidates (or as many as results asked for) are scored in full: on equal
    # estimates the newer.
    monkeypatch.setattr(search_plan, "RESCORE", 1)
    assert await _search_seqs(memory, "s", "lantern harbor violet", limit=2) == [19, 20]
    monkeypatch.setattr(search_plan, "RESCORE", 4)
    # A common word alone: its newest 6 postings are read, so older messages holding it are
    # not found.
    assert await _search_seqs(memory, "s", "lantern", limit=6) == [30, 29, 28, 27, 26, 25]
    # Asked for more results than the budget, a search reads as many postings as asked for.
    assert sorted(await _search_seqs(memory, "s", "lantern", limit=20)) == list(range(11, 31))
    # A role: the postings read are that role's (the newest user messages with "violet": 19
    # and 13).
    assert await _search_seqs(memory, "s", "lantern harbor violet", role="user", limit=4) == [
        19,
        5,
        13,
    ]
    assert await _search_seqs(memory, "s", "lantern harbor violet", role="assistant", limit=4) == [
        20,
        6,
        12,
    ]
    # Never another session's messages.
    for query in ("lantern harbor violet", "lantern", "harbor"):
        hits = await memory.search("s", query)
        assert hits and all("filler" in str(h.message.content) for h in hits)
        assert sorted(await _search_seqs(memory, "t", query)) == [1, 2]


async def test_search_with_tight_limits_finds_what_the_reference_finds(
    memory: MemoryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under limits far below the session's size (whole lists, conjunctions, the newest of one
    term, probes and the cut to RESCORE all at work) every store returns what the in-memory
    store returns: the same plan, read and ranked the same way."""
    import random

    from host_stub.memory import search_plan

    monkeypatch.setattr(search_plan, "MAX_POSTINGS", 25)
    monkeypatch.setattr(search_plan, "MAX_PARTIAL", 12)
    monkeypatch.setattr(search_plan, "RESCORE", 15)
    rng = random.Random(4)
    words = [f"w{i}" for i in range(40)]
    weights = [1 / (i + 1) for i in range(40)]  # a few words in most messages, most in few
    messages = [
        (user if i % 3 else assistant)(" ".join(rng.choices(words, weights, k=rng.randint(2, 9))))
        for i in range(240)
    ]
    reference = InMemoryMemory(count_tokens)
    for store in (memory, reference):
        for i in range(0, len(messages), 60):
            await store.append("s", messages[i : i + 60])
        await store.append("other", messages[:30])
    queries = [" ".join(rng.sample(words[:12], rng.randint(1, 4))) for _ in range(25)]
    queries += [" ".join(rng.sample(words, rng.randint(2, 5))) for _ in range(15)]
    queries.append(" ".join(words[::3]))  # many terms: many reads and probes in one statement
    for query in queries:
        for role in (None, "assistant"):
            got = await memory.search("s", query, role=role)
            want = await reference.search("s", query, role=role)
            assert [h.message.seq for h in got] == [h.message.seq for h in want], (query, role)
            assert [h.score for h in got] == pytest.approx([h.score for h in want]), query


async def test_every_message_of_a_longer_session_is_found_by_its_own_word(
    memory: MemoryService,
) -> None:
    """Seqs on both sides of 64 and 128 (where PostgreSQL's blocks of postings meet), each found
    by its own word, appended one by one and in a batch, and after deletes."""
    await memory.append("s", [user(f"note{seq} here") for seq in range(1, 100)])
    for seq in range(100, 131):
        await memory.append("s", [assistant(f"note{seq} here")])
    for seq in (1, 63, 64, 65, 127, 128, 129, 130):
        # each message's word also finds the message after it (lent at half weight)
        assert await _search_seqs(memory, "s", f"note{seq}") == [
            s for s in (seq, seq + 1) if s <= 130
        ]
    assert await _search_seqs(memory, "s", "note127", role="user") == []
    assert await _search_seqs(memory, "s", "note99", role="user") == [99]
    assert await _search_seqs(memory, "s", "note99", role="assistant") == [100]
    assert await memory.delete_messages("s", [63, 64, 128]) == [63, 64, 128]
    assert sorted(await _search_seqs(memory, "s", "note63 note64 note128")) == [65, 129]
    assert await _search_seqs(memory, "s", "note127") == [127]


async def test_search_marks_active_and_archived_and_knows_the_date(memory: MemoryService) -> None:
    await memory.append("s", [user("the passport is in the blue folder"), assistant("noted")])
    await memory.append("s", [user("and the visa is in the blue folder too")])
    await memory.trim_history("s", up_to_seq=2)
    hits = await memory.search("s", "blue folder")
    found = {h.message.seq: h.message.archived for h in hits}
    assert found == {1: "window", 2: "window", 3: None}  # 2 by the words of 1, lower
    assert hits[-1].message.seq == 2
    assert all(h.stored_at is not None and h.score > 0 for h in hits)
    assert hits[0].score >= hits[1].score >= hits[2].score
    assert {h.message.seq: h.message.role for h in hits} == {1: "user", 2: "assistant", 3: "user"}


async def test_search_finds_unsegmented_chinese_and_japanese(memory: MemoryService) -> None:
    await memory.append(
        "s",
        [
            user("我对花生严重过敏，点菜时请出示过敏卡。"),
            assistant("好的，我会提醒餐厅不要用花生油。"),
            user("京都の旅館を予約しました"),
            user("Shanghai hotel is booked"),
        ],
    )
    assert (await _search_seqs(memory, "s", "花生过敏"))[0] == 1
    assert set((await _search_seqs(memory, "s", "花生"))[:2]) == {1, 2}
    assert await _search_seqs(memory, "s", "旅館") == [3, 4]  # 4 by the words of 3
    assert await _search_seqs(memory, "s", "餐厅") == [2, 3]


async def test_search_role_limit_tool_calls_and_markers(memory: MemoryService) -> None:
    call = ToolCall(
        id="c1", function=ToolCallFunction(name="find_flight", arguments='{"code": "LH716"}')
    )
    await memory.append(
        "s",
        [
            user("flight LH716 please"),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id="c1", name="find_flight", content="LH716 at 9:40"),
            marker("flight LH716 marker"),
            *[user(f"flight note {i}") for i in range(12)],
        ],
    )
    # 5 by the words of 3, lent across the marker (never found itself)
    assert set(await _search_seqs(memory, "s", "LH716")) == {1, 2, 3, 5}
    assert await _search_seqs(memory, "s", "LH716", role="tool") == [3]
    assert await _search_seqs(memory, "s", "LH716", role="assistant") == [2]
    assert len(await memory.search("s", "flight")) == 10  # the default limit
    assert len(await memory.search("s", "flight", limit=3)) == 3
    assert await memory.search("s", "flight", limit=0) == []
    assert 4 not in await _search_seqs(memory, "s", "marker flight", limit=50)


async def test_clear_delete_and_forget_remove_search_entries(memory: MemoryService) -> None:
    await memory.append("s", [user("alpha bravo"), user("alpha charlie"), user("alpha delta")])
    await memory.append("t", [user("alpha in t")])
    await memory.trim_history("s", up_to_seq=1)
    assert await _search_seqs(memory, "s", "alpha", limit=10) != []

    assert await memory.delete_messages("s", [2]) == [2]
    assert sorted(await _search_seqs(memory, "s", "alpha")) == [1, 3]
    assert seqs_of(await memory.get_range("s", 1, 10)) == [1, 3]

    await memory.clear("s", types=["summary"])  # not the history: still searchable
    assert sorted(await _search_seqs(memory, "s", "alpha")) == [1, 3]

    await memory.clear("s", types=["history"])  # archived and active entries both go
    assert await memory.search("s", "alpha bravo delta") == []
    assert await memory.get_range("s", 1, 10) == []
    [after] = await memory.append("s", [user("alpha again")])
    assert await _search_seqs(memory, "s", "alpha") == [after.seq]

    await memory.forget("s")
    assert await memory.search("s", "alpha") == []
    assert await memory.get_range("s", 1, 10) == []
    [fresh] = await memory.append("s", [user("echo")])
    assert await _search_seqs(memory, "s", "alpha echo") == [fresh.seq]
    assert await _search_seqs(memory, "t", "alpha") == [1]


async def test_a_reply_is_found_by_the_words_of_the_message_it_answers(
    memory: MemoryService,
) -> None:
    await memory.append("s", [user("What is the capital of Peru?")])
    await memory.append("s", [assistant("Lima."), marker("marker between"), user("Thanks!")])
    # The reply holds none of the words, but answers the question: both are found, the
    # question (its own words) first.
    assert await _search_seqs(memory, "s", "capital Peru") == [1, 2]
    # A message lends its words to the next searchable one only (the marker is skipped), never
    # further.
    assert 4 not in await _search_seqs(memory, "s", "capital Peru")
    assert await _search_seqs(memory, "s", "Lima") == [2, 4]
    # After a clear of the history nothing lends its words to the messages that follow.
    await memory.clear("s", types=["history"])
    await memory.append("s", [assistant("Cusco.")])
    assert await _search_seqs(memory, "s", "Lima thanks capital") == []


async def test_get_range_returns_searchable_messages_oldest_first(memory: MemoryService) -> None:
    await memory.append(
        "s", [user("one"), assistant("two"), marker(), user("four"), assistant("five")]
    )
    await memory.append("t", [user("other")])
    await memory.trim_history("s", up_to_seq=2)
    got = await memory.get_range("s", 2, 5)
    assert [(m.seq, m.content, m.archived) for m in got] == [
        (2, "two", "window"),
        (4, "four", None),
        (5, "five", None),
    ]
    assert await memory.get_range("s", 9, 20) == []
    assert await memory.get_range("s", 3, 2) == []
    assert seqs_of(await memory.get_range("t", 1, 5)) == [1]
    assert await memory.get_range("nobody", 1, 5) == []


# -- snapshot ---------------------------------------------------------------------------------


async def test_snapshot_contents(memory: MemoryService) -> None:
    empty = await memory.snapshot("s")
    assert (empty.session_id, empty.epoch, empty.messages, empty.record) == ("s", 0, [], None)
    assert empty.first_seq is None and empty.last_seq is None

    await fill(memory, "s", 4)
    await memory.commit_compression("s", {"summary": "1-2"}, 0, 2, epoch=0)
    snap = await memory.snapshot("s")
    assert seqs_of(snap.messages) == [3, 4]
    assert (snap.first_seq, snap.last_seq) == (3, 4)
    assert snap.record is not None
    assert (snap.record.value, snap.record.version) == ({"summary": "1-2"}, 1)

    await memory.clear("s", types=["summary"])
    snap = await memory.snapshot("s")
    assert snap.epoch == 1
    assert snap.record is not None and snap.record.deleted and snap.record.version == 2
    assert (await memory.snapshot("s", namespace="elsewhere")).record is None


async def test_snapshot_is_consistent_with_concurrent_commits(stores: StoreFactory) -> None:
    writer, reader = stores(), stores()
    for handle in (writer, reader):  # connect (and create the schema) before the race
        await handle.get_epoch("warm-up")
    done = asyncio.Event()
    rounds = 25
    snapshots = 0

    async def write() -> None:
        try:
            for n in range(rounds):
                out = await fill(writer, "s", 3)
                await asyncio.sleep(0)  # let readers in between the steps
                entry = await writer.get_metadata("summary", "s")
                version = entry.version if entry else 0
                through = out[-1].seq or 0
                won = await writer.commit_compression(
                    "s", {"through": through}, version, through, epoch=0
                )
                assert won
                while snapshots <= n:  # keep the readers in the race every round
                    await asyncio.sleep(0.001)
        finally:
            done.set()

    async def read() -> None:
        nonlocal snapshots
        while not done.is_set():
            snap = await reader.snapshot("s")
            snapshots += 1
            through = snap.record.value["through"] if snap.record and snap.record.value else 0
            # The record covers exactly the archived prefix: nothing it covers is still active
            # and nothing after it is archived yet.
            assert all((m.seq or 0) > through for m in snap.messages)
            if snap.messages:
                assert snap.first_seq == through + 1
            await asyncio.sleep(0)

    await asyncio.wait_for(asyncio.gather(write(), read(), read()), timeout=30)
    assert snapshots >= rounds
    final = await reader.snapshot("s")
    assert final.messages == [] and final.record is not None
    assert final.record.value == {"through": 3 * rounds}


async def test_close_is_idempotent(memory: MemoryService) -> None:
    await fill(memory, "s", 1)
    await memory.close()
    await memory.close()


# -- open_memory ------------------------------------------------------------------------------


async def test_open_memory_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(open_memory("memory://", count_tokens), InMemoryMemory)

    monkeypatch.chdir(tmp_path)
    relative = open_memory("sqlite:///data/rel.db", count_tokens)
    absolute = open_memory(f"sqlite:///{tmp_path / 'abs.db'}", count_tokens)
    try:
        assert isinstance(relative, SQLiteMemory) and relative.path == "data/rel.db"
        assert isinstance(absolute, SQLiteMemory)
        assert absolute.path == str(tmp_path / "abs.db")
        assert f"sqlite:///{tmp_path / 'abs.db'}".startswith("sqlite:////")
        await relative.append("s", [user("x")])
        await absolute.append("s", [user("x")])
        assert (tmp_path / "data" / "rel.db").is_file()
        assert (tmp_path / "abs.db").is_file()
    finally:
        await relative.close()
        await absolute.close()

    for bad in ("mysql://host/db", "no-scheme.db", "sqlite://host/x.db", "sqlite:///"):
        with pytest.raises(ValueError) as info:
            open_memory(bad, count_tokens)
        assert bad in str(info.value) and "\n" not in str(info.value)


# -- SQLite specifics -------------------------------------------------------------------------


async def test_sqlite_file_format_and_persistence(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    first = SQLiteMemory(path, count_tokens)
    try:
        await first.append("s", [user("persisted", metadata={"k": 1})])
        await first.save_metadata("summary", "s", {"summary": "kept"})
        await first.clear("s", types=["other"])
    finally:
        await first.close()
    with pytest.raises(RuntimeError):
        await first.get_history("s")

    with contextlib.closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"sessions", "messages", "metadata", "leases"} <= tables
        body = raw.execute("SELECT body FROM messages").fetchone()[0]
        assert '"persisted"' in body  # JSON body

    second = SQLiteMemory(path, count_tokens)
    try:
        [message] = await second.get_history("s")
        assert (message.content, message.metadata, message.seq) == ("persisted", {"k": 1}, 1)
        entry = await second.get_metadata("summary", "s")
        assert entry is not None and entry.value == {"summary": "kept"}
        assert await second.get_epoch("s") == 1
    finally:
        await second.close()


async def test_sqlite_schema_1_file_gets_its_search_index(tmp_path: Path) -> None:
    from host_stub.memory.sqlite import MIGRATIONS

    path = tmp_path / "v1.db"
    with contextlib.closing(sqlite3.connect(path)) as raw:
        raw.executescript(MIGRATIONS[0])
        raw.execute("INSERT INTO sessions VALUES ('s', 1, 4, 0), ('t', 0, 1, 0)")
        rows = [
            ("s", 1, 0, "user", "message", '{"content":"old epoch kyoto"}', None),
            ("s", 2, 1, "user", "message", '{"content":"kyoto ryokan"}', "summarized"),
            ("s", 3, 1, "user", "message", '{"content":"kyoto deleted"}', "deleted"),
            ("s", 4, 1, "assistant", "message", '{"content":"kyoto is lovely"}', None),
            ("t", 1, 0, "user", "message", '{"content":"kyoto in t"}', None),
        ]
        raw.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, 1, ?, NULL, 0)", rows)
        raw.execute("PRAGMA user_version = 1")
        raw.commit()
    store = SQLiteMemory(path, count_tokens)
    try:
        assert sorted(h.message.seq for h in await store.search("s", "kyoto")) == [2, 4]
        assert [h.message.seq for h in await store.search("t", "kyoto")] == [1]
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6


async def test_sqlite_schema_5_file_is_not_indexed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 5 indexed every append: its sessions count as indexed up to their last message, so
    the upgrade computes no terms again, and what is appended after it is found."""
    from host_stub.memory.sqlite import schema as sqlite_schema
    from host_stub.memory.sqlite import search as sqlite_search

    path = tmp_path / "v5.db"
    store = SQLiteMemory(path, count_tokens)
    await store.append("s", [Message(role="user", content="kyoto ryokan booked")])
    await store.append("s", [Message(role="assistant", content="osaka castle at nine")])
    assert [h.message.seq for h in await store.search("s", "osaka")] == [2]
    await store.close()
    with contextlib.closing(sqlite3.connect(path)) as raw:
        raw.execute("ALTER TABLE sessions DROP COLUMN indexed_seq")
        raw.execute("PRAGMA user_version = 5")
        raw.commit()
    computed: list[str] = []
    own = sqlite_search.own_terms
    for module in (sqlite_schema, sqlite_search):
        monkeypatch.setattr(module, "own_terms", lambda m: computed.append(m.content) or own(m))
    store = SQLiteMemory(path, count_tokens)
    try:
        assert [h.message.seq for h in await store.search("s", "kyoto")][:1] == [1]
        assert computed == []
        await store.append("s", [Message(role="user", content="kyoto again tomorrow")])
        assert [h.message.seq for h in await store.search("s", "tomorrow")] == [3]
        assert computed == ["kyoto again tomorrow"]
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


# -- an old store's search index, upgraded --------------------------------------------------------

#: Messages of session "s" of the old stores below (3 and 7 archived): overlapping words, so the
#: rankings compared depend on the counts the upgrade fills in.
_OLD_TEXTS = [
    "We booked the ryokan in Kyoto for three nights",
    "The ryokan booking reference is K7XQ2M",
    "Dinner in Osaka near Dotonbori, booked for eight",
    "Kyoto temples: Kinkaku-ji and Ginkaku-ji",
    "The train from Kyoto to Osaka takes fifteen minutes",
    "Remember the ryokan serves breakfast at seven",
    "Osaka castle opens at nine",
    "Pack an umbrella for Kyoto",
]
_OLD_QUERIES = ["ryokan Kyoto", "Osaka booked", "breakfast ryokan K7XQ2M", "umbrella castle nine"]


def _old_messages() -> list[Message]:
    return [(user if i % 2 == 0 else assistant)(t) for i, t in enumerate(_OLD_TEXTS)]


async def _reference_hits(query: str) -> list[tuple[int, float]]:
    """What a fresh store holding the old stores' messages finds."""
    fresh = InMemoryMemory(count_tokens)
    await fresh.append("s", _old_messages())
    await fresh.append("t", [user("Kyoto ryokan in session t")])
    return [(h.message.seq or 0, h.score) for h in await fresh.search("s", query)]


async def _assert_upgraded(store: MemoryService) -> None:
    """All messages kept, as they were; searches as a fresh store's."""
    kept = await store.get_archived("s") + await store.get_history("s")
    assert sorted((m.seq, text_of(m.content)) for m in kept) == [
        (i, t) for i, t in enumerate(_OLD_TEXTS, 1)
    ]
    assert {m.seq for m in await store.get_archived("s")} == {3, 7}
    assert [text_of(m.content) for m in await store.get_history("t")] == [
        "Kyoto ryokan in session t"
    ]
    for query in _OLD_QUERIES:
        got = [(h.message.seq, h.score) for h in await store.search("s", query)]
        expected = await _reference_hits(query)
        assert [seq for seq, _ in got] == [seq for seq, _ in expected], query
        assert [score for _, score in got] == pytest.approx([score for _, score in expected])
    assert [h.message.seq for h in await store.search("t", "ryokan")] == [1]
    # And it goes on indexing: a new message is found, with the counts kept right.
    await store.append("s", [user("A new umbrella from Osaka")])
    assert (await store.search("s", "umbrella new"))[0].message.seq == 9


async def test_sqlite_schema_4_file_keeps_its_messages_and_gets_search_counts(
    tmp_path: Path,
) -> None:
    from host_stub.memory.common import body_of
    from host_stub.memory.sqlite import MIGRATIONS, backfill_search

    path = tmp_path / "v4.db"
    with contextlib.closing(sqlite3.connect(path)) as raw:
        for version in range(4):  # schema 4: messages and the FTS5 index, no counts
            raw.executescript(MIGRATIONS[version])
        raw.execute("INSERT INTO sessions VALUES ('s', 0, 8, 0), ('t', 0, 1, 0)")
        rows = [
            ("s", i, m.role, body_of(m), "summarized" if i in (3, 7) else None)
            for i, m in enumerate(_old_messages(), 1)
        ]
        rows.append(("t", 1, "user", body_of(user("Kyoto ryokan in session t")), None))
        raw.executemany(
            "INSERT INTO messages VALUES (?, ?, 0, ?, 'message', ?, 1, ?, NULL, 0)", rows
        )
        backfill_search(raw)
        raw.execute("PRAGMA user_version = 4")
        raw.commit()
    store = SQLiteMemory(path, count_tokens)
    try:
        await _assert_upgraded(store)
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        # The counts are the entries' counts.
        docs, length = raw.execute(
            "SELECT docs, length FROM search_sessions WHERE session_id = 's'"
        ).fetchone()
        entries = raw.execute(
            "SELECT c0, c1 FROM search_content WHERE id >> 32 ="
            " (SELECT id FROM search_sessions WHERE session_id = 's')"
        ).fetchall()
        assert docs == len(entries) == 9
        assert length == sum(len(o.split()) + 0.5 * len(c.split()) for o, c in entries)
        umbrella = sum("umbrella" in f"{o} {c}".split() for o, c in entries)
        assert raw.execute(
            "SELECT df FROM search_terms t JOIN search_sessions s ON s.id = t.session"
            " WHERE s.session_id = 's' AND t.term = 'umbrella'"
        ).fetchone() == (umbrella,)


async def _churn(store: MemoryService) -> None:
    """Appends, deletes, a clear of the history and a forget: what the search counts follow."""
    await store.append("s", _old_messages())
    await store.append("t", [user("Kyoto ryokan in session t"), user("umbrella")])
    await store.search("t", "kyoto")  # indexed before the clear (stores may index lazily)
    await store.append("u", [user("gone soon: Kyoto umbrella")])
    await store.delete_messages("s", [2, 5, 99])
    await store.delete_messages("s", [2])  # twice: counted once
    await store.clear("t", types=["history"])
    await store.append("t", [user("after the clear: umbrella umbrella")])
    await store.forget("u")
    await store.append("s", [assistant("more Kyoto")])
    for session in ("s", "t"):  # the counts read below are those of an index a search saw
        await store.search(session, "kyoto")


def _recount(entries: list[tuple[str, str]]) -> tuple[int, float, dict[str, int]]:
    """(entries, total length, document frequencies) of (own terms, lent terms) strings."""
    dfs: dict[str, int] = {}
    for own, lent in entries:
        for term in set(own.split()) | set(lent.split()):
            dfs[term] = dfs.get(term, 0) + 1
    return len(entries), sum(len(o.split()) + 0.5 * len(c.split()) for o, c in entries), dfs


async def test_sqlite_search_counts_follow_deletes_clears_and_forget(tmp_path: Path) -> None:
    path = tmp_path / "counts.db"
    store = SQLiteMemory(path, count_tokens)
    try:
        await _churn(store)
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as raw:
        sessions = raw.execute(
            "SELECT id, session_id, docs, length FROM search_sessions"
        ).fetchall()
        assert sorted(sid for _, sid, _, _ in sessions) == ["s", "t"]
        for key, sid, docs, length in sessions:
            entries = raw.execute(
                "SELECT c0, c1 FROM search_content WHERE id >> 32 = ?", (key,)
            ).fetchall()
            assert (docs, length) == _recount(entries)[:2], sid
            stored = dict(
                raw.execute("SELECT term, df FROM search_terms WHERE session = ?", (key,))
            )
            assert stored == _recount(entries)[2], sid
        assert raw.execute("SELECT count(*) FROM search_terms").fetchone()[0] == sum(
            len(
                _recount(
                    raw.execute(
                        "SELECT c0, c1 FROM search_content WHERE id >> 32 = ?", (key,)
                    ).fetchall()
                )[2]
            )
            for key, _, _, _ in sessions
        )


def _bits_seqs(block: int, bits: int) -> set[int]:
    """The seqs a block of postings holds (bit ``seq & 63`` of the block ``seq >> 6``)."""
    return {(block << 6) + b for b in range(64) if (bits & (2**64 - 1)) >> b & 1}


async def _assert_pg_search_index_follows_its_entries(conn: object, schema: str) -> None:
    """Every session's counts, term frequencies and postings are those of its stored entries
    (a message's role is a term of its own, `` role:<role>``), and nothing is left of sessions
    that are gone."""
    import asyncpg

    assert isinstance(conn, asyncpg.Connection)
    p = f'"{schema}".'
    sessions = await conn.fetch(
        f"SELECT session_id, search_key, search_docs, search_length FROM {p}sessions"
    )
    for r in sessions:
        entries = await conn.fetch(
            f"SELECT e.seq, e.terms, e.context, m.role FROM {p}search_entries e"
            f" JOIN {p}messages m ON m.session_id = $2 AND m.seq = e.seq"
            " WHERE e.search_key = $1",
            r["search_key"],
            r["session_id"],
        )
        docs, length, dfs = _recount([(e["terms"], e["context"]) for e in entries])
        holding: dict[str, set[int]] = {}
        for e in entries:
            dfs[f" role:{e['role']}"] = dfs.get(f" role:{e['role']}", 0) + 1
            for term in {*e["terms"].split(), *e["context"].split(), f" role:{e['role']}"}:
                holding.setdefault(term, set()).add(e["seq"])
        assert (r["search_docs"], r["search_length"]) == (docs, pytest.approx(length))
        stored = await conn.fetch(
            f"SELECT t.term, t.df, b.block, b.bits FROM {p}search_terms t"
            f" LEFT JOIN {p}search_postings b ON b.term_id = t.id WHERE t.search_key = $1",
            r["search_key"],
        )
        assert {x["term"]: x["df"] for x in stored} == dfs
        postings: dict[str, set[int]] = {}
        for x in stored:
            assert x["bits"] != 0, x  # an emptied block goes
            postings.setdefault(x["term"], set()).update(_bits_seqs(x["block"], x["bits"]))
        assert postings == holding
    keys = [r["search_key"] for r in sessions]
    for table in ("search_terms", "search_entries"):
        left = await conn.fetchval(
            f"SELECT count(*) FROM {p}{table} WHERE NOT search_key = ANY($1::bigint[])", keys
        )
        assert left == 0, table
    assert not await conn.fetchval(
        f"SELECT count(*) FROM {p}search_postings b WHERE NOT EXISTS"
        f" (SELECT 1 FROM {p}search_terms t WHERE t.id = b.term_id)"
    )


async def test_postgres_search_counts_follow_deletes_clears_and_forget(pg: str) -> None:
    import asyncpg

    store = open_memory(pg, count_tokens)
    try:
        await _churn(store)
    finally:
        await store.close()
    [schema] = parse_qs(urlsplit(pg).query)["schema"]
    conn = await asyncpg.connect(PG_URL, timeout=5)
    try:
        sessions = await conn.fetch(f'SELECT session_id FROM "{schema}".sessions')
        assert sorted(r["session_id"] for r in sessions) == ["s", "t"]
        await _assert_pg_search_index_follows_its_entries(conn, schema)
    finally:
        await conn.close()


async def test_sqlite_refuses_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with contextlib.closing(sqlite3.connect(path)) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        raw.commit()
    store = SQLiteMemory(path, count_tokens)
    try:
        with pytest.raises(RuntimeError, match="newer"):
            await store.get_epoch("s")
    finally:
        await store.close()


# -- across OS processes (SQLite here, PostgreSQL below) ---------------------------------------

_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    from host_stub.memory import open_memory
    from host_stub.messages import Message

    mode, url, work, me = sys.argv[1:5]
    work = Path(work)

    async def main():
        store = open_memory(url, lambda m: 1)
        try:
            await store.get_epoch("warm-up")  # connect and create the schema
            (work / f"ready-{me}").touch()
            while not (work / "go").exists():
                await asyncio.sleep(0.002)
            result = []
            if mode == "append":
                for i in range(int(sys.argv[5])):
                    [m] = await store.append("shared", [Message(role="user", content=f"{me}-{i}")])
                    result.append(m.seq)
            elif mode == "lease":
                # A fixed number of holds each (not a duration): a loaded machine makes the run
                # longer, never the evidence thinner.
                while len(result) < int(sys.argv[5]):
                    lease = await store.acquire_lease("single-flight", 5.0)
                    if lease is None:
                        await asyncio.sleep(0.001)
                        continue
                    start = time.time()
                    await asyncio.sleep(0.01)
                    stop = time.time()
                    released = await store.release_lease(lease)
                    result.append((start, stop, released))
                    await asyncio.sleep(0.002)
            (work / f"out-{me}.json").write_text(json.dumps(result))
        finally:
            await store.close()

    asyncio.run(main())
    """
)


def _run_children(
    tmp_path: Path, mode: str, count: int, arg: str, url: str | None = None
) -> dict[str, list]:
    """Start ``count`` processes on one store (by default the SQLite file ``shared.db``),
    release them together, collect output."""
    import json

    url = url or f"sqlite:///{tmp_path / 'shared.db'}"
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, mode, url, str(work), f"p{n}", arg],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(count)
    ]
    try:
        deadline = time.monotonic() + 30
        while len(list(work.glob("ready-*"))) < count:
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        (work / "go").touch()
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, f"child failed:\n{out}\n{err}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return {f"p{n}": json.loads((work / f"out-p{n}.json").read_text()) for n in range(count)}


def _assert_appends_gapless(
    results: dict[str, list], per_process: int, history: list[Message]
) -> None:
    total = len(results) * per_process
    for seqs in results.values():
        assert len(seqs) == per_process
        assert seqs == sorted(seqs)  # each process's appends commit in its own order
    everything = sorted(seq for seqs in results.values() for seq in seqs)
    assert everything == list(range(1, total + 1))
    assert seqs_of(history) == list(range(1, total + 1))
    by_seq = {m.seq: m.content for m in history}
    for name, seqs in results.items():
        assert [by_seq[s] for s in seqs] == [f"{name}-{i}" for i in range(per_process)]


#: Holds each child process makes in the cross-process lease tests.
LEASE_HOLDS = 25


def _assert_one_lease_holder(results: dict[str, list]) -> None:
    holds = sorted(
        (start, stop, name) for name, spans in results.items() for start, stop, _ in spans
    )
    # A holder that finds its lease gone at release time was overrun by another process.
    assert all(released for spans in results.values() for *_, released in spans)
    assert all(len(spans) == LEASE_HOLDS for spans in results.values())
    for (_, prev_stop, prev), (start, _, name) in zip(holds, holds[1:], strict=False):
        assert start >= prev_stop, f"{name} took the lease while {prev} held it"


@pytest.mark.slow
def test_sqlite_appends_from_several_processes_are_gapless(tmp_path: Path) -> None:
    per_process = 100
    results = _run_children(tmp_path, "append", 2, str(per_process))

    async def read() -> list[Message]:
        store = SQLiteMemory(tmp_path / "shared.db", count_tokens)
        try:
            return await store.get_history("shared")
        finally:
            await store.close()

    _assert_appends_gapless(results, per_process, asyncio.run(read()))


@pytest.mark.slow
def test_sqlite_lease_has_one_holder_across_processes(tmp_path: Path) -> None:
    _assert_one_lease_holder(_run_children(tmp_path, "lease", 4, str(LEASE_HOLDS)))


# -- PostgreSQL specifics ---------------------------------------------------------------------


def _pg_variant(path: str, password: str) -> str:
    """``PG_URL`` with another database and a password."""
    parts = urlsplit(PG_URL)
    netloc = f"{parts.username or 'postgres'}:{password}@"
    netloc += f"{parts.hostname or '127.0.0.1'}:{parts.port or 5432}"
    return urlunsplit((parts.scheme, netloc, path, parts.query, ""))


def _need_asyncpg() -> None:
    """Skip without asyncpg (fail when CI=true)."""
    try:
        import asyncpg  # noqa: F401
    except ModuleNotFoundError:
        _unavailable("asyncpg is not installed (pip install 'plugin-memory-summary[postgres]')")


@pytest.mark.slow
async def test_postgres_appends_from_several_processes_are_gapless(tmp_path: Path, pg: str) -> None:
    per_process = 100
    results = await asyncio.to_thread(_run_children, tmp_path, "append", 3, str(per_process), pg)
    store = open_memory(pg, count_tokens)
    try:
        history = await store.get_history("shared")
    finally:
        await store.close()
    _assert_appends_gapless(results, per_process, history)


@pytest.mark.slow
async def test_postgres_lease_has_one_holder_across_processes(tmp_path: Path, pg: str) -> None:
    results = await asyncio.to_thread(_run_children, tmp_path, "lease", 3, str(LEASE_HOLDS), pg)
    _assert_one_lease_holder(results)


async def test_postgres_urls_choose_the_backend_without_connecting() -> None:
    _need_asyncpg()
    from host_stub.memory.postgres import PostgresMemory

    for url in (
        "postgresql://user:s3cret@db.invalid/app",
        "postgres://db.invalid:6543/app",
        "POSTGRESQL://user@db.invalid/app?schema=tenant_a&sslmode=disable",
    ):
        store = open_memory(url, count_tokens)
        assert isinstance(store, PostgresMemory)
        assert "s3cret" not in store.url and "s3cret" not in repr(store)
        await store.close()  # nothing was opened
    store = open_memory("postgresql://u@db.invalid/app?schema=tenant_a", count_tokens)
    assert isinstance(store, PostgresMemory) and store.schema == "tenant_a"
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.get_epoch("s")

    for bad in (
        "postgresql://user:s3cret@db.invalid:notaport/app",
        "postgresql://user:s3cret@db.invalid:99999/app",
        "postgresql://user:s3cret@db.invalid/app?schema=",
        "postgresql://user:s3cret@db.invalid/app#frag",
    ):
        with pytest.raises(ValueError) as info:
            open_memory(bad, count_tokens)
        message = str(info.value)
        assert "s3cret" not in message and "\n" not in message
        assert "postgresql://user:***@db.invalid" in message
    with pytest.raises(ValueError, match="schema"):
        PostgresMemory("postgresql://u@h/app?schema=a", count_tokens, schema="b")


async def test_postgres_server_down_is_one_quick_connection_error() -> None:
    _need_asyncpg()
    url = "postgresql://someone:s3cret@127.0.0.1:1/test"
    store = open_memory(url, count_tokens)
    started = time.monotonic()
    try:
        with pytest.raises(ConnectionError) as info:
            await store.append("s", [user("lost")])
        assert time.monotonic() - started < 5
        message = str(info.value)
        assert message.startswith("postgresql://someone:***@127.0.0.1:1/test: cannot connect: ")
        assert "\n" not in message
        whole = "".join(traceback.format_exception(info.value))
        assert "s3cret" not in whole
        # Still unusable, still the same clear error, nothing half-open.
        with pytest.raises(ConnectionError):
            await store.get_epoch("s")
    finally:
        await store.close()


async def test_postgres_wrong_database_names_it_and_hides_the_password(pg: str) -> None:
    url = _pg_variant(path="/no_such_database_mst", password="s3cret")
    store = open_memory(url, count_tokens)
    try:
        with pytest.raises(ConnectionError) as info:
            await store.get_epoch("s")
        message = str(info.value)
        assert "no_such_database_mst" in message and ":***@" in message
        assert "\n" not in message
        assert "s3cret" not in "".join(traceback.format_exception(info.value))
    finally:
        await store.close()


async def _assert_pg_schema_5(schema: str) -> None:
    """The schema is at version 5: the entries in search_entries, their postings in blocks, the
    tsvectors of schemas 2-4 and their GIN indexes gone, the counts those of the entries."""
    import asyncpg

    p = f'"{schema}".'
    conn = await asyncpg.connect(PG_URL, timeout=5)
    try:
        assert await conn.fetchval(f"SELECT version FROM {p}memory_schema_version") == 5
        assert not await conn.fetchval(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_schema = $1 AND table_name = 'messages' AND column_name = 'search'",
            schema,
        )
        tables = {
            r["tablename"]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema
            )
        }
        assert "search_docs" not in tables and {"search_entries", "search_postings"} <= tables
        # Autovacuum keeps the postings' visibility map fresh (index-only scans need it).
        options = await conn.fetchval(
            "SELECT reloptions FROM pg_class WHERE oid = $1::regclass", f"{p}search_postings"
        )
        assert "autovacuum_vacuum_scale_factor=0.01" in options
        assert not await conn.fetchval(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexdef LIKE '%gin%'",
            schema,
        )
        key = await conn.fetchval(f"SELECT search_key FROM {p}sessions WHERE session_id = 's'")
        assert (
            await conn.fetchval(
                f"SELECT count(*) FROM {p}search_entries WHERE search_key = $1", key
            )
            == len(_OLD_TEXTS) + 1
        )  # and the one _assert_upgraded appends
        await _assert_pg_search_index_follows_its_entries(conn, schema)
    finally:
        await conn.close()


async def test_postgres_schema_3_keeps_its_messages_and_gets_session_keyed_search(
    pg: str,
) -> None:
    import asyncpg

    from host_stub.memory.common import body_of
    from host_stub.memory.postgres import MIGRATIONS, PostgresMemory

    [schema] = parse_qs(urlsplit(pg).query)["schema"]
    old = PostgresMemory(pg, count_tokens)  # only for its SQL helpers: never opened
    conn = await asyncpg.connect(PG_URL, timeout=5)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(
            f'CREATE TABLE "{schema}".memory_schema_version'
            " (id integer PRIMARY KEY DEFAULT 1 CHECK (id = 1), version integer NOT NULL)"
        )
        for version in range(3):  # schema 3: tsvectors of plain terms, no counts
            for statement in MIGRATIONS[version]:
                await conn.execute(old.sql(statement))
        await conn.execute(old.sql("INSERT INTO {p}sessions VALUES ('s', 0, 8, 0), ('t', 0, 1, 0)"))
        rows = [
            ("s", i, m.role, body_of(m), "summarized" if i in (3, 7) else None)
            for i, m in enumerate(_old_messages(), 1)
        ]
        rows.append(("t", 1, "user", body_of(user("Kyoto ryokan in session t")), None))
        await conn.executemany(
            old.sql(
                "INSERT INTO {p}messages VALUES ($1, $2, 0, $3, 'message', $4, 1, $5, NULL, 0)"
            ),
            rows,
        )
        await old.backfill_search(conn)
        await conn.execute(
            old.sql("INSERT INTO {p}memory_schema_version (id, version) VALUES (1, 3)")
        )
    finally:
        await conn.close()
    store = open_memory(pg, count_tokens)
    try:
        await _assert_upgraded(store)
    finally:
        await store.close()
    await _assert_pg_schema_5(schema)


def _v4_tsvector(key: int, own: list[str], lent: list[str]) -> str:
    """A schema 4 tsvector's text form: each term under the session's key (``<key>_<term>``) at
    its positions, the message's own terms in weight class A, the lent ones in B."""
    positions: dict[str, list[str]] = {}
    for pos, (term, weight) in enumerate([*((t, "A") for t in own), *((t, "B") for t in lent)], 1):
        positions.setdefault(term, []).append(f"{pos}{weight}")
    return " ".join(f"'{key}_{term}':{','.join(p)}" for term, p in positions.items())


async def test_postgres_schema_4_moves_its_entries_to_blocks_of_postings(pg: str) -> None:
    """A schema 4 database (tsvectors with a GIN index in search_docs) is converted: the same
    messages, searches as a fresh store's, counts and postings those of its entries, the old
    table and index gone."""
    import asyncpg

    from host_stub.memory.common import body_of
    from host_stub.memory.postgres import MIGRATIONS, PostgresMemory
    from host_stub.memory.search_plan import batch_terms, distinct_terms, doc_length

    [schema] = parse_qs(urlsplit(pg).query)["schema"]
    old = PostgresMemory(pg, count_tokens)  # only for its SQL helpers: never opened
    sessions = {
        "s": [(m, "summarized" if i in (3, 7) else None) for i, m in enumerate(_old_messages(), 1)],
        "t": [(user("Kyoto ryokan in session t"), None)],
    }
    conn = await asyncpg.connect(PG_URL, timeout=5)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(
            f'CREATE TABLE "{schema}".memory_schema_version'
            " (id integer PRIMARY KEY DEFAULT 1 CHECK (id = 1), version integer NOT NULL)"
        )
        for version in range(4):
            for statement in MIGRATIONS[version]:
                await conn.execute(old.sql(statement))
        await conn.execute(old.sql("ALTER TABLE {p}messages DROP COLUMN search"))
        for session_id, messages in sessions.items():
            key = await conn.fetchval(
                old.sql(
                    "INSERT INTO {p}sessions (session_id, last_seq, updated_at)"
                    " VALUES ($1, $2, 0) RETURNING search_key"
                ),
                session_id,
                len(messages),
            )
            await conn.executemany(
                old.sql(
                    "INSERT INTO {p}messages VALUES ($1, $2, 0, $3, 'message', $4, 1, $5, NULL, 0)"
                ),
                [
                    (session_id, seq, m.role, body_of(m), archived)
                    for seq, (m, archived) in enumerate(messages, 1)
                ],
            )
            entries = batch_terms([m for m, _ in messages], None)
            dfs: dict[str, int] = {}
            for entry in entries:
                assert entry is not None
                for term in distinct_terms(entry):
                    dfs[term] = dfs.get(term, 0) + 1
            await conn.executemany(
                old.sql("INSERT INTO {p}search_docs VALUES ($1, $2, $3, $4, $5::tsvector)"),
                [
                    (key, seq, m.role, doc_length(entry), _v4_tsvector(key, *entry))
                    for seq, ((m, _), entry) in enumerate(zip(messages, entries, strict=True), 1)
                    if entry is not None
                ],
            )
            await conn.executemany(
                old.sql("INSERT INTO {p}search_terms VALUES ($1, $2, $3)"),
                [(key, term, df) for term, df in dfs.items()],
            )
            await conn.execute(
                old.sql(
                    "UPDATE {p}sessions SET search_docs = $2, search_length = $3"
                    " WHERE session_id = $1"
                ),
                session_id,
                len(entries),
                sum(doc_length(e) for e in entries if e is not None),
            )
        await conn.execute(
            old.sql("INSERT INTO {p}memory_schema_version (id, version) VALUES (1, 4)")
        )
    finally:
        await conn.close()
    store = open_memory(pg, count_tokens)
    try:
        await _assert_upgraded(store)
        # A role is read from the converted postings too.
        assert (
            await _search_seqs(store, "s", "ryokan Kyoto", role="assistant")
            == [
                h.message.seq
                for h in await store.search("s", "ryokan Kyoto", limit=50)
                if h.message.role == "assistant"
            ][:10]
        )
    finally:
        await store.close()
    await _assert_pg_schema_5(schema)


async def test_postgres_schema_migration_is_idempotent_when_stores_start_together(
    pg: str,
) -> None:
    import asyncpg

    from host_stub.memory.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION

    stores = [open_memory(pg, count_tokens) for _ in range(4)]
    try:
        # All create the schema and its tables at once; one migrates, the others wait and find
        # it done.
        appended = await asyncio.gather(
            *(store.append("s", [user(f"from {i}")]) for i, store in enumerate(stores))
        )
        assert sorted(m.seq for [m] in appended) == [1, 2, 3, 4]
        again = open_memory(pg, count_tokens)  # a later start finds everything in place
        try:
            assert seqs_of(await again.get_history("s")) == [1, 2, 3, 4]
        finally:
            await again.close()
    finally:
        for store in stores:
            await store.close()

    [schema] = parse_qs(urlsplit(pg).query)["schema"]
    conn = await asyncpg.connect(PG_URL, timeout=5)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)
        tables = {r["tablename"] for r in rows}
        assert tables == {
            "memory_schema_version",
            "sessions",
            "messages",
            "metadata",
            "leases",
            "search_entries",
            "search_postings",
            "search_terms",
        }
        rows = await conn.fetch(f'SELECT version FROM "{schema}".memory_schema_version')
        assert [r["version"] for r in rows] == [PG_SCHEMA_VERSION]
        body = await conn.fetchval(f'SELECT body FROM "{schema}".messages LIMIT 1')
        assert '"from ' in body  # JSON body
        # A newer schema than the code knows is refused, not silently used.
        await conn.execute(f'UPDATE "{schema}".memory_schema_version SET version = version + 1')
    finally:
        await conn.close()
    future = open_memory(pg, count_tokens)
    try:
        with pytest.raises(RuntimeError, match="newer"):
            await future.get_epoch("s")
    finally:
        await future.close()


async def test_postgres_schemas_isolate_stores(pg: str) -> None:
    other = pg_url()
    one, two = open_memory(pg, count_tokens), open_memory(other, count_tokens)
    try:
        await one.append("s", [user("only in one")])
        await one.save_metadata("summary", "s", {"x": 1})
        assert await two.get_history("s") == []
        assert await two.get_metadata("summary", "s") is None
        assert await two.acquire_lease("L", 5) is not None
        assert await one.acquire_lease("L", 5) is not None
    finally:
        await one.close()
        await two.close()
        await pg_drop(other)


# -- Redis specifics --------------------------------------------------------------------------


def _redis_backend():  # type: ignore[no-untyped-def]
    """The Redis backend module (it needs redis-py)."""
    try:
        from host_stub.memory import redis as backend
    except ModuleNotFoundError:
        _unavailable("redis-py is not installed (pip install 'plugin-memory-summary[redis]')")
    return backend


@pytest.mark.slow
def test_redis_appends_from_several_processes_are_gapless(tmp_path: Path, rds: str) -> None:
    per_process = 100
    results = _run_children(tmp_path, "append", 3, str(per_process), url=rds)

    async def read() -> list[Message]:
        store = open_memory(rds, count_tokens)
        try:
            return await store.get_history("shared")
        finally:
            await store.close()

    _assert_appends_gapless(results, per_process, asyncio.run(read()))


@pytest.mark.slow
def test_redis_lease_has_one_holder_across_processes(tmp_path: Path, rds: str) -> None:
    _assert_one_lease_holder(_run_children(tmp_path, "lease", 3, str(LEASE_HOLDS), url=rds))


async def test_redis_keys_stay_under_the_prefix_and_forget_leaves_none(rds: str) -> None:
    import redis.asyncio as aioredis

    prefix = parse_qs(urlsplit(rds).query)["prefix"][-1]
    other = redis_url()
    one, two = open_memory(rds, count_tokens), open_memory(other, count_tokens)
    admin = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        await fill(one, "s", 3)
        await one.commit_compression("s", {"x": 1}, 0, 1, epoch=0)
        lease = await one.acquire_lease("L", 5)
        assert lease is not None
        keys = {key async for key in admin.scan_iter(match=f"{prefix}*")}
        assert keys == {
            f"{prefix}{name}"
            for name in ("s:s", "m:s", "a:s", "z:s", "x:s", "sessions", "md:summary", "mk:s")
        } | {f"{prefix}lease:L", f"{prefix}fence:L"} | {
            # the search index: per-message entries, term counts, one posting set per term
            f"{prefix}{name}"
            for name in ("xd:s", "xf:s", "xo:s", "xp:s:message", "xp:s:1", "xp:s:2", "xp:s:3")
        }
        # Another prefix is another store.
        assert await two.get_history("s") == []
        assert await two.get_metadata("summary", "s") is None
        assert await two.list_sessions() == []
        assert await two.acquire_lease("L", 5) is not None

        await one.forget("s")
        assert await one.release_lease(lease)
        # Only the lease's fence counter stays, so a later holder's fence is still larger.
        assert [key async for key in admin.scan_iter(match=f"{prefix}*")] == [f"{prefix}fence:L"]
    finally:
        await one.close()
        await two.close()
        await admin.aclose()
        redis_drop_now(other)


async def test_redis_scripts_survive_script_flush(rds: str) -> None:
    import redis.asyncio as aioredis

    store = open_memory(rds, count_tokens)
    admin = aioredis.Redis.from_url(REDIS_URL)
    try:
        await fill(store, "s", 4)
        lease = await store.acquire_lease("L", 5)
        assert lease is not None
        await admin.script_flush()  # as after a server restart or failover
        assert seqs_of(await fill(store, "s", 2, start=5)) == [5, 6]
        await admin.script_flush()
        assert await store.commit_compression("s", {"x": 1}, 0, 2, epoch=0)
        await admin.script_flush()
        assert await store.release_lease(lease)
        await admin.script_flush()
        results = await asyncio.gather(*(store.snapshot("s") for _ in range(5)))
        for snap in results:
            assert seqs_of(snap.messages) == [3, 4, 5, 6]
            assert snap.record is not None and snap.record.version == 1
    finally:
        await store.close()
        await admin.aclose()


async def test_redis_errors_never_echo_the_password(rds: str) -> None:
    host = urlsplit(REDIS_URL).netloc.rpartition("@")[2]
    store = open_memory(f"redis://nobody:s3cret-pw%21@{host}/0", count_tokens)
    try:
        shown = store.url  # type: ignore[attr-defined]
        assert "s3cret" not in repr(store) and "s3cret" not in shown
        with pytest.raises(ConnectionError) as info:
            await store.get_epoch("s")
        text = "".join(traceback.format_exception(info.value))
        assert "s3cret" not in text
        assert "cannot connect: authentication failed" in str(info.value)
        assert "nobody:***@" in str(info.value) and "\n" not in str(info.value)
    finally:
        await store.close()


async def test_redis_server_down_is_one_quick_line() -> None:
    _redis_backend()
    url = "redis://:s3cret-pw@127.0.0.1:1/0"  # nothing listens on port 1
    store = open_memory(url, count_tokens)
    calls = {
        "append": lambda: store.append("s", [user("x")]),
        "get_history": lambda: store.get_history("s"),
        "get_metadata": lambda: store.get_metadata("ns", "k"),
        "acquire_lease": lambda: store.acquire_lease("L", 1),
    }
    try:
        for name, call in calls.items():
            start = time.monotonic()
            with pytest.raises(ConnectionError) as info:
                await call()
            assert time.monotonic() - start < 2, name
            text = str(info.value)
            assert text.startswith("redis://:***@127.0.0.1:1/0: cannot connect: "), text
            assert "\n" not in text and "s3cret" not in text
    finally:
        await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.get_epoch("s")


async def test_redis_silent_server_times_out() -> None:
    """A server that accepts the connection but never answers fails after socket_timeout."""
    import socket

    _redis_backend()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        store = open_memory(f"redis://127.0.0.1:{port}/0?socket_timeout=0.2", count_tokens)
        try:
            start = time.monotonic()
            with pytest.raises(TimeoutError) as info:
                await store.get_epoch("s")
            assert time.monotonic() - start < 2
            assert str(info.value).startswith(f"redis://127.0.0.1:{port}/0?socket_timeout=0.2: ")
            assert "\n" not in str(info.value)
        finally:
            await store.close()


async def test_redis_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _redis_backend()
    url = "rediss://:pw@redis.example:6380/2?prefix=app:&socket_timeout=1.5"
    store = open_memory(url, count_tokens)
    try:  # nothing connects before the first call
        assert isinstance(store, backend.RedisMemory)
        assert store.prefix == "app:"
        assert store.url == "rediss://:***@redis.example:6380/2?prefix=app:&socket_timeout=1.5"
    finally:
        await store.close()
    plain = open_memory("redis://127.0.0.1", count_tokens)
    assert isinstance(plain, backend.RedisMemory) and plain.prefix == "hs:"
    await plain.close()

    for bad in (
        "redis://127.0.0.1:6379/zero",
        "redis://:6379/0",
        "redis://127.0.0.1:99999/0",
        "redis://127.0.0.1:6379/0?bogus=1",
        "redis://127.0.0.1:6379/0?prefix=",
        "redis://127.0.0.1:6379/0?socket_timeout=soon",
    ):
        with pytest.raises(ValueError) as info:
            open_memory(bad, count_tokens)
        assert bad in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError) as info:
        open_memory("redis://:s3cret@127.0.0.1:port/0", count_tokens)
    assert "s3cret" not in str(info.value) and "redis://:***@127.0.0.1:port/0" in str(info.value)

    # Without redis-py the error says what to install.
    monkeypatch.setitem(sys.modules, "redis", None)
    backend = "host_stub.memory.redis"
    for name in [m for m in sys.modules if m == backend or m.startswith(backend + ".")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'plugin-memory-summary\[redis\]'"):
        open_memory("redis://127.0.0.1:6379/0", count_tokens)


def test_postgres_connections_run_small_statements_without_jit_or_workers() -> None:
    """A search's statements are small, but the planner cannot tell how rare a session's
    lexemes are: its estimates passed jit_above_cost and each search paid about 12 ms compiling
    (at 300,000 indexed messages). The pool's connections turn JIT and parallel workers off,
    unless the URL sets them."""
    from host_stub.memory.postgres import server_settings

    url = "postgresql://postgres@127.0.0.1:5432/test"
    assert server_settings(url) == {"max_parallel_workers_per_gather": "0", "jit": "off"}
    assert server_settings(url + "?jit=on") == {"max_parallel_workers_per_gather": "0"}
    assert server_settings(url + "?max_parallel_workers_per_gather=2&jit=on") == {}
