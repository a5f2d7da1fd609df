"""Hook implementations by which the plugin extends the host itself rather than its turns: CLI
commands (``summary``, ``compress``, ``rebuild``, ``pin``, ``replay``, ``demo``), chat commands,
the models it calls (for the CLI's pre-flight check) and its generated docs. The host knows none
of them by name; each module is imported when its hook is called."""

from __future__ import annotations

import logging
from typing import Any

from host_stub.hookspecs import ChatCommand, DocsSection, hookimpl

from .config import MemorySummaryConfig

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
    """Mixed into the plugin class: the hooks that extend the host's CLI, chat and docs."""

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
    def plugin_models(self, config: MemorySummaryConfig, default_model: str | None) -> list[str]:
        model = config.summary_model or default_model
        return [model] if model else []

    @hookimpl
    def docs_sections(self) -> list[DocsSection]:
        from .docs import docs_sections

        return docs_sections()

    @hookimpl
    def chat_commands(self, session_id: str, notify: Any) -> list[ChatCommand]:
        from .chat import chat_commands

        return chat_commands(self, session_id, notify)  # type: ignore[arg-type]
