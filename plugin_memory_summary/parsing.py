"""Reading a summarizer's answer: a JSON payload parsed tolerantly, or plain text accepted as the
summary only when it is not a refusal, not an error dump and keeps every known identifier."""

from __future__ import annotations

import json
from typing import Any

from .identifiers import extract_identifiers
from .patterns import lazy_regex
from .summary_model import (
    InProgressTask,
    SummaryPayload,
    TimelineEvent,
    group_sources,
    sources_of,
)
from .text import collapse_whitespace

__all__ = [
    "answer_gate",
    "carries_instructions",
    "debris_reason",
    "echo_reason",
    "looks_like_prose",
    "parse_summary_output",
    "payload_from_text",
    "plain_text_gate",
    "refusal_reason",
]


_FENCE = lazy_regex(r"(?s)```[A-Za-z0-9_-]*[ \t]*\n?(.*?)(?:```|\Z)")
_TRAILING_COMMA = lazy_regex(r",\s*([}\]])")
_FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "summary": ("summary", "summary_text", "long_term_summary"),
    "conversation_goal": ("conversation_goal", "goal", "user_goal"),
    "stable_facts": ("stable_facts", "facts", "key_facts"),
    "user_profile": ("user_profile", "user_preferences", "preferences", "profile", "user_facts"),
    "decisions": ("decisions", "resolved_points", "resolved", "conclusions"),
    "open_questions": ("open_questions", "pending_questions", "questions", "unresolved"),
    "in_progress_tasks": ("in_progress_tasks", "tasks", "unfinished_tasks", "pending_tasks"),
    "timeline": ("timeline", "events", "event_timeline"),
    "retrieval_hints": ("retrieval_hints", "keywords", "hints"),
    "identifiers": ("identifiers", "ids", "entities"),
    "pinned_facts": ("pinned_facts",),
}
_KNOWN_KEYS = frozenset(k for aliases in _FIELD_ALIASES.values() for k in aliases)


