"""``host-stub chat``: lines read from the terminal, the log lines held while a reply streams,
the chat's slash commands and the plugins' (``chat_commands``), and the turn loop. The ``chat``
command in :mod:`host_stub.cli` checks the config, opens the host and runs :func:`chat_loop`."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from .bus import await_me_maybe
from .config import ConfigError
from .hookspecs import ChatCommand
from .host import Host
from .services import SearchHit

__all__ = [
    "CHAT_COMMANDS",
    "CHAT_SETTLE_S",
    "SEARCH_LIMIT",
    "HeldLogLines",
    "ModelUnusable",
    "TurnErrorsShownByChat",
    "chat_commands",
    "chat_help",
    "chat_loop",
    "chat_status",
    "error_line",
    "one_line",
    "resume_notice",
    "search_line",
    "search_snippet",
]


class ModelUnusable(Exception):
    """The chat's first turn failed: the model cannot be used (its one-line reason)."""


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (whitespace runs made one space), at most ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def error_line(text: str) -> str:
    """A provider error in one line, without litellm's repeated prefixes
    (``AuthenticationError: litellm.AuthenticationError: AuthenticationError: ...``)."""
    parts: list[str] = []
    for part in " ".join(str(text).split()).split(": "):
        part = part.removeprefix("litellm.")
        if not parts or parts[-1] != part:
            parts.append(part)
    return one_line(": ".join(parts))


#: Matches ``search`` and ``/search`` show unless told otherwise.
SEARCH_LIMIT = 10


def search_snippet(text: str, query: str, width: int = 160) -> str:
    """``text`` on one line, at most ``width`` characters (plus ``…`` marks), from a little before
    the first query word it holds (case-insensitive), or from its start."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    low = flat.casefold()
    words = "".join(c if c.isalnum() else " " for c in query.casefold()).split()
    found = [p for p in (low.find(w) for w in words if len(w) > 1) if p >= 0]
    start = min(max(0, min(found) - width // 4), len(flat) - width) if found else 0
    piece = flat[start : start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(flat) else "")


def search_line(hit: SearchHit, query: str) -> str:
    """``#12 user, archived, 2025-04-03 09:30: ...the snippet...``"""
    from .memory.search_plan import search_text

    message = hit.message
    status = "active" if message.archived is None else "archived"
    date = "" if hit.stored_at is None else f", {hit.stored_at:%Y-%m-%d %H:%M}"
    snippet = search_snippet(search_text(message), query)
    return f"#{message.seq} {message.role}, {status}{date}: {snippet}"


class TurnErrorsShownByChat(logging.Filter):
    """``chat`` prints a failed turn itself, in one line; the host's log line would repeat it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("turn failed")


class HeldLogLines(logging.Filter):
    """Log records wait while a reply streams and are printed after it: a line printed inside
    the reply would split it (``assistant> WARNING ...``). Attached to the root logger's
    handlers by :meth:`attach`."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if self.holding:
            if not any(record is r for r in self.held):  # each handler asks once
                self.held.append(record)
            return False
        return True

    def attach(self) -> list[logging.Handler]:
        handlers = list(logging.getLogger().handlers)
        for handler in handlers:
            handler.addFilter(self)
        return handlers

    def release(self, handlers: Sequence[logging.Handler]) -> None:
        """Stop holding and print what was held, through ``handlers``, in order."""
        self.holding = False
        held, self.held = self.held, []
        for record in held:
            for handler in handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)


