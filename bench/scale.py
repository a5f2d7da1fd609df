"""Scale: many concurrent sessions through one host (one process, one SQLite file) with a fake
LLM of fixed latency for both the chat model and the summarizer; with and without the plugin.

Every session is an asyncio task running its turns one after another (``run_turn`` with the
model called: the fake answers after ``--latency`` seconds). Reported: turn latency with and
without the plugin and the difference (the plugin's added latency), compressions per second,
summarizer calls in flight at most against the plugin's global cap
(``max_concurrent_summaries``), the backlog left when the last turn ended, and peak memory
(``ru_maxrss`` of each variant's own process).

    python bench/scale.py [--sessions 1000] [--turns 100] [--latency 0.2] [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    Table,
    TokenCounter,
    make_rig,
    out_dir,
    parser,
    percentile,
    print_versions,
    progress,
    versions,
    write_results,
)
from fakes import CHAT_MODEL, SUMMARIZER_MODEL, bench_llm, chat_stats, summarizer_stats  # noqa: E402

CAP = 4  # the plugin's default max_concurrent_summaries
#: The chat model's window: a chat here grows by about 100 tokens a turn, so at the defaults (which
#: compress at the soft mark, 0.85 of the window, not on a message count) its first compression
#: comes near turn 65 of 100, and another may follow. At 16,000 tokens, this bench's window until
#: the defaults changed, nothing was compressed at all.
WINDOW = 8_000
_WORDS = (
    "please check my booking for next week and tell me whether the seat upgrade to row 12 "
    "is still possible, my customer number is 4471-XK and I travel with two children"
).split()


def user_text(session: int, turn: int) -> str:
    n = 20 + (session * 31 + turn * 17) % 25
    return f"[s{session} t{turn}] " + " ".join(
        _WORDS[(session + turn * 3 + k) % len(_WORDS)] for k in range(n)
    )


async def child(variant: str, sessions: int, turns: int, latency: float) -> dict[str, Any]:
    counter = TokenCounter()
    llm = bench_llm(counter=counter, latency=latency, default_model=CHAT_MODEL, reply_words=30)
    config = (
        {"summary_model": SUMMARIZER_MODEL, "max_concurrent_summaries": CAP}
        if variant == "plugin"
        else None
    )
    rig = await make_rig(llm, config, context_window=WINDOW, model=CHAT_MODEL)
    latencies: list[float] = []
    errors = 0
    rng = random.Random(7)
    jitter = [rng.uniform(0, max(latency, 0.01) * 5) for _ in range(sessions)]
    done_turns = [0]

    async def session(i: int) -> None:
        nonlocal errors
        await asyncio.sleep(jitter[i])
        for t in range(turns):
            start = time.perf_counter()
            result = await rig.host.run_turn(f"s{i:04d}", user_text(i, t))
            latencies.append(time.perf_counter() - start)
            errors += result.outcome != "replied"
            done_turns[0] += 1

    async def report() -> None:
        total = sessions * turns
        while done_turns[0] < total:
            await asyncio.sleep(15)
            progress(
                f"{variant}: {done_turns[0]}/{total} turns, "
                f"{len(rig.finals('done'))} compressions, "
                f"summarizer in flight max {summarizer_stats(llm).max_in_flight}"
            )

    started = time.perf_counter()
    reporter = asyncio.ensure_future(report())
    await asyncio.gather(*(session(i) for i in range(sessions)))
    turns_s = time.perf_counter() - started
    reporter.cancel()
    done_at_end = len(rig.finals("done"))
    backlog = len(rig.plugin.scheduler.running) if variant == "plugin" else 0
    drain_start = time.perf_counter()
    await rig.drain()
    drain_s = time.perf_counter() - drain_start
    sessions_info = await rig.host.memory.list_sessions()
    await rig.close()
    statuses = rig.statuses
    reasons: dict[str, int] = {}
    for s in statuses:
        if s["status"] == "start":
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    return {
        "variant": variant,
        "sessions": sessions,
        "turns": turns,
        "latency_s": latency,
        "turns_wall_s": turns_s,
        "turn_latencies": latencies,
        "errors": errors,
        "compressions_done": done_at_end,
        "compressions_done_total": len(rig.finals("done")),
        "compression_errors": len(rig.finals("error")),
        "compression_starts_by_reason": reasons,
        "backlog_at_end": backlog,
        "drain_s": drain_s,
        "summarizer_calls": summarizer_stats(llm).calls,
        "summarizer_max_in_flight": summarizer_stats(llm).max_in_flight,
        "chat_calls": chat_stats(llm).calls,
        "active_mean": sum(s.active for s in sessions_info) / max(1, len(sessions_info)),
        "active_max": max((s.active for s in sessions_info), default=0),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_variant(variant: str, args: Any) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--variant",
        variant,
        "--sessions",
        str(args.sessions),
        "--turns",
        str(args.turns),
        "--latency",
        str(args.latency),
    ]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=None)
    p.add_argument("--turns", type=int, default=None)
    p.add_argument("--latency", type=float, default=None, help="fake LLM latency, seconds")
    p.add_argument("--variant", choices=["plugin", "none"], help=argparse_internal())
    p.add_argument("--name", default="scale", help="results file name (default: scale)")
    args = p.parse_args()
    args.sessions = args.sessions or (20 if args.quick else 1000)
    args.turns = args.turns or (20 if args.quick else 100)
    args.latency = args.latency if args.latency is not None else (0.02 if args.quick else 0.2)
    if args.variant:
        result = asyncio.run(child(args.variant, args.sessions, args.turns, args.latency))
        print(json.dumps(result))
        return
    out = out_dir(args.out)
    v = versions()
    print_versions(v)
    started = time.perf_counter()
    results = {}
    for variant in ("plugin", "none"):
        progress(
            f"variant {variant}: {args.sessions} sessions x {args.turns} turns, "
            f"latency {args.latency}s"
        )
        results[variant] = run_variant(variant, args)

    table = Table(
        f"{args.sessions} concurrent sessions x {args.turns} turns, one host, fake LLM "
        f"{args.latency * 1000:.0f} ms (chat and summarizer)",
        ["measure", "with plugin", "without plugin", "difference"],
    )
    w, n = results["plugin"], results["none"]
    lat_w = [x * 1000 for x in w.pop("turn_latencies")]
    lat_n = [x * 1000 for x in n.pop("turn_latencies")]
    for label, q in (
        ("turn latency p50 (ms)", 50),
        ("turn latency p99 (ms)", 99),
        ("turn latency max (ms)", 100),
    ):
        a, b = percentile(lat_w, q), percentile(lat_n, q)
        table.add(label, round(a, 1), round(b, 1), round(a - b, 1))
    model_ms = args.latency * 1000
    table.add(
        "turn latency p99 minus the model call (ms)",
        round(percentile(lat_w, 99) - model_ms, 1),
        round(percentile(lat_n, 99) - model_ms, 1),
        "",
    )
    table.add("turns failed", w["errors"], n["errors"], "")
    table.add(
        "wall time of the turns (s)", round(w["turns_wall_s"], 1), round(n["turns_wall_s"], 1), ""
    )
    table.add(
        "turns per second",
        round(len(lat_w) / w["turns_wall_s"], 1),
        round(len(lat_n) / n["turns_wall_s"], 1),
        "",
    )
    table.add(
        "compressions done while turns ran (per second)",
        f"{w['compressions_done']} ({w['compressions_done'] / w['turns_wall_s']:.1f}/s)",
        "-",
        "",
    )
    table.add(
        "compressions by trigger (starts)",
        ", ".join(f"{k} {v}" for k, v in sorted(w["compression_starts_by_reason"].items())),
        "-",
        "",
    )
    table.add("compression errors", w["compression_errors"], "-", "")
    table.add(
        f"summarizer calls in flight, max (cap {CAP})",
        w["summarizer_max_in_flight"],
        "-",
        "cap held" if w["summarizer_max_in_flight"] <= CAP else "CAP EXCEEDED",
    )
    table.add("compressions queued when the last turn ended", w["backlog_at_end"], "-", "")
    table.add("time to drain that backlog (s)", round(w["drain_s"], 1), "-", "")
    table.add(
        "active messages per session at the end (mean / max)",
        f"{w['active_mean']:.0f} / {w['active_max']}",
        f"{n['active_mean']:.0f} / {n['active_max']}",
        "",
    )
    table.add(
        "peak memory, whole process (MB)",
        round(w["peak_rss_mb"]),
        round(n["peak_rss_mb"]),
        round(w["peak_rss_mb"] - n["peak_rss_mb"]),
    )
    write_results(
        args.name,
        "Scale: concurrent sessions through one host",
        [table],
        out=out,
        versions_used=v,
        settings={
            "sessions": args.sessions,
            "turns": args.turns,
            "latency_s": args.latency,
            "context_window": WINDOW,
            "plugin": f"defaults, summary_model {SUMMARIZER_MODEL}, max_concurrent_summaries {CAP}",
            "quick": args.quick,
        },
        runtime_s=time.perf_counter() - started,
        notes=[
            "Each variant runs in its own process (peak memory = its ru_maxrss). Sessions start "
            "with a random 0-5x latency offset, then run their turns back to back.",
            "Added latency = with plugin minus without, at the same percentile; both include "
            "queueing on the one event loop and the one SQLite connection.",
        ],
        extra=results,
    )


def argparse_internal() -> str:
    return "internal: run one variant and print its JSON"


if __name__ == "__main__":
    main()
