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
client gave up, is taken to be busy with it for the time the model says it still needed.

Everything here is pure; :class:`SpeedBook` holds the samples per model.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "UNKNOWN_OVERHEAD_TOKENS",
    "UNKNOWN_SPEED",
    "CallLimits",
    "Sample",
    "Speed",
    "SpeedBook",
    "busy_after_timeout",
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
    ``timeout_s``: what the model still needed for it at ``speed`` (the whole answer written),
    at least a quarter and at most twice the timeout."""
    needed = speed.seconds(prompt_tokens, max_tokens) if speed is not None else timeout_s
    return min(2 * timeout_s, max(0.25 * timeout_s, needed - timeout_s))


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


class SpeedBook:
    """The newest samples per model, and until when its server is busy with an abandoned call."""

    def __init__(self, keep: int = KEEP, min_seconds: float = MIN_SAMPLE_S) -> None:
        self._samples: dict[str, deque[Sample]] = {}
        self._busy_until: dict[str, float] = {}
        self.keep = keep
        self.min_seconds = min_seconds

    def observe(self, model: str, sample: Sample) -> Speed | None:
        self._samples.setdefault(model, deque(maxlen=self.keep)).append(sample)
        return self.speed(model)

    def speed(self, model: str) -> Speed | None:
        return fit_speed(list(self._samples.get(model, ())), min_seconds=self.min_seconds)

    def timed_out(
        self, model: str, sample: Sample, max_tokens: int, now: float | None = None
    ) -> float:
        """Record a call abandoned after ``sample.seconds``; returns how long its server is taken
        to stay busy with it."""
        speed = self.observe(model, sample)
        busy = busy_after_timeout(
            speed,
            prompt_tokens=sample.prompt_tokens,
            max_tokens=max_tokens,
            timeout_s=sample.seconds,
        )
        self._busy_until[model] = (time.monotonic() if now is None else now) + busy
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
