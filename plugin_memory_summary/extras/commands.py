"""CLI subcommands the plugin adds to ``host-stub`` through ``register_commands``.

Every command works on a session that exists (it has messages, or a summary record such as
pinned facts): an unknown one is a mistake, said in one line with exit code 2, and nothing is
stored. ``pin --create`` pins facts ahead of a session's first message. With the plugin left
out by the host's ``[plugins]`` (``deny``, or an ``allow`` without it), each command says so
in one line before it opens anything.

``compress`` runs the plugin's compression again and again (each run bounded as any run is, by
``max_batches_per_run``) until the session's prompt fits the target a compression aims at
(``fill_target`` of the window), or a run makes no progress: a line per run on a terminal
(stderr), then one line with the totals and, when it stopped short, how many tokens are left over
the target and why (exit code :data:`STILL_OVER`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from host_stub.services import SUMMARY_NAMESPACE

from .._name import PLUGIN_NAME

if TYPE_CHECKING:  # the pipeline loads when a command runs, not when the CLI starts
    from ..base import Result, Status

__all__ = [
    "MAX_PIN_CHARS",
    "STILL_OVER",
    "CompressRuns",
    "compress_line",
    "register",
    "status_line",
]

#: The longest fact ``pin`` takes, in characters: a pinned fact is kept verbatim in every later
#: summary, so it is a sentence, not a document.
MAX_PIN_CHARS = 500

#: Exit code of ``compress`` when the session's prompt is still over the target after it (a run
#: made no progress, or ``--max-runs`` were done); 0 when it fits, 2 for a user mistake.
STILL_OVER = 1


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


def status_line(
    result: Mapping[str, Any], command: str = "compress", *, runs: int | None = None
) -> str:
    """A pipeline result in one line: ``done: 40 messages summarized, tokens 12,400 -> 1,020``
    (``summarized in 3 runs`` with ``runs``). A rebuild says what it rebuilt before what the
    compression after it did."""
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
            f"summarized{'' if runs is None else ' in ' + counted(runs, 'run', commas=True)}"
            f"{tokens}"
            f"{', fallback ' + stats['fallback'] if stats.get('fallback') else ''})"
        )
    elif stats.get("messages_archived"):  # the window strategy: archived, no summary
        line += (
            f" ({counted(int(stats['messages_archived']), 'message', commas=True)} archived"
            f"{'' if runs is None else ' in ' + counted(runs, 'run', commas=True)})"
        )
    if command == "rebuild" and "rebuilt_from" in stats:
        count = int(stats["rebuilt_from"])
        covers = counted(count, "archived message", commas=True)
        rebuilt = f"rebuilt: the summary now covers {covers}"
        if result["status"] == "skipped":
            return f"{rebuilt}; nothing more to compress"
        return f"{rebuilt}; then compressed: {line}"
    return line


def _changed(result: Result) -> bool:
    """Whether a run summarized or archived anything."""
    stats = result.stats
    return bool(stats.get("messages_summarized") or stats.get("messages_archived"))


@dataclass
class CompressRuns:
    """What ``compress`` did: each run's result and the session's prompt (tokens, as the host
    measures the prompt it would send, reply reserve included) before the first run and after
    each. ``target`` is ``share`` (``fill_target``) of the ``window``; ``stopped`` says why the
    command stopped with the prompt still over it (``None``: it fits)."""

    before: int
    target: int
    share: float
    window: int
    results: list[Result] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)
    stopped: str | None = None

    @property
    def prompt(self) -> int:
        return self.prompts[-1] if self.prompts else self.before

    @property
    def over(self) -> int:
        """Tokens the prompt is over the target (0 when it fits)."""
        return max(0, self.prompt - self.target)

    def total(self) -> Result:
        """The runs as one result: ``error`` if a run fell back, else ``done`` if one changed
        the session, else the last run's; the stats summed (tokens: before the first run that
        changed the session, after the last one)."""
        from ..base import result as make_result

        changed = [r for r in self.results if _changed(r)]
        errors = [r for r in self.results if r.status == "error"]
        last = self.results[-1]
        if not changed:
            return last
        status: Status = "error" if errors else "done"
        reason = errors[0].reason if errors else changed[-1].reason
        stats: dict[str, Any] = {"runs": len(self.results)}
        for key in ("messages_summarized", "messages_archived"):
            count = sum(int(r.stats.get(key) or 0) for r in self.results)
            if count:
                stats[key] = count
        stats["tokens_before"] = changed[0].stats.get("tokens_before")
        stats["tokens_after"] = changed[-1].stats.get("tokens_after")
        fallback = next((r.stats["fallback"] for r in changed if r.stats.get("fallback")), None)
        if fallback:
            stats["fallback"] = fallback
        return make_result(status, reason, stats)

    def target_text(self) -> str:
        return (
            f"the target of {self.target:,} ({self.share:.0%} of the {self.window:,}-token window)"
        )

    def to_dict(self) -> dict[str, Any]:
        """``compress --json``: the totals as a result (``status``, ``reason``, ``stats``), each
        run with the prompt's tokens after it, the target and what is left over it."""
        return {
            **self.total().to_dict(),
            "runs": [
                r.to_dict() | {"prompt_tokens": p}
                for r, p in zip(self.results, self.prompts, strict=True)
            ],
            "prompt_tokens_before": self.before,
            "prompt_tokens": self.prompt,
            "target": {
                "tokens": self.target,
                "share": round(self.share, 4),
                "context_window": self.window,
            },
            "over_target": self.over,
            "reached": self.stopped is None,
            "stopped": self.stopped,
        }


