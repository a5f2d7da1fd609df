"""host_stub: the contracts of a chat-agent host (hooks, signals, services, messages) and a
small reference runtime that implements them.

The contract modules (:mod:`.hookspecs`, :mod:`.signals`, :mod:`.services`, :mod:`.messages`)
import only pluggy, blinker and pydantic; their models build their validators on first use
(``defer_build``), not at import. litellm is imported lazily, on the first model call or token
count, never at import time.
"""

from __future__ import annotations

from .hookspecs import ENTRY_POINT_GROUP, Contribution, PromptView, hookimpl, hookspec
from .messages import Message, ToolCall, ToolCallFunction
from .services import (
    Completion,
    LLMService,
    MemoryService,
    MessageArchiveService,
    MetadataEntry,
    Snapshot,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Completion",
    "Contribution",
    "LLMService",
    "MemoryService",
    "Message",
    "MessageArchiveService",
    "MetadataEntry",
    "PromptView",
    "Snapshot",
    "ToolCall",
    "ToolCallFunction",
    "hookimpl",
    "hookspec",
]
