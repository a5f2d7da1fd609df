"""Fault injection for a fake LLM: one seeded :class:`FaultPlan`, and the failed answers it serves.

Faults (each a probability per call; what is left answers normally):

=========== =========================================================================
error       a provider error is raised (``RuntimeError`` / ``ConnectionError`` / ...)
timeout     ``TimeoutError`` at once
hang        no answer: blocks until the call's timeout, a cancellation or the test
empty       an empty or blank answer
garbage     not JSON, not prose (HTML, a JSON fragment, control characters)
wrong_types JSON whose fields have the wrong types
oversized   the normal answer (a JSON object) blown far over any budget
length      ``finish_reason="length"``: the normal answer cut off
slow        the normal answer, late
=========== =========================================================================

The answers are built by functions, so a fake server can serve the same plan over HTTP.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "CUT_MARK",
    "FAULT_KINDS",
    "LEAK_MARKERS",
    "FaultPlan",
    "FaultSampler",
    "cut_answer",
    "garbage_answer",
    "oversized_answer",
    "provider_error",
    "wrong_types_answer",
]

#: Every fault kind, in the order the plan draws them.
FAULT_KINDS = (
    "error",
    "timeout",
    "hang",
    "empty",
    "garbage",
    "wrong_types",
    "oversized",
    "length",
    "slow",
)


@dataclass(frozen=True)
class FaultPlan:
    """Per-call probabilities of each fault (their sum at most 1) and the seed of the draws."""

    error: float = 0.0
    timeout: float = 0.0
    hang: float = 0.0
    empty: float = 0.0
    garbage: float = 0.0
    wrong_types: float = 0.0
    oversized: float = 0.0
    length: float = 0.0
    slow: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        rates = [getattr(self, k) for k in FAULT_KINDS]
        if any(r < 0 or r > 1 for r in rates):
            raise ValueError(f"fault rates must be within [0, 1]: {self}")
        if sum(rates) > 1 + 1e-9:
            raise ValueError(f"fault rates add up to {sum(rates):.3f} > 1: {self}")

    def draw(self, rng: random.Random) -> str:
        """One call's fate: a fault kind, or ``"ok"``."""
        x = rng.random()
        for kind in FAULT_KINDS:
            x -= getattr(self, kind)
            if x < 0:
                return kind
        return "ok"

    def sampler(self) -> FaultSampler:
        return FaultSampler(self)

    def describe(self) -> str:
        parts = [
            f"{f.name}={getattr(self, f.name):g}"
            for f in fields(self)
            if f.name != "seed" and getattr(self, f.name)
        ]
        parts.append(f"seed={self.seed}")
        return ", ".join(parts) or "no faults"


class FaultSampler:
    """A seeded, thread-safe source of fault kinds (a fake server draws from handler threads),
    with a queue of kinds the test forces on the next calls and a count of what was served."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.forced: deque[str] = deque()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def force(self, *kinds: str) -> None:
        for kind in kinds:
            if kind not in FAULT_KINDS and kind != "ok":
                raise ValueError(f"unknown fault kind {kind!r}")
        with self._lock:
            self.forced.extend(kinds)

    def next(self) -> tuple[str, random.Random]:
        """The next call's kind, and a random source for its details (derived from the main one,
        so the details do not shift the sequence of kinds)."""
        with self._lock:
            kind = self.forced.popleft() if self.forced else self.plan.draw(self.rng)
            detail = random.Random(self.rng.getrandbits(64))
            self.counts[kind] += 1
        return kind, detail


def garbage_answer(rng: random.Random) -> str:
    """Not JSON, not prose."""
    return rng.choice(
        [
            "<html><body>502 Bad Gateway</body></html>",
            '{"summary": "unterminated',
            "}}}{{{ :::: ]]]",
            "\x00\x01\x02\x7f\x1b[31m\x1b[0m",
            "null",
            "[1, 2, 3]",
            "<!DOCTYPE html><title>Error</title>",
            '```json\n{"summ',
            "�" * 40,
        ]
    )


def wrong_types_answer(rng: random.Random) -> str:
    """A JSON object whose fields have the wrong types."""
    return json.dumps(
        rng.choice(
            [
                {"summary": 12345, "stable_facts": "not a list", "identifiers": {"a": 1}},
                {"summary": ["a", "list", "of", "words"], "timeline": 7, "decisions": None},
                {"summary": None, "conversation_goal": 3.5, "in_progress_tasks": [1, None]},
                {"summary": {"nested": "object"}, "user_profile": [[["deep"]]], "identifiers": 9},
                {"summary": True, "open_questions": {"q": "?"}, "retrieval_hints": False},
                {"summary": "valid prose summary text", "stable_facts": [{"x": 1}, 2, None]},
            ]
        )
    )


def _object(answer: str) -> dict[str, Any]:
    try:
        value = json.loads(answer)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def oversized_answer(answer: str, rng: random.Random) -> str:
    """``answer`` (its fields, when it is a JSON object) blown far over any budget."""
    base = _object(answer)
    filler = " ".join(f"word{i}" for i in range(rng.randint(8_000, 12_000)))
    return json.dumps(
        {
            **base,
            "summary": f"{base.get('summary', 'summary')} {filler}",
            "stable_facts": [f"fact {i} " + "x" * 300 for i in range(400)],
            "identifiers": [*base.get("identifiers", []), *(f"ID{i:06d}" for i in range(800))],
            "timeline": [{"when": f"t{i}", "event": "e" * 200} for i in range(300)],
        }
    )


#: Ends the unfinished part of every cut-off (``length``) answer: a consumer may keep the
#: complete items of such an answer, so a stored mark means an unfinished item was stored.
CUT_MARK = "CUT-OFF-ANSWER"

#: Pieces of the failed answers and error messages served here (a JSON dump of anything stored
#: must contain none of them: no error text and no unusable answer is ever stored).
LEAK_MARKERS = (
    "provider error",
    "onnection reset",
    "rate limited",
    "invalid response",
    "simulated",
    "Bad Gateway",
    "<html>",
    "DOCTYPE",
    "unterminated",
    "}}}{{{",
    "\\u0000",  # a control character, as JSON escapes it
    CUT_MARK,
)


def cut_answer(answer: str, rng: random.Random) -> str:
    """``answer`` as a model cut off at the length limit would send it: usually cut short, its
    unfinished end marked with :data:`CUT_MARK` (sometimes whole: the finish reason alone says it
    was cut)."""
    if rng.random() < 0.3:
        return answer
    return answer[: max(1, int(len(answer) * rng.uniform(0.2, 0.9)))] + CUT_MARK


_ERRORS: tuple[Callable[[], BaseException], ...] = (
    lambda: RuntimeError("provider error 500: internal error"),
    lambda: ConnectionError("connection reset by peer"),
    lambda: ValueError("provider returned an invalid response"),
    lambda: OSError(104, "Connection reset"),
    lambda: RuntimeError("rate limited (429): try again later"),
)


def provider_error(rng: random.Random) -> BaseException:
    """One of the errors a provider client raises."""
    return rng.choice(_ERRORS)()
