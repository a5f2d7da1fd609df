"""The fake LLM service: scripted, per-model or default answers, a delay, faults, call stats."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..messages import Message
from ..services import Completion, LLMUsage
from .faults import (
    FaultPlan,
    cut_answer,
    garbage_answer,
    oversized_answer,
    provider_error,
    wrong_types_answer,
)

__all__ = ["CallStats", "FakeLLM", "Reply", "count_simple", "message_tokens", "simple_count"]

#: What a fake call answers: a text, a whole completion, an exception to raise, or a callable of
#: the request's messages (OpenAI format) returning any of these (or awaitable).
Reply = str | Completion | BaseException | Callable[[list[dict[str, Any]]], Any]


# -- token estimates -----------------------------------------------------------------------------
def simple_count(text: str) -> int:
    """A text's tokens, estimated: one per four characters, plus one."""
    return len(text) // 4 + 1


def count_simple(messages_or_text: Any) -> int:
    """The fakes' token count for a text or a list of messages: cheap and deterministic."""
    if isinstance(messages_or_text, str):
        return simple_count(messages_or_text)
    total = 0
    for m in messages_or_text:
        data = m.to_openai() if isinstance(m, Message) else m
        total += 4 + simple_count(json.dumps(data.get("content"), ensure_ascii=False))
        if data.get("tool_calls"):
            total += simple_count(json.dumps(data["tool_calls"]))
    return total


def message_tokens(message: Message) -> int:
    """A stored message's tokens, estimated (the token counter of a test's store)."""
    tokens = 4 + simple_count(json.dumps(message.content, ensure_ascii=False))
    if message.tool_calls:
        tokens += simple_count(json.dumps([c.model_dump() for c in message.tool_calls]))
    return tokens


def _discard(futures: list[asyncio.Future[None]], fut: asyncio.Future[None]) -> None:
    if fut in futures:
        futures.remove(fut)


# -- the LLM service double ----------------------------------------------------------------------
@dataclass
class CallStats:
    """The calls one model received."""

    calls: int = 0
    input_tokens: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    durations: list[float] = field(default_factory=list)


