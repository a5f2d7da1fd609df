"""A slow summarizer of unknown speed, on a fake clock (issue "Weak models", points 2 and 3): the
first call is sized so that it ends well within ``summary_timeout_s``, and a call that times out
in the middle of a compression leaves nothing of its batch in the summary.

The model is scripted: a call takes ``prompt_s`` per prompt token and ``output_s`` per token it
may write (it writes all of them, as a small model that rambles to its limit does), on a clock
the test owns. Past the call's timeout the client gives up: the clock moves by the timeout and
the call raises, as litellm's ``Timeout`` does. No wall-clock time orders anything here."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Sequence
from typing import Any

import pytest

from host_stub.messages import Message
from host_stub.services import Completion, LLMUsage
from host_stub.testing import simple_count
from plugin_memory_summary.base.config import MemorySummaryConfig
from plugin_memory_summary.record.fitting import render_payload
from plugin_memory_summary.safety.redact import Redactor
from plugin_memory_summary.summarizer import speed as speed_module
from plugin_memory_summary.summarizer import summarize as summarize_module
from plugin_memory_summary.summarizer.speed import (
    MARGIN,
    MIN_ANSWER_TOKENS,
    MIN_BATCH_TOKENS,
    UNKNOWN_OVERHEAD_TOKENS,
    UNKNOWN_SPEED,
    CallLimits,
    Sample,
    SpeedBook,
)
from plugin_memory_summary.summarizer.summarize import summarize_batches

TIMEOUT = 60.0


class Clock:
    """The time the summarizer's code reads; only the scripted model and waits move it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


class Timeout(Exception):  # noqa: N818 - named as litellm's, which the summarizer recognises
    """What the client raises when it gives up on a call."""


