"""The lowest layer: the config model, the result type, the pure decisions (when to compress,
what to cut, how big the batches and the budget are) and small text utilities (cutting and
collapsing text, lazily compiled patterns, remembered functions, the identifier scanner). It
imports nothing of the plugin's other packages, and of the host only its message contract.

The identifier scanner loads on first use: a host that only injects an existing summary never
needs it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .config import DEFAULT_READ_ONLY_TOOLS, MemorySummaryConfig, PayloadCaps
from .decisions import (
    CompressionPlan,
    after_compression,
    conversation_messages,
    core_tokens,
    counters_after_run,
    fixed_tokens,
    hard_triggered,
    plan_compression,
    soft_triggered,
    split_batches,
    summary_budget,
    summary_growth,
    tail_room_cap,
    turn_triggered,
)
from .memo import remembered
from .patterns import LazyRegex, lazy_regex, validate_patterns
from .results import LOST_RACE, Result, Status, result
from .text import ELLIPSIS, collapse_whitespace, cut_middle, cut_text, sentences

if TYPE_CHECKING:
    from .identifiers import extract_identifiers, reads_as_number

#: Names whose module is imported on first use.
_LAZY = {"extract_identifiers": "identifiers", "reads_as_number": "identifiers"}

__all__ = [
    "DEFAULT_READ_ONLY_TOOLS",
    "ELLIPSIS",
    "LOST_RACE",
    "CompressionPlan",
    "LazyRegex",
    "MemorySummaryConfig",
    "PayloadCaps",
    "Result",
    "Status",
    "after_compression",
    "collapse_whitespace",
    "conversation_messages",
    "core_tokens",
    "counters_after_run",
    "cut_middle",
    "cut_text",
    "extract_identifiers",
    "fixed_tokens",
    "hard_triggered",
    "lazy_regex",
    "plan_compression",
    "reads_as_number",
    "remembered",
    "result",
    "sentences",
    "soft_triggered",
    "split_batches",
    "summary_budget",
    "summary_growth",
    "tail_room_cap",
    "turn_triggered",
    "validate_patterns",
]


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
