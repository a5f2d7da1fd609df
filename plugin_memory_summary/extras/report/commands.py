"""``host-stub replay`` and ``host-stub demo``: the plugin's showcase, added to the host's CLI
through ``register_commands``. Both replay a conversation through a host with the plugin and
report what it did (see :mod:`plugin_memory_summary.extras.report`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from host_stub.cli import (
    UserError,
    host_config,
    memory_origin,
    option_values,
    preflight,
    run_async,
    sqlite_path,
)
from host_stub.config import HostConfig, load_host_config, read_toml
from host_stub.session_ids import session_id_problem
from host_stub.transcripts import (
    TranscriptError,
    load_transcript,
    resume_point,
    stored_replay,
    with_replay_keys,
)

from .screen import Screen

__all__ = ["register", "report_run"]


def check_save(path: str | None, *, force: bool, store: Path | None = None) -> None:
    """``demo --save FILE``: an existing file (a SQLite store, say) is overwritten only with
    ``--force``; the demo's own store (``store``, a SQLite file) never."""
    if path is None:
        return
    target = Path(path)
    if store is not None and target.resolve() == store.resolve():
        raise UserError(
            f"--save {path}: that file is the demo's store; save the conversation elsewhere"
        )
    if target.exists() and not force:
        raise UserError(f"--save {path}: the file exists (pass --force to overwrite it)")


def check_plot(path: str | None) -> None:
    """Fail before a long replay if the plot cannot be written."""
    if path is None:
        return
    from .plot import PlotError, check_plot_target

    try:
        check_plot_target(path)
    except PlotError as exc:
        raise UserError(str(exc)) from None


async def report_run(
    config: HostConfig,
    messages: list[Any],
    session_id: str,
    *,
    title: str,
    plot: str | None,
    as_json: bool,
    baseline: str,
    store: str,
    facts: dict[str, str] | None = None,
    fresh: bool = False,
    origin: str = "host.memory",
) -> None:
    """Replay ``messages`` with progress, one line per compression, then the report (and the
    plot); shared by ``replay`` and ``demo``. With ``fresh``, a session that already has
    messages is refused (the demo's numbers are those of a new session). Otherwise a replay
    resumes: the messages of ``messages`` (carrying replay keys) already stored are skipped,
    and a session that holds other messages is refused (see :mod:`host_stub.transcripts`)."""
    from . import PlotError, compression_line, plot_report, render_report, run_replay
    from .text import counted

    preflight(config, origin=origin)
    stored, keys = await stored_replay(config.host.memory, session_id)
    if stored and fresh:
        raise UserError(
            f"session {session_id!r} already has {stored} message{'' if stored == 1 else 's'} "
            f"in {config.host.memory}: "
            f"use another --db, or clear it first (host-stub clear {session_id})"
        )
    try:
        done = resume_point(messages, keys)
    except TranscriptError as exc:
        raise UserError(
            f"session {session_id!r}: {exc}: replay it with --session NAME, or clear it first "
            f"(host-stub clear {session_id})"
        ) from None
    if done == len(messages):
        if as_json:
            click.echo(
                json.dumps({"session_id": session_id, "replayed": 0, "already_stored": done})
            )
        else:
            click.echo(
                f"nothing to replay: session {session_id!r} already holds all "
                f"{counted(done, 'message')} of {title}"
            )
        return
    if done and not as_json:
        click.echo(
            f"resuming: session {session_id!r} already holds the first {done} of the "
            f"{len(messages)} messages; replaying the other {len(messages) - done}",
            err=True,
        )
    with Screen(quiet=as_json) as screen:
        report = await run_replay(
            config,
            messages[done:],
            session_id,
            resumed=done > 0,
            title=title,
            baseline=baseline,
            store=store,
            facts=facts,
            on_start=screen.start,
            on_turn=screen.turn,
            on_event=lambda event: screen.line(f"compression: {compression_line(event)}"),
        )
    if plot is not None:
        try:
            plot_report(report, plot)
        except PlotError as exc:
            raise UserError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report.to_dict() | {"plot": plot}, ensure_ascii=False))
        return
    with_plugin = report.with_plugin
    click.echo(
        f"replayed {counted(report.messages, 'message')} in {counted(report.turns, 'turn')} "
        f"into session {session_id!r}: {counted(len(with_plugin.compressions), 'compression')}, "
        f"{counted(report.active, 'message')} active, peak context {with_plugin.max} tokens"
    )
    click.echo("")
    click.echo(render_report(report))
    if plot is not None:
        click.echo("")
        click.echo(f"plot: {plot}")


BASELINE_OPTION = click.option(
    "--baseline",
    type=click.Choice(["computed", "replay", "off"]),
    default="computed",
    show_default=True,
    help="The comparison without the plugin: computed from the run's own token counts, or "
    "replayed a second time without the plugin on a throw-away store (slower, same numbers).",
)
PLOT_OPTION = click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    metavar="FILE.svg|FILE.png",
    help="Draw the context per turn, with and without the plugin (needs matplotlib).",
)
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")


