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

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import CompressionEvent, ReplayReport, RunSeries, compression_event
    from .plot import PlotError, check_plot_target, plot_report
    from .replay import baseline_config, replay_series, run_replay, turn_context
    from .text import calibration_line, compression_line, render_report

#: Where each name lives; a submodule is imported on first use (the ``replay`` and ``demo``
#: commands are registered at every CLI start and need none of them until they run).
_HOME = {
    "CompressionEvent": "models",
    "ReplayReport": "models",
    "RunSeries": "models",
    "compression_event": "models",
    "PlotError": "plot",
    "check_plot_target": "plot",
    "plot_report": "plot",
    "baseline_config": "replay",
    "replay_series": "replay",
    "run_replay": "replay",
    "turn_context": "replay",
    "calibration_line": "text",
    "compression_line": "text",
    "render_report": "text",
}

__all__ = [
    "CompressionEvent",
    "PlotError",
    "ReplayReport",
    "RunSeries",
    "baseline_config",
    "calibration_line",
    "check_plot_target",
    "compression_event",
    "compression_line",
    "plot_report",
    "render_report",
    "replay_series",
    "run_replay",
    "turn_context",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
