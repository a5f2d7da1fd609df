"""The plugin's added cost per turn on the hot path, at history lengths 100, 300 and 600, on the
SQLite backend: the turn-end handler and the prompt contribution (plus the two per-call
receivers, ``token:usage`` and ``before_model_call``), and the whole turn, each with and without
the plugin, p50 and p99.

Two hosts per history length, one with the plugin (from its entry point) and one without, each
on its own SQLite file with one session holding N active messages (the plugin's has a summary,
so ``agent_prompt`` injects it). The plugin runs with ``threshold`` out of reach and a 128k
window, so what is timed is the per-turn check, not a compression (compressions run in the
background, off the turn). Each component is timed alternately on both hosts; the whole turn
is a replayed turn (``run_turn(..., recorded=...)``) after which, untimed, the oldest messages are
archived so the history stays at N.

    python bench/overhead.py [--quick] [--out DIR] [--iterations N]

With ``--flatness`` it times instead the whole host turn (store append, snapshot, prompt build,
the plugin's hooks, the recorded reply's append; no model) at message 100 and at message 3,000
of a chat, on the in-memory store and on SQLite, with the same 60 messages active in both (the
rest archived), and writes ``overhead_flatness``: does a turn cost the same late in a long chat?
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    Rig,
    Table,
    TokenCounter,
    make_rig,
    out_dir,
    parser,
    percentile,
    print_versions,
    progress,
    us,
    versions,
    write_results,
)
from fakes import bench_llm  # noqa: E402

from host_stub import signals  # noqa: E402
from host_stub.messages import Message  # noqa: E402

LENGTHS = (100, 300, 600)
PLUGIN = {"threshold": 100_000, "keep_recent": 20}
SESSION = "bench-session"
_WORDS = (
    "the flight to Seattle leaves on May 20th and the reservation id is ZFA04Y; "
    "I prefer an aisle seat, my budget is 500 dollars, and my daughter travels with me"
).split()


def text(i: int, n: int = 30) -> str:
    return " ".join(_WORDS[(i * 7 + k) % len(_WORDS)] for k in range(n)) + f" ({i})"


def conversation(n: int, start: int = 0) -> list[Message]:
    return [
        Message(role="user" if i % 2 == 0 else "assistant", content=text(i))
        for i in range(start, start + n)
    ]


async def prepare(plugin: bool, length: int, counter: TokenCounter) -> Rig:
    rig = await make_rig(
        bench_llm(counter=counter), PLUGIN if plugin else None, context_window=None
    )
    memory = rig.host.memory
    if plugin:
        await memory.append(SESSION, conversation(60))
        result = await rig.plugin.compress(SESSION)
        assert result["status"] == "done", result
        active = [m for m in await memory.get_history(SESSION) if not m.is_marker]
        await memory.append(SESSION, conversation(length - len(active), start=60))
    else:
        await memory.append(SESSION, conversation(length))
    active = [m for m in await memory.get_history(SESSION) if not m.is_marker]
    assert len(active) == length, (len(active), length)
    return rig


async def sample(
    fns: dict[str, Callable[[], Awaitable[Any]]], iterations: int
) -> dict[str, list[float]]:
    """Time each coroutine function ``iterations`` times, alternating between them."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(max(5, iterations // 50)):  # warm-up
        for fn in fns.values():
            await fn()
    for _ in range(iterations):
        for key, fn in fns.items():
            start = time.perf_counter()
            await fn()
            times[key].append(time.perf_counter() - start)
    return times


