"""Fault injection for the summarizer: one seeded :class:`FaultPlan`, two ways to serve it.

* :class:`FaultyLLM`: an ``LLMService`` double. Per call it draws a fault from the plan (or takes
  one forced by the test with :meth:`FaultyLLM.force`) and raises or answers accordingly;
  otherwise it answers a valid JSON summary built from the request's transcript. Nothing here
  sleeps for long: a hanging call blocks on an :class:`asyncio.Future` until the call's own
  ``timeout`` passes (as a real client would time out), until it is cancelled (the plugin's outer
  guard), or until the test fires it (:meth:`FaultyLLM.fire_hangs`); a slow reply completes after
  a tiny delay, or, with ``hold_slow=True``, when the test resolves it
  (:meth:`FaultyLLM.resolve_slow`).
* :func:`openai_replies`: the same plan as a reply callable for
  :class:`fake_openai.FakeOpenAIServer`, so the real litellm HTTP path sees the same faults.

Faults (each a probability per call; what is left answers normally):

========== =========================================================================
error      a provider error is raised (``RuntimeError`` / ``ConnectionError`` / ...;
           the server answers HTTP 500/429/503/400)
timeout    ``TimeoutError`` at once (the server hangs past the client's timeout)
hang       no answer: blocks until the call's timeout, a cancellation or the test
empty      an empty or blank answer
garbage    not JSON, not prose (HTML, a JSON fragment, control characters)
wrong_types JSON whose fields have the wrong types (the server: also a malformed body)
oversized  a valid JSON summary far over any budget
length     ``finish_reason="length"``: a cut-off answer (its unfinished end marked)
slow       a valid answer, late
========== =========================================================================
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from fake_openai import Reply
from fakes import count_simple, simple_count

from host_stub.messages import Message
from host_stub.services import Completion, LLMUsage

__all__ = [
    "CUT_MARK",
    "FAULT_KINDS",
    "LEAK_MARKERS",
    "FaultPlan",
    "FaultSampler",
    "FaultyLLM",
    "openai_replies",
    "summary_from_messages",
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
    """A seeded, thread-safe source of fault kinds (the fake server draws from handler threads),
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


# -- answers ----------------------------------------------------------------------------------------

_TRANSCRIPT = re.compile(r"<transcript>\n(.*)\n</transcript>", re.S)
_IDENTIFIER = re.compile(r"\[[A-Z]\d+T\d+\]|\b[A-Z0-9]{6}\b|\b[a-z]+_[a-z]+_\d{3,5}\b")


def _transcript(messages: Sequence[dict[str, Any]]) -> str | None:
    for m in reversed(messages):
        content = m.get("content")
        if isinstance(content, str):
            match = _TRANSCRIPT.search(content)
            if match is not None:
                return match.group(1)
    return None


def summary_from_messages(messages: Sequence[dict[str, Any]]) -> str:
    """A valid JSON summary built from a summarizer request: how many transcript lines it saw,
    its last line, and the identifier-looking tokens in it (so the identifier gate passes)."""
    transcript = _transcript(messages)
    if transcript is None:  # not a summarizer request (a chat call): a plain answer
        return "ok"
    lines = [line for line in transcript.splitlines() if line.strip()]
    last = lines[-1][:120] if lines else ""
    identifiers = sorted(set(_IDENTIFIER.findall(transcript)))
    previous = re.findall(r'"identifiers":\s*\[([^\]]*)\]', messages[-1].get("content") or "")
    carried = (
        [x.strip().strip('"') for x in previous[0].split(",") if x.strip()] if previous else []
    )
    return json.dumps(
        {
            "summary": f"{len(lines)} transcript lines summarized; the last: {last}",
            "conversation_goal": "soak-tested conversation",
            "stable_facts": [line[:70] for line in lines[-3:]],
            "decisions": [],
            "identifiers": list(dict.fromkeys([*carried, *identifiers]))[:30],
        }
    )


def _garbage(rng: random.Random) -> str:
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


def _wrong_types(rng: random.Random) -> str:
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


def _oversized(messages: Sequence[dict[str, Any]], rng: random.Random) -> str:
    base = json.loads(summary_from_messages(messages)) if _transcript(messages) else {}
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


