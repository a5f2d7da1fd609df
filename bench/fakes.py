"""The fake LLM every system is benchmarked with: instant or with a fixed latency, deterministic,
and the same summary size for our plugin and the peers.

No provider is reachable here, so a summarizer's *quality* is not measured with it: it answers
with an extractive stand-in (the newest lines of what it was sent, about ``SUMMARY_CHARS``
characters, ~300 tokens). What it measures is what the systems around it decide: when they
call it, how much they send it, what they put into the next prompt.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from common import TokenCounter

from host_stub.messages import Message
from host_stub.services import Completion, LLMUsage

#: Size of every fake summary (characters); ~300 tokens of English.
SUMMARY_CHARS = 1200
SUMMARIZER_MODEL = "bench/summarizer"
CHAT_MODEL = "bench/chat"

_TRANSCRIPT = re.compile(r"<transcript>\n?(.*?)\n?</transcript>", re.S)
_IDENT = re.compile(r"\b(?=[A-Za-z0-9_\-]*\d)[A-Za-z0-9_\-]{5,}\b")


def fake_summary_text(sent_text: str, chars: int = SUMMARY_CHARS) -> str:
    """The newest lines of what the summarizer was sent, up to ``chars`` characters."""
    lines = [line.strip() for line in sent_text.splitlines() if line.strip()]
    out: list[str] = []
    size = 0
    for line in reversed(lines):
        if size + len(line) + 1 > chars:
            if not out:
                out.append(line[-chars:])
            break
        out.append(line)
        size += len(line) + 1
    text = " ".join(reversed(out))
    return text or "Nothing to summarize yet."


def fake_summary_json(sent_text: str) -> str:
    """The plugin's structured answer built from the same extractive text."""
    match = _TRANSCRIPT.search(sent_text)
    body = match.group(1) if match else sent_text
    text = fake_summary_text(body)
    return json.dumps(
        {
            "summary": text,
            "conversation_goal": "continue the conversation",
            "identifiers": sorted(set(_IDENT.findall(body)))[:10],
        }
    )


@dataclass
class CallLog:
    calls: int = 0
    input_tokens: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    durations: list[float] = field(default_factory=list)


class BenchLLM:
    """An :class:`~host_stub.services.LLMService` double. Calls for ``SUMMARIZER_MODEL`` get a
    JSON summary, any other model a short chat reply. ``latency`` seconds per call (asyncio
    sleep). Token counts come from :class:`common.TokenCounter` (cl100k_base)."""

    def __init__(
        self,
        *,
        counter: TokenCounter | None = None,
        latency: float = 0.0,
        default_model: str | None = SUMMARIZER_MODEL,
        window: int = 128_000,
        max_output: int = 4096,
        reply_words: int = 30,
    ) -> None:
        self.counter = counter or TokenCounter()
        self.latency = latency
        self.default_model = default_model
        self.window = window
        self.max_output = max_output
        self.reply_words = reply_words
        self.summarizer = CallLog()
        self.chat = CallLog()

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
        prompt_tokens = self.counter.messages(sent)
        is_summary = (model or self.default_model) == SUMMARIZER_MODEL
        log = self.summarizer if is_summary else self.chat
        log.calls += 1
        log.input_tokens += prompt_tokens
        log.in_flight += 1
        log.max_in_flight = max(log.max_in_flight, log.in_flight)
        start = time.perf_counter()
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
        finally:
            log.in_flight -= 1
            log.durations.append(time.perf_counter() - start)
        if is_summary:
            text = fake_summary_json(str(sent[-1].get("content") or ""))
        else:
            n = log.calls
            text = f"Reply {n}: " + " ".join(
                f"word{(n * 7 + i) % 97}" for i in range(self.reply_words)
            )
        return Completion(
            text=text,
            finish_reason="stop",
            usage=LLMUsage(prompt_tokens=prompt_tokens, completion_tokens=self.counter.text(text)),
            model=model or "",
            cost=0.0,
        )

    def context_window(self, model: str | None = None) -> int:
        return self.window

    def max_output_tokens(self, model: str | None = None) -> int:
        return self.max_output

    def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
        if isinstance(messages_or_text, str):
            return self.counter.text(messages_or_text) if messages_or_text else 0
        wire = [m.to_openai() if isinstance(m, Message) else dict(m) for m in messages_or_text]
        return self.counter.messages(wire)
