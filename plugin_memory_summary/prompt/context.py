"""The parts of a session's memory, for callers that assemble their own prompt."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from host_stub.services import Snapshot

from ..base import MemorySummaryConfig, conversation_messages
from ..record import SummaryPayload, read_record
from ..safety import neutralise
from ..summarizer import render_transcript, transcript_lang

__all__ = ["MemoryContext", "memory_context"]


class MemoryContext(BaseModel):
    """The summary, its structured payload and the recent transcript of one session. The
    summary's chat-template tokens, role headers and block delimiters are made inert as in the
    injected block (``safety.neutralise``)."""

    model_config = ConfigDict(defer_build=True)  # built on first use, not at import

    session_id: str
    summary: str | None
    payload: SummaryPayload | None
    recent_transcript: str
    covered_up_to_seq: int
    summary_version: int
    active_messages: int


def memory_context(
    snap: Snapshot, config: MemorySummaryConfig, recent: int | None = None
) -> MemoryContext:
    """The memory context of a snapshot; ``recent``: how many active messages to render."""
    record = read_record(snap.record, snap.epoch)
    conv = conversation_messages(snap.messages)
    shown = conv if recent is None else conv[-recent:]
    return MemoryContext(
        session_id=snap.session_id,
        summary=neutralise(record.text) if record else None,
        payload=record.payload if record else None,
        recent_transcript=render_transcript(
            shown,
            tool_truncate_chars=config.tool_truncate_chars,
            message_truncate_chars=config.message_truncate_chars,
            lang=transcript_lang(record.lang) if record else "en",
        ),
        covered_up_to_seq=record.covered_up_to_seq if record else 0,
        summary_version=snap.record.version if snap.record else 0,
        active_messages=len(conv),
    )