async def measure(
    length: int, iterations: int, turn_iterations: int, counter: TokenCounter
) -> dict[str, dict[str, list[float]]]:
    with_plugin = await prepare(True, length, counter)
    without = await prepare(False, length, counter)
    rigs = {"plugin": with_plugin, "none": without}
    out: dict[str, dict[str, list[float]]] = {}
    try:
        views: dict[str, Any] = {}
        usages: dict[str, Any] = {}
        last: dict[str, tuple[Message, Message]] = {}
        for key, rig in rigs.items():
            _, _, usage, view = await rig.host.build_prompt(SESSION)
            views[key], usages[key] = view, usage
            active = [m for m in view.messages if not m.is_marker]
            last[key] = (active[-2], active[-1])
        assert views["plugin"].summary is not None and any(
            c.id == "memory-summary"
            for c in await with_plugin.host._collect_contributions(views["plugin"])
        ), "the plugin did not inject its summary"

        def turn_after(key: str) -> Callable[[], Awaitable[Any]]:
            user, reply = last[key]
            bus = rigs[key].host.bus
            return lambda: bus.send(
                signals.AGENT_TURN_AFTER,
                session_id=SESSION,
                model="bench/chat",
                outcome="replied",
                message=user,
                reply=reply,
                metadata={},
            )

        def token_usage(key: str) -> Callable[[], Awaitable[Any]]:
            payload = usages[key].model_dump()
            bus = rigs[key].host.bus
            return lambda: bus.send(signals.TOKEN_USAGE, **payload)

        async def agent_prompt_direct() -> Any:
            return with_plugin.plugin.agent_prompt(view=views["plugin"])

        progress(f"N={length}: components")
        gc.collect()
        out["turn_after"] = await sample({k: turn_after(k) for k in rigs}, iterations)
        out["collect"] = await sample(
            {k: (lambda r=rigs[k], v=views[k]: r.host._collect_contributions(v)) for k in rigs},
            iterations,
        )
        out["agent_prompt"] = await sample({"plugin": agent_prompt_direct}, iterations)
        out["token_usage"] = await sample({k: token_usage(k) for k in rigs}, iterations)
        out["before_call"] = await sample(
            {k: (lambda r=rigs[k], v=views[k]: r.host._before_model_call(v)) for k in rigs},
            iterations,
        )

        progress(f"N={length}: whole turns")
        counter_i = [0]

        def whole_turn(key: str) -> Callable[[], Awaitable[Any]]:
            rig = rigs[key]

            async def turn() -> Any:
                counter_i[0] += 1
                i = counter_i[0]
                return await rig.host.run_turn(
                    SESSION, text(i), recorded=[Message(role="assistant", content=text(i + 1))]
                )

            return turn

        turn_times: dict[str, list[float]] = {k: [] for k in rigs}
        for n in range(turn_iterations + 10):
            for key, rig in rigs.items():
                start = time.perf_counter()
                result = await whole_turn(key)()
                elapsed = time.perf_counter() - start
                assert result.outcome == "replied", result
                if n >= 10:
                    turn_times[key].append(elapsed)
                await rig.host.memory.trim_history(SESSION, keep_recent=length)
        out["turn"] = turn_times
        active = [m for m in await with_plugin.host.memory.get_history(SESSION) if not m.is_marker]
        assert len(active) == length
        assert not with_plugin.finals("done")[1:], "a compression ran during the timing"
    finally:
        for rig in rigs.values():
            await rig.close()
    return out


FLAT_TOTALS = (100, 3000)
FLAT_ACTIVE = 60
FLAT_STORES = ("memory", "sqlite")
ROUNDS = 8


async def flat_rig(store: str, total: int, counter: TokenCounter) -> Rig:
    """A host with the plugin whose session has ``total`` messages, a summary, and the newest
    ``FLAT_ACTIVE`` active."""
    rig = await make_rig(
        bench_llm(counter=counter),
        PLUGIN,
        context_window=None,
        memory="memory://" if store == "memory" else None,
    )
    memory = rig.host.memory
    await memory.append(SESSION, conversation(FLAT_ACTIVE))
    result = await rig.plugin.compress(SESSION)
    assert result["status"] == "done", result
    stored = (await memory.list_sessions())[0]
    await memory.append(SESSION, conversation(total - stored.last_seq, start=FLAT_ACTIVE))
    await memory.trim_history(SESSION, keep_recent=FLAT_ACTIVE)
    info = (await memory.list_sessions())[0]
    assert info.last_seq == total and info.active <= FLAT_ACTIVE + 1, info
    return rig


