"""Background work lets a turn waiting on the store go first: the host counts its turns' store
calls (``Host.after_turns``), a background compression waits for them before each CPU step (a
blocking one, which its turn waits for, never does), and the new record's block is made before
the commit and kept only once the commit won."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
from plugin_harness import plugin_host

from host_stub.memory.inmemory import InMemoryMemory
from host_stub.messages import Message
from host_stub.services import Snapshot, YieldsToTurns
from host_stub.store_watch import TurnWaits
from host_stub.testing import message_tokens
from plugin_memory_summary.pipeline import pipeline as pipeline_module
from plugin_memory_summary.pipeline.pipeline import Pipeline


class GatedMemory(InMemoryMemory):
    """An in-memory store whose appends wait for ``gate`` (a store call that leaves the event
    loop, as SQLite's worker or a database round trip does); ``events`` records each append."""

    def __init__(self) -> None:
        super().__init__(message_tokens)
        self.gate = asyncio.Event()
        self.gate.set()
        self.events: list[str] = []

    async def append(self, session_id: str, messages: Sequence[Message]) -> list[Message]:
        await self.gate.wait()
        self.events.append("append")
        return await super().append(session_id, messages)

    async def append_snapshot(
        self, session_id: str, messages: Sequence[Message], namespace: str = "summary"
    ) -> tuple[list[Message], Snapshot]:
        await self.gate.wait()
        self.events.append("append")
        return await super().append_snapshot(session_id, messages, namespace)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# -- the counter -------------------------------------------------------------------------------


async def test_no_wait_when_no_turn_waits() -> None:
    waits = TurnWaits()
    started = time.monotonic()
    assert await waits.none_waiting(5.0)
    assert time.monotonic() - started < 0.5


async def test_background_work_waits_for_the_turns_store_call_then_goes() -> None:
    waits = TurnWaits()
    release = asyncio.Event()
    call = asyncio.ensure_future(waits.around(release.wait()))
    await settle()
    assert waits.waiting == 1
    waiter = asyncio.ensure_future(waits.none_waiting(5.0))
    await settle()
    assert not waiter.done()
    release.set()
    assert await waiter
    await call
    assert waits.waiting == 0


async def test_a_turn_that_waits_again_first_keeps_background_work_waiting() -> None:
    waits = TurnWaits()
    first, second = asyncio.Event(), asyncio.Event()

    async def turn() -> None:
        await waits.around(first.wait())
        await waits.around(second.wait())  # no yield between: the waiter must look again

    task = asyncio.ensure_future(turn())
    await settle()
    waiter = asyncio.ensure_future(waits.none_waiting(5.0))
    await settle()
    first.set()
    await settle()
    assert not waiter.done()
    second.set()
    assert await waiter
    await task


async def test_background_work_is_delayed_never_stopped() -> None:
    waits = TurnWaits()
    never = asyncio.Event()
    call = asyncio.ensure_future(waits.around(never.wait()))
    await settle()
    started = time.monotonic()
    assert not await waits.none_waiting(0.05)
    assert 0.04 <= time.monotonic() - started < 1.0
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert waits.waiting == 0  # a cancelled store call is no longer waited for


# -- the host ----------------------------------------------------------------------------------


async def test_the_hosts_turn_store_calls_are_waited_for() -> None:
    memory = GatedMemory()
    async with plugin_host({"strategy": "off"}, memory=memory) as h:
        assert isinstance(h.host, YieldsToTurns)
        memory.gate.clear()
        turn = asyncio.ensure_future(
            h.host.run_turn("s", "hello", recorded=[Message(role="assistant", content="hi")])
        )
        await settle()
        waiter = asyncio.ensure_future(h.host.after_turns(5.0))
        await settle()
        assert not waiter.done()  # the turn's append is in the store
        memory.gate.set()
        assert await waiter
        assert (await turn).outcome == "replied"


# -- the plugin --------------------------------------------------------------------------------


async def _compress_while_a_turn_waits(blocking: bool) -> list[str]:
    """The order of a compression's planning and a turn's append it overlaps: the turn's append
    waits in the store when the compression starts."""
    memory = GatedMemory()
    async with plugin_host({"threshold": 100_000}, memory=memory) as h:
        await h.turns("s", 6)
        pipeline: Pipeline = h.plugin.pipeline
        plan = pipeline._plan_run

        def planned(*args: Any, **kwargs: Any) -> Any:
            memory.events.append("plan")
            return plan(*args, **kwargs)

        pipeline._plan_run = planned  # type: ignore[method-assign]
        memory.events.clear()
        memory.gate.clear()
        turn = asyncio.ensure_future(
            h.host.run_turn("s", "more", recorded=[Message(role="assistant", content="ok")])
        )
        await settle()
        deadline = time.monotonic() + 30 if blocking else None
        run = asyncio.ensure_future(pipeline.compress_once("s", "auto", deadline, None, []))
        await asyncio.sleep(0.05)
        memory.gate.set()
        await asyncio.gather(turn, run)
        return memory.events


async def test_a_background_compression_plans_after_the_turns_store_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pipeline_module, "TURNS_FIRST_S", 5.0)  # longer than the turn waits
    events = await _compress_while_a_turn_waits(blocking=False)
    assert events[0] == "append" and "plan" in events, events


async def test_a_blocking_compression_does_not_wait_for_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pipeline_module, "TURNS_FIRST_S", 5.0)
    events = await _compress_while_a_turn_waits(blocking=True)
    assert events[0] == "plan" and "append" in events, events


async def test_a_lost_commit_keeps_no_block_for_the_version_it_expected() -> None:
    async with plugin_host({"threshold": 200, "keep_recent": 2}) as h:
        await h.turns("s", 12, pad=200)
        await h.plugin.scheduler.wait_idle()
        pipeline: Pipeline = h.plugin.pipeline
        snap = await h.host.memory.snapshot("s")
        version = snap.record.version if snap.record else 0
        blocks_before = dict(pipeline.tokens._blocks)

        commits: list[int] = []

        async def lost(*args: Any, **kwargs: Any) -> bool:
            commits.append(kwargs["expected_version"])
            return False  # another writer's record took the version first

        h.host.memory.commit_compression = lost  # type: ignore[method-assign]
        await h.turns("s", 8, start=12, pad=200)
        await h.plugin.scheduler.wait_idle()
        result = await pipeline.compress_once("s", "manual", None, None, [])
        assert result.status != "done" and version in commits
        kept = {k for k in pipeline.tokens._blocks if k not in blocks_before}
        assert not any(k[0] == "s" and k[1] == version + 1 for k in kept), kept
