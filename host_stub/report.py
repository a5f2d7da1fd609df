"""Replay a conversation through the host with the memory plugin, measure the context of every
turn against a baseline without the plugin, and report: text, JSON, and a plot.

Every number of the report comes from the runs: the per-turn context is the ``token:usage`` the
host measured for the prompt it actually built (after any compression before the call), and the
compressions are the ``session:compressing`` results the plugin reported.

The baseline (the context each turn would need without the plugin) is, by default, computed from
the same run: the fixed parts the host measured for the turn's last prompt (system prompt, tool
definitions, reply reserve) plus the stored token counts of every message the conversation had
by then. ``baseline="replay"`` replays the conversation a second time through the same host with
the plugin denied, on a throw-away store, and measures it; the tests check that both agree.

Between turns the replay waits for the background work the turn started (a compression), as a
user's think time would allow; so a run is reproducible.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import signals
from .config import HostConfig
from .host import Host, TurnResult
from .messages import Message
from .prompt import PrefixReuse, reuse_shares
from .transcripts import split_turns

__all__ = [
    "PLUGIN",
    "CompressionEvent",
    "PlotError",
    "ReplayReport",
    "RunSeries",
    "baseline_config",
    "check_plot_target",
    "compression_line",
    "plot_report",
    "render_report",
    "replay_series",
    "run_replay",
    "turn_context",
]

PLUGIN = "memory-summary"
FINAL = ("done", "error", "skipped")

#: How long a replay waits, after a turn, for the background work that turn started.
SETTLE_S = 600.0


class PlotError(RuntimeError):
    """The plot cannot be drawn (matplotlib missing, unknown file type)."""


@dataclass
class CompressionEvent:
    """One compression that archived messages, as the plugin reported it."""

    turn: int
    status: str
    trigger: str
    reason: str
    messages_summarized: int = 0
    messages_archived: int = 0
    tokens_before: int | None = None
    tokens_after: int | None = None
    summary_tokens: int | None = None
    model: str | None = None
    fallback: str | None = None
    cost: float = 0.0
    duration_s: float = 0.0

    @property
    def fell_back(self) -> bool:
        """A model was asked and failed (or the deadline passed): the fallback wrote it."""
        return self.model is not None and self.fallback is not None


@dataclass
class RunSeries:
    """One replay: the context measured per turn and the compressions."""

    context: list[int] = field(default_factory=list)
    #: Per turn, the context the turn would have needed with nothing compressed (see above).
    uncompressed: list[int] = field(default_factory=list)
    compressions: list[CompressionEvent] = field(default_factory=list)
    #: Final statuses that archived nothing, by status (``skipped``, ``error``).
    other_statuses: dict[str, int] = field(default_factory=dict)
    #: Per model call after a session's first: (prompt tokens reused from the previous prompt's
    #: prefix, prompt tokens), from ``token:usage``.
    prefix: list[tuple[int, int]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def max(self) -> int:
        return max(self.context, default=0)

    @property
    def mean(self) -> float:
        return sum(self.context) / len(self.context) if self.context else 0.0

    def over(self, limit: int) -> int:
        return sum(1 for c in self.context if c > limit)

    @property
    def prefix_reuse(self) -> tuple[float, float] | None:
        """Share of prompt tokens reused from the previous prompt: pooled, median per call."""
        return reuse_shares(PrefixReuse(*p) for p in self.prefix)


@dataclass
class ReplayReport:
    title: str
    session_id: str
    messages: int
    turns: int
    tool_results: int
    context_window: int
    summary_model: str | None
    auto_mark: float | None
    hard_mark: float | None
    with_plugin: RunSeries
    without_plugin: RunSeries | None
    #: How the baseline was obtained: ``computed``, ``replay`` or ``off``.
    baseline: str = "computed"
    summary: str | None = None
    summary_tokens: int = 0
    summary_messages: int = 0
    summary_compressions: int = 0
    summary_lang: str | None = None
    summary_cost: float = 0.0
    active: int = 0
    archived: int = 0
    #: Event markers the plugin wrote (one per compression); the store counts them as messages.
    markers: int = 0
    plugin_loaded: bool = True
    seconds: float = 0.0
    store: str = ""
    #: Facts stated early (label -> text): which the final summary still holds verbatim.
    facts_kept: dict[str, str] = field(default_factory=dict)
    facts_lost: dict[str, str] = field(default_factory=dict)
    #: How the chat model's token counts were calibrated (``Host.calibration_report()``).
    calibration: dict[str, Any] = field(default_factory=dict)

    @property
    def fell_back(self) -> list[CompressionEvent]:
        return [e for e in self.with_plugin.compressions if e.fell_back]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        runs = (("with_plugin", self.with_plugin), ("without_plugin", self.without_plugin))
        for key, series in runs:
            if series is not None:
                out[key].update(
                    max=series.max,
                    mean=round(series.mean, 1),
                    over_window=series.over(self.context_window),
                    prefix_reuse=series.prefix_reuse,
                )
        out["fell_back"] = len(self.fell_back)
        return out


# -- measuring -----------------------------------------------------------------------------------
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


def _event(turn: int, payload: dict[str, Any]) -> CompressionEvent | None:
    stats = payload.get("stats") or {}
    summarized = int(stats.get("messages_summarized") or 0)
    archived = int(stats.get("messages_archived") or 0)
    if not (summarized or archived):
        return None
    return CompressionEvent(
        turn=turn,
        status=payload["status"],
        trigger=str(stats.get("trigger") or payload.get("reason") or ""),
        reason=str(payload.get("reason") or ""),
        messages_summarized=summarized,
        messages_archived=archived,
        tokens_before=stats.get("tokens_before"),
        tokens_after=stats.get("tokens_after"),
        summary_tokens=stats.get("summary_tokens"),
        model=stats.get("model"),
        fallback=stats.get("fallback"),
        cost=float(stats.get("cost") or 0.0),
        duration_s=float(stats.get("duration_s") or 0.0),
    )


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

    async def on_status(sender: Any, **payload: Any) -> None:
        if payload["session_id"] != session_id or payload["status"] not in FINAL:
            return
        event = _event(current, payload)
        if event is None:
            status = payload["status"]
            series.other_statuses[status] = series.other_statuses.get(status, 0) + 1
            return
        series.compressions.append(event)
        if on_event is not None:
            on_event(event)

    host.bus.connect(signals.SESSION_COMPRESSING, on_status)
    try:
        for number, (inputs, recorded) in enumerate(turns, 1):
            current = number
            before = asyncio.all_tasks()
            result = await host.run_turn(session_id, inputs, recorded=recorded)
            spawned = asyncio.all_tasks() - before
            if spawned:  # the compression this turn started, if any
                await asyncio.wait(spawned, timeout=settle_s)
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
            "deny": [*config.plugins.deny, PLUGIN],
            "allow": None if allow is None else [n for n in allow if n != PLUGIN],
        }
    )
    host = config.host.model_copy(update={"memory": memory})
    rest = {name: value for name, value in config.plugin.items() if name != PLUGIN}
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
        item = host.plugins.get(PLUGIN)
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
        has_text = record is not None and bool(record.text)
        summary_model = (
            (plugin_config.summary_model or host.llm.default_model) if plugin_config else None
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
            summary=record.text if has_text else None,
            summary_tokens=host.count_text(record.text) if has_text else 0,
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


# -- text ----------------------------------------------------------------------------------------
def _n(value: float) -> str:
    return f"{value:,.0f}"


def compression_line(event: CompressionEvent) -> str:
    """``24 messages summarized at turn 31, tokens 3,120 -> 1,034 (rules engine)``; a turn of 0
    (not known) is left out."""
    if event.messages_summarized:
        what = f"{event.messages_summarized} messages summarized"
    else:
        what = f"{event.messages_archived} messages archived without a summary"
    if event.turn:
        what += f" at turn {event.turn}"
    tokens = ""
    if event.tokens_before is not None and event.tokens_after is not None:
        tokens = f", tokens {_n(event.tokens_before)} -> {_n(event.tokens_after)}"
    if event.model is None:
        how = "rules engine"
    elif event.fell_back:
        how = f"{event.model} failed, fallback {event.fallback}: {_short(event.reason)}"
    else:
        how = event.model
    trigger = {
        "turn": "",
        "auto": ", soft watermark",
        "hard": ", hard watermark",
        "manual": ", manual",
    }.get(event.trigger, f", {event.trigger}")
    return f"{what}{tokens} ({how}{trigger})"


def _short(text: str, limit: int = 120) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def calibration_line(calibration: dict[str, Any], summary_model: str | None) -> str | None:
    """``openai/m: the provider counts 1.25x the host's tokens (4 calls), watermark corrected``;
    ``None`` when no model was called (the rules engine, offline)."""
    if not calibration:
        return None
    model = calibration.get("model", "")
    calls = {**calibration.get("service_calls", {}), **calibration.get("agent_calls", {})}
    if not calls:
        if summary_model is None:
            return None
        return f"not calibrated: no call to {summary_model} reported its prompt tokens"
    parts = []
    for name, state in calls.items():
        parts.append(
            f"{name}: the provider counts {state['ratio']:.2f}x the host's tokens "
            f"({state['samples']} call{'' if state['samples'] == 1 else 's'})"
        )
    if not calibration.get("enabled", True):
        tail = "; calibration off (calibrate_tokens = false)"
    elif model in calls:
        tail = f"; watermark corrected x{calibration.get('ratio', 1.0):.2f}"
    else:
        tail = ""
    return "; ".join(parts) + tail


def render_report(report: ReplayReport) -> str:
    """The report as plain text (numbers from the runs only)."""
    w = report.with_plugin
    b = report.without_plugin
    window = report.context_window
    lines = [f"report: {report.title}"]
    lines.append(
        f"  turns              {report.turns} ({report.messages} messages, "
        f"{report.tool_results} tool results)"
    )
    engine = report.summary_model or "the rules engine, offline, no model"
    lines.append(f"  compressions       {len(w.compressions)} (summarizer: {engine})")
    if report.fell_back:
        reasons = Counter(_short(e.reason, 100) for e in report.fell_back)
        lines.append(
            f"  fell back          {len(report.fell_back)} of {len(w.compressions)} "
            f"compressions used the {report.fell_back[0].fallback} fallback:"
        )
        pad = " " * 23
        lines += [f"{pad}{count} x {reason}" for reason, count in reasons.most_common(3)]
    elif report.summary_model:
        lines.append("  fell back          0 compressions")
    marks = []
    if report.auto_mark:
        marks.append(f"soft mark {report.auto_mark:.0%} = {_n(window * report.auto_mark)}")
    if report.hard_mark:
        marks.append(f"hard mark {report.hard_mark:.0%} = {_n(window * report.hard_mark)}")
    lines.append(
        f"  context window     {_n(window)} tokens" + (f" ({', '.join(marks)})" if marks else "")
    )
    lines.append(
        "  context per turn   with plugin   without plugin"
        + {
            "computed": " (computed from the same run)",
            "replay": " (replayed without the plugin)",
        }.get(report.baseline, "")
    )
    for label, a, c in (
        ("max", _n(w.max), _n(b.max) if b else "-"),
        ("mean", _n(w.mean), _n(b.mean) if b else "-"),
        ("turns over window", str(w.over(window)), str(b.over(window)) if b else "-"),
    ):
        lines.append(f"    {label:<17}{a:>12}   {c:>14}")
    reuse = w.prefix_reuse
    if reuse is not None:
        bare = b.prefix_reuse if b is not None else None
        lines.append(
            f"  prompt prefix      {reuse[0]:.0%} of prompt tokens reused from the previous "
            f"call's prompt (median per call {reuse[1]:.0%}, {len(w.prefix)} calls)"
            + (f"; without the plugin {bare[0]:.0%}" if bare is not None else "")
        )
    if not report.plugin_loaded:
        lines.append("  summary            (the memory-summary plugin is not loaded)")
    elif report.summary:
        lines.append(
            f"  summary            {_n(report.summary_tokens)} tokens, "
            f"{_n(len(report.summary))} characters, covers {report.summary_messages} "
            f"messages ({report.summary_compressions} compressions)"
        )
    else:
        lines.append("  summary            none (nothing was compressed)")
    if report.facts_kept or report.facts_lost:
        total = len(report.facts_kept) + len(report.facts_lost)
        lost = ", ".join(report.facts_lost.values())
        kept = len(report.facts_kept)
        lines.append(
            f"  early facts        {kept} of {total} still in the summary"
            + (f"; lost: {lost}" if lost else "")
        )
    if report.summary_cost:
        lines.append(f"  summarizer cost    ${report.summary_cost:.4f}")
    calibrated = calibration_line(report.calibration, report.summary_model)
    if calibrated:
        lines.append(f"  token counts       {calibrated}")
    markers = f", {report.markers} compression markers" if report.markers else ""
    lines.append(
        f"  store              {report.active} messages active, {report.archived} archived"
        f"{markers}" + (f" ({report.store})" if report.store else "")
    )
    lines.append(f"  time               {report.seconds:.1f} s")
    if report.summary:
        lines.append("")
        lines.append("final summary:")
        lines += [f"  {line}" if line else "" for line in report.summary.splitlines()]
    return "\n".join(lines)


# -- plot ----------------------------------------------------------------------------------------
def check_plot_target(path: str | Path) -> None:
    """Fail before a long replay if the plot cannot be written: type, matplotlib, directory."""
    import importlib.util

    path = Path(path)
    if path.suffix.lower() not in (".svg", ".png"):
        raise PlotError(f"{path}: the plot must be a .svg or .png file")
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotError("plotting needs matplotlib: pip install 'plugin-memory-summary[plot]'")
    if not path.parent.is_dir():
        raise PlotError(f"{path}: directory {str(path.parent)!r} does not exist")


def plot_report(report: ReplayReport, path: str | Path) -> dict[str, Any]:
    """Draw the context per turn (with and without the plugin), the window and the watermarks,
    and mark the compressions; write SVG or PNG by the file's extension. Returns what was drawn.

    The elements carry ids in the SVG: ``with-plugin`` (one vertex per turn), ``without-plugin``,
    ``compressions`` (one marker per compression), ``context-window``, ``soft-mark``."""
    path = Path(path)
    kind = path.suffix.lower().lstrip(".")
    if kind not in ("svg", "png"):
        raise PlotError(f"{path}: the plot must be a .svg or .png file")
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib import pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        raise PlotError(
            "plotting needs matplotlib: pip install 'plugin-memory-summary[plot]'"
        ) from None

    w, b = report.with_plugin, report.without_plugin
    window = report.context_window
    turns = list(range(1, len(w.context) + 1))
    marks = [
        (e.turn, w.context[e.turn - 1]) for e in w.compressions if 0 < e.turn <= len(w.context)
    ]
    # The baseline can grow far past the window: show up to ~1.6 windows and say where it ends.
    top = max(w.max, window) * 1.25
    clipped = b is not None and b.max > top * 1.3
    if b is not None and not clipped:
        top = max(top, b.max * 1.05)
    drawn: dict[str, Any] = {
        "turns": turns,
        "with_plugin": list(w.context),
        "without_plugin": list(b.context) if b else None,
        "compressions": marks,
        "window": window,
    }
    rc = {
        "path.simplify": False,
        "svg.fonttype": "none",
        "svg.hashsalt": "host-stub",
        "font.size": 10,
    }
    with plt.rc_context(rc):
        fig, ax = plt.subplots(figsize=(10, 5.4), dpi=110, layout="constrained")
        try:
            if b is not None:
                (line,) = ax.plot(
                    turns[: len(b.context)],
                    b.context,
                    color="#9aa0a6",
                    lw=1.6,
                    label="without the plugin",
                )
                line.set_gid("without-plugin")
                if clipped:
                    ax.annotate(
                        f"without the plugin: {_n(b.max)} tokens by turn {len(b.context)}"
                        f" ({b.max / window:.0f}x the window)",
                        xy=(_first_over(b.context, top) or 1, top),
                        xycoords="data",
                        xytext=(0.35, 0.93),
                        textcoords="axes fraction",
                        color="#5f6368",
                        arrowprops={"arrowstyle": "->", "color": "#9aa0a6"},
                        va="center",
                    )
            (line,) = ax.plot(turns, w.context, color="#1a73e8", lw=1.6, label="with the plugin")
            line.set_gid("with-plugin")
            if marks:
                (dots,) = ax.plot(
                    [t for t, _ in marks],
                    [c for _, c in marks],
                    linestyle="none",
                    marker="v",
                    ms=6,
                    color="#d93025",
                    label=f"compression ({len(marks)})",
                )
                dots.set_gid("compressions")
            budget = ax.axhline(
                window, color="#d93025", lw=1.2, label=f"context window ({_n(window)})"
            )
            budget.set_gid("context-window")
            if report.auto_mark:
                soft = ax.axhline(
                    window * report.auto_mark,
                    color="#f29900",
                    lw=1,
                    ls="--",
                    label=f"soft watermark ({report.auto_mark:.0%})",
                )
                soft.set_gid("soft-mark")
            ax.set_xlim(0, max(len(turns), 1) + 1)
            ax.set_ylim(0, top)
            ax.set_xlabel("turn")
            ax.set_ylabel("context tokens sent to the model")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            ax.grid(axis="y", color="#e8eaed")
            ax.spines[["top", "right"]].set_visible(False)
            ax.set_title(f"{report.title}: context per turn, {len(marks)} compressions", loc="left")
            legend = fig.legend(loc="outside lower center", ncols=5, frameon=False, fontsize=9)
            legend.set_gid("legend")
            fig.savefig(path, format=kind, metadata={"Date": None} if kind == "svg" else None)
        finally:
            plt.close(fig)
    return drawn


def _first_over(values: Sequence[int], limit: float) -> int | None:
    return next((i + 1 for i, v in enumerate(values) if v > limit), None)
