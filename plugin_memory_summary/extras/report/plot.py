"""The report as a plot: the context per turn with and without the plugin (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .models import ReplayReport

__all__ = ["PlotError", "check_plot_target", "plot_report"]


def _n(value: float) -> str:
    return f"{value:,.0f}"


class PlotError(RuntimeError):
    """The plot cannot be drawn (matplotlib missing, unknown file type)."""


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
    with plt.rc_context(
        {
            "path.simplify": False,
            "svg.fonttype": "none",
            "svg.hashsalt": "host-stub",
            "font.size": 10,
        }
    ):
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
