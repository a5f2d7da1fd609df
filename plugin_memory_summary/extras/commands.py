"""CLI subcommands the plugin adds to ``host-stub`` through ``register_commands``.

Every command works on a session that exists (it has messages, or a summary record such as
pinned facts): an unknown one is a mistake, said in one line with exit code 2, and nothing is
stored. ``pin --create`` pins facts ahead of a session's first message. With the plugin left
out by the host's ``[plugins]`` (``deny``, or an ``allow`` without it), each command says so
in one line before it opens anything.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from host_stub.services import SUMMARY_NAMESPACE

from .._name import PLUGIN_NAME

if TYPE_CHECKING:  # the pipeline loads when a command runs, not when the CLI starts
    from ..base import Result

__all__ = ["MAX_PIN_CHARS", "register", "status_line"]

#: The longest fact ``pin`` takes, in characters: a pinned fact is kept verbatim in every later
#: summary, so it is a sentence, not a document.
MAX_PIN_CHARS = 500


class Refused(click.ClickException):
    """A user mistake: one line, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        ctx = click.get_current_context(silent=True)
        prog = (ctx.find_root().info_name if ctx is not None else None) or "host-stub"
        click.echo(f"{prog}: error: {self.message}", err=True)


def _plugin(host: Any) -> Any:
    if PLUGIN_NAME not in host.plugins:
        raise Refused(f"the {PLUGIN_NAME} plugin is not loaded ({host.config.source})")
    return host.get_plugin(PLUGIN_NAME)


def _require_loaded(ctx: click.Context) -> None:
    """Refuse, before any store is opened, when the host's config leaves the plugin out."""
    from host_stub.cli import host_config

    config = host_config(ctx)
    plugins = config.plugins
    if PLUGIN_NAME in plugins.deny:
        why = "deny names it"
    elif plugins.allow is not None and PLUGIN_NAME not in plugins.allow:
        why = "allow leaves it out"
    else:
        return
    raise Refused(f"the {PLUGIN_NAME} plugin is not loaded ({config.source}: [plugins] {why})")


def _check_fact(fact: str) -> None:
    """A pinned fact has words, and at most :data:`MAX_PIN_CHARS` characters."""
    text = fact.strip()
    if not text:
        raise Refused("the fact is empty: give the words to pin")
    if len(text) > MAX_PIN_CHARS:
        raise Refused(
            f"the fact has {len(text):,} characters, over the limit of {MAX_PIN_CHARS:,} for a "
            "pinned fact: pin a shorter one"
        )


async def _require_session(host: Any, session: str) -> None:
    """Refuse a session the store does not know (no messages, no summary record)."""
    known = {s.session_id for s in await host.memory.list_sessions()}
    if session in known or await host.memory.get_metadata(SUMMARY_NAMESPACE, session):
        return
    raise Refused(f"unknown session {session!r} in {host.config.host.memory}")


def _plain(reason: str) -> str:
    """A provider error without litellm's repeated prefixes (``InternalServerError:
    litellm.InternalServerError: InternalServerError: ...``), on one line."""
    parts: list[str] = []
    for part in " ".join(reason.split()).split(": "):
        part = part.removeprefix("litellm.")
        if not parts or parts[-1] != part:
            parts.append(part)
    return ": ".join(parts)


def status_line(result: Mapping[str, Any], command: str = "compress") -> str:
    """A pipeline result in one line: ``done: 40 messages summarized, tokens 12,400 -> 1,020``.
    A rebuild says what it rebuilt before what the compression after it did."""
    from .report.text import counted

    stats = result.get("stats", {})
    line = f"{result['status']}: {_plain(str(result.get('reason', '')))}".rstrip(": ")
    if stats.get("messages_summarized"):
        before, after = stats.get("tokens_before"), stats.get("tokens_after")
        tokens = (
            f", tokens {before:,} -> {after:,}"
            if isinstance(before, int) and isinstance(after, int)
            else ""
        )
        line += (
            f" ({counted(int(stats['messages_summarized']), 'message', commas=True)} "
            f"summarized{tokens}"
            f"{', fallback ' + stats['fallback'] if stats.get('fallback') else ''})"
        )
    if command == "rebuild" and "rebuilt_from" in stats:
        count = int(stats["rebuilt_from"])
        covers = counted(count, "archived message", commas=True)
        rebuilt = f"rebuilt: the summary now covers {covers}"
        if result["status"] == "skipped":
            return f"{rebuilt}; nothing more to compress"
        return f"{rebuilt}; then compressed: {line}"
    return line


def register(cli: Any, open_host: Any) -> None:
    @cli.command("summary")
    @click.argument("session")
    @click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
    @click.pass_context
    def summary(ctx: click.Context, session: str, as_json: bool) -> None:
        """Show a session's summary."""
        from .report.text import counted

        _require_loaded(ctx)

        async def run() -> None:
            async with open_host(ctx) as host:
                await _require_session(host, session)
                record = await _plugin(host).show(session)
            if as_json:
                click.echo(
                    json.dumps(
                        record.model_dump(mode="json") if record else None, ensure_ascii=False
                    )
                )
            elif record is None or not record.text:
                click.echo(f"no summary for session {session!r}")
            else:
                click.echo(
                    f"session {session}: "
                    f"{counted(record.messages_summarized, 'message', commas=True)} summarized in "
                    f"{counted(record.compressions, 'compression', commas=True)}, covered through "
                    f"seq {record.covered_up_to_seq}"
                )
                click.echo(record.text)

        asyncio.run(run())

    def status_command(name: str, method: str, help_text: str) -> None:
        """A command that runs one pipeline entry point and prints its final status."""

        @cli.command(name, help=help_text)
        @click.argument("session")
        @click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
        @click.pass_context
        def command(ctx: click.Context, session: str, as_json: bool) -> None:
            _require_loaded(ctx)

            async def run() -> Result:
                async with open_host(ctx) as host:
                    await _require_session(host, session)
                    result: Result = await getattr(_plugin(host), method)(session)
                    return result

            result = asyncio.run(run())
            if as_json:
                click.echo(json.dumps(result.to_dict(), ensure_ascii=False, default=str))
            else:
                click.echo(status_line(result, name))

    status_command("compress", "compress", "Compress a session now (ignores the threshold).")
    status_command(
        "rebuild", "rebuild", "Rebuild a session's summary from its archived and active messages."
    )

    @cli.command("pin")
    @click.argument("session")
    @click.argument("fact")
    @click.option(
        "--create",
        is_flag=True,
        help="Pin even if the session does not exist yet (facts ahead of its first message).",
    )
    @click.pass_context
    def pin(ctx: click.Context, session: str, fact: str, create: bool) -> None:
        """Pin a fact that every later summary keeps (at most 500 characters)."""
        _check_fact(fact)
        _require_loaded(ctx)

        async def run() -> None:
            async with open_host(ctx, create=create) as host:
                if not create:
                    try:
                        await _require_session(host, session)
                    except Refused as exc:
                        raise Refused(f"{exc.message} (pin --create pins ahead of it)") from None
                record = await _plugin(host).pin(session, fact)
            count = len(record.payload.pinned_facts)
            click.echo(
                f"pinned in session {session!r} ({count} pinned fact{'' if count == 1 else 's'})"
            )

        asyncio.run(run())
