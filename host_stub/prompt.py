"""Pure prompt assembly: where contributions go, what is sent, what it costs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .hookspecs import ANCHORS, Contribution
from .messages import Message, tool_groups
from .signals import TokenBreakdown

__all__ = [
    "apply_replacements",
    "assemble_prompt",
    "dedupe_contributions",
    "history_breakdown",
    "sanitize_tool_pairs",
]

HEAD_ANCHORS = ("identity", "knowledge", "context")


def dedupe_contributions(contributions: Sequence[Contribution]) -> list[Contribution]:
    """One contribution per id (the first wins), ordered by anchor, stable within one."""
    seen: set[str] = set()
    unique: list[Contribution] = []
    for item in contributions:
        if item.id in seen or not item.content:
            continue
        seen.add(item.id)
        unique.append(item)
    return sorted(unique, key=lambda c: ANCHORS.index(c.anchor))


def apply_replacements(
    history: Sequence[Message],
    replacements: Mapping[int, str],
    count_message: Callable[[Message], int],
) -> list[Message]:
    """``history`` with the content of each message whose seq ``replacements`` names replaced by
    that text, and its token count taken again; role, tool calls and the call id stay, so tool
    pairs stay."""
    out = []
    for m in history:
        text = replacements.get(m.seq) if m.seq is not None else None
        if text is None or m.is_marker:
            out.append(m)
            continue
        shown = m.model_copy(update={"content": text})
        out.append(shown.model_copy(update={"tokens": count_message(shown)}))
    return out


def sanitize_tool_pairs(messages: Sequence[Message]) -> tuple[list[Message], int]:
    """Leave out tool results that do not directly follow their call and tool-call groups that
    lack any result (the assistant's text, if any, is kept). Returns the messages and how many
    it left out or changed."""
    items = list(messages)
    keep = [m.role != "tool" for m in items]
    replace: dict[int, Message] = {}
    for start, end, complete in tool_groups(items):
        if complete:
            keep[start:end] = [True] * (end - start)
        else:
            keep[start] = bool(items[start].content)
            if keep[start]:
                replace[start] = items[start].model_copy(update={"tool_calls": None})
    out = [replace.get(i, m) for i, m in enumerate(items) if keep[i]]
    changed = sum(1 for k in keep if not k) + len(replace)
    return out, changed


def assemble_prompt(
    system_prompt: str,
    contributions: Sequence[Contribution],
    history: Sequence[Message],
    *,
    merge_system_messages: bool = False,
) -> list[dict[str, Any]]:
    """The messages sent to the model: identity, the static system prompt, knowledge and context
    contributions (the static prefix stays first, so it stays cacheable), the history (markers
    left out), a ``turn-context`` message before the last user message and ``turn-hint`` last."""
    items = dedupe_contributions(contributions)
    by_anchor: dict[str, list[str]] = {a: [] for a in ANCHORS}
    for item in items:
        by_anchor[item.anchor].append(item.content)
    head = [*by_anchor["identity"], system_prompt, *by_anchor["knowledge"], *by_anchor["context"]]
    head = [text for text in head if text]
    if merge_system_messages and head:
        head = ["\n\n".join(head)]
    out: list[dict[str, Any]] = [{"role": "system", "content": text} for text in head]
    body = [m.to_openai() for m in history if not m.is_marker]
    if by_anchor["turn-context"]:
        last_user = max((i for i, m in enumerate(body) if m["role"] == "user"), default=len(body))
        for text in reversed(by_anchor["turn-context"]):
            body.insert(last_user, {"role": "system", "content": text})
    out.extend(body)
    out.extend({"role": "system", "content": text} for text in by_anchor["turn-hint"])
    return out


def history_breakdown(
    history: Sequence[Message],
    contributions: Sequence[Contribution],
    *,
    system_tokens: int,
    tool_def_tokens: int,
    reserved_for_reply: int,
    count_text: Callable[[str], int],
) -> TokenBreakdown:
    """Token use by part. History tokens are the counts stored at append; tool calls and results
    go to ``tools``; ``context``-anchored contributions are the summary."""
    history_tokens = tools = 0
    for m in history:
        if m.is_marker:
            continue
        if m.role == "tool" or (m.role == "assistant" and m.tool_calls):
            tools += m.tokens or 0
        else:
            history_tokens += m.tokens or 0
    summary = extra = 0
    for c in dedupe_contributions(contributions):
        n = count_text(c.content)
        if c.anchor == "context":
            summary += n
        else:
            extra += n
    return TokenBreakdown(
        system=system_tokens + extra,
        summary=summary,
        history=history_tokens,
        tools=tools,
        tool_defs=tool_def_tokens,
        reserved_for_reply=reserved_for_reply,
    )