class SlowModel:
    """A weak model on a slow server, on ``clock``. ``answers``: the text of each call (by its
    index, from 0), else a sentence of the part it digests; ``time_out``: the calls (by index)
    that never end in time, whatever their size. Each call's simulated seconds, and whether it
    timed out, are kept in ``calls``."""

    default_model = "slow"

    def __init__(
        self,
        clock: Clock,
        *,
        prompt_s: float,
        output_s: float,
        time_out: Sequence[int] = (),
        partial: str = "",
    ) -> None:
        self.clock, self.prompt_s, self.output_s = clock, prompt_s, output_s
        self.time_out = set(time_out)
        #: What a call that times out had streamed when the client gave up: its error carries
        #: it (as a client's error may quote what it received), and it must go nowhere.
        self.partial = partial
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
        needed = self.prompt_s * prompt + self.output_s * out
        index = len(self.calls)
        limit = timeout if timeout is not None else float("inf")
        timed_out = index in self.time_out or needed > limit
        self.calls.append(
            {
                "prompt": prompt,
                "max_tokens": out,
                "seconds": min(needed, limit),
                "timed_out": timed_out,
                "transcript": messages[-1]["content"],
            }
        )
        if timed_out:
            self.clock.now += limit
            raise Timeout(f"Request timed out after {limit} seconds; received: {self.partial}")
        self.clock.now += needed
        # A sentence of the first message it digests (grounded, so the answer is used), marked
        # with the call's number so the test can find it in the summary.
        first = messages[-1]["content"].split("<transcript>", 1)[-1]
        seq = next(w for w in first.split() if w.isdigit())
        text = f"Message {seq} was about the trip planning, the hotel and the train times."
        usage = LLMUsage(prompt_tokens=prompt, completion_tokens=out)
        return Completion(text=text, usage=usage, finish_reason="stop")

    def context_window(self, model: str | None = None) -> int:
        return 100_000

    def max_output_tokens(self, model: str | None = None) -> int:
        return 4096

    def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
        return simple_count(str(messages_or_text))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The summarizer's and the speed book's clock, and the summarizer's waits, made fake."""
    fake = Clock()
    monkeypatch.setattr(summarize_module, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    monkeypatch.setattr(speed_module, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    monkeypatch.setattr(
        summarize_module,
        "asyncio",
        types.SimpleNamespace(
            sleep=fake.sleep, wait_for=asyncio.wait_for, CancelledError=asyncio.CancelledError
        ),
    )
    return fake


def _text(i: int) -> str:
    """Message ``i``: about 60 tokens (as the scripted model counts them)."""
    return (
        f"Message {i} about the trip planning, the hotel and the train times. We compared the "
        "fares, the seats, the luggage rules and the transfers between the stations, and we "
        "wrote down which options were left for the days after that one."
    )


def batch(first: int, n: int) -> list[Message]:
    return [
        Message(
            role="user" if i % 2 == 0 else "assistant",
            content=_text(i),
            seq=i,
            tokens=simple_count(_text(i)),
        )
        for i in range(first, first + n)
    ]


async def digest(
    llm: SlowModel,
    batches: list[list[Message]],
    book: SpeedBook,
    fallback: str = "rules",
    budget: int = 400,
) -> summarize_module.SummarizeOutcome:
    return await summarize_batches(
        None,
        batches,
        llm=llm,  # type: ignore[arg-type]
        model="slow",
        config=MemorySummaryConfig(summary_timeout_s=TIMEOUT, fallback=fallback),  # type: ignore[arg-type]
        budget=budget,
        lang="en",
        redactor=Redactor(),
        count_tokens=simple_count,
        speed=book,
    )


# --- point 2: the first call of a model of unknown speed ------------------------------------


@pytest.mark.parametrize("timeout", [60.0, 120.0, 600.0])
def test_the_first_call_fits_well_within_the_timeout_at_the_assumed_speed(timeout: float) -> None:
    limits = SpeedBook().limits("new", timeout_s=timeout, max_tokens=2000)
    assert limits is not None  # unknown is not "fast": the first call is sized
    prompt = limits.batch_tokens + UNKNOWN_OVERHEAD_TOKENS
    assert UNKNOWN_SPEED.seconds(prompt, limits.max_tokens) <= MARGIN * timeout


def test_under_a_short_timeout_the_first_call_is_the_smallest_there_is() -> None:
    limits = SpeedBook().limits("new", timeout_s=10.0, max_tokens=2000)
    assert limits == CallLimits(batch_tokens=MIN_BATCH_TOKENS, max_tokens=MIN_ANSWER_TOKENS)


def test_a_model_whose_calls_are_quick_is_not_sized() -> None:
    book = SpeedBook()
    book.observe("fast", Sample(3000, 2700, 300, 0.4))  # too quick to say anything: fast
    assert book.limits("fast", timeout_s=TIMEOUT, max_tokens=2000) is None


async def test_the_first_call_to_a_slow_model_does_not_time_out(clock: Clock) -> None:
    # A weak model on a busy CPU: 100 prompt and 10 output tokens a second (twice as fast as the
    # speed assumed while it is unknown). A whole batch of 4,000 tokens in one call would need
    # 40 s to read and 40 s to write its 400-token answer: a timeout at 60 s, then more.
    llm = SlowModel(clock, prompt_s=0.01, output_s=0.1)
    outcome = await digest(llm, [batch(1, 66)], SpeedBook())
    assert not outcome.errors, outcome.errors
    assert not any(c["timed_out"] for c in llm.calls), llm.calls
    assert outcome.batches_done == 1 and outcome.model_batches == len(llm.calls) > 1
    # The first call, sized blind, takes well under the timeout; every later one (sized from
    # the speed measured) fits in it too.
    assert llm.calls[0]["seconds"] <= MARGIN * TIMEOUT
    assert all(c["seconds"] < TIMEOUT for c in llm.calls)
    assert outcome.latencies == pytest.approx([c["seconds"] for c in llm.calls])


# --- point 3: a call that times out mid-way leaves nothing of its batch ---------------------


def _known(book: SpeedBook) -> None:
    """The model's speed measured before: 100 prompt and 10 output tokens a second."""
    book.observe("slow", Sample(1000, 700, 100, 0.01 * 1000 + 0.1 * 100))
    book.observe("slow", Sample(2000, 1700, 50, 0.01 * 2000 + 0.1 * 50))


@pytest.mark.parametrize("fallback", ["trim", "rules"])
async def test_a_batch_whose_call_timed_out_leaves_no_partial_items(
    clock: Clock, fallback: str
) -> None:
    # Batch 1 takes one call, batch 2 (2,400 tokens) two at the model's speed; the second call
    # of batch 2 times out after the first one's answer came in.
    llm = SlowModel(
        clock,
        prompt_s=0.01,
        output_s=0.1,
        time_out=[2],
        partial="Message 41 was about the ferry, half written when the client gave up",
    )
    book = SpeedBook()
    _known(book)
    outcome = await digest(llm, [batch(1, 10), batch(11, 40)], book, fallback=fallback)
    assert [c["timed_out"] for c in llm.calls] == [False, False, True], llm.calls
    assert len(outcome.errors) == 1 and "timed out" in outcome.errors[0]
    text = render_payload(outcome.payload, "en")
    assert "Message 1 was about the trip planning" in text  # batch 1's answer
    # Nothing of the abandoned call: not what it had streamed, in the summary or the reason.
    assert "half written" not in text and "ferry" not in text
    assert "ferry" not in outcome.errors[0]
    if fallback == "trim":
        # The batch is not covered: nothing of it is in the summary, not even the answer its
        # first call gave (the messages are archived by the trim, not summarized).
        assert outcome.batches_done == 1
        assert "Message 11 was about" not in text, text
        assert "Message 11 " not in text and "Message 30 " not in text, text
    else:
        # The rules engine merged the part the call could not digest: the batch is whole.
        assert outcome.batches_done == 2 and outcome.fallback == "rules"
