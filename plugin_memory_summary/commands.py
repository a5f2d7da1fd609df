"""CLI subcommands the plugin adds to ``host-stub`` through ``register_commands``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click

__all__ = ["register"]


def _plugin(host: Any) -> Any:
    from .plugin import PLUGIN_NAME

    return host.get_plugin(PLUGIN_NAME)


def _echo_status(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, ensure_ascii=False, default=str))
        return
    stats = result.get("stats", {})
    line = f"{result['status']}: {result.get('reason', '')}".rstrip(": ")
    if stats.get("messages_summarized"):
        line += (
            f" ({stats['messages_summarized']} messages summarized, tokens "
            f"{stats.get('tokens_before')} -> {stats.get('tokens_after')}"
            f"{', fallback ' + stats['fallback'] if stats.get('fallback') else ''})"
        )
    click.echo(line)


def register(cli: Any, open_host: Any) -> None:
    @cli.command("summary")
    @click.argument("session")
    @click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
    @click.pass_context
    def summary(ctx: click.Context, session: str, as_json: bool) -> None:
        """Show a session's summary."""

        async def run() -> None:
            async with open_host(ctx) as host:
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
                    f"session {session}: {record.messages_summarized} messages summarized in "
                    f"{record.compressions} compressions, covered through seq "
                    f"{record.covered_up_to_seq}"
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
            async def run() -> dict[str, Any]:
                async with open_host(ctx) as host:
                    result: dict[str, Any] = await getattr(_plugin(host), method)(session)
                    return result

            _echo_status(asyncio.run(run()), as_json)

    status_command("compress", "compress", "Compress a session now (ignores the threshold).")
    status_command(
        "rebuild", "rebuild", "Rebuild a session's summary from its archived and active messages."
    )

    @cli.command("pin")
    @click.argument("session")
    @click.argument("fact")
    @click.pass_context
    def pin(ctx: click.Context, session: str, fact: str) -> None:
        """Pin a fact that every later summary keeps."""

        async def run() -> None:
            async with open_host(ctx) as host:
                record = await _plugin(host).pin(session, fact)
            click.echo(f"pinned ({len(record.payload.pinned_facts)} pinned facts)")

        asyncio.run(run())
