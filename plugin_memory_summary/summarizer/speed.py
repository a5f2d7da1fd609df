"""How fast the summarizer answers, measured from its own calls, and what fits in its timeout.

Each call gives one sample: the prompt's tokens (as the host counts them), the tokens the model
wrote and the seconds it took. A call's time is modelled as ``prompt_s * prompt tokens +
output_s * output tokens`` (reading a prompt is cheaper per token than writing an answer: from
about as cheap on a busy CPU to a hundred times cheaper on a GPU). With two or more samples of
different shapes both costs are fitted (least squares); before that, writing a token is
assumed to cost :data:`OUTPUT_COST_RATIO` times reading one.

Before any call to a model ended, it is taken to be slow (:data:`UNKNOWN_SPEED`): its first call
digests a small part, sized to end well within the timeout at that speed, and measures it.

A call that timed out is a lower bound: it is kept as a sample that took :data:`TIMEOUT_FACTOR`
times the timeout, so the next calls are asked for less; and the server, which does not know the
client gave up, is taken to be busy with it for the time the model says it still needed (as long
again as it was given, when the speed is unknown), twice that after two calls in a row were given
up on, up to :data:`MAX_BUSY_FACTOR` times.

A call given up on is one the server still works on, whichever path gave up on it (a background
compression's timeout, a blocking one's deadline, a cancelled run): :class:`SummarizerCalls`
wraps the LLM service for one compression run and records every such call in the model's
:class:`SpeedBook`, shared by every session of the process. While the server is taken to be busy
with it no new call goes out: a run waits for it (:meth:`SpeedBook.take_turn`) or the rules engine
does the work. A model not yet known to answer in time (no call ended yet, or one timed out among
its recent calls) takes one run's calls at a time, so at most one call given up on is
outstanding; and a run gives up on the model after its first call given up on (the rules engine
merges the rest), so a compression ends within about twice ``summary_timeout_s``.

The speed model is pure; :class:`SpeedBook` holds the samples and the server's state per model.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from host_stub.messages import Message, text_of
from host_stub.services import Completion, LLMService

__all__ = [
    "MAX_BUSY_FACTOR",
    "UNKNOWN_OVERHEAD_TOKENS",
    "UNKNOWN_SPEED",
    "CallLimits",
    "ModelBusy",
    "RunSpeed",
    "Sample",
    "Speed",
    "SpeedBook",
    "SummarizerCalls",
    "busy_after_timeout",
    "busy_factor",
    "call_limits",
    "fit_speed",
    "timeout_reason",
]

#: Before both costs can be fitted: seconds per output token / seconds per prompt token.
OUTPUT_COST_RATIO = 4.0
#: A timed-out call is counted as having needed this many times its timeout.
TIMEOUT_FACTOR = 1.5
#: Share of the timeout a call is sized to take (the rest is margin for noise and queueing).
MARGIN = 0.5
#: Share of that time the answer may take (the rest is for reading the prompt).
OUTPUT_SHARE = 0.5
#: A call that took less says nothing about tokens per second (connection set-up, a first
#: import and the server's queue dominate it), and a model that fast needs no sizing.
MIN_SAMPLE_S = 1.0
#: Samples kept per model (the newest).
KEEP = 8
#: Smallest batch and answer a call is cut to, however slow the model: below these a digest is
#: not worth a call (and the timeout warning says which setting to raise).
MIN_BATCH_TOKENS = 200
MIN_ANSWER_TOKENS = 64
#: Calls given up on in a row multiply the time the server is taken to stay busy with the last
#: one (1, 2, 4 ... times), up to this factor: a server that never catches up is left alone for
#: longer and longer, and the rules engine does the work meanwhile.
MAX_BUSY_FACTOR = 4.0


@dataclass(frozen=True)
class Sample:
    """One call: prompt tokens sent, of which ``batch_tokens`` were the conversation part, output
    tokens written, seconds taken; ``timed_out``: the seconds are a lower bound."""

    prompt_tokens: int
    batch_tokens: int
    output_tokens: int
    seconds: float
    timed_out: bool = False


@dataclass(frozen=True)
class Speed:
    """Seconds per prompt token and per output token, and how many samples they rest on."""

    prompt_s: float
    output_s: float
    samples: int

    def seconds(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.prompt_s * prompt_tokens + self.output_s * output_tokens

    @property
    def output_tps(self) -> float:
        return 1.0 / self.output_s if self.output_s > 0 else float("inf")

    @property
    def prompt_tps(self) -> float:
        return 1.0 / self.prompt_s if self.prompt_s > 0 else float("inf")


#: The speed a model is taken to have before any call to it ended: slow (a small model on a busy
#: CPU reads 50 tokens and writes 5 a second), so its first call is small enough to end well
#: within the timeout; that call measures the real speed. A model faster than this pays one
#: small call more, once; one slower may still time out, and is then measured by the timeout.
UNKNOWN_SPEED = Speed(prompt_s=1 / 50, output_s=1 / 5, samples=0)
#: The prompt's tokens besides the conversation (instructions, a few lines of the previous
#: summary, labels) before a call measured them.
UNKNOWN_OVERHEAD_TOKENS = 300


def _seconds(s: Sample) -> float:
    return s.seconds * TIMEOUT_FACTOR if s.timed_out else s.seconds


def fit_speed(
    samples: Sequence[Sample],
    ratio: float = OUTPUT_COST_RATIO,
    min_seconds: float = MIN_SAMPLE_S,
) -> Speed | None:
    """Both per-token costs from ``samples`` (``None`` without any). Least squares through the
    origin on both costs when the samples differ enough in shape and both come out positive;
    otherwise one cost with the output ``ratio`` times the prompt's. Samples under
    ``min_seconds`` (:data:`MIN_SAMPLE_S`) are not used."""
    usable = [
        s for s in samples if s.seconds >= min_seconds and (s.prompt_tokens or s.output_tokens)
    ]
    if not usable:
        return None
    pp = sum(s.prompt_tokens**2 for s in usable)
    oo = sum(s.output_tokens**2 for s in usable)
    po = sum(s.prompt_tokens * s.output_tokens for s in usable)
    pl = sum(s.prompt_tokens * _seconds(s) for s in usable)
    ol = sum(s.output_tokens * _seconds(s) for s in usable)
    det = pp * oo - po * po
    if len(usable) >= 2 and det > 1e-3 * pp * oo:
        a = (pl * oo - ol * po) / det
        b = (ol * pp - pl * po) / det
        if a > 0 and b > 0:
            return Speed(a, b, len(usable))
    weights = [s.prompt_tokens + ratio * s.output_tokens for s in usable]
    a = sum(w * _seconds(s) for w, s in zip(weights, usable, strict=True)) / sum(
        w * w for w in weights
    )
    return Speed(a, a * ratio, len(usable))


@dataclass(frozen=True)
class CallLimits:
    """The most conversation tokens one call may digest and the most tokens it may write."""

    batch_tokens: int
    max_tokens: int


def call_limits(
    speed: Speed | None,
    *,
    timeout_s: float,
    max_tokens: int,
    overhead_tokens: int,
    margin: float = MARGIN,
    typical_output: int | None = None,
) -> CallLimits | None:
    """What one call may take so that it ends within ``margin`` of ``timeout_s`` at ``speed``
    (``None`` when the speed is not known yet): the answer its ``max_tokens`` unless writing
    them would take more than :data:`OUTPUT_SHARE` of that time (then what fits in it), the
    prompt the rest. ``overhead_tokens``: the
    prompt's tokens besides the conversation (instructions, context, labels), from a previous
    call (the margin covers labels that grow with the batch).
    ``typical_output``: how long the model's answers were so far (the batch is sized for those,
    while the answer may still take all of its share)."""
    if speed is None:
        return None
    allowed = timeout_s * margin
    out = max_tokens
    if speed.output_s * max_tokens > allowed * OUTPUT_SHARE:
        out = max(min(max_tokens, MIN_ANSWER_TOKENS), int(allowed * OUTPUT_SHARE / speed.output_s))
    # The batch is sized for the answers the model writes (half as long again), the answer cut
    # at what fits: a call that writes all of ``out`` still ends within the timeout.
    expected = out if typical_output is None else min(out, int(typical_output * 1.5))
    left = allowed - speed.output_s * expected
    prompt = int(left / speed.prompt_s) if speed.prompt_s > 0 else 10**9
    batch = prompt - overhead_tokens
    return CallLimits(batch_tokens=max(MIN_BATCH_TOKENS, batch), max_tokens=out)


def busy_after_timeout(
    speed: Speed | None, *, prompt_tokens: int, max_tokens: int, timeout_s: float
) -> float:
    """Seconds the server is taken to go on with a request the client gave up on at
    ``timeout_s``: what the model still needed for it at ``speed`` (the whole answer written;
    a model of unknown speed: as long again as the timeout), at least a quarter and at most
    twice the timeout."""
    needed = speed.seconds(prompt_tokens, max_tokens) if speed is not None else 2 * timeout_s
    return min(2 * timeout_s, max(0.25 * timeout_s, needed - timeout_s))


def busy_factor(streak: int) -> float:
    """How much longer the server is taken to stay busy after the ``streak``-th call in a row
    given up on: 1, 2, 4 ... up to :data:`MAX_BUSY_FACTOR`."""
    return min(MAX_BUSY_FACTOR, 2.0 ** max(0, streak - 1))


def timeout_reason(timeout_s: float, speed: Speed | None) -> str:
    """The reason a timed-out call gives: how long it waited, the speed measured so far, and the
    setting to raise."""
    measured = ""
    if speed is not None:
        measured = (
            f" (the model reads {speed.prompt_tps:,.0f} and writes {speed.output_tps:,.1f} "
            "tokens/s: later calls are sized to fit)"
        )
    # One reason, no "; " in it: a run's reasons are joined with that.
    return (
        f"timed out after {timeout_s:.1f}s{measured}, raise summary_timeout_s "
        "([plugin.memory-summary] in the host config) for a slow model"
    )


class ModelBusy(RuntimeError):  # noqa: N818 - the summarizer's error names the class
    """A summarizer call that was not sent: the server is taken to be still busy with a call
    given up on, or the run already gave up on the model (the rules engine does the part)."""


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower()


class SpeedBook:
    """The newest samples per model, until when its server is busy with a call given up on, how
    many calls in a row were given up on, and which run's calls it takes while it is not known to
    answer in time (see :meth:`take_turn`). One per plugin: shared by every session."""

    def __init__(self, keep: int = KEEP, min_seconds: float = MIN_SAMPLE_S) -> None:
        self._samples: dict[str, deque[Sample]] = {}
        self._busy_until: dict[str, float] = {}
        #: Calls given up on in a row, per model (a call that ended resets it).
        self._streak: dict[str, int] = {}
        #: The run whose calls a model takes now (see :meth:`take_turn`), and what wakes the
        #: runs waiting for it.
        self._holders: dict[str, object] = {}
        self._released: dict[str, asyncio.Event] = {}
        self.keep = keep
        self.min_seconds = min_seconds

    def observe(self, model: str, sample: Sample) -> Speed | None:
        self._samples.setdefault(model, deque(maxlen=self.keep)).append(sample)
        if not sample.timed_out:
            self._streak.pop(model, None)
        return self.speed(model)

    def speed(self, model: str) -> Speed | None:
        return fit_speed(list(self._samples.get(model, ())), min_seconds=self.min_seconds)

    def timed_out(
        self, model: str, sample: Sample, max_tokens: int, now: float | None = None
    ) -> float:
        """Record a call abandoned after ``sample.seconds``; returns how long its server is taken
        to stay busy with it."""
        self._streak[model] = self._streak.get(model, 0) + 1
        return self._busy_after(model, sample, max_tokens, now)

    def _busy_after(
        self, model: str, sample: Sample, max_tokens: int, now: float | None = None
    ) -> float:
        """Record the timed-out ``sample``; the server is busy with it for what the model still
        needed, times :func:`busy_factor` of the calls given up on in a row (never less than
        what an earlier call given up on left)."""
        speed = self.observe(model, sample)
        busy = busy_after_timeout(
            speed,
            prompt_tokens=sample.prompt_tokens,
            max_tokens=max_tokens,
            timeout_s=sample.seconds,
        ) * busy_factor(self._streak.get(model, 1))
        self._busy(model, busy, now)
        return busy

    def _busy(self, model: str, seconds: float, now: float | None = None) -> None:
        until = (time.monotonic() if now is None else now) + seconds
        self._busy_until[model] = max(self._busy_until.get(model, 0.0), until)

    def abandoned(
        self,
        model: str,
        *,
        waited_s: float,
        prompt_tokens: int,
        max_tokens: int,
        now: float | None = None,
    ) -> float:
        """A call given up on after ``waited_s`` (its timeout, or a deadline or a cancellation
        that came first): the server is taken to be busy with it for what the model still needed
        (:func:`busy_after_timeout`, on the time it was given), times :func:`busy_factor`.
        Returns the seconds."""
        self._streak[model] = self._streak.get(model, 0) + 1
        busy = busy_after_timeout(
            self.speed(model),
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            timeout_s=waited_s,
        ) * busy_factor(self._streak[model])
        self._busy(model, busy, now)
        return busy

    def limits(self, model: str, *, timeout_s: float, max_tokens: int) -> CallLimits | None:
        """:func:`call_limits` for ``model``, the prompt's overhead (instructions, labels) taken
        from its newest completed call. Before any call to ``model``, its speed is taken to be
        :data:`UNKNOWN_SPEED` (the first call is small); ``None`` once its calls were all too
        quick to measure (a fast model: no limit)."""
        samples = self._samples.get(model, ())
        done = [s for s in samples if not s.timed_out]
        last = done[-1] if done else None
        overhead = (
            max(0, last.prompt_tokens - last.batch_tokens) if last else UNKNOWN_OVERHEAD_TOKENS
        )
        typical = max((s.output_tokens for s in done[-3:]), default=None)
        return call_limits(
            self.speed(model) if samples else UNKNOWN_SPEED,
            timeout_s=timeout_s,
            max_tokens=max_tokens,
            overhead_tokens=overhead,
            typical_output=typical,
        )

    def busy_for(self, model: str, now: float | None = None) -> float:
        """Seconds until the server is free of an abandoned call (0 when it is)."""
        until = self._busy_until.get(model, 0.0)
        return max(0.0, until - (time.monotonic() if now is None else now))

    # -- one run's calls at a time ---------------------------------------------------------------
    def proven(self, model: str) -> bool:
        """Whether ``model`` answers in time: some of its calls ended and none of its recent
        ones was given up on. Such a model takes calls from any number of runs at once."""
        samples = self._samples.get(model, ())
        return (
            bool(samples)
            and not any(s.timed_out for s in samples)
            and not self._streak.get(model)
            and self.busy_for(model) <= 0
        )

    def holder(self, model: str) -> object | None:
        return self._holders.get(model)

    async def take_turn(self, model: str, run: object, wait_s: float) -> bool:
        """Let ``run`` call ``model``: at once for a model that answers in time
        (:meth:`proven`); otherwise once no other run holds the model and its server is free of
        any call given up on, waiting at most ``wait_s`` seconds (not at all for a server busy
        past that). Whether ``run`` may call it; a turn taken is given back with
        :meth:`release_turn`."""
        end = time.monotonic() + wait_s
        while True:
            if self.proven(model) or self._holders.get(model) is run:
                return True
            busy = self.busy_for(model)
            if model not in self._holders and busy <= 0:
                self._holders[model] = run
                return True
            left = end - time.monotonic()
            if left <= 0 or busy > left:
                return False
            if model not in self._holders:
                await asyncio.sleep(busy)  # free then, unless another call is given up on
                continue
            released = self._released.setdefault(model, asyncio.Event())
            try:
                await asyncio.wait_for(released.wait(), left)
            except TimeoutError:
                return False

    def try_turn(self, model: str, run: object) -> bool:
        """:meth:`take_turn` without waiting."""
        if self.proven(model) or self._holders.get(model) is run:
            return True
        if model in self._holders or self.busy_for(model) > 0:
            return False
        self._holders[model] = run
        return True

    def release_turn(self, model: str, run: object) -> None:
        """``run`` is done calling ``model`` (nothing when it held no turn)."""
        if self._holders.get(model) is run:
            del self._holders[model]
            released = self._released.pop(model, None)
            if released is not None:
                released.set()

    def for_run(self, deadline: float | None = None) -> RunSpeed:
        """A view of this book for one compression run (see :class:`RunSpeed`)."""
        return RunSpeed(self, deadline=deadline)


class RunSpeed(SpeedBook):
    """One compression run's view of a :class:`SpeedBook`: the same samples and server state
    (every update goes to the book), and what the run did. Once the run gave up on the model
    (:attr:`gave_up`), or its deadline passed, a batch is no longer cut for the model's speed
    and nothing is waited for: the rules engine merges what is left."""

    def __init__(self, book: SpeedBook, *, deadline: float | None) -> None:
        self.book = book
        self.deadline = deadline
        #: Why the run stopped calling the model (``None`` while it has not).
        self.gave_up: str | None = None
        #: The run's call given up on whose timeout the summarizer is about to report: it is
        #: already counted (see :meth:`timed_out`).
        self.reported = False
        self.keep = book.keep
        self.min_seconds = book.min_seconds
        self._samples = book._samples
        self._busy_until = book._busy_until
        self._streak = book._streak
        self._holders = book._holders
        self._released = book._released

    def timed_out(
        self, model: str, sample: Sample, max_tokens: int, now: float | None = None
    ) -> float:
        if self.reported:  # SummarizerCalls counted this call when it was given up on
            self.reported = False
            return self._busy_after(model, sample, max_tokens, now)
        return super().timed_out(model, sample, max_tokens, now)

    def busy_for(self, model: str, now: float | None = None) -> float:
        if self.gave_up is not None:
            return 0.0  # no wait: the call is not sent (SummarizerCalls)
        return super().busy_for(model, now)

    def limits(self, model: str, *, timeout_s: float, max_tokens: int) -> CallLimits | None:
        if self.gave_up is not None or (
            self.deadline is not None and self.deadline - time.monotonic() <= 0.05
        ):
            return None  # the rules engine merges the rest: no call to size
        return super().limits(model, timeout_s=timeout_s, max_tokens=max_tokens)


#: The reasons a run stops calling the model.
GAVE_UP = "the summarizer's call was given up on: the rules engine merged the rest of the run"
BUSY = (
    "the summarizer was busy (with another compression's calls, or one given up on that its "
    "server still works on): the rules engine merged the part"
)


class SummarizerCalls:
    """The LLM service as one compression run calls it (any :class:`LLMService`): a call is sent
    only while the run may call the model (its turn, see :meth:`SpeedBook.take_turn`), its
    server is not busy with a call given up on, and the run did not give up on the model;
    otherwise it raises :class:`ModelBusy` at once. A call given up on (a timeout, or the
    run's deadline or cancellation that came first) is recorded in the book
    (:meth:`SpeedBook.abandoned`) and ends the run's use of the model."""

    def __init__(self, llm: LLMService, run: RunSpeed, count_tokens: Callable[[str], int]) -> None:
        self._llm = llm
        self.default_model = llm.default_model
        self.run = run
        self._count = count_tokens
        #: Calls not sent (:class:`ModelBusy`).
        self.refused = 0

    def context_window(self, model: str | None = None) -> int:
        return self._llm.context_window(model)

    def max_output_tokens(self, model: str | None = None) -> int:
        return self._llm.max_output_tokens(model)

    def count_tokens(
        self, messages_or_text: str | Sequence[Message | dict[str, Any]], model: str | None = None
    ) -> int:
        return self._llm.count_tokens(messages_or_text, model)

    def _refuse(self, why: str) -> ModelBusy:
        self.refused += 1
        if self.run.gave_up is None:
            self.run.gave_up = why
        return ModelBusy(self.run.gave_up)

    async def complete(
        self,
        messages: Sequence[Message | dict[str, Any]],
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion:
        name = model or self._llm.default_model or ""
        run, book = self.run, self.run.book
        if run.gave_up is not None:
            raise self._refuse(run.gave_up)
        if book.busy_for(name) > 0 or not book.try_turn(name, run):
            raise self._refuse(BUSY)
        started = time.monotonic()
        try:
            return await self._llm.complete(
                messages,
                model=model,
                max_tokens=max_tokens,
                temperature=temperature,
                timeout=timeout,
                tools=tools,
            )
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) or _is_timeout(exc):
                self._abandoned(name, messages, max_tokens, time.monotonic() - started)
            raise

    def _abandoned(
        self,
        model: str,
        messages: Sequence[Message | dict[str, Any]],
        max_tokens: int | None,
        waited: float,
    ) -> None:
        prompt = sum(
            self._count(text_of(m.content if isinstance(m, Message) else m.get("content")))
            for m in messages
        )
        self.run.book.abandoned(
            model,
            waited_s=waited,
            prompt_tokens=prompt,
            max_tokens=max_tokens or 0,
        )
        self.run.gave_up = GAVE_UP
        self.run.reported = True
