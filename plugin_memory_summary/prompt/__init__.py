"""What the plugin puts into each prompt, and what it costs: the summary block and the plugin's
token counts and budgets (``tokens``), tier 1's replacements of old tool results (``pruning``),
both fitted to the window once per prompt (``prompt_fit``, ``contribution``), the per-session
numbers kept between turns (``state``), and the memory context for hosts that assemble their
own prompt (``context``). Nothing here runs a compression: the per-turn path reads a stored
record only."""

from __future__ import annotations

from .context import MemoryContext, memory_context
from .contribution import PromptSources, fitted_replacements, summary_contribution
from .pruning import configured_replacements, pruned_costs
from .state import MAX_TRACKED_SESSIONS, SessionState, SessionTable
from .tokens import TokenBook

__all__ = [
    "MAX_TRACKED_SESSIONS",
    "MemoryContext",
    "PromptSources",
    "SessionState",
    "SessionTable",
    "TokenBook",
    "configured_replacements",
    "fitted_replacements",
    "memory_context",
    "pruned_costs",
    "summary_contribution",
]
