"""The host's signals: one name each, and the pydantic model of its payload.

Receivers are called as ``receiver(sender, **payload)`` where ``sender`` is the host; they should
accept ``**extra`` so new payload keys break nobody. Each host has its own blinker ``Namespace``
(see :class:`host_stub.bus.EventBus`).

Signals are for observers: the host ignores what a receiver returns. Whatever answers the host
(clearing a plugin's memory types, say) is a hook (:mod:`host_stub.hookspecs`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .messages import Message

__all__ = [
    "AGENT_TURN_AFTER",
    "MEMORY_MESSAGES_DELETED",
    "PAYLOADS",
    "SESSION_COMPRESS",
    "SESSION_COMPRESSING",
    "TOKEN_USAGE",
    "AgentTurnAfter",
    "MemoryMessagesDeleted",
    "SessionCompress",
    "SessionCompressing",
    "TokenBreakdown",
    "TokenUsage",
]

AGENT_TURN_AFTER = "agent:turn:after"
TOKEN_USAGE = "token:usage"
SESSION_COMPRESS = "session:compress"
SESSION_COMPRESSING = "session:compressing"
MEMORY_MESSAGES_DELETED = "memory:messages-deleted"


class _Payload(BaseModel):
    # Every payload model builds its validator on the first send, not at import.
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, defer_build=True)


class AgentTurnAfter(_Payload):
    """Sent after every turn, streaming or not."""

    session_id: str
    model: str
    outcome: Literal["replied", "silent", "aborted", "error"]
    message: Message | None = None
    reply: Message | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class TokenBreakdown(_Payload):
    system: int = 0
    summary: int = 0
    history: int = 0
    tools: int = 0
    tool_defs: int = 0
    reserved_for_reply: int = 0


class TokenUsage(_Payload):
    """Sent by the agent loop before each of its model calls (never for a summarizer's calls).
    ``used`` is the sum of the breakdown, reply reserve included; ``usage_ratio = used /
    context_window``. Counts are the host's; ``calibration`` is the provider's prompt tokens per
    host token for this model, and ``context_window`` (and the reply reserve) are the model's,
    divided by it, so ``usage_ratio`` is the provider's usage.

    ``message_tokens`` are the prompt's messages, each counted as the host counts a stored
    message (tool definitions left out); ``reused_tokens`` how many of them open the prompt
    exactly as the previous prompt the host sent in this session opened (what a provider's
    prompt cache could reuse; ``None`` when there was none). Both are set on the agent loop's
    calls only."""

    session_id: str
    model: str
    context_window: int
    used: int
    usage_ratio: float
    breakdown: TokenBreakdown
    summary_version: int = 0
    dry_run: bool = False
    rebuilt: bool = False
    calibration: float = 1.0
    message_tokens: int = 0
    reused_tokens: int | None = None


class SessionCompress(_Payload):
    """A user, an API call or a plugin asks for compression."""

    request_id: str
    session_id: str
    reason: Literal["manual", "auto", "hard"] = "manual"
    usage_ratio: float | None = None


class SessionCompressing(_Payload):
    """Progress of a compression request; every request id gets exactly one final status
    (``done``, ``error`` or ``skipped``) after an optional ``start``."""

    request_id: str
    session_id: str
    status: Literal["start", "done", "error", "skipped"]
    reason: str = ""
    stats: dict[str, Any] = Field(default_factory=dict)


class MemoryMessagesDeleted(_Payload):
    """Messages were deleted or edited (a rollback)."""

    session_id: str
    seqs: list[int]


PAYLOADS: dict[str, type[BaseModel]] = {
    AGENT_TURN_AFTER: AgentTurnAfter,
    TOKEN_USAGE: TokenUsage,
    SESSION_COMPRESS: SessionCompress,
    SESSION_COMPRESSING: SessionCompressing,
    MEMORY_MESSAGES_DELETED: MemoryMessagesDeleted,
}