def _line_editor() -> Any:
    """The ``readline`` module when standard input and output are a terminal (line editing, and
    Up / Down for the lines typed before), else ``None``."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return None
    try:
        import readline
    except ImportError:  # pragma: no cover - Python built without it
        return None
    return readline


class _Lines:
    """Lines of standard input read by a daemon thread, so a blocked read never keeps the
    process alive (Ctrl-C, or leaving while a background compression finishes). On a terminal
    the thread reads with ``readline`` (line editing and history, prompt included); otherwise
    it reads plain lines."""

    def __init__(self) -> None:
        import threading

        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._editor = _line_editor()
        self._prompts: Any = None
        if self._editor is not None:
            import queue

            self._prompts = queue.SimpleQueue()
            target = self._read_edited
        else:
            target = self._read
        threading.Thread(target=target, name="host-stub-stdin", daemon=True).start()

    def _read(self) -> None:
        try:
            for line in sys.stdin:
                if not self._put(line.rstrip("\r\n")):
                    return
        except (OSError, ValueError):
            pass
        self._put(None)

    def _read_edited(self) -> None:
        """One ``input(prompt)`` per prompt asked for: readline draws the prompt, edits the
        line and keeps it in the history."""
        while True:
            prompt = self._prompts.get()
            try:
                line: str | None = input(prompt)
            except (EOFError, OSError, ValueError):
                line = None
            if not self._put(line) or line is None:
                return

    def _put(self, line: str | None) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, line)
        except RuntimeError:  # the chat is over and its loop closed
            return False
        return True

    async def next(self, prompt: str) -> str | None:
        if self._prompts is not None:
            self._prompts.put(prompt)
        else:
            click.echo(prompt, nl=False)
        return await self._queue.get()


#: The chat's own commands, as ``/help`` lists them; plugins add theirs (``chat_commands``).
CHAT_COMMANDS = {
    "/search": "search this session's messages, archived ones too: /search QUERY",
    "/clear": "clear the session's memory (its history, and what plugins keep)",
    "/help": "list these commands",
    "/quit": "leave (Ctrl-D too); the session stays stored",
}


def chat_help(added: Sequence[ChatCommand] = ()) -> str:
    """What ``/help`` prints: the plugins' commands, then the chat's own."""
    lines = ["commands:"]
    lines += [f"  {c.name:<10} {c.help}" for c in added]
    lines += [f"  {name:<10} {what}" for name, what in CHAT_COMMANDS.items()]
    lines.append("  anything else is sent to the model; Up and Down recall earlier lines")
    return "\n".join(lines)


def resume_notice(session_id: str, active: int, archived: int, summarized: bool) -> str | None:
    """The line that says a chat goes on with a stored session; ``None`` for a new one."""
    if not active and not archived:
        return None
    total = active + archived
    detail = f"{active} active"
    if archived:
        detail += f", {archived} archived" + (" into the summary" if summarized else "")
    return (
        f"resuming session {session_id!r} with {total} message{'' if total == 1 else 's'} "
        f"({detail}); /clear starts it afresh"
    )


async def chat_commands(
    host: Host, session_id: str, notify: Callable[[str], None]
) -> dict[str, ChatCommand]:
    """The slash commands the plugins add to a chat on ``session_id``, by name; a name the chat
    or another plugin already uses is a config error."""
    assert host.pm is not None
    found: dict[str, ChatCommand] = {}
    for impl in host.pm.hook.chat_commands.get_hookimpls():
        kwargs = {"session_id": session_id, "notify": notify}
        value = await await_me_maybe(impl.function(**{k: kwargs[k] for k in impl.argnames}))
        items = value if isinstance(value, list) else ([] if value is None else [value])
        for item in items:
            command = ChatCommand.model_validate(item)
            if command.name in CHAT_COMMANDS or command.name in found:
                raise ConfigError(
                    f"plugin {impl.plugin_name!r}: chat command {command.name!r} is taken"
                )
            found[command.name] = command
    return found


async def chat_loop(
    host: Host, session_id: str, held: HeldLogLines, handlers: Sequence[logging.Handler]
) -> None:
    """The chat on ``session_id`` until ``/quit`` or the end of input: each line a slash command
    or a turn (its reply streamed, the log lines ``held`` meanwhile and printed after it
    through ``handlers``). :class:`ModelUnusable` when the first turn fails."""
    window = host.context_window()
    notices: list[str] = []

    def flush() -> None:
        while notices:
            click.echo(notices.pop(0))

    added = await chat_commands(host, session_id, notices.append)
    click.echo(
        f"chatting with {host.model} as session {session_id!r} (context window {window:,} "
        f"tokens{'' if host.plugins else ', no plugins'}); /help lists the commands"
    )
    found = [s for s in await host.memory.list_sessions() if s.session_id == session_id]
    if found:
        # Summarized: the prompt carries a summary of what was archived.
        _, _, usage, _ = await host.build_prompt(session_id, dry_run=True)
        notice = resume_notice(
            session_id,
            found[0].active,
            found[0].archived,
            summarized=usage.breakdown.summary > 0,
        )
        if notice:
            click.echo(notice)
    lines = _Lines()
    replied = False
    while True:
        flush()
        line = await lines.next("you> ")
        if line is None:
            click.echo("")
            break
        command = line.strip()
        if command == "/quit":
            break
        if not command:
            continue
        name, _, argument = command.partition(" ")
        if name in added and (added[name].takes_argument or not argument.strip()):
            shown = await await_me_maybe(added[name].handler(argument.strip()))
            if shown:
                click.echo(shown)
            continue
        if command == "/search" or command.startswith("/search "):
            query = command[len("/search") :].strip()
            if not query:
                click.echo("usage: /search QUERY")
                continue
            hits = await host.memory.search(session_id, query, limit=SEARCH_LIMIT)
            for hit in hits:
                click.echo(search_line(hit, query))
            if not hits:
                click.echo(f"(nothing found for {query!r})")
            continue
        if command == "/clear":
            cleared = await host.clear(session_id)
            click.echo(f"[cleared: {' and '.join(cleared) or 'nothing'} of this session]")
            continue
        if command == "/help":
            click.echo(chat_help(list(added.values())))
            continue
        if command.startswith("/") and (name in CHAT_COMMANDS or name in added):
            click.echo(f"{command.split()[0]} takes no arguments; /help lists the commands")
            continue
        if command.startswith("/"):
            click.echo(f"unknown command {command.split()[0]}: /help lists the commands")
            continue
        limit = host.config.host.max_message_chars
        if limit and len(command) > limit:
            click.echo(
                f"[not sent: {len(command):,} characters, over the limit of {limit:,} "
                "(host.max_message_chars)]"
            )
            continue
        click.echo("assistant> ", nl=False)
        held.holding = True
        try:
            result = await host.run_turn(
                session_id, command, stream=True, on_delta=lambda d: click.echo(d, nl=False)
            )
        finally:
            click.echo("")
            held.release(handlers)
        if result.outcome == "error":
            error = error_line(result.error or "unknown error")
            if not replied:  # the model cannot be used at all: stop here, say why
                raise ModelUnusable(f"{host.model}: {error}")
            click.echo(f"[error: {error}]", err=True)
            continue
        replied = replied or result.outcome == "replied"
        if result.usage and result.sent:
            click.echo(chat_status(result, window))
        # A compression this turn started: give it a moment to report (the host's and the
        # plugins' own work only, never a task a library started: see Host.settle).
        await host.settle(CHAT_SETTLE_S)
    flush()


#: After a turn, how long chat waits for the plugins' background work (a compression the turn
#: started) before the next prompt (a slower one is announced later).
CHAT_SETTLE_S = 3.0


def chat_status(result: Any, window: int) -> str:
    """What the turn's last prompt held:
    ``[context 2,310/8,000 tokens (29%, 1,024 kept for the reply): 12 messages + summary 310]``."""
    usage = result.usage[-1]
    messages = sum(1 for m in result.sent[-1] if m.get("role") != "system")
    b = usage.breakdown
    memory = f" + summary {b.summary:,} tokens" if b.summary else ", no summary yet"
    # In the provider's tokens, as the window is: the host's counts times the calibration.
    used = round(usage.used * usage.calibration)
    reserved = round(b.reserved_for_reply * usage.calibration)
    calibrated = f", counts x{usage.calibration:.2f}" if usage.calibration != 1.0 else ""
    return (
        f"[context {used:,}/{window:,} tokens ({usage.usage_ratio:.0%}{calibrated}, "
        f"{reserved:,} kept for the reply): {messages} "
        f"message{'' if messages == 1 else 's'}{memory}]"
    )
