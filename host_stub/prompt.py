"""Pure prompt assembly: where contributions go, what is sent, what it costs."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from .hookspecs import ANCHORS, Contribution
from .messages import Message, clone_model, tool_groups
from .signals import TokenBreakdown

__all__ = [
    "PrefixReuse",
    "apply_replacements",
    "assemble_prompt",
    "dedupe_contributions",
    "history_breakdown",
    "known_counts",
    "prefix_reuse",
    "reuse_shares",
    "sanitize_tool_pairs",
    "shared_messages",
    "wire_key",
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
        shown = clone_model(m, {"content": text})
        shown.tokens = count_message(shown)  # a private copy: set in place
        out.append(shown)
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
    stored_counts: dict[int, int] | None = None,
    sources: dict[int, Message] | None = None,
) -> list[dict[str, Any]]:
    """The messages sent to the model: identity, the static system prompt, knowledge
    contributions, the history's leading system messages, context contributions (the static
    prefix stays first, so it stays cacheable), the rest of the history (markers left out), a
    ``turn-context`` message before the last user message and ``turn-hint`` last.

    The history's leading system messages are core memory (never archived), as static as the
    system prompt: before the context contributions, a summary that changes at every compression
    leaves them in the prefix a provider's prompt cache reuses. ``merge_system_messages`` joins
    the head into one system message (core messages that are plain text included).

    ``stored_counts``, when given, is filled with ``id(sent message) -> tokens`` for each history
    message sent as it is, from the count it carries (stored at append, or taken again by
    :func:`apply_replacements`): the caller need not count those again. ``sources``, when given,
    is filled with ``id(sent message) -> history message`` for each history message sent (an
    outside agent loop maps the prompt back to its own message objects)."""
    items = dedupe_contributions(contributions)
    by_anchor: dict[str, list[str]] = {a: [] for a in ANCHORS}
    for item in items:
        by_anchor[item.anchor].append(item.content)
    static = [*by_anchor["identity"], system_prompt, *by_anchor["knowledge"]]
    static = [text for text in static if text]
    context = [text for text in by_anchor["context"] if text]
    body = [m.to_openai() for m in history if not m.is_marker]
    if sources is not None:
        sources.update(
            (id(w), m) for w, m in zip(body, [m for m in history if not m.is_marker], strict=True)
        )
    if stored_counts is not None:
        sent = [m for m in history if not m.is_marker]
        stored_counts.update(
            (id(w), m.tokens) for w, m in zip(body, sent, strict=True) if m.tokens is not None
        )
    lead = 0
    while lead < len(body) and body[lead]["role"] == "system":
        lead += 1
    core, body = body[:lead], body[lead:]
    out: list[dict[str, Any]]
    if merge_system_messages:
        plain = 0
        while plain < len(core) and _plain_system(core[plain]):
            plain += 1
        head = [*static, *(m["content"] for m in core[:plain]), *context]
        out = [{"role": "system", "content": "\n\n".join(head)}] if head else []
        out.extend(core[plain:])
    else:
        out = [{"role": "system", "content": text} for text in static]
        out.extend(core)
        out.extend({"role": "system", "content": text} for text in context)
    if by_anchor["turn-context"]:
        last_user = max((i for i, m in enumerate(body) if m["role"] == "user"), default=len(body))
        for text in reversed(by_anchor["turn-context"]):
            body.insert(last_user, {"role": "system", "content": text})
    out.extend(body)
    out.extend({"role": "system", "content": text} for text in by_anchor["turn-hint"])
    return out


def _plain_system(message: Mapping[str, Any]) -> bool:
    """A system message that is only text (it can join a merged head without losing a field)."""
    return set(message) == {"role", "content"} and isinstance(message["content"], str)


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


class PrefixReuse(NamedTuple):
    """Of a prompt's ``tokens``, how many (``reused``) open it exactly as the previous prompt
    opened: what a provider's prompt cache could serve from the previous call."""

    reused: int
    tokens: int


def shared_messages(
    previous: Sequence[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]
) -> int:
    """How many leading messages of ``current`` equal ``previous``'s at the same place."""
    same = 0
    for before, now in zip(previous, current, strict=False):
        if before != now:
            break
        same += 1
    return same


def wire_key(message: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """A hashable form of an OpenAI-format message whose values are all plain (text content, no
    tool calls); ``None`` for one with lists (content parts, tool calls)."""
    key = tuple(message.items())
    try:
        hash(key)
    except TypeError:
        return None
    return key


def known_counts(messages: Sequence[Mapping[str, Any]], tokens: Sequence[int]) -> dict[Any, int]:
    """``wire_key`` -> tokens of the plain messages of a prompt already counted."""
    out: dict[Any, int] = {}
    for message, n in zip(messages, tokens, strict=True):
        key = wire_key(message)
        if key is not None:
            out[key] = n
    return out


def prefix_reuse(
    previous: Sequence[Mapping[str, Any]] | None,
    current: Sequence[Mapping[str, Any]],
    count_message: Callable[[Mapping[str, Any]], int],
    *,
    tokens: Sequence[int] | None = None,
) -> PrefixReuse:
    """The tokens of ``current`` (OpenAI-format messages, each counted with ``count_message``,
    or given in ``tokens`` when the caller knows them) that are a common prefix with
    ``previous``: every leading message equal to the previous prompt's message at the same
    place, then, in the first message that differs (same role), its role and the leading
    characters of its text the two share. No previous prompt reuses nothing."""
    counts = list(tokens) if tokens is not None else [count_message(m) for m in current]
    total = sum(counts)
    if not previous:
        return PrefixReuse(0, total)
    same = shared_messages(previous, current)
    reused = sum(counts[:same])
    if same < len(current) and same < len(previous):
        before, now = previous[same], current[same]
        if before.get("role") == now.get("role"):
            head: dict[str, Any] = {"role": now.get("role")}
            a, b = before.get("content"), now.get("content")
            if isinstance(a, str) and isinstance(b, str):
                head["content"] = os.path.commonprefix([a, b])
            reused += min(count_message(head), counts[same])
    return PrefixReuse(reused, total)


def reuse_shares(calls: Iterable[PrefixReuse]) -> tuple[float, float] | None:
    """Over model calls: the share of their tokens that were a reused prefix, pooled (reused
    tokens / tokens) and the median of the per-call shares; ``None`` for no calls."""
    items = [c for c in calls if c.tokens > 0]
    if not items:
        return None
    pooled = sum(c.reused for c in items) / sum(c.tokens for c in items)
    return pooled, statistics.median(c.reused / c.tokens for c in items)
