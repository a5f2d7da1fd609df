"""The compression: ``pipeline`` runs one attempt as named steps (plan, summarize, build the
record, commit, report); ``scheduler`` runs the attempts (single flight per session, the global
cap with the summarizer ``slot``, the cross-process ``lease``, every task the plugin starts) and
knows nothing of how one is done; ``watermark`` compresses, blocking, before a model call past
the hard mark; ``maintenance`` edits, marks stale and rebuilds records; ``parts`` bundles what
``startup`` builds."""

from __future__ import annotations

from .maintenance import mark_stale, rebuild, update_record
from .parts import NotStartedError, Parts
from .pipeline import Pipeline
from .scheduler import LEASE_BUSY, LEASE_LOST, Scheduler
from .watermark import compress_before_call

__all__ = [
    "LEASE_BUSY",
    "LEASE_LOST",
    "NotStartedError",
    "Parts",
    "Pipeline",
    "Scheduler",
    "compress_before_call",
    "mark_stale",
    "rebuild",
    "update_record",
]
