"""The plugin's names, in a module that imports nothing: the host-facing extras name the plugin
without importing it."""

__all__ = ["EXTRAS_NAME", "PLUGIN_NAME"]

#: The plugin's entry-point name in ``host_stub.plugins``, and its ``[plugin.<name>]`` table.
PLUGIN_NAME = "memory-summary"
#: The entry-point name of the host-facing extras (CLI and chat commands, docs section).
EXTRAS_NAME = "memory-summary-extras"
