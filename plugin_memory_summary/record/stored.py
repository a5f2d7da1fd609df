"""The summary record stored under the memory service's ``summary`` namespace."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from host_stub.services import MetadataEntry

from .fitting import render_payload
from .summary_model import SummaryPayload

__all__ = [
    "SCHEMA_VERSION",
    "SummaryRecord",
    "build_record",
    "dump_record",
    "read_record",
    "with_pinned",
    "with_text",
    "without_pinned",
]

SCHEMA_VERSION = 1


class SummaryRecord(BaseModel):
    """One record per session. Its version is the metadata entry's version (compare-and-set)."""

    # Its validator is built on first use, not at import.
    model_config = ConfigDict(extra="ignore", defer_build=True)

    schema_version: int = SCHEMA_VERSION
    text: str = ""
    payload: SummaryPayload = Field(default_factory=SummaryPayload)
    lang: str = "en"
    covered_up_to_seq: int = 0
    epoch: int = 0
    #: Last seq of the history when the compression ran: debounce counts user turns after it.
    compressed_at_seq: int = 0
    messages_summarized: int = 0
    compressions: int = 0
    model: str | None = None
    cost: float = 0.0
    fallback: str | None = None
    #: A covered message was deleted or edited: the record must be rebuilt.
    stale: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0


def read_record(entry: MetadataEntry | None, epoch: int | None = None) -> SummaryRecord | None:
    """The record of a metadata entry; ``None`` if never written, deleted, of another epoch or
    unreadable (a broken record is treated as absent, never as a crash)."""
    if entry is None or entry.deleted or entry.value is None:
        return None
    try:
        record = SummaryRecord.model_validate(entry.value)
    except ValidationError:
        return None
    if epoch is not None and record.epoch != epoch:
        return None
    return record


def dump_record(record: SummaryRecord) -> dict[str, Any]:
    return record.model_dump(mode="json")


def build_record(
    previous: SummaryRecord | None,
    payload: SummaryPayload,
    *,
    lang: str,
    covered_up_to_seq: int,
    epoch: int,
    compressed_at_seq: int,
    messages_summarized: int,
    compressions: int,
    model: str | None = None,
    cost: float = 0.0,
    fallback: str | None = None,
    text: str | None = None,
) -> SummaryRecord:
    """The record a compression or a rebuild writes (``text`` defaults to the rendering)."""
    now = time.time()
    return SummaryRecord(
        text=render_payload(payload, lang) if text is None else text,
        payload=payload,
        lang=lang,
        covered_up_to_seq=covered_up_to_seq,
        epoch=epoch,
        compressed_at_seq=compressed_at_seq,
        messages_summarized=messages_summarized,
        compressions=compressions,
        model=model,
        cost=cost,
        fallback=fallback,
        created_at=previous.created_at if previous else now,
        updated_at=now,
    )


# -- changes a user makes (pure; ``Pipeline.update_record`` writes them) -----------------------
def with_text(record: SummaryRecord, text: str) -> SummaryRecord:
    """The summary's prose replaced; the structured fields and pinned facts stay."""
    return _with_payload(record, record.payload.model_copy(update={"summary": text}))


def with_pinned(record: SummaryRecord, fact: str) -> SummaryRecord:
    """``fact`` pinned: every later merge keeps it verbatim."""
    pinned = list(dict.fromkeys([*record.payload.pinned_facts, fact]))
    return _with_payload(record, record.payload.model_copy(update={"pinned_facts": pinned}))


def without_pinned(record: SummaryRecord, fact: str) -> SummaryRecord:
    pinned = [f for f in record.payload.pinned_facts if f != fact]
    return _with_payload(record, record.payload.model_copy(update={"pinned_facts": pinned}))


def _with_payload(record: SummaryRecord, payload: SummaryPayload) -> SummaryRecord:
    return record.model_copy(
        update={"payload": payload, "text": render_payload(payload, record.lang)}
    )