class FakeLLM:
    """An ``LLMService`` double (see the module's docstring).

    A call answers, in this order of precedence: the oldest reply queued with :meth:`enqueue`,
    the reply of ``replies`` for the call's model (its ``model``, else ``default_model``), then
    ``default`` (``"ok"`` when unset). With ``faults``, each call first draws its fate; a fault
    that needs no answer (an error, a timeout, a hang, an empty, garbage or wrongly typed answer)
    takes no reply. ``hold_slow``: slow replies wait until :meth:`resolve_slow` (or the call's
    timeout, or a cancellation) instead of ``slow_delay`` seconds. ``deaf_hangs``: hanging calls
    ignore the ``timeout`` argument and wait to be cancelled or fired. ``count`` counts the
    tokens of a text or of a list of messages (default: :func:`count_simple`)."""

    def __init__(
        self,
        default: Reply | None = None,
        *,
        default_model: str | None = "fake/summarizer",
        context_window: int = 8000,
        max_output: int = 4096,
        delay: float = 0.0,
        replies: dict[str, Reply] | None = None,
        faults: FaultPlan | None = None,
        slow_delay: float = 0.002,
        hold_slow: bool = False,
        deaf_hangs: bool = False,
        count: Callable[[Any], int] | None = None,
        cost: float = 0.0001,
        keep_calls: bool = True,
    ) -> None:
        self.default = default
        self.default_model = default_model
        self.window = context_window
        self.max_output = max_output
        self.delay = delay
        self.replies = dict(replies or {})
        self.plan = faults
        self.sampler = faults.sampler() if faults is not None else None
        self.slow_delay = slow_delay
        self.hold_slow = hold_slow
        self.deaf_hangs = deaf_hangs
        self.count = count or count_simple
        self.cost = cost
        self.queue: deque[Reply] = deque()
        #: Every call: its messages (OpenAI format), model, max_tokens, temperature and tools;
        #: none with ``keep_calls=False`` (a long benchmark would keep every prompt it sent).
        self.calls: list[dict[str, Any]] = []
        self.keep_calls = keep_calls
        #: Per model (the call's, else the default one).
        self.stats: defaultdict[str, CallStats] = defaultdict(CallStats)
        #: (kind, how the call ended: "raised" / "answered" / "cancelled") -> calls.
        self.outcomes: Counter[tuple[str, str]] = Counter()
        #: Calls waiting now: slow replies held for :meth:`resolve_slow`, hanging calls.
        self.waiting_slow: list[asyncio.Future[None]] = []
        self.hanging: list[asyncio.Future[None]] = []
        self.in_flight = 0

    # -- steering ----------------------------------------------------------------------------
    def enqueue(self, *replies: Reply) -> None:
        """The next calls answer these, in order."""
        self.queue.extend(replies)

    @property
    def counts(self) -> Counter[str]:
        """Fault kinds served so far (``ok`` included), with a fault plan."""
        return self.sampler.counts if self.sampler is not None else Counter()

    def force(self, *kinds: str) -> None:
        """The next calls get these fault kinds (in order), whatever the plan draws."""
        if self.sampler is None:
            self.plan = FaultPlan()
            self.sampler = self.plan.sampler()
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

    # -- the service ---------------------------------------------------------------------------
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
        if self.keep_calls:
            self.calls.append(
                {
                    "messages": sent,
                    "model": model,
                    "max_tokens": max_tokens,
                    "temperature": temperature,
                    "tools": tools,
                }
            )
        stats = self.stats[model or self.default_model or ""]
        prompt_tokens = self.count_tokens(sent)
        stats.calls += 1
        stats.input_tokens += prompt_tokens
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        kind, rng = self.sampler.next() if self.sampler is not None else ("ok", None)
        self.in_flight += 1
        started = time.perf_counter()
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            completion = await self._answer(kind, rng, sent, model, timeout, prompt_tokens)
        except asyncio.CancelledError:
            self.outcomes[(kind, "cancelled")] += 1
            raise
        except BaseException:
            self.outcomes[(kind, "raised")] += 1
            raise
        finally:
            self.in_flight -= 1
            stats.in_flight -= 1
            stats.durations.append(time.perf_counter() - started)
        self.outcomes[(kind, "answered")] += 1
        return completion

    async def _reply(self, sent: list[dict[str, Any]], model: str | None) -> str | Completion:
        """The normal answer to a call (raises the reply that is an exception)."""
        reply: Reply | None
        if self.queue:
            reply = self.queue.popleft()
        else:
            reply = self.replies.get(model or self.default_model or "", self.default)
        if callable(reply) and not isinstance(reply, type):
            reply = reply(sent)
            if asyncio.iscoroutine(reply):
                reply = await reply
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Completion):
            return reply
        return "ok" if reply is None else str(reply)

    async def _text(self, sent: list[dict[str, Any]], model: str | None) -> str:
        reply = await self._reply(sent, model)
        return reply.text if isinstance(reply, Completion) else reply

    async def _wait(self, fut: asyncio.Future[None], timeout: float | None, honor: bool) -> None:
        if honor and timeout is not None:
            await asyncio.wait_for(fut, timeout)  # TimeoutError when the call's timeout passes
        else:
            await fut

    async def _answer(
        self,
        kind: str,
        rng: random.Random | None,
        sent: list[dict[str, Any]],
        model: str | None,
        timeout: float | None,
        prompt_tokens: int,
    ) -> Completion:
        loop = asyncio.get_running_loop()
        finish = "stop"
        text: str | Completion
        if rng is None or kind == "ok":
            text = await self._reply(sent, model)
        elif kind == "error":
            raise provider_error(rng)
        elif kind == "timeout":
            raise TimeoutError("simulated provider timeout")
        elif kind == "hang":
            fut: asyncio.Future[None] = loop.create_future()
            self.hanging.append(fut)
            try:
                await self._wait(fut, timeout, honor=not self.deaf_hangs)
            finally:
                _discard(self.hanging, fut)
            raise AssertionError("a hanging call was resolved")  # pragma: no cover
        elif kind == "slow":
            if self.hold_slow:
                fut = loop.create_future()
                self.waiting_slow.append(fut)
                try:
                    await self._wait(fut, timeout, honor=True)
                finally:
                    _discard(self.waiting_slow, fut)
            else:
                await asyncio.sleep(self.slow_delay * rng.uniform(0.5, 1.5))
            text = await self._reply(sent, model)
        elif kind == "empty":
            text = rng.choice(["", " ", "\n\n", "\t "])
        elif kind == "garbage":
            text = garbage_answer(rng)
        elif kind == "wrong_types":
            text = wrong_types_answer(rng)
        elif kind == "oversized":
            text = oversized_answer(await self._text(sent, model), rng)
        else:  # length
            text, finish = cut_answer(await self._text(sent, model), rng), "length"
        if isinstance(text, Completion):
            return text
        return Completion(
            text=text,
            finish_reason=finish,
            usage=LLMUsage(prompt_tokens=prompt_tokens, completion_tokens=self.count_tokens(text)),
            model=model or "",
            cost=self.cost,
        )

    async def stream(self, messages: Sequence[Any], **kwargs: Any) -> Any:
        completion = await self.complete(messages, **kwargs)
        for i in range(0, len(completion.text), 4):
            yield completion.text[i : i + 4]
        yield completion

    def context_window(self, model: str | None = None) -> int:
        return self.window

    def max_output_tokens(self, model: str | None = None) -> int:
        return self.max_output

    def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
        return self.count(messages_or_text)
