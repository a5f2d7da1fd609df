"""Reading conversations from OpenAI-format JSON or JSONL, with errors naming file and line, and
the keys that make a replay resumable and idempotent.

A transcript is refused whole (nothing is stored) when it holds no message, a message without
content or over the size limit (see :mod:`host_stub.checks`), or a tool result whose call no
earlier assistant message made.

Replay keys. Every replayed message carries ``metadata["replay_key"]``: its position in the file
and a digest of its OpenAI fields (``"17:3f2a..."``). Replaying a file again into the same session
(same epoch) compares the file's keys with the ones stored, in order: the messages already stored
are skipped, and the replay goes on from the first one that is not, even in the middle of a turn
(after a crash). A stored key that differs from the file's means the session holds another
conversation: that is refused. A session whose messages carry no key (stored by an older demo,
say) is compared the same way, with the keys its messages would have had.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .checks import DEFAULT_MAX_MESSAGE_CHARS, message_problem
from .messages import Message

__all__ = [
    "REPLAY_KEY",
    "TranscriptError",
    "load_transcript",
    "replay_key",
    "resume_point",
    "split_turns",
    "stored_replay",
    "with_replay_keys",
]

#: The metadata key of a replayed message's position-and-digest key.
REPLAY_KEY = "replay_key"


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
    except RecursionError:
        raise TranscriptError(f"{where}: {_TOO_DEEP}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise TranscriptError(f"{where}: {key}: {first['msg']}") from None


def load_transcript(
    path: str | Path, *, max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS
) -> list[Message]:
    """Messages from a ``.json`` file (a list of messages, or ``{"messages": [...]}``) or a
    ``.jsonl`` file (one message per line), checked: at least one message, each with content
    and at most ``max_message_chars`` characters (0 = no limit), no tool result without its
    call."""
    path = Path(path)
    items = _read(path)
    if not items:
        raise TranscriptError(f"{path}: no messages (the conversation is empty)")
    messages = [_message(raw, where) for raw, where in items]
    _check(messages, [where for _, where in items], max_message_chars)
    return messages


def _check(messages: list[Message], wheres: list[str], max_chars: int) -> None:
    calls: set[str] = set()  # ids of tool calls made and not answered yet
    for message, where in zip(messages, wheres, strict=True):
        problem = message_problem(message, max_chars)
        if problem is not None:
            raise TranscriptError(f"{where}: {problem}")
        if message.role == "assistant" and message.tool_calls:
            calls.update(c.id for c in message.tool_calls)
        elif message.role == "tool":
            if message.tool_call_id is None:
                raise TranscriptError(f"{where}: a tool result needs tool_call_id")
            if message.tool_call_id not in calls:
                raise TranscriptError(
                    f"{where}: tool result for call {message.tool_call_id!r} without its call "
                    "(no earlier assistant message made it, or it was answered already)"
                )
            calls.discard(message.tool_call_id)


def _read(path: Path) -> list[tuple[Any, str]]:
    """The raw items of the file, each with where it is (``file:line`` or ``file: message N``)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TranscriptError(f"{path}: file not found") from None
    except OSError as exc:
        raise TranscriptError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = raw[: exc.start].count(b"\n") + 1
        raise TranscriptError(f"{path}:{where}: invalid UTF-8") from None
    stripped = text.lstrip()
    if path.suffix == ".jsonl" or (stripped.startswith("{") and "\n{" in stripped.rstrip()):
        items: list[tuple[Any, str]] = []
        # Lines end at "\n" only (a "\r" before it goes too): U+2028, U+0085 and the other
        # breaks str.splitlines knows may stand inside a JSON string.
        for number, line in enumerate(text.split("\n"), 1):
            line = line.removesuffix("\r")
            if not line.strip(_JSON_BLANK):
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TranscriptError(f"{path}:{number}: malformed JSON: {exc.msg}") from None
            except RecursionError:
                raise TranscriptError(f"{path}:{number}: {_TOO_DEEP}") from None
            items.append((item, f"{path}:{number}"))
        return items
    if not stripped:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TranscriptError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    except RecursionError:
        raise TranscriptError(f"{path}:{_deepest_line(text)}: {_TOO_DEEP}") from None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        data = data["messages"]
    if not isinstance(data, list):
        raise TranscriptError(f"{path}: expected a list of messages or {{'messages': [...]}}")
    return [(item, f"{path}: message {i + 1}") for i, item in enumerate(data)]


