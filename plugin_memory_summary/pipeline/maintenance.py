"""Records changed outside a compression: a rebuild from the archive, a summary marked stale
when covered messages were deleted, and a user's edits."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from host_stub.messages import text_of
from host_stub.services import SUMMARY_NAMESPACE, MemoryService

from ..base import conversation_messages, core_tokens, split_batches
from ..record import SummaryPayload, SummaryRecord, build_record, dump_record, read_record
from .pipeline import Pipeline

__all__ = ["Rebuilt", "mark_stale", "rebuild", "update_record"]


@dataclass(frozen=True)
class Rebuilt:
    """What ``rebuild`` did: nothing to rebuild from, a committed record, or a lost
    compare-and-set."""

    status: Literal["empty", "committed", "lost"]
    messages: int = 0


async def rebuild(pipeline: Pipeline, session_id: str) -> Rebuilt:
    """Re-summarize the archived (summarized) messages of the current epoch into a fresh record;
    pinned facts stay. The caller compresses the active history afterwards."""
    from ..summarizer import detect_language, summarize_batches

    memory, tokens = pipeline.memory, pipeline.tokens
    snap = await memory.snapshot(session_id)
    record = read_record(snap.record, snap.epoch)
    archived = conversation_messages(
        [
            m
            for m in await memory.get_archived(session_id, epoch=snap.epoch)
            if m.archived == "summarized"
        ]
    )
    if record is None and not archived:
        return Rebuilt("empty")  # nothing summarized yet: only history to compress
    payload = SummaryPayload(pinned_facts=record.payload.pinned_facts if record else [])
    state = pipeline.sessions.peek(session_id)
    budget = tokens.budget(
        pipeline.context_window(session_id),
        state.breakdown if state is not None else None,
        core_tokens(snap.messages),
    )
    lang = record.lang if record else detect_language(text_of(m.content) for m in archived[-40:])
    if archived:
        outcome = await summarize_batches(
            payload,
            split_batches(archived, tokens.batch_tokens(budget)),
            llm=pipeline.llm,
            model=tokens.summary_model(),
            config=pipeline.config,
            budget=budget,
            lang=lang,
            redactor=pipeline.redactor,
            count_tokens=tokens.count,
            text_budget=budget - tokens.framing_tokens(lang),
            speed=tokens.speed,
        )
        payload = outcome.payload
    covered = max([record.covered_up_to_seq if record else 0, *[m.seq or 0 for m in archived]])
    new = build_record(
        record,
        payload,
        lang=lang,
        covered_up_to_seq=covered,
        epoch=snap.epoch,
        compressed_at_seq=record.compressed_at_seq if record else 0,
        messages_summarized=len(archived),
        compressions=record.compressions if record else 0,
        text=None if archived or payload.pinned_facts else "",
    )
    won = await memory.commit_compression(
        session_id,
        dump_record(new),
        expected_version=snap.record.version if snap.record else 0,
        archive_through_seq=covered,
        epoch=snap.epoch,
    )
    tokens.forget_blocks()
    return Rebuilt("committed", len(archived)) if won else Rebuilt("lost")


async def mark_stale(memory: MemoryService, session_id: str, seqs: Sequence[int]) -> bool:
    """Mark the summary stale when it covers one of ``seqs`` (deleted or edited messages);
    whether it did (then it must be rebuilt)."""
    for _ in range(3):
        snap = await memory.snapshot(session_id)
        record = read_record(snap.record, snap.epoch)
        if snap.record is None or record is None or not seqs:
            return False
        if min(seqs) > record.covered_up_to_seq:
            return False
        record = record.model_copy(update={"stale": True, "updated_at": time.time()})
        version = await memory.save_metadata(
            SUMMARY_NAMESPACE, session_id, dump_record(record), expected_version=snap.record.version
        )
        if version is not None:
            return True
    return False


async def update_record(
    memory: MemoryService, session_id: str, change: Callable[[SummaryRecord], SummaryRecord]
) -> SummaryRecord:
    """Read-modify-write of the record with compare-and-set, retried on a concurrent write."""
    for _ in range(10):
        snap = await memory.snapshot(session_id)
        record = read_record(snap.record, snap.epoch) or SummaryRecord(
            epoch=snap.epoch, created_at=time.time()
        )
        updated = change(record).model_copy(update={"updated_at": time.time()})
        version = await memory.save_metadata(
            SUMMARY_NAMESPACE,
            session_id,
            dump_record(updated),
            expected_version=snap.record.version if snap.record else 0,
        )
        if version is not None:
            return updated
    raise RuntimeError(f"summary of {session_id} kept changing; edit not saved")