def _json_objects(text: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    for candidate in (text, _TRAILING_COMMA().sub(r"\1", text)):
        start = candidate.find("{")
        tries = 0
        while start != -1 and tries < 50:
            tries += 1
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except ValueError:
                start = candidate.find("{", start + 1)
                continue
            if isinstance(value, dict):
                found.append(value)
                return found
            start = candidate.find("{", start + 1)
    return found


def _outermost_object(text: str) -> dict[str, Any] | None:
    sources = [m.group(1) for m in _FENCE().finditer(text)] + [text]
    for source in sources:
        objects = _json_objects(source)
        if objects:
            return objects[0]
    return None


def _partial_object(text: str) -> dict[str, Any] | None:
    """The complete members of a JSON object cut off before its end (an answer that hit the
    length limit): a string, list item or object left unfinished is dropped, not guessed."""
    import pydantic_core

    sources = [m.group(1) for m in _FENCE().finditer(text)] + [text]
    for source in sources:
        start = source.find("{")
        if start == -1:
            continue
        try:
            value = pydantic_core.from_json(source[start:], allow_partial=True)
        except ValueError:
            continue
        if isinstance(value, dict) and value:
            return value
    return None


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(v.strip() for v in value if v.strip())
    return None


def _as_item(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return collapse_whitespace(value) or None
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        parts = [(k, _as_item(v)) for k, v in value.items()]
        parts = [(k, v) for k, v in parts if v]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0][1]
        return "; ".join(f"{k}: {v}" for k, v in parts)
    return None


def _as_items(value: Any) -> list[str] | None:
    if value is None:
        return []
    if not isinstance(value, list):
        value = [value]
    items: list[str] = []
    for entry in value:
        for leaf in entry if isinstance(entry, list) else [entry]:
            item = _as_item(leaf)
            if item:
                items.append(item)
    if value and not items and not all(v in ("", None) or v == [] for v in value):
        return None
    return items


def _pick(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in data and data[key] not in (None, "", []):
            return data[key]
    return None


def _as_tasks(value: Any) -> list[InProgressTask] | None:
    if value is None:
        return []
    if not isinstance(value, list):
        value = [value]
    tasks: list[InProgressTask] = []
    for entry in value:
        if isinstance(entry, str):
            if entry.strip():
                tasks.append(InProgressTask(goal=collapse_whitespace(entry)))
        elif isinstance(entry, dict):
            goal = _as_item(_pick(entry, "goal", "task", "title", "name", "description")) or ""
            done = _as_items(_pick(entry, "done", "completed", "finished")) or []
            todo = (
                _as_items(
                    _pick(entry, "todo", "to_do", "pending", "remaining", "next", "next_steps")
                )
                or []
            )
            if goal or done or todo:
                tasks.append(InProgressTask(goal=goal, done=done, todo=todo))
    if value and not tasks:
        return None
    return tasks


_WHEN_PREFIX = lazy_regex(r"(?s)^\s*\[([^\]]{1,40})\]\s*(.+)$|^\s*([^:：]{1,40}?)\s*[:：]\s+(.+)$")


def _as_timeline(value: Any) -> list[TimelineEvent] | None:
    if value is None:
        return []
    if not isinstance(value, list):
        value = [value]
    events: list[TimelineEvent] = []
    for entry in value:
        if isinstance(entry, str):
            text = entry.strip()
            if not text:
                continue
            match = _WHEN_PREFIX().match(text)
            when = event = ""
            if match:
                when = (match.group(1) or match.group(3) or "").strip()
                event = (match.group(2) or match.group(4) or "").strip()
            if when and any(c.isdigit() for c in when):
                events.append(TimelineEvent(when=when, event=collapse_whitespace(event)))
            else:
                events.append(TimelineEvent(event=collapse_whitespace(text)))
        elif isinstance(entry, dict):
            when = _as_item(_pick(entry, "when", "date", "time", "timestamp")) or ""
            event = _as_item(_pick(entry, "event", "what", "description", "text", "summary")) or ""
            if when or event:
                events.append(TimelineEvent(when=when, event=event))
    if value and not events:
        return None
    return events


def _coerce(data: dict[str, Any]) -> SummaryPayload | None:
    fields: dict[str, Any] = {}
    for name, aliases in _FIELD_ALIASES.items():
        raw = _pick(data, *aliases)
        if raw is None:
            continue
        if name in ("summary", "conversation_goal"):
            value: Any = _as_text(raw)
            if name == "conversation_goal" and value is not None:
                value = collapse_whitespace(value)
        elif name == "in_progress_tasks":
            value = _as_tasks(raw)
        elif name == "timeline":
            value = _as_timeline(raw)
        else:
            value = _as_items(raw)
        if value:
            fields[name] = value
    if not fields:
        return None
    return SummaryPayload(**fields)


def parse_summary_output(text: str, *, partial: bool = False) -> SummaryPayload | None:
    """A model's answer parsed into a payload, tolerantly: code fences are stripped, the outermost
    JSON object is taken, seed-002 field names (``user_preferences``, ``resolved_points``,
    ``pending_questions``) are accepted as aliases, a string where a list belongs becomes a
    one-item list, and tasks / timeline entries may be plain strings. A field whose value cannot
    be read is left empty. ``None`` when there is no JSON object or no field of it carries
    anything usable. ``partial``: the answer was cut off at the length limit, so a JSON object
    without its end is read for its complete members."""
    if not text or "{" not in text:
        return None
    data = _outermost_object(text)
    if data is None and partial:
        data = _partial_object(text)
    if data is None:
        return None
    if not (_KNOWN_KEYS & data.keys()):
        nested = [v for v in data.values() if isinstance(v, dict) and _KNOWN_KEYS & v.keys()]
        if len(nested) != 1:
            return None
        data = nested[0]
    return _coerce(data)


# --- the plain-text gate ----------------------------------------------------------------------

_REFUSAL_ANYWHERE = lazy_regex(
    r"\bI(?:'m| am) (?:sorry|afraid),? but\b"
    r"|\bI (?:can(?:no|')t|can not|won't|will not|am unable to|'m unable to) "
    r"(?:help|assist|comply|provide|do that|fulfil+|complete|summari[sz]e|continue)\b"
    r"|\bAs an AI\b|\bAs a (?:large )?language model\b"
    r"|作为一个?(?:AI|ai|人工智能|语言模型|大语言模型|AI助手)"
    r"|我(?:无法|不能|没法)(?:提供|协助|帮助|帮你|完成|回答|满足|处理|总结|继续)",
)
_REFUSAL_START = lazy_regex(
    r"(?i)^(?:I(?:'m| am) sorry|Sorry\b|I apologi[sz]e|I (?:cannot|can't|can not|won't)\b"
    r"|I(?:'m| am) (?:unable|not able)\b|Unfortunately,? I\b"
    r"|抱歉|很抱歉|对不起|非常抱歉|我无法|我不能|很遗憾)"
)
_ERROR_DUMP = lazy_regex(
    r"(?im)^(?:error|exception|fatal|traceback)\b\s*[:(\[]?"
    r"|Traceback \(most recent call last\)"
    r"|^\s*[A-Za-z_.]*(?:Error|Exception): "
    r"|^\s*\{\s*\"error\"\s*:"
    r"|^\s*<(?:!doctype|html)\b"
    r"|^\s*(?:HTTP/\d(?:\.\d)? )?[45]\d\d (?:[A-Z][a-z]+ ?)+$"
)


def refusal_reason(text: str) -> str | None:
    """Why ``text`` reads as a refusal (English or Chinese), or ``None``. Apologies only count at
    the start; unambiguous phrases ("As an AI", "I can't help", "我无法提供") anywhere in the
    first 300 characters."""
    head = text.lstrip(" \t\r\n*#>-\"'“「").strip()[:300]
    match = _REFUSAL_START().match(head) or _REFUSAL_ANYWHERE().search(head)
    if match:
        return f"refusal: {match.group()!r}"
    return None


def _error_reason(text: str) -> str | None:
    match = _ERROR_DUMP().search(text.strip()[:2000])
    if match:
        return f"error output: {collapse_whitespace(match.group())[:60]!r}"
    return None


_INSTRUCTIONS = lazy_regex(
    r"(?i)\b(?:ignore|disregard|forget|override)\s+(?:all\s+|any\s+|the\s+)?"
    r"(?:previous|prior|above|earlier|your|system)\s+(?:instructions?|prompts?|rules?|messages?)"
    r"|\byou\s+are\s+now\b|\bnew\s+instructions?\s*:|\bfrom\s+now\s+on\s*,?\s+you\b"
    r"|忽略(?:之前|以上|先前|所有)(?:的)?(?:指令|指示|提示)|从现在起你"
)


def carries_instructions(text: str) -> bool:
    """``text`` tells an agent to drop its instructions or take a new role ("ignore previous
    instructions", "you are now ..."): never worth keeping in a summary that goes back into a
    system message."""
    return _INSTRUCTIONS().search(text) is not None


def answer_gate(text: str, previous: SummaryPayload | None = None) -> str | None:
    """Why a summarizer answer (JSON or prose, as the model wrote it) must be rejected whatever
    its form, or ``None``: it carries instructions to the agent ("ignore previous instructions",
    "you are now ..."), which a digest of the past never needs. (An answer that leaves out what
    the previous summary held drops nothing: the model digests the new part only and the rules
    engine merges; an identifier it makes up is left out by :mod:`.answers`.)"""
    match = _INSTRUCTIONS().search(text)
    if match:
        return f"carries instructions: {collapse_whitespace(match.group())[:60]!r}"
    return None


_JSON_KEY = lazy_regex(r'"[^"\n]{1,40}"\s*:\s*[\[{"\d]')
_BRACKET_LINE = lazy_regex(r"(?m)^\s*[\[\]{},]+\s*$")
_SYNTAX = frozenset('{}[]":,')
#: A line's opening stamp (``[5:23 pm on 8 May, 2023]:``); a JSON list never matches.
_STAMP = lazy_regex(r'(?m)^(\s*)\[[^\[\]{}"\n]{1,60}\]:?')


def debris_reason(text: str) -> str | None:
    """Why ``text``, offered as prose, is a JSON fragment instead (``"key": value`` pairs, lines
    of brackets, or mostly JSON punctuation, a line's opening stamp in brackets not counted),
    or ``None``: fragments are never stored as prose."""
    if _JSON_KEY().search(text) or _BRACKET_LINE().search(text):
        return "JSON fragments, not prose"
    stripped = _STAMP().sub(r"\1", text).strip()
    if not stripped:
        return None
    syntax = sum(1 for ch in stripped if ch in _SYNTAX)
    if syntax / len(stripped) > 0.08:
        return "JSON fragments, not prose"
    return None


_NGRAM = 4


def _ngrams(text: str) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i : i + _NGRAM]) for i in range(len(words) - _NGRAM + 1)}


