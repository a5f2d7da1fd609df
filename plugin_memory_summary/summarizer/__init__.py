"""The summarizer: from a batch of messages to a new payload. ``summarize`` runs it: the
transcript (``transcript``) and the request (``prompts``) go to the model, sized to its speed
(``speed``); its answer is read (``parsing``, ``answers``) and merged into the previous summary
by the rules engine (``rules``, with ``turns``, ``excerpts`` and the action ``ledger``), which
also summarizes alone when no model can.

Only the light parts load with the plugin (the speed book, the transcript renderer, the warm-up);
the rest is imported on first use, by the first compression, so a host that only injects an
existing summary never loads it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .speed import BUSY, GAVE_UP, ModelBusy, SpeedBook, SummarizerCalls
from .transcript import render_transcript, transcript_lang
from .warm import warm_up

if TYPE_CHECKING:
    from .ledger import held_ids
    from .prompts import detect_language
    from .summarize import SummarizeOutcome, summarize_batches

#: Names whose module is imported on first use.
_LAZY = {
    "SummarizeOutcome": "summarize",
    "detect_language": "prompts",
    "held_ids": "ledger",
    "summarize_batches": "summarize",
}

__all__ = [
    "BUSY",
    "GAVE_UP",
    "ModelBusy",
    "SpeedBook",
    "SummarizeOutcome",
    "SummarizerCalls",
    "detect_language",
    "held_ids",
    "render_transcript",
    "summarize_batches",
    "transcript_lang",
    "warm_up",
]


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
