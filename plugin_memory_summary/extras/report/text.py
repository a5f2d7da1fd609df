"""The report as text: one line per compression, the summary table, the token calibration."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .models import CompressionEvent, ReplayReport
from .reasons import fallback_kinds

__all__ = ["calibration_line", "compression_line", "counted", "fallback_lines", "render_report"]


def _n(value: float) -> str:
    return f"{value:,.0f}"


def counted(count: int, noun: str, *, commas: bool = False) -> str:
    """``1 message``, ``2 messages`` (``1,200 messages`` with ``commas``)."""
    number = f"{count:,}" if commas else str(count)
    return f"{number} {noun}{'' if count == 1 else 's'}"


def compression_line(event: CompressionEvent) -> str:
    """``24 messages summarized at turn 31, tokens 3,120 -> 1,034 (rules engine)``; a turn of 0
    (not known) is left out."""
    if event.messages_summarized:
        what = f"{counted(event.messages_summarized, 'message')} summarized"
    else:
        what = f"{counted(event.messages_archived, 'message')} archived without a summary"
    if event.turn:
        what += f" at turn {event.turn}"
    tokens = ""
    if event.tokens_before is not None and event.tokens_after is not None:
        tokens = f", tokens {_n(event.tokens_before)} -> {_n(event.tokens_after)}"
    if event.model is None:
        how = "rules engine"
    elif event.fell_back:
        how = f"{event.model} failed, fallback {event.fallback}: {_why(event.reason)}"
        if event.answers_used:
            how = f"{event.model}: {event.answers_used} of {event.llm_calls} answers used, " + (
                f"fallback {event.fallback} for the rest: {_why(event.reason)}"
            )
    else:
        how = event.model
    trigger = {
        "turn": "",
        "auto": ", soft watermark",
        "hard": ", hard watermark",
        "manual": ", manual",
    }.get(event.trigger, f", {event.trigger}")
    return f"{what}{tokens} ({how}{trigger})"


#: Kinds of fallback reason listed one per line; the rest are counted on a "+N more" line.
KINDS_SHOWN = 8


def fallback_lines(reasons: Iterable[str], pad: str = " " * 23) -> list[str]:
    """One line per kind of reason (``3 x rejected: lost identifiers``), every kind up to
    :data:`KINDS_SHOWN` and then ``+N more kinds``; a provider error or a timeout shows its
    first message, cut in the middle so its numbers stay."""
    kinds = fallback_kinds(reasons)
    lines = []
    for kind, count, example in kinds[:KINDS_SHOWN]:
        detail = f": {example}" if kind.startswith(("error:", "timed out")) else ""
        lines.append(f"{pad}{count} x {kind}{detail}")
    if len(kinds) > KINDS_SHOWN:
        rest = kinds[KINDS_SHOWN:]
        lines.append(
            f"{pad}+{len(rest)} more kinds ({counted(sum(n for _, n, _ in rest), 'compression')}): "
            + ", ".join(kind for kind, _, _ in rest)
        )
    return lines


def _why(reason: str) -> str:
    """A run's reasons as their kinds; a provider error's or a timeout's message, cut in the
    middle, after its kind."""
    return ", ".join(
        f"{kind} ({example})" if kind.startswith(("error:", "timed out")) else kind
        for kind, _, example in fallback_kinds([reason])
    ) or _short(reason)


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
        f"  turns              {report.turns} ({counted(report.messages, 'message')}, "
        f"{counted(report.tool_results, 'tool result')})"
    )
    engine = report.summary_model or "the rules engine, offline, no model"
    lines.append(f"  compressions       {len(w.compressions)} (summarizer: {engine})")
    used = [e for e in w.compressions if e.answers_used]
    if report.summary_model and w.compressions:
        lines.append(
            f"  model's answer     used in {len(used)} of "
            f"{counted(len(w.compressions), 'compression')} "
            f"({sum(e.answers_used for e in w.compressions)} of "
            f"{counted(sum(e.llm_calls for e in w.compressions), 'summarizer call')})"
        )
    if report.fell_back:
        lines.append(
            f"  fell back          {len(report.fell_back)} of "
            f"{counted(len(w.compressions), 'compression')} used the "
            f"{report.fell_back[0].fallback} fallback, by kind:"
        )
        lines += fallback_lines(e.reason for e in report.fell_back)
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
            f"{_n(len(report.summary))} characters, covers "
            f"{counted(report.summary_messages, 'message')} "
            f"({counted(report.summary_compressions, 'compression')})"
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
    markers = f", {counted(report.markers, 'compression marker')}" if report.markers else ""
    lines.append(
        f"  store              {counted(report.active, 'message')} active, "
        f"{report.archived} archived"
        f"{markers}" + (f" ({report.store})" if report.store else "")
    )
    lines.append(f"  time               {report.seconds:.1f} s")
    if report.summary:
        lines.append("")
        lines.append("final summary:")
        lines += [f"  {line}" if line else "" for line in report.summary.splitlines()]
    return "\n".join(lines)
