"""Replay a conversation through a host and measure every turn (see the package's docstring)."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from host_stub import signals
from host_stub.config import HostConfig
from host_stub.host import Host, TurnResult
from host_stub.messages import Message
from host_stub.transcripts import split_turns

from ..._name import PLUGIN_NAME
from .models import CompressionEvent, ReplayReport, RunSeries, compression_event

__all__ = ["SETTLE_S", "baseline_config", "replay_series", "run_replay", "turn_context"]

FINAL = ("done", "error", "skipped")

#: How long a replay waits, after a turn, for the background work of the host and its plugins
#: (see :meth:`~host_stub.host.Host.settle`).
SETTLE_S = 600.0


def _sent(result: TurnResult) -> list[signals.TokenUsage]:
    """The usage of each prompt a turn sent (a prompt rebuilt after a compression replaces the
    one measured before it)."""
    return [
        u
        for i, u in enumerate(result.usage)
        if not (i + 1 < len(result.usage) and result.usage[i + 1].rebuilt)
    ]


def turn_context(result: TurnResult) -> int | None:
    """The largest context of the prompts a turn sent; ``None`` if the turn called no model."""
    return max((u.used for u in _sent(result)), default=None)


def _fixed(usage: signals.TokenUsage) -> int:
    """What a prompt needs whatever the history: system prompt (and plugins' contributions other
    than the summary), tool definitions, the reply reserve."""
    b = usage.breakdown
    return b.system + b.tool_defs + b.reserved_for_reply


async def replay_series(
    host: Host,
    session_id: str,
    turns: Sequence[tuple[list[Message], list[Message]]],
    *,
    on_turn: Callable[[int], Any] | None = None,
    on_event: Callable[[CompressionEvent], Any] | None = None,
    settle_s: float = SETTLE_S,
) -> RunSeries:
    """Replay ``turns`` into ``session_id`` of a started host and measure every turn."""
    series = RunSeries()
    current = 0
    started = time.perf_counter()
    stored = 0  # tokens of every message stored before this turn

    runs: set[str] = set()  # the stats of each run counted: a joined request repeats them

    async def on_status(sender: Any, **payload: Any) -> None:
        if payload["session_id"] != session_id or payload["status"] not in FINAL:
            return
        event = compression_event(current, payload)
        run = json.dumps(payload.get("stats") or {}, sort_keys=True, default=str)
        if event is not None and run in runs:
            event, payload = None, {**payload, "status": "joined"}
        if event is None:
            status = payload["status"]
            series.other_statuses[status] = series.other_statuses.get(status, 0) + 1
            return
        runs.add(run)
        series.compressions.append(event)
        if on_event is not None:
            on_event(event)

    host.bus.connect(signals.SESSION_COMPRESSING, on_status)
    try:
        for number, (inputs, recorded) in enumerate(turns, 1):
            current = number
            result = await host.run_turn(session_id, inputs, recorded=recorded)
            # The compression this turn started, if any: the host's and the plugin's own work,
            # never a task a library started (litellm's logging worker lives as long as the loop).
            await host.settle(settle_s)
            sent = _sent(result)
            series.prefix += [
                (u.reused_tokens, u.message_tokens) for u in sent if u.reused_tokens is not None
            ]
            messages = [m for m in result.messages if not m.is_marker]
            if sent:
                used = max(u.used for u in sent)
                # The turn's last prompt was built just before its last assistant message.
                last = max(i for i, m in enumerate(messages) if m.role == "assistant")
                before = messages[:last]
                measured = sent[-1]
            else:  # no model call in this turn: measure the prompt it would get
                _, _, measured, _ = await host.build_prompt(session_id, dry_run=True)
                used, before = measured.used, messages
            # Without the plugins their tool definitions would not be sent either.
            fixed = _fixed(measured) - measured.breakdown.tool_defs + host.host_tool_def_tokens()
            series.context.append(used)
            series.uncompressed.append(fixed + stored + sum(m.tokens or 0 for m in before))
            stored += sum(m.tokens or 0 for m in messages)
            if on_turn is not None:
                on_turn(number)
    finally:
        host.bus.disconnect(signals.SESSION_COMPRESSING, on_status)
    series.seconds = time.perf_counter() - started
    return series


def baseline_config(config: HostConfig, memory: str = "memory://") -> HostConfig:
    """The same host without the memory plugin, on the store ``memory`` (a throw-away one)."""
    allow = config.plugins.allow
    plugins = config.plugins.model_copy(
        update={
            "deny": [*config.plugins.deny, PLUGIN_NAME],
            "allow": None if allow is None else [n for n in allow if n != PLUGIN_NAME],
        }
    )
    host = config.host.model_copy(update={"memory": memory})
    rest = {name: value for name, value in config.plugin.items() if name != PLUGIN_NAME}
    out = config.model_copy(update={"plugins": plugins, "host": host, "plugin": rest})
    out.source = config.source
    return out


async def run_replay(
    config: HostConfig,
    messages: list[Message],
    session_id: str,
    *,
    title: str = "",
    baseline: str = "computed",
    on_start: Callable[[str, int], Any] | None = None,
    on_turn: Callable[[str, int], Any] | None = None,
    on_event: Callable[[CompressionEvent], Any] | None = None,
    store: str = "",
    facts: dict[str, str] | None = None,
    resumed: bool = False,
) -> ReplayReport:
    """Replay ``messages`` into ``session_id`` through a host built from ``config`` (plugin on).
    ``baseline``: ``computed`` (from the same run), ``replay`` (a second replay through the same
    host without the plugin, on a throw-away store) or ``off``. ``on_start(run, turns)`` and
    ``on_turn(run, done)`` report progress; ``run`` is ``"with"`` or ``"without"``. ``facts``
    (label -> text) are looked up in the final summary. ``resumed``: ``messages`` are the rest of
    a conversation whose start is already stored (a resumed replay; the report covers the rest)."""
    if baseline not in ("computed", "replay", "off"):
        raise ValueError(f"baseline must be computed, replay or off, not {baseline!r}")
    started = time.perf_counter()
    turns = split_turns(messages, resumed=resumed)
    host = Host(config)
    await host.start()
    try:
        window = host.context_window()
        item = host.plugins.get(PLUGIN_NAME)
        plugin = item.plugin if item is not None else None
        plugin_config = item.config if item is not None else None
        if on_start is not None:
            on_start("with", len(turns))
        with_plugin = await replay_series(
            host,
            session_id,
            turns,
            on_turn=(lambda n: on_turn("with", n)) if on_turn else None,
            on_event=on_event,
        )
        record = await plugin.show(session_id) if plugin is not None else None
        history = await host.memory.get_history(session_id)
        archived = await host.memory.get_archived(session_id)
        text = record.text if record is not None and record.text else None
        summary_model = (
            (getattr(plugin_config, "summary_model", None) or host.llm.default_model)
            if plugin_config
            else None
        )
        report = ReplayReport(
            title=title or session_id,
            session_id=session_id,
            messages=len(messages),
            turns=len(turns),
            tool_results=sum(1 for m in messages if m.role == "tool"),
            context_window=window,
            summary_model=summary_model,
            auto_mark=getattr(plugin_config, "auto_compress_threshold", None) or None,
            hard_mark=_hard_mark(plugin_config),
            with_plugin=with_plugin,
            without_plugin=(
                RunSeries(context=list(with_plugin.uncompressed))
                if baseline == "computed"
                else None
            ),
            baseline=baseline,
            summary=text,
            summary_tokens=host.count_text(text) if text else 0,
            summary_messages=record.messages_summarized if record is not None else 0,
            summary_compressions=record.compressions if record is not None else 0,
            summary_lang=record.lang if record is not None else None,
            summary_cost=record.cost if record is not None else 0.0,
            active=sum(1 for m in history if not m.is_marker),
            archived=sum(1 for m in archived if not m.is_marker),
            markers=sum(1 for m in [*history, *archived] if m.is_marker),
            plugin_loaded=plugin is not None,
            store=store,
        )
        report.calibration = host.calibration_report()
        text = report.summary or ""
        for label, value in (facts or {}).items():
            (report.facts_kept if value in text else report.facts_lost)[label] = value
    finally:
        await host.stop()
    if baseline == "replay":
        # A SQLite file in a temporary directory: the in-memory store copies the whole history
        # on every read, which is slow for a long conversation without compression.
        with tempfile.TemporaryDirectory(prefix="host-stub-baseline-") as tmp:
            bare = Host(baseline_config(config, f"sqlite:///{Path(tmp) / 'baseline.db'}"))
            await bare.start()
            try:
                if on_start is not None:
                    on_start("without", len(turns))
                report.without_plugin = await replay_series(
                    bare,
                    session_id,
                    turns,
                    on_turn=(lambda n: on_turn("without", n)) if on_turn else None,
                )
            finally:
                await bare.stop()
    report.seconds = time.perf_counter() - started
    return report


def _hard_mark(plugin_config: Any) -> float | None:
    mark = getattr(plugin_config, "hard_compress_threshold", None)
    return mark if mark and 0 < mark < 1 else None