def echo_reason(text: str, instructions: str) -> str | None:
    """Why ``text`` is an echo of the summarizer's own instructions (most of its word 4-grams
    are theirs, or it repeats most of them), or ``None``."""
    if "<transcript>" in text or "</transcript>" in text:
        return "echoes the request"
    theirs = _ngrams(instructions)
    ours = _ngrams(text)
    if not theirs or not ours:
        return None
    shared = len(ours & theirs)
    if shared / len(ours) >= 0.5 or shared / len(theirs) >= 0.5:
        return "echoes the request"
    return None


def looks_like_prose(text: str) -> bool:
    """Plain text worth keeping: some words, mostly letters (lines' opening stamps left out; a
    JSON fragment is caught by :func:`debris_reason`)."""
    stripped = _STAMP().sub(r"\1", text).strip()
    if len(stripped) < 8:
        return False
    letters = sum(ch.isalpha() for ch in stripped)
    return letters / len(stripped) >= 0.5


def plain_text_gate(text: str, previous: SummaryPayload | None = None) -> str | None:
    """Why plain (non-JSON) summarizer output must be rejected (empty, a refusal, an error dump,
    JSON debris), or ``None``; an identifier it does not repeat is no reason (merges carry it)."""
    if not text or not text.strip():
        return "empty output"
    reason = refusal_reason(text) or _error_reason(text) or debris_reason(text)
    if reason is None and not looks_like_prose(text):
        reason = "neither JSON nor prose"
    return reason


def payload_from_text(text: str, previous: SummaryPayload | None) -> SummaryPayload:
    """Accepted plain text as a payload: the text is the summary, identifiers are those of
    ``previous`` (the gate checked they are in the text, and their recorded sources stay)
    followed by the ones found in it, and ``previous``'s pinned facts are kept."""
    prior = list(previous.identifiers) if previous else []
    identifiers = list(dict.fromkeys(prior + extract_identifiers(text)))
    return SummaryPayload(
        summary=text.strip(),
        identifiers=identifiers,
        pinned_facts=list(previous.pinned_facts) if previous else [],
        identifier_sources=group_sources(identifiers, sources_of(previous)) if previous else {},
    )
