"""The blocking (hard watermark) path and the block it leaves for the next prompt: it reads the
store only when a compression can help, it is the only run when a call passes both marks at once,
after joining another run it plans on what that run left instead of running again, it returns at
its commit (the marker and the lease release follow), and a trim it makes rebuilds the prompt."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from plugin_harness import Harness, json_summary, plugin_host

import plugin_memory_summary.plugin as plugin_module
from host_stub.messages import Message
from host_stub.testing import FakeLLM
from plugin_memory_summary.base.decisions import (
    after_compression,
    plan_compression,
    plan_watermark,
)
from plugin_memory_summary.record.fitting import render_payload
from plugin_memory_summary.record.summary_model import SummaryPayload
from plugin_memory_summary.safety.hygiene import SUMMARY_OPEN, wrap_summary_block


def seq(messages: list[Message], tokens: int = 100) -> list[Message]:
    return [
        m.model_copy(update={"seq": i + 1, "tokens": m.tokens or tokens})
        for i, m in enumerate(messages)
    ]


def plan(messages: list[Message], **overrides: Any) -> Any:
    args: dict[str, Any] = {
        "reason": "hard",
        "threshold": 30,
        "keep_recent": 100,
        "keep_recent_tokens": None,
        "context_window": 4000,
        "mark": 0.9,
        "min_gain": 0.1,
        "breakdown": {"system": 100, "summary": 0},
        "summary_budget_tokens": 500,
        "batch_tokens": 10_000,
        "max_batches": 4,
    }
    args.update(overrides)
    return plan_compression(messages, **args)


class CountingMemory:
    """The harness store, counting what a compression run does: leases taken, snapshots read,
    commits (won or lost) and, per commit, the snapshots read since its run took the lease."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.leases = self.snapshots = self._at_lease = 0
        self.commits: list[bool] = []
        self.reads_in_run: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def acquire_lease(self, name: str, ttl_s: float) -> Any:
        self.leases += 1
        self._at_lease = self.snapshots
        return await self._inner.acquire_lease(name, ttl_s)

    async def snapshot(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        self.snapshots += 1
        return await self._inner.snapshot(session_id, *args, **kwargs)

    async def commit_compression(self, *args: Any, **kwargs: Any) -> bool:
        won = bool(await self._inner.commit_compression(*args, **kwargs))
        self.commits.append(won)
        self.reads_in_run.append(self.snapshots - self._at_lease)
        return won


@contextlib.asynccontextmanager
async def hard_mark_only(
    llm: FakeLLM | None = None,
) -> AsyncIterator[tuple[Harness, CountingMemory]]:
    """A harness whose only trigger is the hard mark at half a 4,000-token window, the plugin's
    store wrapped in a :class:`CountingMemory`."""
    async with plugin_host(
        {
            "threshold": 1000,
            "keep_recent": 2,
            "auto_compress_threshold": 0,
            "hard_compress_threshold": 0.5,
        },
        host={"context_window": 4000, "system_prompt": "S"},
        llm=llm,
    ) as h:
        memory = CountingMemory(h.plugin.memory)
        h.plugin.memory = memory
        yield h, memory


async def fill_to(h: Any, ratio: float, *, pad: int = 150, limit: int = 40) -> Any:
    """Turns of session ``s`` until the measured usage reaches ``ratio``; the last turn's result."""
    for i in range(limit):
        result = (await h.turns("s", 1, start=i, pad=pad))[0]
        if result.usage[-1].usage_ratio >= ratio:
            return result
    raise AssertionError(f"usage stayed under {ratio} after {limit} turns")


# -- pure ------------------------------------------------------------------------------------------


def test_plan_says_why_nothing_would_run() -> None:
    one = seq([Message(role="user", content="u")])
    assert plan(one).skip == "nothing to compress (1 active messages)"
    # The newest message alone reaches the mark: blocked, whatever the history before it.
    huge = seq([Message(role="user", content=str(i)) for i in range(5)])
    huge[-1] = huge[-1].model_copy(update={"tokens": 3500})
    blocked = plan(huge)
    assert blocked.skip is not None and blocked.skip.startswith("blocked: ")
    assert blocked.blocked is not None and "newest message 3500" in blocked.blocked
    few = seq([Message(role="user", content=str(i)) for i in range(30)], tokens=10)
    assert plan(few, reason="turn", threshold=31).skip == "30 messages, below threshold 31"
    # The soft mark waits until a run frees at least min_gain of the window.
    small = plan(few, reason="auto", mark=0.7, min_gain=0.5)
    assert small.skip is not None and small.skip.startswith("min_gain: ")
    assert small.gain is not None and small.gain < 0.5


def test_plan_runs_with_batches_of_what_the_cut_covers() -> None:
    msgs = seq([Message(role="user", content=str(i)) for i in range(40)])
    p = plan(msgs)
    assert p.skip is None and p.cut is not None
    assert [m.seq for b in p.batches for m in b] == [m.seq for m in p.cut.messages]
    assert p.archived_tokens == 100 * len(p.cut.messages)
    # keep window = (0.9 - 0.1) x 4000 - fixed 100 - summary budget 500 = 2600 tokens = 26 msgs
    assert len(p.cut.kept) == 26


def test_a_blocking_run_past_both_marks_aims_under_the_lower_one() -> None:
    kwargs = dict(
        context_window=4000,
        mark=0.9,
        min_gain=0.1,
        fixed_tokens=100,
        summary_budget_tokens=500,
        newest_tokens=100,
    )
    assert plan_watermark(**kwargs).keep_tokens == 3200 - 100 - 500  # type: ignore[arg-type]
    aimed = plan_watermark(aim=0.7, **kwargs)  # type: ignore[arg-type]
    assert aimed.keep_tokens == 2400 - 100 - 500  # (0.7 - 0.1) x 4000
    # The floor is still judged against the mark that fired, not the lower aim.
    assert plan_watermark(**{**kwargs, "newest_tokens": 3000}, aim=0.7).blocked is None  # type: ignore[arg-type]
    msgs = seq([Message(role="user", content=str(i)) for i in range(40)])
    assert len(plan(msgs, aim=0.7).cut.kept) == 18 < len(plan(msgs).cut.kept) == 26


def test_after_compression_keeps_core_and_newer_messages_and_the_new_summary() -> None:
    msgs = seq(
        [Message(role="system", content="core")]
        + [Message(role="user", content=str(i)) for i in range(9)]
    )
    left, breakdown = after_compression(
        msgs,
        {"system": 50, "summary": 0, "history": 1000, "tools": 300, "tool_defs": 7},
        covered_up_to_seq=6,
        summary_tokens=120,
    )
    assert [m.seq for m in left] == [1, 7, 8, 9, 10]
    assert breakdown == {"system": 50, "summary": 120, "history": 500, "tools": 0, "tool_defs": 7}


# -- through the host ------------------------------------------------------------------------------


async def test_a_hard_mark_no_compression_can_help_takes_no_lease_and_still_reports() -> None:
    async with plugin_host(
        {
            "threshold": 1000,
            "keep_recent": 2,
            "auto_compress_threshold": 0,
            "hard_compress_threshold": 0.9,
            "cooldown_s": 0,
        },
        host={"context_window": 4000},
    ) as h:
        memory = CountingMemory(h.plugin.memory)
        h.plugin.memory = memory
        await h.turns("s", 2)
        # The newest message alone is over the mark: planning on the prompt's view says so.
        for _ in range(3):
            await h.host.run_turn(
                "s", "x " * 7600, recorded=[Message(role="assistant", content="ok")]
            )
        finals = h.finals()
        assert len(finals) == 3 and all(s["reason"].startswith("blocked: ") for s in finals)
        starts = [s for s in h.statuses if s["status"] == "start"]
        assert {s["request_id"] for s in starts} == {s["request_id"] for s in finals}
        assert memory.leases == 0 and h.llm.calls == []


async def test_a_call_past_both_marks_runs_one_blocking_compression_only() -> None:
    async with plugin_host(
        {
            "threshold": 1000,
            "keep_recent": 50,
            "auto_compress_threshold": 0.5,
            "hard_compress_threshold": 0.6,
            "min_gain": 0.05,
        },
        host={"context_window": 4000, "system_prompt": "S"},
    ) as h:
        # ~35% of the window in small turns, then one message that passes both marks at once.
        await fill_to(h, 0.35, pad=100, limit=200)
        assert not h.starts() and not h.finals()
        result = await h.host.run_turn(
            "s", "big " * 1000, recorded=[Message(role="assistant", content="ok")]
        )
        await h.plugin.wait_idle(timeout=30)
        first, rebuilt = result.usage
        assert first.usage_ratio >= 0.6 and rebuilt.rebuilt
        assert not h.starts("auto")  # no background (soft) request next to the blocking one
        done = [s for s in h.finals() if s["status"] == "done"]
        assert [s["stats"]["trigger"] for s in done] == ["hard"]
        # It aimed under the soft mark, so the next call does not start another run.
        assert rebuilt.usage_ratio < 0.5
        await h.turns("s", 1, start=500)
        await h.plugin.wait_idle(timeout=30)
        assert not h.starts("auto") and len(h.finals()) == 1


async def test_a_blocking_request_that_joined_a_run_which_made_room_does_not_run_again() -> None:
    gate = asyncio.Event()

    async def slow(sent: list[dict[str, Any]]) -> str:
        await gate.wait()
        return json_summary(sent)

    async with hard_mark_only(FakeLLM(default=slow)) as (h, memory):
        try:
            await fill_to(h, 0.4)
            assert not h.finals()
            _, _, usage, view = await h.host.build_prompt("s")
            assert usage.usage_ratio < 0.5
            # A prompt over the hard mark while a manual run of the same session waits on the model.
            view = view.model_copy(update={"usage_ratio": 0.55})
            manual = asyncio.ensure_future(h.plugin.compress("s"))
            while not h.plugin.scheduler.running:
                await asyncio.sleep(0.01)
            blocking = asyncio.ensure_future(h.plugin.before_model_call(view))
            await asyncio.sleep(0.05)
            assert not blocking.done()  # it joined the running compression
            gate.set()
            await blocking
            assert (await manual)["status"] == "done"
            # What the manual run left (2 messages and its summary) is far under the mark.
            assert memory.leases == 1
            finals = h.finals()
            assert len(finals) == 2 and all(s["status"] == "done" for s in finals)
        finally:
            gate.set()


async def test_a_blocking_run_compresses_the_prompts_own_view_without_reading_it_again() -> None:
    async with hard_mark_only() as (h, memory):
        results = []
        for i in range(40):
            results.extend(await h.turns("s", 1, start=i, pad=150))
            if h.finals():
                break
        done = [s for s in h.finals() if s["status"] == "done"]
        assert [s["stats"]["trigger"] for s in done] == ["hard"]
        assert results[-1].usage[-1].rebuilt
        assert memory.leases == 1 and memory.commits == [True] and memory.reads_in_run == [0]


async def test_a_view_gone_stale_loses_the_commit_race_and_the_run_reads_afresh() -> None:
    async with hard_mark_only() as (h, memory):
        for i in range(12):
            await h.turns("s", 1, start=i, pad=150)
        _, _, _, view = await h.host.build_prompt("s")
        # Another writer compresses after the view was read...
        assert (await h.plugin.compress("s"))["status"] == "done"
        await h.turns("s", 6, start=100, pad=150)
        assert memory.commits == [True]
        # ...so the blocking run on the old view loses the compare-and-set and starts over.
        await h.plugin.before_model_call(view.model_copy(update={"usage_ratio": 0.6}))
        assert memory.commits == [True, False, True]
        assert memory.reads_in_run[1:] == [0, 1]  # the view first, then one fresh read
        snap = await h.host.memory.snapshot("s")
        archived = await h.host.memory.get_archived("s")
        seqs = sorted([m.seq for m in snap.messages] + [m.seq for m in archived])
        assert seqs == list(range(1, seqs[-1] + 1))  # nothing lost, nothing twice
        record = snap.record.value if snap.record else {}
        assert record["covered_up_to_seq"] >= max(m.seq for m in archived if m.kind == "message")


# -- the injected block ----------------------------------------------------------------------------


async def test_the_stored_summary_fits_its_block_whole_and_the_block_is_ready_before_the_turn() -> (
    None
):
    async with plugin_host(
        {"threshold": 100, "keep_recent": 2, "caps": {"summary_chars": 100_000}},
        host={"context_window": 8000},
    ) as h:
        budget, framing = h.plugin.tokens.budget(8000), h.plugin.tokens.framing_tokens("en")
        # An answer whose rendering fits the budget but not together with the block's framing.
        n = next(
            n
            for n in range(10, 5000)
            if h.plugin.tokens.count(render_payload(SummaryPayload(summary="word " * n), "en"))
            > budget - framing // 2
        )
        assert (
            h.plugin.tokens.count(render_payload(SummaryPayload(summary="word " * n), "en"))
            <= budget
        )
        h.llm.default = json.dumps({"summary": "word " * n})
        await h.turns("s", 4)
        assert (await h.plugin.compress("s"))["status"] == "done"
        record = await h.plugin.show("s")
        assert record is not None
        # Fitted to the budget less the framing: the block is the whole text, never cut.
        # (the default config gives the agent the recall tools: the framing says so)
        whole = wrap_summary_block(record.text, record.lang, recall=True)
        assert h.plugin.tokens.count(whole) <= budget
        counted: list[str] = []
        real = h.plugin.tokens.count

        def spy(text: str) -> int:
            counted.append(text)
            return real(text)

        h.plugin.tokens.count = spy  # type: ignore[method-assign]
        result = (await h.turns("s", 1, start=10))[0]
        sent = next(m["content"] for m in result.sent[0] if SUMMARY_OPEN in str(m["content"]))
        assert sent == whole
        assert counted == []  # built when the compression committed, not on the turn


class GatedRelease(CountingMemory):
    """A :class:`CountingMemory` whose lease releases wait for ``gate``."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.releases = 0

    async def release_lease(self, lease: Any) -> bool:
        await self.gate.wait()
        self.releases += 1
        return bool(await self._inner.release_lease(lease))


@contextlib.asynccontextmanager
async def near_the_hard_mark() -> AsyncIterator[tuple[Harness, GatedRelease, Any]]:
    """A hard-mark-only harness at 40% of its window, its store a :class:`GatedRelease` (its
    gate opened before the host stops), and a prompt view of session ``s`` that reads 55% (past
    the mark)."""
    async with hard_mark_only() as (h, _):
        memory = GatedRelease(h.host.memory)
        h.plugin.memory = memory
        try:
            await fill_to(h, 0.4)
            _, _, _, view = await h.host.build_prompt("s")
            yield h, memory, view.model_copy(update={"usage_ratio": 0.55})
        finally:
            memory.gate.set()


async def markers(h: Any, session_id: str) -> list[Message]:
    snap = await h.host.memory.snapshot(session_id)
    return [m for m in snap.messages if m.kind == "event-marker"]


async def test_a_blocking_request_ends_at_its_commit_and_the_next_run_waits_for_the_lease() -> None:
    async with near_the_hard_mark() as (h, memory, view):
        # The lease release is held back, yet the blocking request is over: the commit is in.
        await asyncio.wait_for(h.plugin.before_model_call(view), timeout=10)
        assert [s["status"] for s in h.finals()] == ["done"] and memory.commits == [True]
        assert memory.releases == 0 and h.plugin.scheduler.tail_pending("s")
        # The next run in this process waits for that release instead of finding its own
        # lease busy.
        manual = asyncio.ensure_future(h.plugin.compress("s"))
        await asyncio.sleep(0.1)
        assert not manual.done() and memory.leases == 1
        memory.gate.set()
        result = await asyncio.wait_for(manual, timeout=10)
        assert result["reason"] != plugin_module.LEASE_BUSY
        assert (
            memory.leases == 2 and memory.releases == 2 and not h.plugin.scheduler.tail_pending("s")
        )
        assert [m.metadata["trigger"] for m in await markers(h, "s")][:1] == ["hard"]


async def test_memory_clear_waits_for_the_marker_of_a_run_that_just_ended() -> None:
    async with near_the_hard_mark() as (h, memory, view):
        await asyncio.wait_for(h.plugin.before_model_call(view), timeout=10)
        assert memory.releases == 0  # the marker and the release are still to come
        clearing = asyncio.ensure_future(h.host.clear("s"))
        await asyncio.sleep(0.1)
        assert not clearing.done()  # it waits for them
        memory.gate.set()
        await asyncio.wait_for(clearing, timeout=10)
        # The marker was written before the clear, so it went with the cleared history.
        assert await markers(h, "s") == [] and memory.releases == 1


async def test_a_blocking_window_trim_behind_a_core_system_message_rebuilds_the_prompt() -> None:
    # A trim changes neither the epoch, nor the summary record, nor the first active seq when a
    # core system message (never archived) heads the history: the host must still rebuild.
    async with plugin_host(
        {
            "strategy": "window",
            "threshold": 1000,
            "keep_recent": 2,
            "auto_compress_threshold": 0,
            "hard_compress_threshold": 0.5,
        },
        host={"context_window": 4000, "system_prompt": "S"},
    ) as h:
        await h.host.memory.append("s", [Message(role="system", content="policy " * 50)])
        for i in range(60):
            result = (await h.turns("s", 1, start=i, pad=150))[0]
            if len(result.usage) > 1:
                break
        first, rebuilt = result.usage
        assert first.usage_ratio >= 0.5 and rebuilt.rebuilt and rebuilt.usage_ratio < 0.5
        assert [s["stats"]["trigger"] for s in h.finals() if s["status"] == "done"] == ["hard"]
        sent = result.sent[-1]
        assert sum(1 for m in sent if m["role"] != "system") <= 4  # the trimmed history went