def register(cli: Any, open_host: Any) -> None:
    """Add ``replay`` and ``demo`` to ``cli`` (the host gives them its options)."""

    @cli.command()
    @click.argument("file", type=click.Path(dir_okay=False))
    @click.option(
        "--session",
        "session_id",
        help="Session id (default: the file's name). Replaying the same file into the same session "
        "again resumes it: messages already stored are skipped.",
    )
    @PLOT_OPTION
    @JSON_OPTION
    @BASELINE_OPTION
    @click.pass_context
    @run_async
    async def replay(
        ctx: click.Context,
        file: str,
        session_id: str | None,
        plot: str | None,
        as_json: bool,
        baseline: str,
    ) -> None:
        """Replay an OpenAI-format conversation (JSON or JSONL) through the host, using the
        recorded assistant replies instead of a model, and report what the memory plugin did.

        Without --model the summaries come from the offline rules engine; with --model (any litellm
        model string, --api-base for an OpenAI-compatible server) the plugin summarizes with it."""
        check_plot(plot)
        config = host_config(ctx)
        messages = with_replay_keys(
            load_transcript(file, max_message_chars=config.host.max_message_chars)
        )
        if session_id is None:
            session_id = Path(file).stem
            if problem := session_id_problem(session_id):
                raise UserError(
                    f"{file}: the file's name is not a valid session id ({problem}): "
                    "name one with --session"
                )
        await report_run(
            config,
            messages,
            session_id,
            title=Path(file).name,
            plot=plot,
            as_json=as_json,
            baseline=baseline,
            store=config.host.memory,
            origin=memory_origin(ctx, config),
        )

    @cli.command()
    @click.option(
        "--turns",
        default=300,
        show_default=True,
        type=click.IntRange(20, 5000),
        help="User turns of the generated conversation.",
    )
    @click.option("--seed", default=7, show_default=True, help="Seed of the generator.")
    @click.option("--print-config", is_flag=True, help="Print the demo's host config and exit.")
    @click.option(
        "--save",
        type=click.Path(dir_okay=False),
        metavar="FILE.jsonl",
        help="Also write the generated conversation (OpenAI-format JSONL); an existing file "
        "only with --force.",
    )
    @click.option("--force", is_flag=True, help="Let --save overwrite an existing file.")
    @PLOT_OPTION
    @JSON_OPTION
    @BASELINE_OPTION
    @click.pass_context
    @run_async
    async def demo(
        ctx: click.Context,
        turns: int,
        seed: int,
        print_config: bool,
        save: str | None,
        force: bool,
        plot: str | None,
        as_json: bool,
        baseline: str,
    ) -> None:
        """Generate a long conversation (trip planning and coding help, tool calls, some Chinese)
        and replay it through the host with the memory plugin: offline, no API key.

        Runs with the config `--print-config` shows (a small 8k context window); pass your own with
        --config. The store is a temporary SQLite file unless --db or --memory names one."""
        import tempfile

        from host_stub.messages import Message

        from ..demo import DEMO_CONFIG, EARLY_FACTS, generate_conversation

        if print_config:
            click.echo(DEMO_CONFIG, nl=False)
            return
        check_plot(plot)
        check_save(save, force=force)
        obj = option_values(ctx)
        with tempfile.TemporaryDirectory(prefix="host-stub-demo-") as tmp:
            memory = obj.get("memory") or (f"sqlite:///{obj['db']}" if obj.get("db") else None)
            if memory is None and obj.get("config"):
                memory = (read_toml(Path(obj["config"])).get("host") or {}).get("memory")
            temporary = memory is None
            if temporary:
                memory = f"sqlite:///{Path(tmp) / 'demo.db'}"
            if obj.get("config"):
                config = load_host_config(
                    obj["config"],
                    memory=memory,
                    model=obj.get("model"),
                    api_base=obj.get("api_base"),
                )
            else:
                path = Path(tmp) / "demo.toml"
                path.write_text(DEMO_CONFIG, encoding="utf-8")
                config = load_host_config(
                    path, memory=memory, model=obj.get("model"), api_base=obj.get("api_base")
                )
                config.source = "<demo config>"
            raw = generate_conversation(turns=turns, seed=seed)
            if save is not None:
                check_save(save, force=force, store=sqlite_path(str(memory)))
                try:
                    Path(save).write_text(
                        "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in raw),
                        encoding="utf-8",
                    )
                except OSError as exc:
                    raise UserError(f"{save}: cannot write: {exc.strerror}") from None
            # With replay keys, as `replay` stores them: replaying the --save file into this
            # store later finds its messages already there.
            messages = with_replay_keys([Message.model_validate(m) for m in raw])
            store = str(memory)
            if temporary:
                store = "a temporary SQLite file, gone at exit: keep it with --db PATH"
            await report_run(
                config,
                messages,
                "demo",
                title=f"demo ({turns} turns, seed {seed})",
                plot=plot,
                as_json=as_json,
                baseline=baseline,
                store=store,
                facts=EARLY_FACTS,
                fresh=True,
            )
        if not as_json and not temporary:
            click.echo("")
            click.echo(
                "inspect it: host-stub summary demo, host-stub sessions (same --db/--memory)"
            )
