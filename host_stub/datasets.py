"""Converters from the public evaluation sets to chats the host can replay.

The data is read at run time from a directory the caller names (``--data``); nothing of it is
part of this package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .messages import Message, Role

__all__ = ["Conversation", "load_locomo", "load_tau_bench", "tau_action_identifiers"]


@dataclass
class Conversation:
    name: str
    messages: list[Message]
    qa: list[dict[str, Any]] = field(default_factory=list)
    #: LoCoMo: dia_id -> index into ``messages``.
    turn_index: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def load_tau_bench(path: str | Path) -> list[Conversation]:
    """tau-bench trajectories: already OpenAI-format, tool calls included."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for item in data:
        messages = []
        for raw in item["traj"]:
            fields = {
                k: raw[k]
                for k in ("role", "content", "tool_calls", "tool_call_id", "name")
                if k in raw
            }
            messages.append(Message.model_validate(fields))
        out.append(
            Conversation(
                name=f"tau-{item['task_id']}-{item.get('trial', 0)}",
                messages=messages,
                info=item.get("info", {}),
            )
        )
    return out


def _flatten(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _flatten(v)]
    if isinstance(value, list):
        return [s for v in value for s in _flatten(v)]
    return [str(value)]


def tau_action_identifiers(conversation: Conversation, min_chars: int = 5) -> set[str]:
    """Ground-truth action argument values that look like identifiers: 5+ characters, no spaces,
    at least one digit (user ids, reservation and payment ids, flight numbers, dates)."""
    actions = conversation.info.get("task", {}).get("actions", [])
    values = {v for a in actions for v in _flatten(a.get("kwargs", {}))}
    return {
        v for v in values if len(v) >= min_chars and " " not in v and any(c.isdigit() for c in v)
    }


def load_locomo(path: str | Path) -> list[Conversation]:
    """LoCoMo conversations as chats: speaker_a is the user, speaker_b the assistant, each turn
    prefixed with its session date and speaker."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out: list[Conversation] = []
    for item in data:
        conv = item["conversation"]
        a, b = conv["speaker_a"], conv["speaker_b"]
        messages: list[Message] = []
        index: dict[str, int] = {}
        n = 1
        while f"session_{n}" in conv:
            date = conv.get(f"session_{n}_date_time", "")
            for turn in conv[f"session_{n}"]:
                role: Role = "user" if turn["speaker"] == a else "assistant"
                text = f"[{date}] {turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    text += f" [shares a photo: {turn['blip_caption']}]"
                index[turn["dia_id"]] = len(messages)
                messages.append(Message(role=role, content=text))
            n += 1
        del b
        out.append(
            Conversation(
                name=item.get("sample_id", f"locomo-{len(out)}"),
                messages=messages,
                qa=item.get("qa", []),
                turn_index=index,
            )
        )
    return out
