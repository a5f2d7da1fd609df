"""The summary record stored under the memory service's ``summary`` namespace."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from host_stub.services import MetadataEntry

from .summary_model import SummaryPayload

__all__ = ["SCHEMA_VERSION", "SummaryRecord", "read_record"]

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
