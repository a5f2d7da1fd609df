"""The rules engine over a whole conversation, batch by batch, as the compressions of one chat
fold it (for the rules engine's tests)."""

from __future__ import annotations

from host_stub.messages import Message
from plugin_memory_summary.base.config import PayloadCaps
from plugin_memory_summary.record.fitting import render_payload
from plugin_memory_summary.record.summary_model import SummaryPayload
from plugin_memory_summary.summarizer.rules import rules_merge


def count(text: str) -> int:
    """A tokenizer stand-in: about four characters a token."""
    return len(text) // 4 + 1


def fold(messages: list[Message], budget: int, batch: int) -> SummaryPayload:
    """Each ``batch`` messages merged into the previous payload; every merge fits ``budget``."""
    payload: SummaryPayload | None = None
    for start in range(0, len(messages), batch):
        payload = rules_merge(
            payload,
            messages[start : start + batch],
            budget_tokens=budget,
            count_tokens=count,
            caps=PayloadCaps(),
        )
        assert count(render_payload(payload)) <= budget
    assert payload is not None
    return payload
