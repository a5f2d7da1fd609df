"""What the agent can recall of the archive: the ``memory_search`` and ``memory_expand`` tools
(``tools``), added to the agent's tool loop through ``agent_tools``. Imported when the host asks
for the tools, not with the plugin."""

from __future__ import annotations

from .tools import EXPAND_TOOL, SEARCH_TOOL, recall_tools

__all__ = ["EXPAND_TOOL", "SEARCH_TOOL", "recall_tools"]
