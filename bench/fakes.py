"""The fake LLM every system is benchmarked with (:func:`bench_llm`, a configured
:class:`host_stub.testing.FakeLLM`): instant or with a fixed latency, deterministic, and the same
summary size for our plugin and the peers.

No provider is reachable here, so a summarizer's *quality* is not measured with it: it answers
with an extractive stand-in (the newest lines of what it was sent, about ``SUMMARY_CHARS``
characters, ~300 tokens). What it measures is what the systems around it decide: when they
call it, how much they send it, what they put into the next prompt.
"""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any

from common import TokenCounter

from host_stub.messages import Message
from host_stub.testing import CallStats, FakeLLM

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


def _count(counter: TokenCounter, messages_or_text: Any) -> int:
    """Tokens of a text or of a list of messages, as ``counter`` counts the wire format."""
    if isinstance(messages_or_text, str):
        return counter.text(messages_or_text) if messages_or_text else 0
    wire = [m.to_openai() if isinstance(m, Message) else dict(m) for m in messages_or_text]
    return counter.messages(wire)


def bench_llm(
    *,
    counter: TokenCounter | None = None,
    latency: float = 0.0,
    default_model: str | None = SUMMARIZER_MODEL,
    window: int = 128_000,
    max_output: int = 4096,
    reply_words: int = 30,
) -> FakeLLM:
    """The :class:`~host_stub.testing.FakeLLM` every system is benchmarked with: calls for
    ``SUMMARIZER_MODEL`` get a JSON summary (:func:`fake_summary_json`), any other model a short
    chat reply of ``reply_words`` words. ``latency`` seconds per call (asyncio sleep). Token
    counts come from :class:`common.TokenCounter` (cl100k_base). Its calls per model are in
    :func:`summarizer_stats` and :func:`chat_stats`."""
    counter = counter or TokenCounter()
    chat_calls = 0

    def chat_reply(sent: list[dict[str, Any]]) -> str:
        nonlocal chat_calls
        chat_calls += 1
        n = chat_calls
        return f"Reply {n}: " + " ".join(f"word{(n * 7 + i) % 97}" for i in range(reply_words))

    def summary_reply(sent: list[dict[str, Any]]) -> str:
        return fake_summary_json(str(sent[-1].get("content") or ""))

    return FakeLLM(
        chat_reply,
        replies={SUMMARIZER_MODEL: summary_reply},
        default_model=default_model,
        context_window=window,
        max_output=max_output,
        delay=latency,
        count=partial(_count, counter),
        cost=0.0,
        keep_calls=False,  # the benches read the per-model stats; a scale run sends 100,000 prompts
    )


def summarizer_stats(llm: FakeLLM) -> CallStats:
    """The calls the summarizer model received."""
    return llm.stats[SUMMARIZER_MODEL]


def chat_stats(llm: FakeLLM) -> CallStats:
    """The calls every other model received, together."""
    out = CallStats()
    for model, stats in llm.stats.items():
        if model != SUMMARIZER_MODEL:
            out.calls += stats.calls
            out.input_tokens += stats.input_tokens
            out.max_in_flight = max(out.max_in_flight, stats.max_in_flight)
            out.durations += stats.durations
    return out
