"""The host's floor: how much of our whole host turn is the reference host itself, with and
without its durable store, set beside LangChain ``SummarizationMiddleware.before_model`` on the
same tau-bench steps.

Five systems on each trajectory, interleaved as in ``bench/peers.py``: ours with the memory
plugin as shipped, on a SQLite file and in memory; the same host with the plugin's strategy
``off`` (it stores, builds the prompt and dispatches every hook and signal as always; the plugin
returns at once and nothing is summarized, so the history is not bounded), on both stores; and
the middleware's call. Each step of ours is the whole host turn around a model call, timed as in
``bench/peers.py``; the tables count only the steps that wait for no summarizer.

    python3 -m venv .benchvenv && .benchvenv/bin/pip install -e '.[bench]'
    .benchvenv/bin/python bench/host_floor.py [--data DIR] [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BUDGET,
    Table,
    TokenCounter,
    mean,
    out_dir,
    parser,
    percentile,
    print_versions,
    progress,
    require_data,
    us,
    versions,
    write_results,
)
from peer_runs import KEEP_MESSAGES, LANGCHAIN, PEER_PACKAGES, import_peers, run_langchain  # noqa: E402
from peers import (  # noqa: E402
    add_step_options,
    fixed_tokens,
    interleaved,
    run_ours,
    slash,
    step_settings,
)
from replay import SystemRun  # noqa: E402
from settings import RECOMMENDED, SETTINGS  # noqa: E402
from verdict import split_steps  # noqa: E402

from host_stub.datasets import load_tau_bench  # noqa: E402

#: Our systems: label -> (plugin config over the recommended setting, store URL or None for a
#: SQLite file).
OURS: dict[str, tuple[dict[str, Any], str | None]] = {
    "ours, SQLite": ({}, None),
    "ours, in memory": ({}, "memory://"),
    "host alone (plugin off), SQLite": ({"strategy": "off"}, None),
    "host alone (plugin off), in memory": ({"strategy": "off"}, "memory://"),
}
MIDDLEWARE = f"{LANGCHAIN}.before_model (keep {KEEP_MESSAGES} msgs)"

COLUMNS = [
    "data set",
    "system",
    "steps not waiting",
    "messages sent verbatim (mean)",
    "whole turn p50 / p99 (us)",
    "to the middleware: p50 / p99",
    "at or below the middleware: p50 / p99",
]


def turn_figures(runs: list[SystemRun]) -> dict[str, float]:
    """The steps that wait for no summarizer: how many, their p50 and p99 (us), and the mean
    number of messages the prompts carried (all steps)."""
    turn, _ = split_steps(
        [t for r in runs for t in r.step_times], [w for r in runs for w in r.waited]
    )
    return {
        "steps": len(turn),
        "p50_us": us(percentile(turn, 50)),
        "p99_us": us(percentile(turn, 99)),
        "messages": mean([s.verbatim for r in runs for s in r.steps]),
    }


def floor_row(figures: dict[str, float], middleware: dict[str, float]) -> list[Any]:
    """One system's columns after its label, against the middleware's figures."""
    ratios = [figures[k] / middleware[k] for k in ("p50_us", "p99_us")]
    at_or_below = ["yes" if figures[k] <= middleware[k] else "no" for k in ("p50_us", "p99_us")]
    return [
        figures["steps"],
        round(figures["messages"], 1),
        slash(figures["p50_us"], figures["p99_us"]),
        " / ".join(f"{r:.2f}x" for r in ratios),
        " / ".join(at_or_below),
    ]


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    add_step_options(p)
    args = p.parse_args()
    lc = import_peers()
    tau_path = require_data(args.data, "tau_bench/airline_dev.json")
    out = out_dir(args.out)
    v = versions(PEER_PACKAGES)
    print_versions(v)
    started = time.perf_counter()
    counter = TokenCounter(cached=False)
    tau = load_tau_bench(tau_path)
    if args.quick:
        tau = tau[:5]
    latency = args.model_latency_ms / 1000
    history = args.history_budget
    cases: list[tuple[str, Callable[[Any], int]]] = [
        ("tau-bench", lambda c: BUDGET),
        (f"tau-bench, {history:,}-token history", lambda c: fixed_tokens(c, counter) + history),
    ]
    table = Table(
        "The whole host turn with and without the memory plugin, on a SQLite file and in "
        "memory, against the middleware's call on the same steps (steps that wait for no "
        f"summarizer; {args.model_latency_ms:g} ms model calls)",
        COLUMNS,
    )
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, budget_of in cases:
        systems: dict[str, Callable[..., Any]] = {
            label: functools.partial(
                run_ours,
                config={**SETTINGS[RECOMMENDED], **config},
                counter=counter,
                label=label,
                model_latency_s=latency,
                memory=memory,
            )
            for label, (config, memory) in OURS.items()
        }
        systems[MIDDLEWARE] = functools.partial(
            run_langchain, lc, counter=counter, model_latency_s=latency
        )
        runs: dict[str, list[SystemRun]] = {label: [] for label in systems}
        for i, label in interleaved(len(tau), list(systems)):
            if all(len(r) == i for r in runs.values()):
                progress(f"{name}: trajectory {i + 1} of {len(tau)}")
            run = systems[label](tau[i], budget=budget_of(tau[i]))
            runs[label].append(await run if inspect.isawaitable(run) else run)
        figures = {label: turn_figures(rs) for label, rs in runs.items()}
        results[name] = figures
        peer = figures[MIDDLEWARE]
        for label, f in figures.items():
            table.add(f"{name} ({len(tau)})", label, *floor_row(f, peer))
    notes = [
        f"Budget {BUDGET} tokens for the whole prompt (ours: the host's context_window; the "
        f"middleware: its trigger, keeping {KEEP_MESSAGES} messages); the {history:,}-token "
        "history rows: each trajectory's system prompt plus that many tokens. Same uncached "
        "token counter and fake instant summarizer as bench/peers.py.",
        "Host alone: the same host and store with the plugin's strategy 'off': every append, "
        "snapshot, prompt build, hook and signal of a turn, nothing summarized; its history is "
        "not bounded, so its prompts carry more messages than the others (the 'messages"
        " sent verbatim' column): a ceiling on what the host alone costs on these "
        "trajectories.",
        "Whole turn: from the end of one model call (or the turn's start) until the next "
        "prompt is ready, plus a turn's tail after its last call; the middleware: its "
        "before_model call alone, which keeps its state in a Python list and writes nothing.",
    ]
    write_results(
        "host_floor",
        "The host's floor: the whole turn with and without the memory plugin, against the "
        "middleware's call",
        [table],
        out=out,
        versions_used=v,
        settings=step_settings(args),
        runtime_s=time.perf_counter() - started,
        notes=notes,
        extra=results,
    )


if __name__ == "__main__":
    asyncio.run(main())
