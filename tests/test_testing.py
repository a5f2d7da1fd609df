"""``host_stub.testing``: the one fake LLM (scripted, per model, faulty, counted) and the
``async with`` host harness the tests and benches use."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from host_stub.hookspecs import hookimpl
from host_stub.messages import Message
from host_stub.services import Completion, LLMUsage
from host_stub.testing import (
    CUT_MARK,
    FAULT_KINDS,
    FakeLLM,
    FaultPlan,
    HostHarness,
    cut_answer,
    oversized_answer,
)

HELLO = [{"role": "user", "content": "hello"}]


async def test_answers_come_from_the_queue_then_the_models_reply_then_the_default() -> None:
    llm = FakeLLM("default", replies={"m/summary": lambda sent: f"saw {len(sent)}"})
    llm.enqueue("first", RuntimeError("down"))
    assert (await llm.complete(HELLO, model="m/summary")).text == "first"
    with pytest.raises(RuntimeError, match="down"):
        await llm.complete(HELLO)
    assert (await llm.complete(HELLO, model="m/summary")).text == "saw 1"
    assert (await llm.complete(HELLO, model="m/chat")).text == "default"
    assert (await FakeLLM().complete(HELLO)).text == "ok"
    done = Completion(text="whole", finish_reason="stop", usage=LLMUsage(), model="x")
    assert await FakeLLM(done).complete(HELLO) is done
    assert [c["model"] for c in llm.calls] == ["m/summary", None, "m/summary", "m/chat"]
    # Per model (the call's, else the default one): calls and the prompt tokens sent.
    assert llm.stats["m/summary"].calls == 2 and llm.stats["fake/summarizer"].calls == 1
    assert llm.stats["m/chat"].input_tokens == llm.count_tokens(HELLO)


async def test_a_given_count_measures_prompts_and_replies() -> None:
    llm = FakeLLM("four", count=lambda x: 7 if isinstance(x, str) else 100 * len(x))
    done = await llm.complete([Message(role="user", content="hi"), *HELLO])
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (200, 7)


async def test_the_delay_keeps_calls_in_flight_together() -> None:
    llm = FakeLLM(delay=0.05)
    await asyncio.gather(*(llm.complete(HELLO) for _ in range(3)))
    stats = llm.stats["fake/summarizer"]
    assert stats.max_in_flight == 3 and stats.in_flight == 0 and len(stats.durations) == 3
    assert min(stats.durations) >= 0.04


def _well_typed(text: str) -> bool:
    """A JSON object with a text ``summary`` and only texts or lists of texts besides."""
    try:
        data = json.loads(text)
    except ValueError:
        return False
    if not isinstance(data, dict) or not isinstance(data.get("summary"), str):
        return False
    return all(
        isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
        for v in data.values()
    )


async def test_forced_faults_fail_as_named_and_are_counted() -> None:
    answer = json.dumps({"summary": "the trip", "identifiers": ["K7XQ2M"]})
    assert _well_typed(answer)
    llm = FakeLLM(answer)
    llm.force("error", "timeout", "empty", "garbage", "wrong_types", "oversized", "length", "ok")
    with pytest.raises((RuntimeError, ConnectionError, ValueError, OSError)):
        await llm.complete(HELLO)
    with pytest.raises(TimeoutError):
        await llm.complete(HELLO)
    assert not (await llm.complete(HELLO)).text.strip()
    assert not _well_typed((await llm.complete(HELLO)).text)  # garbage
    assert not _well_typed((await llm.complete(HELLO)).text)  # wrong types
    oversized = json.loads((await llm.complete(HELLO)).text)
    assert oversized["summary"].startswith("the trip ") and "K7XQ2M" in oversized["identifiers"]
    assert len(oversized["identifiers"]) > 800
    cut = await llm.complete(HELLO)
    assert cut.finish_reason == "length" and CUT_MARK in cut.text
    assert (await llm.complete(HELLO)).text == answer
    assert llm.outcomes[("error", "raised")] == llm.outcomes[("timeout", "raised")] == 1
    assert sum(llm.counts.values()) == 8


async def test_hangs_wait_for_the_timeout_or_the_test_and_slow_replies_for_resolve() -> None:
    llm = FakeLLM("late", hold_slow=True)
    llm.force("hang", "hang", "slow")
    with pytest.raises(TimeoutError):
        await llm.complete(HELLO, timeout=0.01)  # the call's own timeout
    hanging = asyncio.ensure_future(llm.complete(HELLO))
    slow = asyncio.ensure_future(llm.complete(HELLO))
    while not (llm.hanging and llm.waiting_slow):
        await asyncio.sleep(0.001)
    assert llm.fire_hangs() == 1 and llm.resolve_slow() == 1
    with pytest.raises(TimeoutError, match="simulated"):
        await hanging
    assert (await slow).text == "late" and llm.in_flight == 0


def test_a_plan_draws_every_kind_at_its_rate_and_the_same_seed_the_same_kinds() -> None:
    plan = FaultPlan(**{k: 0.1 for k in FAULT_KINDS}, seed=3)
    draws = [plan.draw(random.Random(i)) for i in range(2000)]
    for kind in (*FAULT_KINDS, "ok"):
        assert 100 < draws.count(kind) < 300, kind
    first, second = plan.sampler(), plan.sampler()
    assert [first.next()[0] for _ in range(50)] == [second.next()[0] for _ in range(50)]
    with pytest.raises(ValueError, match="add up"):
        FaultPlan(error=0.6, timeout=0.6)


def test_failed_answers_build_on_the_normal_one() -> None:
    rng = random.Random(0)
    assert json.loads(oversized_answer("not json", rng))["summary"].startswith("summary ")
    # Cut short, the unfinished end is marked; sometimes only the finish reason says "cut".
    answers = [cut_answer("plain text answer", random.Random(seed)) for seed in range(20)]
    cut = [a for a in answers if a != "plain text answer"]
    assert cut and all(
        a.endswith(CUT_MARK) and "plain text answer".startswith(a[: -len(CUT_MARK)]) for a in cut
    )
    assert len(cut) < len(answers)


async def test_the_harness_starts_records_and_stops_the_host() -> None:
    class Compressing:
        """A plugin that answers every compression request with one final status."""

        def __init__(self) -> None:
            self.stopped = False

        @hookimpl
        def startup(self, host: Any) -> None:
            self.host = host
            host.bus.connect("session:compress", self.on_request)

        async def on_request(self, sender: Any, **payload: Any) -> None:
            await self.host.bus.send(
                "session:compressing",
                request_id=payload["request_id"],
                session_id=payload["session_id"],
                status="done",
            )

        @hookimpl
        def shutdown(self) -> None:
            self.stopped = True

    plugin = Compressing()
    config = {"plugins": {"allow": []}, "host": {"model": "fake/chat"}}
    async with HostHarness(config, plugins=[("c", plugin)]) as h:
        assert h.get_plugin("c") is plugin
        results = await h.turns("s", 2, pad=60)
        assert [r.outcome for r in results] == ["replied", "replied"]
        request_id = await h.host.request_compression("s")
        assert [r["request_id"] for r in h.requests] == [request_id]
        assert [s["status"] for s in h.finals(request_id)] == ["done"]
        assert len(await h.host.memory.get_history("s")) == 4
        assert "lorem" in (await h.host.memory.get_history("s"))[0].content
    assert plugin.stopped  # the way out stopped the host


async def test_a_fake_that_keeps_no_calls_still_counts_them() -> None:
    """A benchmark sends tens of thousands of prompts: ``keep_calls=False`` keeps none of them,
    and the per-model stats still count every call and its tokens."""
    kept, counted = FakeLLM("ok"), FakeLLM("ok", keep_calls=False)
    for llm in (kept, counted):
        for i in range(3):
            await llm.complete([{"role": "user", "content": f"question {i}"}], model="m")
    assert len(kept.calls) == 3 and counted.calls == []
    assert counted.stats["m"].calls == kept.stats["m"].calls == 3
    assert counted.stats["m"].input_tokens == kept.stats["m"].input_tokens > 0
