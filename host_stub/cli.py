"""``host-stub``: replay a conversation, chat with a model, inspect sessions.

User mistakes (a missing file, malformed JSON, a bad config value, an unknown model, an
unreachable server) end with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import click

from . import signals
from .config import ConfigError, HostConfig, load_host_config
from .host import Host
from .transcripts import TranscriptError, load_transcript, split_turns

__all__ = ["cli", "main"]

USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, TranscriptError, FileNotFoundError)


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"host-stub: error: {self.message}", err=True)


def _set(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, _: click.Parameter, value: Any) -> Any:
        if value is not None:
            ctx.ensure_object(dict)[key] = value
        return value

    return callback


HOST_OPTIONS = [
    click.Option(["--config", "config_path"], type=click.Path(dir_okay=False), expose_value=False,
                 callback=_set("config"), help="Host config file (TOML)."),
    click.Option(["--db"], type=click.Path(dir_okay=False), expose_value=False, callback=_set("db"),
                 help="SQLite file of the memory store (shorthand for --memory sqlite:///PATH)."),
    click.Option(["--memory"], expose_value=False, callback=_set("memory"),
                 help="Memory store URL: sqlite:///PATH or memory://."),
    click.Option(["--model"], expose_value=False, callback=_set("model"),
                 help="Chat model (any litellm model string)."),
    click.Option(["--api-base"], expose_value=False, callback=_set("api_base"),
                 help="Base URL of an OpenAI-compatible server."),
]


def host_options(command: click.Command) -> click.Command:
    """Give a command the host options (config, store, model), so they work after its name."""
    command.params.extend(HOST_OPTIONS)
    return command


def host_config(ctx: click.Context) -> HostConfig:
    obj = ctx.find_root().ensure_object(dict) | ctx.ensure_object(dict)
    memory = obj.get("memory")
    if memory is None and obj.get("db"):
        memory = f"sqlite:///{obj['db']}"
    return load_host_config(
        obj.get("config"), memory=memory, model=obj.get("model"), api_base=obj.get("api_base")
    )


@contextlib.asynccontextmanager
async def open_host(ctx: click.Context, **kwargs: Any) -> AsyncIterator[Host]:
    """The host a command runs against; config errors become one-line user errors."""
    try:
        host = Host(host_config(ctx), **kwargs)
        await host.start()
    except USER_ERRORS as exc:
        raise UserError(str(exc)) from None
    try:
        yield host
    finally:
        await host.stop()


def run_async(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return asyncio.run(func(*args, **kwargs))
        except USER_ERRORS as exc:
            raise UserError(str(exc)) from None

    return wrapper


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """Reference host for conversation-memory plugins."""
    ctx.ensure_object(dict)
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


for _option in HOST_OPTIONS:
    cli.params.append(_option)


@host_options
@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--session", "session_id", help="Session id (default: the file's name).")
@click.pass_context
@run_async
async def replay(ctx: click.Context, file: str, session_id: str | None) -> None:
    """Replay an OpenAI-format conversation (JSON or JSONL) through the host, using the
    recorded assistant replies instead of a model."""
    messages = load_transcript(file)
    session_id = session_id or Path(file).stem
    turns = split_turns(messages)
    async with open_host(ctx) as host:
        compressions: list[dict[str, Any]] = []

        async def on_status(sender: Any, **payload: Any) -> None:
            if payload["status"] in ("done", "error") and payload["stats"].get("messages_summarized"):
                compressions.append(payload)
                stats = payload["stats"]
                click.echo(
                    f"compression: {stats['messages_summarized']} messages summarized, tokens "
                    f"{stats.get('tokens_before')} -> {stats.get('tokens_after')}"
                    + (f", fallback {stats['fallback']}" if stats.get("fallback") else "")
                )

        host.bus.connect(signals.SESSION_COMPRESSING, on_status)
        peak = 0
        for inputs, recorded in turns:
            result = await host.run_turn(session_id, inputs, recorded=recorded)
            peak = max([peak, *(u.used for u in result.usage)])
        history = await host.memory.get_history(session_id)
    click.echo(
        f"replayed {len(messages)} messages in {len(turns)} turns into session {session_id!r}: "
        f"{len(compressions)} compressions, {len(history)} messages active, peak context {peak} tokens"
    )


@host_options
@cli.command()
@click.option("--session", "session_id", default="chat", show_default=True)
@click.pass_context
@run_async
async def chat(ctx: click.Context, session_id: str) -> None:
    """Chat with a model (streaming). Commands: /compress, /summary, /clear, /quit."""
    async with open_host(ctx) as host:
        if not host.config.host.model:
            raise UserError("chat needs a model: --model M (any litellm model string)")
        plugin = host.plugins.get("memory-summary")
        click.echo(f"chatting with {host.model} as session {session_id!r}; /quit to leave")
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, _prompt)
            if line is None or line.strip() == "/quit":
                break
            command = line.strip()
            if not command:
                continue
            if command == "/summary":
                text = await plugin.plugin.get_conversation_summary(session_id) if plugin else None
                click.echo(text or "(no summary yet)")
                continue
            if command == "/compress":
                if plugin is None:
                    click.echo("(no memory plugin loaded)")
                    continue
                result = await plugin.plugin.compress(session_id)
                click.echo(f"[compress: {result['status']} {result.get('reason', '')}]")
                continue
            if command == "/clear":
                await host.clear(session_id)
                click.echo("[cleared]")
                continue
            click.echo("assistant> ", nl=False)
            result = await host.run_turn(
                session_id, command, stream=True, on_delta=lambda d: click.echo(d, nl=False)
            )
            click.echo("")
            if result.outcome == "error":
                click.echo(f"[error: {result.error}]", err=True)


def _prompt() -> str | None:
    try:
        return input("you> ")
    except EOFError:
        return None


@host_options
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@run_async
async def sessions(ctx: click.Context, as_json: bool) -> None:
    """List the sessions in the store."""
    async with open_host(ctx) as host:
        items = await host.memory.list_sessions()
    if as_json:
        click.echo(json.dumps([s.model_dump(mode="json") for s in items]))
        return
    if not items:
        click.echo("no sessions")
    for s in items:
        click.echo(f"{s.session_id}: {s.active} active, {s.archived} archived, last seq {s.last_seq}, epoch {s.epoch}")


@host_options
@cli.command()
@click.argument("session", required=False)
@click.option("--all", "all_sessions", is_flag=True, help="Clear every session.")
@click.option("--type", "types", multiple=True, help="Only these memory types (history, summary, ...).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@run_async
async def clear(ctx: click.Context, session: str | None, all_sessions: bool, types: tuple[str, ...], as_json: bool) -> None:
    """Clear a session's memory (history and what plugins keep, e.g. its summary)."""
    if not session and not all_sessions:
        raise UserError("name a SESSION or pass --all")
    async with open_host(ctx) as host:
        results = await host.clear(None if all_sessions else session, list(types) or None)
    if as_json:
        click.echo(json.dumps(results, default=str))
    else:
        click.echo(f"cleared {session or 'all sessions'}: " + ", ".join(f"{k}: {v}" for k, v in results.items()))


def _register_plugin_commands() -> None:
    """Plugins add commands through ``register_commands``; they get the host options too."""
    from .plugins import get_plugin_manager

    try:
        pm, _ = get_plugin_manager(HostConfig())
    except ConfigError as exc:
        click.echo(f"host-stub: warning: {exc}", err=True)
        return
    before = dict(cli.commands)
    pm.hook.register_commands(cli=cli, open_host=open_host)
    for name, command in cli.commands.items():
        if before.get(name) is not command:
            host_options(command)


def main(argv: list[str] | None = None) -> int:
    _register_plugin_commands()
    try:
        cli.main(args=argv, prog_name="host-stub", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except USER_ERRORS as exc:
        click.echo(f"host-stub: error: {exc}", err=True)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
