"""Reading conversations from OpenAI-format JSON or JSONL, with errors naming file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .messages import Message

__all__ = ["TranscriptError", "load_transcript", "split_turns"]


class TranscriptError(ValueError):
    """A malformed transcript; the message is one line naming file and line or item."""


def _message(raw: Any, where: str) -> Message:
    if not isinstance(raw, dict):
        raise TranscriptError(f"{where}: expected a message object, got {type(raw).__name__}")
    fields = {
        k: raw[k] for k in ("role", "content", "tool_calls", "tool_call_id", "name") if k in raw
    }
    try:
        return Message.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise TranscriptError(f"{where}: {key}: {first['msg']}") from None


def load_transcript(path: str | Path) -> list[Message]:
    """Messages from a ``.json`` file (a list of messages, or ``{"messages": [...]}``) or a
    ``.jsonl`` file (one message per line)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TranscriptError(f"{path}: file not found") from None
    except OSError as exc:
        raise TranscriptError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise TranscriptError(f"{path}:{line}: invalid UTF-8") from None
    stripped = text.lstrip()
    if path.suffix == ".jsonl" or (stripped.startswith("{") and "\n{" in stripped.rstrip()):
        messages = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TranscriptError(f"{path}:{number}: malformed JSON: {exc.msg}") from None
            messages.append(_message(item, f"{path}:{number}"))
        return messages
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TranscriptError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        data = data["messages"]
    if not isinstance(data, list):
        raise TranscriptError(f"{path}: expected a list of messages or {{'messages': [...]}}")
    return [_message(item, f"{path}: message {i + 1}") for i, item in enumerate(data)]


def split_turns(messages: list[Message]) -> list[tuple[list[Message], list[Message]]]:
    """Group a conversation into turns: ``(input, recorded)`` where ``input`` is the user message
    (plus any system messages before it) and ``recorded`` the assistant and tool messages after it
    up to the next user message."""
    turns: list[tuple[list[Message], list[Message]]] = []
    pending: list[Message] = []
    for m in messages:
        if m.role == "user":
            turns.append(([*pending, m], []))
            pending = []
        elif m.role == "system" or not turns:
            pending.append(m)
        else:
            turns[-1][1].append(m)
    if pending:
        turns.append((pending, []))
    return turns