async def flat_turns(rig: Rig, turns: int) -> list[float]:
    times: list[float] = []
    for n in range(turns + 10):
        start = time.perf_counter()
        result = await rig.host.run_turn(
            SESSION, text(n), recorded=[Message(role="assistant", content=text(n + 1))]
        )
        elapsed = time.perf_counter() - start
        assert result.outcome == "replied", result
        if n >= 10:
            times.append(elapsed)
        await rig.host.memory.trim_history(SESSION, keep_recent=FLAT_ACTIVE)
    return times


async def flatness(args: Any, out: Path, v: dict[str, str]) -> None:
    turns = 60 if args.quick else (args.iterations or 400)
    counter = TokenCounter()
    started = time.perf_counter()
    results: dict[str, dict[int, list[float]]] = {}
    for store in FLAT_STORES:
        rigs = {}
        try:
            for total in FLAT_TOTALS:
                progress(f"{store}: preparing {total} messages")
                rigs[total] = await flat_rig(store, total, counter)
            results[store] = {total: [] for total in FLAT_TOTALS}
            # Alternate the two lengths in rounds, so load drifts hit both alike.
            for r in range(ROUNDS):
                for total, rig in rigs.items():
                    progress(f"{store}: {total} messages, round {r + 1}/{ROUNDS}")
                    gc.collect()
                    results[store][total] += await flat_turns(rig, turns // ROUNDS)
        finally:
            for rig in rigs.values():
                await rig.close()
    table = Table(
        f"Whole host turn (us), {FLAT_ACTIVE} messages active, a summary injected, no model; "
        "at message 100 and 3,000 of the chat",
        [
            "store",
            "p50 @100",
            "p50 @3,000",
            "p50 ratio",
            "p99 @100",
            "p99 @3,000",
            "p99 ratio",
            "flat (within 20%)",
        ],
    )
    extra: dict[str, Any] = {}
    for store, by_total in results.items():
        a, b = by_total[FLAT_TOTALS[0]], by_total[FLAT_TOTALS[1]]
        a50, b50 = us(percentile(a, 50)), us(percentile(b, 50))
        a99, b99 = us(percentile(a, 99)), us(percentile(b, 99))
        flat = b50 <= 1.2 * a50 and b99 <= 1.2 * a99
        table.add(
            store,
            a50,
            b50,
            round(b50 / a50, 2),
            a99,
            b99,
            round(b99 / a99, 2),
            "yes" if flat else "no",
        )
        extra[store] = {str(t): [round(x * 1e6, 1) for x in by_total[t]] for t in FLAT_TOTALS}
    write_results(
        "overhead_flatness",
        "Whole host turn at message 100 vs 3,000 (in-memory and SQLite)",
        [table],
        out=out,
        versions_used=v,
        settings={"turns": turns, "active": FLAT_ACTIVE, "quick": args.quick},
        runtime_s=time.perf_counter() - started,
        notes=[
            "Each session: 60 messages compressed into a summary (the rules engine), then "
            "messages appended up to the length, then all but the newest 60 archived; each timed "
            "turn appends a user message and a recorded reply (run_turn with recorded=...), and "
            "the oldest are archived again, untimed, so 60 stay active.",
            "The plugin is on (threshold 100000: no compression while timing); bench_llm counts "
            "with cl100k_base; 128k window. Turns at both lengths alternate in 8 rounds.",
        ],
        extra=extra,
    )


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=None, help="timed calls per component")
    p.add_argument(
        "--flatness", action="store_true", help="whole turn at message 100 vs 3,000 instead"
    )
    args = p.parse_args()
    out = out_dir(args.out)
    v = versions()
    print_versions(v)
    if args.flatness:
        await flatness(args, out, v)
        return
    iterations = args.iterations or (300 if args.quick else 5000)
    turn_iterations = max(20, iterations // 25) if args.quick else 300
    counter = TokenCounter()
    started = time.perf_counter()
    results = {}
    for length in LENGTHS:
        results[length] = await measure(length, iterations, turn_iterations, counter)

    components = Table(
        "Hot-path components, microseconds (plugin = with the plugin's receivers/hooks; none = "
        "the same host call without the plugin)",
        [
            "history",
            "component",
            "plugin p50",
            "plugin p99",
            "none p50",
            "none p99",
            "added p50",
            "added p99",
        ],
    )
    summary = Table(
        "Per turn (one model call): the plugin's added time vs the whole turn without the plugin",
        [
            "history",
            "added hot path p50 (us)",
            "added hot path p99 (us)",
            "turn without plugin p50 (us)",
            "turn without plugin p99 (us)",
            "turn with plugin p50 (us)",
            "turn with plugin p99 (us)",
            "added / turn (p50)",
            "turn ratio with/without (p50)",
            "turn ratio with/without (p99)",
        ],
    )
    labels = {
        "turn_after": "agent:turn:after send (turn-end handler)",
        "collect": "agent_prompt via host (contribution)",
        "agent_prompt": "plugin.agent_prompt(view) alone",
        "token_usage": "token:usage send",
        "before_call": "before_model_call via host",
    }
    extra: dict[str, Any] = {}
    for length, data in results.items():
        added50 = added99 = 0.0
        for key, label in labels.items():
            t = data[key]
            p50 = us(percentile(t["plugin"], 50))
            p99 = us(percentile(t["plugin"], 99))
            n50 = us(percentile(t["none"], 50)) if "none" in t else 0.0
            n99 = us(percentile(t["none"], 99)) if "none" in t else 0.0
            components.add(
                length,
                label,
                p50,
                p99,
                n50 if "none" in t else "-",
                n99 if "none" in t else "-",
                p50 - n50,
                p99 - n99,
            )
            if key != "agent_prompt":
                added50 += p50 - n50
                added99 += p99 - n99
            extra[f"{length}:{key}"] = {
                "plugin_p50_us": p50,
                "plugin_p99_us": p99,
                "none_p50_us": n50,
                "none_p99_us": n99,
            }
        turn = data["turn"]
        t50, t99 = us(percentile(turn["none"], 50)), us(percentile(turn["none"], 99))
        w50, w99 = us(percentile(turn["plugin"], 50)), us(percentile(turn["plugin"], 99))
        summary.add(
            length,
            added50,
            added99,
            t50,
            t99,
            w50,
            w99,
            round(added50 / t50, 3),
            round(w50 / t50, 3),
            round(w99 / t99, 3),
        )
    notes = [
        f"{iterations} timed calls per component and host, alternating with/without the plugin; "
        f"{turn_iterations} whole turns per host and length.",
        "Added hot path = sum over turn-end handler, contribution, token:usage and "
        "before_model_call of (with plugin - without plugin), each at the same percentile "
        "(an upper bound of the p99 of the sum).",
        "The whole turn is a replayed turn: append, snapshot, contributions, token:usage, "
        "before_model_call, append the recorded reply, agent:turn:after; no model is called.",
        "Plugin config: threshold 100000 (no compression while timing), keep_recent 20; host: "
        "bench_llm (cl100k counting), 128k window, SQLite file.",
    ]
    write_results(
        "overhead",
        "Per-turn overhead on the hot path (SQLite)",
        [summary, components],
        out=out,
        versions_used=v,
        settings={
            "lengths": list(LENGTHS),
            "iterations": iterations,
            "turns": turn_iterations,
            "quick": args.quick,
        },
        runtime_s=time.perf_counter() - started,
        notes=notes,
        extra=extra,
    )


if __name__ == "__main__":
    asyncio.run(main())