#: Ends the unfinished part of every cut-off (``length``) answer, so a test can tell if an
#: unfinished item was ever stored.
CUT_MARK = "CUT-OFF-ANSWER"

#: Pieces of the failed answers and error messages served here (a JSON dump of a stored summary
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


def _cut(messages: Sequence[dict[str, Any]], rng: random.Random) -> str:
    """An answer cut off at the length limit. Its complete items may be kept; what the cut left
    unfinished ends with ``CUT_MARK``, so a stored mark means an unfinished item was stored."""
    whole = summary_from_messages(messages)
    if rng.random() < 0.3:
        return whole  # looks whole, but the finish reason says it was cut
    return whole[: max(1, int(len(whole) * rng.uniform(0.2, 0.9)))] + CUT_MARK


_ERRORS: tuple[Callable[[], BaseException], ...] = (
    lambda: RuntimeError("provider error 500: internal error"),
    lambda: ConnectionError("connection reset by peer"),
    lambda: ValueError("provider returned an invalid response"),
    lambda: OSError(104, "Connection reset"),
    lambda: RuntimeError("rate limited (429): try again later"),
)


def _discard(futures: list[asyncio.Future[None]], fut: asyncio.Future[None]) -> None:
    if fut in futures:
        futures.remove(fut)


# -- the LLM service double --------------------------------------------------------------------------


