"""The message model every part of the host and its plugins share.

Messages are OpenAI-shaped (role, content, tool_calls, tool_call_id, name) plus what the store
adds: a per-session ``seq``, a ``kind`` (a real message or an event marker), the token count taken
once at append time, the archive reason once archived, and free metadata.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ArchiveReason",
    "Message",
    "MessageKind",
    "Role",
    "ToolCall",
    "ToolCallFunction",
    "clone_model",
    "scrub_surrogates",
    "text_of",
    "tool_groups",
]

Role = Literal["system", "user", "assistant", "tool"]
MessageKind = Literal["message", "event-marker"]
#: Why a message left the active history. ``summarized`` is the only reason that promises the
#: summary record covers it; the others are explicit strategies, fallbacks or user actions.
ArchiveReason = Literal["summarized", "window", "fallback-trim", "cleared", "deleted"]

_M = TypeVar("_M", bound=BaseModel)


def scrub_surrogates(text: str) -> str:
    """Text every store and model can encode: a surrogate pair written as two code points is
    joined, a lone surrogate becomes U+FFFD (JSON may spell one: ``"\\ud800"``).

    Every message is checked when it is made and when it is stored: ASCII text (most tool
    output) is passed at once; other text is checked by the UTF-8 codec, which refuses
    surrogates and nothing else (a regular expression search took 100 times as long)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return scrub_surrogates(value)
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    return value


# Every model here builds its validator on first use, not at import (``defer_build``): importing
# the contracts stays cheap for a plugin that is loaded but not yet called.
class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    name: str
    arguments: str = ""

    @field_validator("name", "arguments", mode="before")
    @classmethod
    def _encodable(cls, value: Any) -> Any:
        return _scrub(value)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(BaseModel):
    """One chat message as stored and as sent (without the store's fields) to a model."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    role: Role
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    # Set by the store.
    seq: int | None = None
    kind: MessageKind = "message"
    tokens: int | None = None
    epoch: int | None = None
    archived: ArchiveReason | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("content", "name", "tool_call_id", "metadata", mode="before")
    @classmethod
    def _encodable(cls, value: Any) -> Any:
        return _scrub(value)

    def to_openai(self) -> dict[str, Any]:
        """The message as an OpenAI-format dict, without the store's own fields."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump(exclude_none=True) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @property
    def is_marker(self) -> bool:
        return self.kind == "event-marker"


def text_of(content: str | list[dict[str, Any]] | None) -> str:
    """The text parts of a message's content joined; non-text parts become ``[<kind>]``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        kind = str(part.get("type", "unknown"))
        if kind == "text":
            parts.append(str(part.get("text", "")))
        elif kind in ("image_url", "input_image", "image"):
            parts.append("[image]")
        else:
            parts.append(f"[{kind}]")
    return "\n".join(parts)


def tool_groups(messages: list[Message]) -> list[tuple[int, int, bool]]:
    """Tool-call groups by position: ``(start, end, complete)`` for each assistant message with
    tool calls at ``start``, followed by the contiguous tool results up to ``end`` (exclusive).
    ``complete`` is True when every call has exactly its result there. Pairing is positional, as
    the chat APIs require, so a call id reused later in the conversation pairs correctly."""
    groups: list[tuple[int, int, bool]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role == "assistant" and m.tool_calls:
            end = i + 1
            while end < len(messages) and messages[end].role == "tool":
                end += 1
            wanted = [c.id for c in m.tool_calls]
            got = [str(r.tool_call_id) for r in messages[i + 1 : end]]
            complete = len(wanted) == len(got) and (wanted == got or sorted(wanted) == sorted(got))
            groups.append((i, end, complete))
            i = end
        else:
            i += 1
    return groups


_new = object.__new__
_set = object.__setattr__


def clone_model(model: _M, update: dict[str, Any] | None = None) -> _M:
    """A shallow copy of a pydantic model, ``update`` (declared fields) set on it, not
    validated: what ``model.model_copy(update=update)`` gives (its own field dict, set of fields
    set, extras and private attributes), without its generic dispatch. A store copies every
    active message at each read; those copies were most of an in-memory prompt build."""
    new = _new(type(model))
    fields = model.__dict__.copy()
    fields_set = model.__pydantic_fields_set__.copy()
    if update:
        fields.update(update)
        fields_set.update(update)
    extra, private = model.__pydantic_extra__, model.__pydantic_private__
    _set(new, "__dict__", fields)
    _set(new, "__pydantic_fields_set__", fields_set)
    _set(new, "__pydantic_extra__", None if extra is None else extra.copy())
    _set(new, "__pydantic_private__", None if private is None else private.copy())
    return new