#: What JSON counts as blank around a value (a line of only these is skipped).
_JSON_BLANK = " \t\r"
_TOO_DEEP = "JSON nested too deeply to read (arrays or objects inside each other, hundreds deep)"


def _deepest_line(text: str) -> int:
    """The line where the nesting of ``text``'s arrays and objects first reaches its deepest
    (strings skipped): where a document too deep to read goes wrong."""
    depth = deepest = 0
    line = where = 1
    for token in re.finditer(r'"(?:[^"\\\n]|\\.)*"?|[\[\]{}\n]', text):
        char = token.group()
        if char == "\n":
            line += 1
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest, where = depth, line
        elif char in "]}":
            depth -= 1
    return where


def replay_key(position: int, message: Message) -> str:
    """``"<position>:<digest>"``: where the message is in its file (1-based) and what it says."""
    body = json.dumps(message.to_openai(), ensure_ascii=False, sort_keys=True)
    return f"{position}:{hashlib.sha256(body.encode('utf-8', 'replace')).hexdigest()[:16]}"


def with_replay_keys(messages: Sequence[Message]) -> list[Message]:
    """Copies of ``messages`` that carry their replay key in ``metadata``."""
    return [
        m.model_copy(update={"metadata": {**m.metadata, REPLAY_KEY: replay_key(i, m)}})
        for i, m in enumerate(messages, 1)
    ]


def resume_point(messages: Sequence[Message], stored_keys: Sequence[str]) -> int:
    """How many leading ``messages`` (carrying replay keys) are already stored, given the replay
    keys found in the session, oldest first. Raises :class:`TranscriptError` when the stored
    keys are not this file's (another conversation, or the file changed)."""
    keys = [m.metadata.get(REPLAY_KEY) for m in messages]
    for i, stored in enumerate(stored_keys):
        if i >= len(keys):
            raise TranscriptError(
                f"the session already holds {len(stored_keys)} replayed messages, more than the "
                f"file's {len(keys)}: it holds another conversation"
            )
        if keys[i] != stored:
            raise TranscriptError(
                f"message {i + 1} differs from the one the session already holds: it holds "
                "another conversation (or the file changed)"
            )
    return len(stored_keys)


async def stored_replay(url: str, session_id: str) -> tuple[int, list[str]]:
    """How many messages ``session_id`` already has in the store at ``url`` in its current
    epoch, and the replay keys among them, oldest first. A session none of whose messages
    carries a key (stored by an older demo, say) gets the keys its messages would have had as
    a replay of a file: the file they came from is recognised by its messages."""
    from .memory import open_memory

    memory = open_memory(url, lambda message: 0)
    try:
        epoch = await memory.get_epoch(session_id)
        stored = [
            *await memory.get_archived(session_id, epoch=epoch),
            *await memory.get_history(session_id),
        ]
    finally:
        await memory.close()
    stored.sort(key=lambda m: m.seq or 0)
    messages = [m for m in stored if not m.is_marker]
    keys = [str(m.metadata[REPLAY_KEY]) for m in messages if REPLAY_KEY in m.metadata]
    if not keys:
        keys = [replay_key(i, m) for i, m in enumerate(messages, 1)]
    return len(messages), keys


def split_turns(
    messages: list[Message], *, resumed: bool = False
) -> list[tuple[list[Message], list[Message]]]:
    """Group a conversation into turns: ``(input, recorded)`` where ``input`` is the user message
    (plus any system messages before it) and ``recorded`` the assistant and tool messages after it
    up to the next user message. With ``resumed`` (the rest of a conversation whose start is
    already stored), leading assistant and tool messages finish the stored turn: ``([], them)``."""
    turns: list[tuple[list[Message], list[Message]]] = []
    pending: list[Message] = []
    if resumed and messages and messages[0].role in ("assistant", "tool"):
        turns.append(([], []))
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