class FaultyLLM:
    """An ``LLMService`` whose ``complete`` fails as a :class:`FaultPlan` says.

    ``hold_slow``: slow replies wait until :meth:`resolve_slow` (or the call's timeout, or a
    cancellation) instead of ``slow_delay`` seconds. ``deaf_hangs``: hanging calls ignore the
    ``timeout`` argument and wait to be cancelled (the caller's own guard) or fired. Token counts
    and windows are the same cheap estimates as :class:`fakes.ScriptedLLM`."""

    def __init__(
        self,
        plan: FaultPlan,
        *,
        default_model: str | None = "fake/summarizer",
        context_window: int = 8000,
        max_output: int = 4096,
        slow_delay: float = 0.002,
        hold_slow: bool = False,
        deaf_hangs: bool = False,
    ) -> None:
        self.plan = plan
        self.sampler = plan.sampler()
        self.default_model = default_model
        self.window = context_window
        self.max_output = max_output
        self.slow_delay = slow_delay
        self.hold_slow = hold_slow
        self.deaf_hangs = deaf_hangs
        self.calls = 0
        #: (kind, how the call ended: "raised" / "answered" / "cancelled") -> calls.
        self.outcomes: Counter[tuple[str, str]] = Counter()
        #: Calls waiting now: slow replies held for :meth:`resolve_slow`, hanging calls.
        self.waiting_slow: list[asyncio.Future[None]] = []
        self.hanging: list[asyncio.Future[None]] = []
        self.in_flight = 0

    @property
    def counts(self) -> Counter[str]:
        return self.sampler.counts

    def force(self, *kinds: str) -> None:
        """The next calls get these kinds (in order), whatever the plan draws."""
        self.sampler.force(*kinds)

    def resolve_slow(self, n: int | None = None) -> int:
        """Let held slow replies answer (the oldest ``n``, or all); returns how many."""
        done = 0
        while self.waiting_slow and (n is None or done < n):
            fut = self.waiting_slow.pop(0)
            if not fut.done():
                fut.set_result(None)
                done += 1
        return done

    def fire_hangs(self) -> int:
        """Time out every hanging call now (as its deadline would); returns how many."""
        fired = 0
        for fut in self.hanging:
            if not fut.done():
                fut.set_exception(TimeoutError("simulated: no answer before the timeout"))
                fired += 1
        self.hanging.clear()
        return fired

    async def _wait(self, fut: asyncio.Future[None], timeout: float | None, honor: bool) -> None:
        if honor and timeout is not None:
            await asyncio.wait_for(fut, timeout)  # TimeoutError when the call's timeout passes
        else:
            await fut

    async def complete(
        self,
        messages: Sequence[Message | dict[str, Any]],
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion:
        sent = [m.to_openai() if isinstance(m, Message) else dict(m) for m in messages]
        kind, rng = self.sampler.next()
        self.calls += 1
        self.in_flight += 1
        try:
            completion = await self._answer(kind, rng, sent, model, timeout)
        except asyncio.CancelledError:
            self.outcomes[(kind, "cancelled")] += 1
            raise
        except BaseException:
            self.outcomes[(kind, "raised")] += 1
            raise
        finally:
            self.in_flight -= 1
        self.outcomes[(kind, "answered")] += 1
        return completion

    async def _answer(
        self,
        kind: str,
        rng: random.Random,
        sent: list[dict[str, Any]],
        model: str | None,
        timeout: float | None,
    ) -> Completion:
        loop = asyncio.get_running_loop()
        finish = "stop"
        if kind == "error":
            raise rng.choice(_ERRORS)()
        if kind == "timeout":
            raise TimeoutError("simulated provider timeout")
        if kind == "hang":
            fut: asyncio.Future[None] = loop.create_future()
            self.hanging.append(fut)
            try:
                await self._wait(fut, timeout, honor=not self.deaf_hangs)
            finally:
                _discard(self.hanging, fut)
            raise AssertionError("a hanging call was resolved")  # pragma: no cover
        if kind == "slow":
            if self.hold_slow:
                fut = loop.create_future()
                self.waiting_slow.append(fut)
                try:
                    await self._wait(fut, timeout, honor=True)
                finally:
                    _discard(self.waiting_slow, fut)
            else:
                await asyncio.sleep(self.slow_delay * rng.uniform(0.5, 1.5))
            text = summary_from_messages(sent)
        elif kind == "empty":
            text = rng.choice(["", " ", "\n\n", "\t "])
        elif kind == "garbage":
            text = _garbage(rng)
        elif kind == "wrong_types":
            text = _wrong_types(rng)
        elif kind == "oversized":
            text = _oversized(sent, rng)
        elif kind == "length":
            text, finish = _cut(sent, rng), "length"
        else:
            text = summary_from_messages(sent)
        return Completion(
            text=text,
            finish_reason=finish,
            usage=LLMUsage(
                prompt_tokens=self.count_tokens(sent), completion_tokens=simple_count(text)
            ),
            model=model or "",
            cost=0.0001,
        )

    def context_window(self, model: str | None = None) -> int:
        return self.window

    def max_output_tokens(self, model: str | None = None) -> int:
        return self.max_output

    def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
        return count_simple(messages_or_text)


# -- the same plan for the fake OpenAI-compatible server -------------------------------------------


def openai_replies(
    plan: FaultPlan | FaultSampler, *, timeout_s: float = 1.0
) -> Callable[[Any], Reply]:
    """A reply callable for :class:`FakeOpenAIServer` (``server.default_reply = ...``) drawing
    from ``plan``. ``timeout_s`` is the client's timeout: a ``timeout`` reply hangs a little past
    it, a ``hang`` reply four times as long (bounded, so no handler thread outlives the test by
    much; the server's ``stop()`` wakes them anyway). ``sampler.counts`` tells what was served."""
    sampler = plan if isinstance(plan, FaultSampler) else plan.sampler()

    def reply(body: Any) -> Reply:
        kind, rng = sampler.next()
        messages = body.get("messages", []) if isinstance(body, dict) else []
        if kind == "error":
            status = rng.choice([500, 502, 503, 429, 400])
            return Reply.error(status, f"simulated provider error {status}")
        if kind == "timeout":
            return Reply.hang(timeout_s + 0.5)
        if kind == "hang":
            return Reply.hang(timeout_s * 4)
        if kind == "empty":
            return Reply.empty()
        if kind == "garbage":
            return Reply.garbage(_garbage(rng).encode("utf-8", "replace"))
        if kind == "wrong_types":
            if rng.random() < 0.5:
                return Reply.text(_wrong_types(rng))
            return Reply.raw(
                rng.choice(
                    [
                        {"choices": "not a list"},
                        {"choices": [{"message": {"role": "assistant", "content": 123}}]},
                        {"choices": [], "usage": "none"},
                        {"object": "chat.completion", "choices": [{"index": 0}]},
                    ]
                )
            )
        if kind == "oversized":
            return Reply.text(_oversized(messages, rng))
        if kind == "length":
            return Reply.length(_cut(messages, rng))
        # ok and slow (the server has no cheap notion of "slow": it answers at once)
        return Reply.text(summary_from_messages(messages))

    reply.sampler = sampler  # type: ignore[attr-defined]
    return reply
