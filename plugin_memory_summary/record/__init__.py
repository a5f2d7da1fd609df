"""The summary record: its structured payload (``summary_model``), the record as stored in the
host's metadata (``stored``), and how a payload is rendered to text within a token budget
(``fitting``, with the action ledger's sentences from ``ledger_text``)."""

from __future__ import annotations

from .fitting import (
    PayloadFitter,
    apply_caps,
    fit_lines,
    fit_to_budget,
    render_payload,
    says,
    unique_entries,
)
from .ledger_text import ledger_lines, lookup_lines, tool_words
from .stored import (
    SummaryRecord,
    build_record,
    dump_record,
    read_record,
    with_pinned,
    with_text,
    without_pinned,
)
from .summary_model import (
    Excerpt,
    InProgressTask,
    LedgerEntry,
    SummaryPayload,
    TimelineEvent,
    copy_payload,
    group_sources,
    identifier_rank,
    source_tier,
    sources_of,
    stronger_source,
)

__all__ = [
    "Excerpt",
    "InProgressTask",
    "LedgerEntry",
    "PayloadFitter",
    "SummaryPayload",
    "SummaryRecord",
    "TimelineEvent",
    "apply_caps",
    "build_record",
    "copy_payload",
    "dump_record",
    "fit_lines",
    "fit_to_budget",
    "group_sources",
    "identifier_rank",
    "ledger_lines",
    "lookup_lines",
    "read_record",
    "render_payload",
    "says",
    "source_tier",
    "sources_of",
    "stronger_source",
    "tool_words",
    "unique_entries",
    "with_pinned",
    "with_text",
    "without_pinned",
]
