"""The hook implementations by which the plugin extends the host itself rather than its turns:
CLI commands (``summary``, ``compress``, ``rebuild``, ``pin``, ``replay``, ``demo``), chat
commands and its generated docs. They are a plugin of their own (entry point
``memory-summary-extras``), so the plugin proper imports no CLI library and nothing of the host's
runtime. The host knows none of them by name; each module is imported when its hook is called.

The commands and the chat find the plugin's instance (and through it its config) in the host
they run on, by its name: a host that leaves the plugin out gets the commands' one-line refusal
and no chat commands.
"""

from __future__ import annotations

import logging
from typing import Any

from host_stub.hookspecs import ChatCommand, DocsSection, hookimpl
from host_stub.services import HostProtocol

from .._name import EXTRAS_NAME, PLUGIN_NAME

__all__ = ["HostExtensions"]


class _ShownByTheCommand(logging.Filter):
    """In ``host-stub`` without ``-v``, a summarizer failure is announced by its compression line
    (``... failed, fallback rules: <why>``) or the command's status line; the plugin's warning
    would say it twice. Outside a ``host-stub`` command every line passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("summarizer failed"):
            return True
        import click

        ctx = click.get_current_context(silent=True)
        obj = ctx.find_root().obj if ctx is not None else None
        return not (isinstance(obj, dict) and obj.get("verbose") == 0)


_SHOWN_BY_THE_COMMAND = _ShownByTheCommand()


class HostExtensions:
    """One instance per host (the entry point names ``extras.create_extension``): the hooks that
    extend the host's CLI, chat and docs."""

    name = EXTRAS_NAME

    def __init__(self) -> None:
        self._host: HostProtocol | None = None

    @hookimpl
    def startup(self, host: HostProtocol) -> None:
        self._host = host

    def plugin(self) -> Any:
        """The plugin's instance in the host this extension started with; ``None`` before
        ``startup`` or when the host left the plugin out."""
        if self._host is None:
            return None
        try:
            return self._host.get_plugin(PLUGIN_NAME)
        except LookupError:
            return None

    @hookimpl
    def register_commands(self, cli: Any, open_host: Any) -> None:
        from .commands import register
        from .report.commands import register as register_showcase

        log = logging.getLogger("plugin_memory_summary")
        if _SHOWN_BY_THE_COMMAND not in log.filters:
            log.addFilter(_SHOWN_BY_THE_COMMAND)
        register(cli, open_host)
        register_showcase(cli, open_host)

    @hookimpl
    def docs_sections(self) -> list[DocsSection]:
        from .docs import docs_sections

        return docs_sections()

    @hookimpl
    def chat_commands(self, session_id: str, notify: Any) -> list[ChatCommand]:
        plugin = self.plugin()
        if plugin is None:
            return []
        from .chat import chat_commands

        return chat_commands(plugin, session_id, notify)
