"""The fault plan of :mod:`host_stub.testing` applied to this plugin's summarizer.

* :func:`faulty_llm`: a :class:`~host_stub.testing.FakeLLM` whose normal answer is a valid JSON
  summary built from the request's transcript (:func:`summary_from_messages`), failing as a
  :class:`~host_stub.testing.FaultPlan` says.
* :func:`openai_replies`: the same plan as a reply callable for
  :class:`fake_openai.FakeOpenAIServer`, so the real litellm HTTP path sees the same faults (the
  server answers an ``error`` with HTTP 500/429/503/400, hangs past the client's timeout for a
  ``timeout``, and sends a malformed body for some ``wrong_types``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from fake_openai import Reply

from host_stub.testing import (
    LEAK_MARKERS,
    FakeLLM,
    FaultPlan,
    FaultSampler,
    cut_answer,
    garbage_answer,
    oversized_answer,
    wrong_types_answer,
)

__all__ = [
    "LEAK_MARKERS",
    "FaultPlan",
    "faulty_llm",
    "openai_replies",
    "summary_from_messages",
]

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


def faulty_llm(plan: FaultPlan, **kwargs: Any) -> FakeLLM:
    """A summarizer failing as ``plan`` says and otherwise answering a valid JSON summary of the
    request's transcript; ``kwargs`` go to :class:`FakeLLM` (``hold_slow``, ``deaf_hangs``...)."""
    return FakeLLM(summary_from_messages, faults=plan, **kwargs)


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
            return Reply.garbage(garbage_answer(rng).encode("utf-8", "replace"))
        if kind == "wrong_types":
            if rng.random() < 0.5:
                return Reply.text(wrong_types_answer(rng))
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
            return Reply.text(oversized_answer(summary_from_messages(messages), rng))
        if kind == "length":
            return Reply.length(cut_answer(summary_from_messages(messages), rng))
        # ok and slow (the server has no cheap notion of "slow": it answers at once)
        return Reply.text(summary_from_messages(messages))

    reply.sampler = sampler  # type: ignore[attr-defined]
    return reply
