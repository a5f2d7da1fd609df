"""A background compression's CPU work leaves the event loop to the host's turns (issue 34's
step cost, issue 37's "background compressions on the host's loop"): the rules engine's merge and
the final fit of a background run go to a worker thread; a blocking run keeps them on the loop
(its turn waits for it anyway)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from host_stub.messages import Message
from host_stub.testing.llm import FakeLLM
from plugin_memory_summary.base import MemorySummaryConfig
from plugin_memory_summary.safety import Redactor
from plugin_memory_summary.summarizer import summarize

HOLD_S = 0.3


def _batch() -> list[Message]:
    return [
        Message(role="user" if i % 2 == 0 else "assistant", content=f"message {i} about Lima")
        for i in range(12)
    ]


async def _largest_gap(work: Any) -> float:
    """The longest the loop went without running a ticker while ``work`` ran."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    try:
        await work
    finally:
        done.set()
        await tick
    return max(gaps)


async def _run(monkeypatch: pytest.MonkeyPatch, pause: Any) -> float:
    real = summarize.rules_merge

    def slow_merge(*args: Any, **kwargs: Any) -> Any:
        time.sleep(HOLD_S)  # CPU work that does not await (the thread is held)
        return real(*args, **kwargs)

    monkeypatch.setattr(summarize, "rules_merge", slow_merge)
    work = summarize.summarize_batches(
        None,
        [_batch()],
        llm=FakeLLM(),
        model=None,
        config=MemorySummaryConfig(),
        budget=400,
        lang="en",
        redactor=Redactor([]),
        count_tokens=lambda text: len(text) // 4,
        pause=pause,
    )
    return await _largest_gap(work)


async def test_a_background_runs_merge_leaves_the_loop_to_turns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def pause() -> None:
        return None

    assert await _run(monkeypatch, pause) < HOLD_S / 2


async def test_a_blocking_runs_merge_stays_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    assert await _run(monkeypatch, None) >= HOLD_S


def test_counting_from_two_threads_at_a_full_memo_never_fails() -> None:
    """The count memo is shared by the loop (a prompt's counts) and a background merge's worker
    thread: evicting its oldest entry from both at once must not fail."""
    import threading

    from plugin_memory_summary.prompt import tokens as tokens_module
    from plugin_memory_summary.prompt.tokens import TokenBook

    book = TokenBook(MemorySummaryConfig(), FakeLLM())
    errors: list[BaseException] = []

    def count(offset: int) -> None:
        try:
            for i in range(20_000):
                book.count(f"text {offset} {i}")
        except BaseException as exc:  # pragma: no cover - the failure this test names
            errors.append(exc)

    limit = tokens_module.COUNT_MEMO_SIZE
    tokens_module.COUNT_MEMO_SIZE = 8
    try:
        threads = [threading.Thread(target=count, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        tokens_module.COUNT_MEMO_SIZE = limit
    assert errors == []
