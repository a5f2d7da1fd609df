"""The summarizer's calls sized to what the model answers in time (issue 17, point 4): the speed
measured from its calls, the limits of the next ones, the wait after a call given up on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from host_stub.messages import Message
from host_stub.services import Completion, LLMUsage
from host_stub.testing import simple_count
from plugin_memory_summary.base.config import MemorySummaryConfig
from plugin_memory_summary.safety.redact import Redactor
from plugin_memory_summary.summarizer.speed import (
    MIN_ANSWER_TOKENS,
    TIMEOUT_FACTOR,
    Sample,
    Speed,
    SpeedBook,
    busy_after_timeout,
    call_limits,
    fit_speed,
    timeout_reason,
)
from plugin_memory_summary.summarizer.summarize import summarize_batches


def _sample(a: float, b: float, prompt: int, out: int) -> Sample:
    return Sample(prompt, prompt - 50, out, a * prompt + b * out)


def test_two_costs_are_fitted_from_calls_of_different_shapes() -> None:
    a, b = 0.002, 0.05  # 500 prompt tokens/s, 20 output tokens/s
    speed = fit_speed([_sample(a, b, 3000, 100), _sample(a, b, 800, 400), _sample(a, b, 1500, 60)])
    assert speed is not None and speed.samples == 3
    assert speed.prompt_s == pytest.approx(a, rel=1e-6)
    assert speed.output_s == pytest.approx(b, rel=1e-6)
    assert speed.prompt_tps == pytest.approx(1 / a) and speed.output_tps == pytest.approx(1 / b)


def test_one_call_explains_its_own_time_with_the_prior_ratio() -> None:
    sample = Sample(2000, 1900, 300, 12.0)
    speed = fit_speed([sample], ratio=10.0)
    assert speed is not None
    assert speed.output_s == pytest.approx(10.0 * speed.prompt_s)
    assert speed.seconds(2000, 300) == pytest.approx(12.0)


def test_a_timed_out_call_counts_as_slower_than_its_timeout() -> None:
    speed = fit_speed([Sample(3000, 2900, 500, 60.0, timed_out=True)])
    assert speed is not None
    assert speed.seconds(3000, 500) == pytest.approx(60.0 * TIMEOUT_FACTOR)


def test_short_calls_say_nothing_about_speed() -> None:
    assert fit_speed([Sample(3000, 2900, 500, 0.2)]) is None
    assert fit_speed([]) is None
    assert fit_speed([Sample(3000, 2900, 500, 0.2)], min_seconds=0.0) is not None


@pytest.mark.parametrize(
    ("prompt_s", "output_s", "budget"),
    [(0.002, 0.05, 800), (0.0005, 0.02, 400), (0.01, 0.2, 1200), (0.0001, 0.001, 2000)],
)
def test_limits_fit_the_call_in_the_timeout_with_margin(
    prompt_s: float, output_s: float, budget: int
) -> None:
    speed = Speed(prompt_s, output_s, 2)
    limits = call_limits(speed, timeout_s=60.0, max_tokens=budget, overhead_tokens=300)
    assert limits is not None
    assert limits.max_tokens <= budget
    assert speed.seconds(limits.batch_tokens + 300, limits.max_tokens) <= 60.0 * 0.5 + 1e-6
    if output_s * budget <= 60.0 * 0.5 * 0.5:
        assert limits.max_tokens == budget  # a writer fast enough keeps its whole answer


def test_the_batch_is_sized_for_the_answers_the_model_writes() -> None:
    speed = Speed(0.01, 0.05, 3)
    worst = call_limits(speed, timeout_s=60, max_tokens=300, overhead_tokens=100)
    typical = call_limits(
        speed, timeout_s=60, max_tokens=300, overhead_tokens=100, typical_output=60
    )
    assert worst is not None and typical is not None
    assert typical.max_tokens == worst.max_tokens == 300
    assert typical.batch_tokens > worst.batch_tokens
    # even an answer of the whole max_tokens ends within the timeout
    assert speed.seconds(typical.batch_tokens + 100, typical.max_tokens) < 60


def test_a_slow_writer_is_asked_for_a_shorter_answer_not_below_the_floor() -> None:
    fast = call_limits(Speed(0.001, 0.01, 2), timeout_s=60, max_tokens=1000, overhead_tokens=0)
    slow = call_limits(Speed(0.001, 0.5, 2), timeout_s=60, max_tokens=1000, overhead_tokens=0)
    crawl = call_limits(Speed(0.001, 50.0, 2), timeout_s=60, max_tokens=1000, overhead_tokens=0)
    assert fast is not None and slow is not None and crawl is not None
    assert fast.max_tokens == 1000
    assert slow.max_tokens < 1000
    assert crawl.max_tokens == MIN_ANSWER_TOKENS
    assert call_limits(None, timeout_s=60, max_tokens=1000, overhead_tokens=0) is None


def test_the_server_is_busy_after_a_timeout_for_what_the_call_still_needed() -> None:
    speed = Speed(0.01, 0.1, 1)  # the call needs 30 + 50 = 80 s
    assert busy_after_timeout(speed, prompt_tokens=3000, max_tokens=500, timeout_s=60) == 20
    # bounded: at least a quarter of the timeout, at most twice it
    assert busy_after_timeout(speed, prompt_tokens=10, max_tokens=10, timeout_s=60) == 15
    assert busy_after_timeout(speed, prompt_tokens=10**6, max_tokens=500, timeout_s=60) == 120
    book = SpeedBook()
    busy = book.timed_out("m", Sample(3000, 2900, 500, 60.0, timed_out=True), 500, now=100.0)
    assert book.busy_for("m", now=100.0) == pytest.approx(busy) and busy > 0
    assert book.busy_for("m", now=100.0 + busy + 1) == 0.0
    assert book.busy_for("other", now=100.0) == 0.0


def test_the_timeout_reason_names_the_setting_to_raise() -> None:
    reason = timeout_reason(60.0, Speed(0.002, 0.05, 2))
    assert "timed out after 60.0s" in reason
    assert "summary_timeout_s" in reason and "[plugin.memory-summary]" in reason
    assert "500" in reason and "20.0" in reason  # prompt and output tokens per second
    assert "summary_timeout_s" in timeout_reason(5.0, None)


class PacedLLM:
    """A summarizer that takes ``prompt_s`` per prompt token and ``output_s`` per token it may
    write (it always writes its whole ``max_tokens``), or hangs for the first ``hang`` calls."""

    default_model = "paced"

    def __init__(self, prompt_s: float, output_s: float, hang: int = 0) -> None:
        self.prompt_s, self.output_s, self.hang = prompt_s, output_s, hang
        self.calls: list[dict[str, Any]] = []

    async def complete(
        self,
        messages: Sequence[Any],
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
        tools: Any = None,
    ) -> Completion:
        prompt = sum(simple_count(m["content"]) for m in messages)
        out = max_tokens or 0
        self.calls.append({"start": time.monotonic(), "prompt": prompt, "max_tokens": out})
        if len(self.calls) <= self.hang:
            await asyncio.sleep(3600)
        await asyncio.sleep(self.prompt_s * prompt + self.output_s * out)
        usage = LLMUsage(prompt_tokens=prompt, completion_tokens=out)
        return Completion(text="The user planned a short trip.", usage=usage, finish_reason="stop")

    def context_window(self, model: str | None = None) -> int:
        return 100_000

    def max_output_tokens(self, model: str | None = None) -> int:
        return 4096

    def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
        return simple_count(str(messages_or_text))


def _batch(n: int) -> list[Message]:
    return [
        Message(
            role="user" if i % 2 == 0 else "assistant",
            content=f"Message {i} about the trip planning, the hotel and the train times.",
            seq=i + 1,
            tokens=60,
        )
        for i in range(n)
    ]


async def _run(llm: PacedLLM, batches: list[list[Message]], timeout: float, speed: SpeedBook):
    return await summarize_batches(
        None,
        batches,
        llm=llm,  # type: ignore[arg-type]
        model="paced",
        config=MemorySummaryConfig(summary_timeout_s=timeout),
        budget=200,
        lang="en",
        redactor=Redactor(),
        count_tokens=simple_count,
        speed=speed,
    )


async def test_batches_after_the_first_call_are_sized_to_the_timeout() -> None:
    # 0.15 ms per prompt token, 1 ms per output token; a 2,400-token batch takes ~0.6 s of a
    # 0.5 s budget (the timeout 1 s with its margin): too large once the speed is known.
    llm = PacedLLM(prompt_s=0.00015, output_s=0.001)
    book = SpeedBook(min_seconds=0.0)
    outcome = await _run(llm, [_batch(10), _batch(40), _batch(40)], 1.0, book)
    assert not outcome.errors, outcome.errors
    assert outcome.batches_done == 3
    # the first call was small enough; the big batches were digested in several calls each
    assert len(llm.calls) > 3
    assert outcome.model_batches == len(llm.calls)
    assert max(c["prompt"] for c in llm.calls[1:]) < 40 * 60
    assert len(outcome.latencies) == len(llm.calls)
    assert all(t < 1.0 for t in outcome.latencies)


async def test_without_a_speed_book_a_batch_is_one_call() -> None:
    llm = PacedLLM(prompt_s=0.0, output_s=0.0)
    outcome = await summarize_batches(
        None,
        [_batch(40)],
        llm=llm,  # type: ignore[arg-type]
        model="paced",
        config=MemorySummaryConfig(summary_timeout_s=1.0),
        budget=200,
        lang="en",
        redactor=Redactor(),
        count_tokens=simple_count,
    )
    assert len(llm.calls) == 1 and outcome.model_batches == 1


async def test_no_call_is_sent_while_the_server_works_on_one_given_up_on() -> None:
    llm = PacedLLM(prompt_s=0.00005, output_s=0.0005, hang=1)
    book = SpeedBook(min_seconds=0.0)
    outcome = await _run(llm, [_batch(20), _batch(20)], 0.4, book)
    assert len(outcome.errors) == 1 and "summary_timeout_s" in outcome.errors[0]
    assert len(llm.calls) >= 2
    gap = llm.calls[1]["start"] - llm.calls[0]["start"]
    # given up on after 0.4 s (+1 s grace for a client ignoring its timeout), then a wait
    assert gap >= 0.4 + 0.25 * 0.4
    assert outcome.model_batches >= 1  # the next batch used the model's answer