def progress_line(number: int, result: Result, prompt: int, target: int) -> str:
    """``run 2: done: manual (98 messages summarized, ...); prompt 6,400 tokens, 3,400 over the
    target``: one run of ``compress``."""
    where = f"{prompt - target:,} over the target" if prompt > target else "under the target"
    return f"run {number}: {status_line(result)}; prompt {prompt:,} tokens, {where}"


def compress_line(runs: CompressRuns) -> str:
    """The last line of ``compress``: the totals and where the prompt ended, against the
    target; when it is still over, how much and why. One run that brought the prompt under the
    target (or found it there) is said as that run's status line alone."""
    total = runs.total()
    if len(runs.results) == 1 and runs.stopped is None:
        return status_line(total)
    line = status_line(total, runs=None if total is runs.results[-1] else len(runs.results))
    if runs.stopped is None:
        return f"{line}; prompt {runs.prompt:,} tokens, under {runs.target_text()}"
    line += f"; prompt {runs.prompt:,} tokens, still {runs.over:,} over {runs.target_text()}"
    if total is runs.results[-1] and total.status == "skipped":
        return line  # the status already says why
    return f"{line}: stopped: {_plain(runs.stopped)}"


def _no_progress(result: Result, before: int, after: int) -> str | None:
    """Why the run just done makes another pointless, or ``None`` to go on."""
    if result.status == "skipped" or not _changed(result):
        return result.reason or f"the run did nothing ({result.status})"
    if after >= before:
        return f"the last run freed no prompt tokens ({before:,} -> {after:,})"
    return None


def _stderr_is_terminal() -> bool:
    """Whether the per-run lines go to stderr: a terminal (``TTY_COMPATIBLE=1`` or ``0``
    decides, as for rich's progress)."""
    setting = os.environ.get("TTY_COMPATIBLE")
    if setting in ("0", "1"):
        return setting == "1"
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


async def compress_until_target(
    host: Any, session: str, *, max_runs: int | None = None, on_run: Any = None
) -> CompressRuns:
    """Compress ``session`` until its prompt fits the target (``fill_target`` of the window),
    a run makes no progress, or ``max_runs`` are done; at least one run (``compress`` ignores
    the thresholds). ``on_run(number, result, prompt_tokens, target)`` after each run."""
    plugin = _plugin(host)
    _, _, usage, _ = await host.build_prompt(session, dry_run=True)
    share = float(plugin.config.fill_target)
    window = int(usage.context_window)
    runs = CompressRuns(before=usage.used, target=int(share * window), share=share, window=window)
    previous = usage.used
    while True:
        result: Result = await plugin.compress(session)
        _, _, usage, _ = await host.build_prompt(session, dry_run=True)
        runs.results.append(result)
        runs.prompts.append(usage.used)
        if on_run is not None:
            on_run(len(runs.results), result, usage.used, runs.target)
        if usage.used <= runs.target:
            return runs
        why = _no_progress(result, previous, usage.used)
        if why is None and max_runs is not None and len(runs.results) >= max_runs:
            why = f"--max-runs {max_runs} reached (run it again to go on)"
        if why is not None:
            runs.stopped = why
            return runs
        previous = usage.used


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

    @cli.command("compress")
    @click.argument("session")
    @click.option(
        "--max-runs",
        type=int,
        metavar="N",
        help="Stop after N runs even if the prompt is still over the target (default: no limit).",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
    @click.pass_context
    def compress(ctx: click.Context, session: str, max_runs: int | None, as_json: bool) -> None:
        """Compress a session now (ignores the threshold), run after run, until its prompt
        fits the target a compression aims at (fill_target of the context window) or a run
        makes no progress. Each run folds at most max_batches_per_run batches; on a terminal a
        line per run goes to stderr. Exit code 0 when the prompt fits the target, 1 when it is
        still over it (the last line says by how much and why), 2 for a mistake."""
        if max_runs is not None and max_runs < 1:
            raise Refused(f"--max-runs takes a number of runs of 1 or more, not {max_runs}")
        _require_loaded(ctx)
        show = _stderr_is_terminal()

        def on_run(number: int, result: Result, prompt: int, target: int) -> None:
            if show:
                click.echo(progress_line(number, result, prompt, target), err=True)

        async def run() -> CompressRuns:
            async with open_host(ctx) as host:
                await _require_session(host, session)
                return await compress_until_target(host, session, max_runs=max_runs, on_run=on_run)

        runs = asyncio.run(run())
        if as_json:
            click.echo(json.dumps(runs.to_dict(), ensure_ascii=False, default=str))
        else:
            click.echo(compress_line(runs))
        if runs.stopped is not None:
            ctx.exit(STILL_OVER)

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
