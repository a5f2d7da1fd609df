"""Secrets out of what leaves for the summarizer and out of what a summary keeps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from host_stub.messages import Message

from ..record import SummaryPayload
from .redact import RedactionError, Redactor

__all__ = ["redact_messages", "safe_redactor", "scrub_payload"]


def redact_messages(messages: Sequence[Message], redactor: Redactor) -> list[Message]:
    """Copies with secrets redacted in text content and tool-call arguments."""
    out = []
    for m in messages:
        update: dict[str, object] = {}
        if isinstance(m.content, str):
            update["content"] = redactor.redact(m.content)
        elif isinstance(m.content, list):
            update["content"] = [
                {**p, "text": redactor.redact(str(p["text"]))} if p.get("type") == "text" else p
                for p in m.content
            ]
        if m.tool_calls:
            update["tool_calls"] = [
                c.model_copy(
                    update={
                        "function": c.function.model_copy(
                            update={"arguments": redactor.redact(c.function.arguments)}
                        )
                    }
                )
                for c in m.tool_calls
            ]
        out.append(m.model_copy(update=update) if update else m)
    return out


def _redacted(value: Any, redactor: Redactor) -> Any:
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, list):
        return [_redacted(v, redactor) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v, redactor) for k, v in value.items()}
    return value


def safe_redactor(redactor: Redactor) -> Redactor:
    """The redactor without the user's patterns, for when one of those timed out: the built-in
    patterns are linear, so this one finishes."""
    return redactor if not redactor.extra_patterns else Redactor()


def scrub_payload(payload: SummaryPayload, redactor: Redactor) -> SummaryPayload:
    """``payload`` with every secret redacted from its text (pinned facts aside: the user set
    them, and they reach the summarizer redacted) and every identifier that holds one dropped:
    an identifier is carried verbatim into every later summary, so ``[REDACTED:…]`` in it would
    only be noise, and a secret in it (from a record written before a pattern existed, or a
    summarizer that made one up) would be carried for good."""
    try:
        return _scrub(payload, redactor)
    except RedactionError:
        return _scrub(payload, safe_redactor(redactor))


def _scrub(payload: SummaryPayload, redactor: Redactor) -> SummaryPayload:
    data = payload.model_dump(exclude={"identifiers", "identifier_sources", "pinned_facts"})
    clean = _redacted(data, redactor)
    dropped = {i for i in payload.identifiers if "[REDACTED:" in i or redactor.redact(i) != i}
    if clean == data and not dropped:
        return payload
    return SummaryPayload.model_validate(
        {
            **clean,
            "identifiers": [i for i in payload.identifiers if i not in dropped],
            "identifier_sources": {
                source: [i for i in ids if i not in dropped]
                for source, ids in payload.identifier_sources.items()
            },
            "pinned_facts": payload.pinned_facts,
        }
    )
