"""plugin-memory-summary: summarizes the older part of a conversation, archives what the
summary covers, and puts the summary back into the prompt.

The host loads it through the ``host_stub.plugins`` entry point ``memory-summary``, which names
:func:`create_plugin`, so every host gets its own instance. The host-facing extras (the
``host-stub`` and chat commands, the docs section) are a plugin of their own, :mod:`.extras`,
behind a second entry point, ``memory-summary-extras``. The subpackages are layers (``base``,
``record``, ``safety``, ``summarizer``, ``prompt`` and ``recall``, ``pipeline``, then
:mod:`.plugin` and ``extras``); docs/architecture.md has the map.
"""

from __future__ import annotations

from ._name import PLUGIN_NAME
from .base import MemorySummaryConfig, PayloadCaps, Result, Status
from .plugin import MemorySummaryPlugin
from .prompt import MemoryContext
from .record import SummaryPayload, SummaryRecord

__all__ = [
    "PLUGIN_NAME",
    "__version__",
    "MemoryContext",
    "MemorySummaryConfig",
    "MemorySummaryPlugin",
    "PayloadCaps",
    "Result",
    "Status",
    "SummaryPayload",
    "SummaryRecord",
    "create_plugin",
]


def __getattr__(name: str) -> str:
    """``__version__``: the installed distribution's, whose one source is pyproject.toml."""
    if name == "__version__":
        from importlib.metadata import version

        return version("plugin-memory-summary")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def create_plugin() -> MemorySummaryPlugin:
    """Entry-point factory: a fresh plugin instance for one host."""
    return MemorySummaryPlugin()
