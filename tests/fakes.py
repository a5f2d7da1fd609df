"""Test doubles at the edge: a scripted LLM service (the model's answer is the only fake)."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from host_stub.messages import Message
from host_stub.services import Completion, LLMUsage

Reply = str | Completion | BaseException | Callable[[list[dict[str, Any]]], Any]


def simple_count(text: str) -> int:
    return len(text) // 4 + 1


def count_simple(messages_or_text: Any) -> int:
    """The doubles' token count for a text or a list of messages: cheap and deterministic."""
    if isinstance(messages_or_text, str):
        return simple_count(messages_or_text)
    total = 0
    for m in messages_or_text:
        data = m.to_openai() if isinstance(m, Message) else m
        total += 4 + simple_count(json.dumps(data.get("content"), ensure_ascii=False))
        if data.get("tool_calls"):
            total += simple_count(json.dumps(data["tool_calls"]))
    return total


class ScriptedLLM:
    """An LLMService whose answers come from a queue (``enqueue``) or a ``default`` callable; it
    records every call. Token counts are a cheap deterministic estimate."""

    def __init__(
        self,
        default_model: str | None = "fake/summarizer",
        default: Reply | None = None,
        context_window: int = 8000,
        max_output: int = 4096,
        delay: float = 0.0,
    ) -> None:
        self.default_model = default_model
        self.default = default
        self.window = context_window
        self.max_output = max_output
        self.delay = delay
        self.queue: deque[Reply] = deque()
        self.calls: list[dict[str, Any]] = []

    def enqueue(self, *replies: Reply) -> None:
        self.queue.extend(replies)

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
        self.calls.append(
            {
                "messages": sent,
                "model": model,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "tools": tools,
            }
        )
        if self.delay:
            await asyncio.sleep(self.delay)
        reply = self.queue.popleft() if self.queue else self.default
        if callable(reply) and not isinstance(reply, type):
            reply = reply(sent)
            if asyncio.iscoroutine(reply):
                reply = await reply
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Completion):
            return reply
        text = "ok" if reply is None else str(reply)
        return Completion(
            text=text,
            finish_reason="stop",
            usage=LLMUsage(
                prompt_tokens=self.count_tokens(sent), completion_tokens=simple_count(text)
            ),
            model=model or "",
            cost=0.0001,
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
        return count_simple(messages_or_text)
