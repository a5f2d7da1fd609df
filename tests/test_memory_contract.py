"""The MemoryService contract, run against every backend.

A new backend joins by adding an entry to ``BACKENDS`` (its URL for a test; a server-backed one
should skip when its server is not configured). Tests that need several connections on the same
storage ask the ``stores`` factory for more handles. The SQLite-only tests at the end check the
file format and the cross-process guarantees (seqs and leases with several OS processes).
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
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from host_stub.memory import InMemoryMemory, SQLiteMemory, open_memory
from host_stub.memory.sqlite import SCHEMA_VERSION
from host_stub.messages import Message, ToolCall, ToolCallFunction, text_of
from host_stub.services import LeaseToken, MemoryService

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


# -- backends ---------------------------------------------------------------------------------

#: name -> (URL for a test directory, whether every open_memory call shares one storage only
#: through the same object). Add "postgresql" / "redis" here, skipping when no server is set.
BACKENDS: dict[str, Callable[[Path], str]] = {
    "memory": lambda tmp: "memory://",
    "sqlite": lambda tmp: f"sqlite:///{tmp / 'memory.db'}",
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
    for store in opened:
        await store.close()


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


async def test_expired_lease_is_taken_over(stores: StoreFactory) -> None:
    one, two = stores(), stores()
    crashed = await one.acquire_lease("L", 0.2)
    assert crashed is not None
    assert await two.acquire_lease("L", 5) is None
    await asyncio.sleep(0.25)
    taken = await two.acquire_lease("L", 5)
    assert taken is not None and taken.token != crashed.token
    # The old holder's late release must not free the new holder's lease.
    assert await one.release_lease(crashed) is False
    assert await one.acquire_lease("L", 5) is None
    assert await two.release_lease(taken) is True


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
    for planned in ("postgresql://user@host/db", "redis://localhost:6379/0"):
        with pytest.raises(NotImplementedError, match="not available yet"):
            open_memory(planned, count_tokens)


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


# -- SQLite across OS processes ---------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    from host_stub.memory import open_memory
    from host_stub.messages import Message

    mode, db, work, me = sys.argv[1:5]
    work = Path(work)

    async def main():
        store = open_memory("sqlite:///" + db, lambda m: 1)
        try:
            await store.get_epoch("warm-up")  # open the file and create the schema
            (work / f"ready-{me}").touch()
            while not (work / "go").exists():
                await asyncio.sleep(0.002)
            result = []
            if mode == "append":
                for i in range(int(sys.argv[5])):
                    [m] = await store.append("shared", [Message(role="user", content=f"{me}-{i}")])
                    result.append(m.seq)
            elif mode == "lease":
                end = time.time() + float(sys.argv[5])
                while time.time() < end:
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


def _run_children(tmp_path: Path, mode: str, count: int, arg: str) -> dict[str, list]:
    """Start ``count`` processes on one database file, release them together, collect output."""
    import json

    db = tmp_path / "shared.db"
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, mode, str(db), str(work), f"p{n}", arg],
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


@pytest.mark.slow
def test_sqlite_appends_from_several_processes_are_gapless(tmp_path: Path) -> None:
    per_process = 100
    results = _run_children(tmp_path, "append", 2, str(per_process))
    for seqs in results.values():
        assert len(seqs) == per_process
        assert seqs == sorted(seqs)  # each process's appends commit in its own order
    everything = sorted(seq for seqs in results.values() for seq in seqs)
    assert everything == list(range(1, 2 * per_process + 1))

    async def read() -> list[Message]:
        store = SQLiteMemory(tmp_path / "shared.db", count_tokens)
        try:
            return await store.get_history("shared")
        finally:
            await store.close()

    history = asyncio.run(read())
    assert seqs_of(history) == list(range(1, 2 * per_process + 1))
    by_seq = {m.seq: m.content for m in history}
    for name, seqs in results.items():
        assert [by_seq[s] for s in seqs] == [f"{name}-{i}" for i in range(per_process)]


@pytest.mark.slow
def test_sqlite_lease_has_one_holder_across_processes(tmp_path: Path) -> None:
    results = _run_children(tmp_path, "lease", 4, "1.5")
    holds = sorted(
        (start, stop, name) for name, spans in results.items() for start, stop, _ in spans
    )
    # A holder that finds its lease gone at release time was overrun by another process.
    assert all(released for spans in results.values() for *_, released in spans)
    assert len(holds) >= 5  # usually ~100; low bar so a loaded machine does not flake
    assert len({name for _, _, name in holds}) >= 2, "the lease never changed hands"
    for (_, prev_stop, prev), (start, _, name) in zip(holds, holds[1:], strict=False):
        assert start >= prev_stop, f"{name} took the lease while {prev} held it"
