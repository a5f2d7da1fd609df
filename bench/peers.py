"""Side by side with the peers a user would pick instead: LangChain v1 ``SummarizationMiddleware``
(its ``before_model`` call, and inside LangChain's agent with a checkpointer) and LangMem
``summarize_messages``, with the same fake instant summarizer (same summary size), the same token
counter and the same 4,000-token budget, on LoCoMo and tau-bench. How each peer runs is in
``bench/peer_runs.py``; this script runs ours, interleaves the systems and writes the tables.

The peers are not dependencies of the plugin: install them in a separate environment,

    python3 -m venv .benchvenv && .benchvenv/bin/pip install -e '.[bench]'
    .benchvenv/bin/python bench/peers.py [--data DIR] [--quick] [--out DIR]

Per model call (step): context tokens sent, messages kept verbatim, tool-pair violations in what
is sent, and the time the memory component took for that call. Ours runs in the real host
(SQLite file or the in-memory store, plugin from its entry point); its per-step time is the
whole host turn around the model call (store appends, snapshot, prompt build, every hook and
signal, the plugin's work; not the model), with two parts of it apart: the plugin's own code on
the turn path (its ``agent:turn:after`` and ``token:usage`` receivers, its prompt hooks
``agent_prompt``, ``prune_history`` and ``before_model_call`` with any blocking compression),
and that with the host's dispatch of those signals and hooks around it. Its background
compressions run off the turn. The peers summarize inline, so their step time includes the
(instant) summarizer call.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BUDGET,
    Table,
    TokenCounter,
    fmt,
    make_rig,
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
from fakes import bench_llm, summarizer_stats  # noqa: E402
from peer_runs import (  # noqa: E402
    AGENT_GRAPH,
    CHECKPOINTERS,
    KEEP_MESSAGES,
    LANGCHAIN,
    LANGCHAIN_AGENT,
    LANGMEM,
    LANGMEM_SUMMARY_TOKENS,
    PEER_PACKAGES,
    agent_row,
    import_peers,
    run_langchain,
    run_langchain_agent,
    run_langmem,
    split_system,
)
from replay import (  # noqa: E402
    SystemRun,
    baseline_runs,
    conversation_tokens,
    replay_through_host,
)
from settings import DEFAULT, RECOMMENDED, SETTINGS  # noqa: E402
from verdict import peer_dominates, split_steps, verdict_checks  # noqa: E402

from host_stub import signals  # noqa: E402
from host_stub.datasets import Conversation, load_locomo, load_tau_bench  # noqa: E402
from host_stub.host import WARMING_UP  # noqa: E402


def by_regime(
    results: dict[str, dict[str, dict[str, Any]]], latency: float
) -> Iterator[tuple[str, dict[str, dict[str, Any]], str, str]]:
    """Each data set's results per model-call regime: ``(data set, its results by system, the
    regime as the tables name it, the suffix of its systems' labels)``."""
    for name, by in results.items():
        for wait in regimes(latency):
            suffix = ", instant model calls" if wait != latency else ""
            yield name, by, f"{wait * 1000:g} ms" if wait else "instant", suffix


def regimes(latency_s: float) -> tuple[float, ...]:
    """The model-call durations every system runs with: the given one, and instant calls."""
    return (latency_s, 0.0) if latency_s else (0.0,)


# -- ours ------------------------------------------------------------------------------------------


#: The host's dispatch of the plugins' prompt hooks (contributions, history pruning,
#: ``before_model_call``), timed around the plugin's own code as the host path.
HOST_PATH = ("_collect_contributions", "_pruned", "_before_model_call")


def instrument(host: Any, steps: list[float]) -> None:
    """The host path: the host's dispatch of the prompt hooks (:data:`HOST_PATH`: contributions,
    ``prune_history``, ``before_model_call`` with any rebuild), its ``token:usage`` sends and
    the turn's ``agent:turn:after`` send, dispatch included, are added to ``steps[-1]`` (the
    caller starts a step at each ``Host._prepare_call``)."""
    names = (signals.TOKEN_USAGE, signals.AGENT_TURN_AFTER)
    send = host.bus.send

    def timed(fn: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                if steps and not WARMING_UP.get():
                    steps[-1] += time.perf_counter() - start

        return wrapper

    async def timed_send(name: str, /, *built: Any, **payload: Any) -> Any:
        if name in names:
            return await timed(send)(name, *built, **payload)
        return await send(name, *built, **payload)

    host.bus.send = timed_send
    for name in HOST_PATH:
        setattr(host, name, timed(getattr(host, name)))


#: The plugin's own entry points on the turn path: its signal receivers and its hooks.
PLUGIN_ENTRY_POINTS = (
    "_on_turn_after",
    "_on_token_usage",
    "_on_session_compress",
    "agent_prompt",
    "prune_history",
    "before_model_call",
)


@contextlib.contextmanager
def time_plugin_code(steps: list[float], blocking: list[int]) -> Iterator[None]:
    """While active, the time spent inside the plugin's own receivers and hooks (outermost call
    only: a receiver that sends a signal the plugin also receives is counted once) is added to
    ``steps[-1]``: the analogue of timing a peer's middleware call, without the host's own
    signal and hook dispatch. Patched on the class before the host starts, so the host registers
    the timed methods. ``blocking[-1]`` counts the step's blocking (hard) compression requests:
    the step waits for a compression, as a peer's step waits for its inline summarizer call.
    They are counted where every request goes, the scheduler (``before_model_call`` asks it
    directly, not through the plugin's ``request``)."""
    from plugin_memory_summary.pipeline.scheduler import Scheduler
    from plugin_memory_summary.plugin import MemorySummaryPlugin

    depth = [0]

    def add(elapsed: float) -> None:
        if steps and not WARMING_UP.get():  # a next prompt built in the background: no step's
            steps[-1] += elapsed

    def timed(fn: Any) -> Any:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                depth[0] += 1
                start = time.perf_counter()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    depth[0] -= 1
                    if depth[0] == 0:
                        add(time.perf_counter() - start)

            return async_wrapper

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    add(time.perf_counter() - start)

        return sync_wrapper

    originals = {name: getattr(MemorySummaryPlugin, name) for name in PLUGIN_ENTRY_POINTS}
    request = Scheduler.request

    @functools.wraps(request)
    async def counted_request(self: Any, session_id: str, reason: str, **kwargs: Any) -> Any:
        if reason == "hard" and blocking:
            blocking[-1] += 1
        return await request(self, session_id, reason, **kwargs)

    try:
        for name in PLUGIN_ENTRY_POINTS:
            setattr(MemorySummaryPlugin, name, timed(originals[name]))
        Scheduler.request = counted_request  # type: ignore[method-assign]
        yield
    finally:
        for name, fn in originals.items():
            setattr(MemorySummaryPlugin, name, fn)
        Scheduler.request = request  # type: ignore[method-assign]


async def run_ours(
    conversation: Conversation,
    config: dict[str, Any],
    counter: TokenCounter,
    label: str,
    *,
    model_latency_s: float = 0.0,
    budget: int = BUDGET,
    memory: str | None = None,
) -> SystemRun:
    """``model_latency_s``: how long each recorded model call takes (an ``asyncio.sleep`` once
    the prompt is ready; not part of the step time). With 0 the next step starts at once, so
    background compressions compete with it for the event loop; a real call gives them its
    duration. ``memory``: a store URL (default: a SQLite file).

    A step's time is the whole host turn around that model call: from the end of the previous
    model call (or the turn's start) until the prompt is ready, and, for a turn's last call, the
    rest of the turn after it (the reply's append, ``agent:turn:after``) - the store appends,
    the snapshot, the prompt build, every hook and signal, the plugin's work included; only the
    model call is left out."""
    llm = bench_llm(counter=counter)
    own: list[float] = []  # the plugin's own code, per step
    times: list[float] = []  # the same with the host's dispatch around it
    whole: list[float] = []  # the whole host turn around each model call
    blocking: list[int] = []
    since = [0.0]  # when the host's current stretch of work began
    with time_plugin_code(own, blocking):
        rig = await make_rig(llm, config, context_window=budget, memory=memory)
        instrument(rig.host, times)

        async def new_step(*args: Any, **kwargs: Any) -> Any:
            own.append(0.0)
            times.append(0.0)
            blocking.append(0)
            whole.append(0.0)
            prompt = await prepare(*args, **kwargs)
            whole[-1] += time.perf_counter() - since[0]
            if model_latency_s:
                await asyncio.sleep(model_latency_s)  # the model call
            since[0] = time.perf_counter()
            return prompt

        async def timed_turn(*args: Any, **kwargs: Any) -> Any:
            steps = len(whole)
            since[0] = time.perf_counter()
            try:
                return await run_turn(*args, **kwargs)
            finally:
                if len(whole) > steps:  # the turn's tail goes to its last model call
                    whole[-1] += time.perf_counter() - since[0]

        prepare, run_turn = rig.host._prepare_call, rig.host.run_turn
        rig.host._prepare_call = new_step
        rig.host.run_turn = timed_turn
        try:
            run = await replay_through_host(rig, conversation, conversation.name)
            await rig.drain()
        finally:
            await rig.close()
    run.name = label
    run.step_times = whole
    run.waited = [n > 0 for n in blocking]
    run.extra["host_path_times"] = times
    run.extra["plugin_times"] = own
    run.extra["budget"] = budget
    run.summarizer_calls, run.summarizer_input_tokens = (
        summarizer_stats(llm).calls,
        summarizer_stats(llm).input_tokens,
    )
    return run


def interleaved(conversations: int, systems: Sequence[str]) -> Iterator[tuple[int, str]]:
    """The order the systems run in: ``(conversation index, system)``, every system on one
    conversation before the next conversation, the order of the systems turned by one at each
    conversation. A machine's state drifts over a run (other jobs, its clock, its caches):
    run one system after the other and each meets a different machine; interleaved, each
    system's steps are spread over the same stretch of time, so the ratios compare like with
    like."""
    for i in range(conversations):
        turn = i % len(systems) if systems else 0
        for label in [*systems[turn:], *systems[:turn]]:
            yield i, label


def aggregate(runs: list[SystemRun], conv_tokens: int) -> dict[str, Any]:
    steps = [s for r in runs for s in r.steps]
    times = [t for r in runs for t in r.step_times]
    turn, wait = split_steps(times, [w for r in runs for w in r.waited])
    host = [t for r in runs for t in r.extra.get("host_path_times", ())]
    own = [t for r in runs for t in r.extra.get("plugin_times", ())]
    return {
        "steps": len(steps),
        "mean": mean([s.tokens for s in steps]),
        "max": max(s.tokens for s in steps),
        "over": sum(1 for r in runs for s in r.steps if s.tokens > r.extra["budget"]),
        "calls": sum(r.summarizer_calls for r in runs),
        "input_ratio": sum(r.summarizer_input_tokens for r in runs) / conv_tokens,
        "verbatim": mean([s.verbatim for s in steps]),
        "p50_us": us(percentile(times, 50)),
        "p99_us": us(percentile(times, 99)),
        "mean_us": us(mean(times)),
        "blocked": len(wait),
        "turn_p50_us": us(percentile(turn, 50)),
        "turn_mean_us": us(mean(turn)),
        "turn_p99_us": us(percentile(turn, 99)),
        "wait_mean_us": us(mean(wait)) if wait else None,
        "wait_max_us": us(max(wait)) if wait else None,
        "host_p50_us": us(percentile(host, 50)) if host else None,
        "host_p99_us": us(percentile(host, 99)) if host else None,
        "plugin_p50_us": us(percentile(own, 50)) if own else None,
        "plugin_p99_us": us(percentile(own, 99)) if own else None,
        "violations": sum(s.violations for s in steps),
    }


COLUMNS = [
    "data set",
    "system",
    "steps",
    "mean tokens",
    "max tokens",
    "steps over budget",
    "summarizer calls",
    "summarizer input / conversation",
    "verbatim msgs (mean)",
    "tool-pair violations",
]

TIME_COLUMNS = [
    "data set",
    "system",
    "all steps p50 / mean / p99 (us)",
    "steps waiting on a compression",
    "per-turn cost: steps not waiting, p50 / mean / p99 (us)",
    "a waiting step: mean / max (us)",
    "ours: the plugin's own code p50 / p99 (us)",
    "ours: plugin + host dispatch p50 / p99 (us)",
]

VERDICT_COLUMNS = [
    "data set",
    "model calls",
    "peer",
    "budget adherence",
    "tool-pair safety",
    "per-turn cost (mean and p99)",
    "all steps mean",
    "all steps p99",
    "steps waiting",
    "summarizer input",
    "verbatim msgs",
    "mean tokens",
    "peer better on every column",
]


TURN_COLUMNS = [
    "data set",
    "model calls",
    "ours",
    "ours: whole turn p50 / p99",
    "middleware p50 / p99",
    "p50 at or below",
    "p99 at or below",
    "ours: blocking compressions (steps), mean / max",
    "middleware: summarizing steps, mean / max",
    "LangChain agent's whole step, same kind of store: p50 / p99",
    "p50 / p99 at or below the agent's",
]


def turn_row(
    ours: dict[str, Any], peer: dict[str, Any], agent: dict[str, Any] | None = None
) -> list[Any]:
    """The whole-turn columns of one of our rows against the middleware's, and against
    LangChain's agent with a checkpointer of the same kind as our row's store (``-`` where it
    did not run)."""
    return [
        slash(ours["turn_p50_us"], ours["turn_p99_us"]),
        slash(peer["turn_p50_us"], peer["turn_p99_us"]),
        at_or_below(ours, peer, "turn_p50_us"),
        at_or_below(ours, peer, "turn_p99_us"),
        f"{ours['blocked']}, {slash(ours['wait_mean_us'], ours['wait_max_us'])}",
        f"{peer['blocked']}, {slash(peer['wait_mean_us'], peer['wait_max_us'])}",
        "-" if agent is None else slash(agent["turn_p50_us"], agent["turn_p99_us"]),
        "-" if agent is None else " / ".join(at_or_below(ours, agent, k) for k in TURN_KEYS),
    ]


#: The whole-turn figures the turn table compares.
TURN_KEYS = ("turn_p50_us", "turn_p99_us")


def at_or_below(ours: dict[str, Any], other: dict[str, Any], key: str) -> str:
    return "yes" if ours[key] <= other[key] else "no"


def agent_label(ours_label: str) -> str:
    """The LangChain agent row one of our rows is set beside: the checkpointer of the same
    kind as its store."""
    return agent_row("in-memory" if "in-memory store" in ours_label else "SQLite")


def fixed_tokens(conversation: Conversation, counter: TokenCounter) -> int:
    """Tokens of the system prompt every system sends whole: the host's own plus the
    conversation's system messages (tau-bench's policy), as the peers get it."""
    system_text, _ = split_system(conversation)
    return counter.stored({"role": "system", "content": system_text})


def optional(a: dict[str, Any], key: str) -> str:
    """``p50 / p99`` of one of our extra timings, ``-`` for a peer."""
    if a[f"{key}_p50_us"] is None:
        return "-"
    return slash(a[f"{key}_p50_us"], a[f"{key}_p99_us"])


def slash(*values: float | None) -> str:
    return " / ".join("-" if v is None else fmt(v) for v in values)


def add_step_options(p: argparse.ArgumentParser, *, instant_rows: bool = False) -> None:
    """The options every script that times ours against the peers step by step takes
    (``instant_rows``: the script adds rows with instant model calls as well)."""
    p.add_argument(
        "--history-budget",
        type=int,
        default=1000,
        help="tau-bench again with this many tokens for the history beyond the system prompt "
        "(default 1000: the hard watermark fires on most tool results)",
    )
    p.add_argument(
        "--model-latency-ms",
        type=float,
        default=20.0,
        help="duration of each recorded model call (default 20; real calls take 0.3-30 s)"
        + ("; a row with instant calls is always added" if instant_rows else ""),
    )


def step_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings a results file of such a script records."""
    return {
        "budget": BUDGET,
        "history_budget": args.history_budget,
        "keep_messages": KEEP_MESSAGES,
        "model_latency_ms": args.model_latency_ms,
        "quick": args.quick,
    }


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    add_step_options(p, instant_rows=True)
    args = p.parse_args()
    lc = import_peers()
    locomo_path = require_data(args.data, "locomo/locomo_dev.json")
    tau_path = require_data(args.data, "tau_bench/airline_dev.json")
    out = out_dir(args.out)
    v = versions(PEER_PACKAGES)
    print_versions(v)
    started = time.perf_counter()
    counter = TokenCounter(cached=False)
    locomo, tau = load_locomo(locomo_path), load_tau_bench(tau_path)
    if args.quick:
        locomo, tau = [Conversation(c.name, c.messages[:160]) for c in locomo[:1]], tau[:5]
    history = args.history_budget
    #: (label, conversations, prompt budget of a conversation, the full set of systems?)
    cases: list[tuple[str, list[Conversation], Any, bool]] = [
        ("LoCoMo", locomo, lambda c: BUDGET, True),
        ("tau-bench", tau, lambda c: BUDGET, True),
        (
            f"tau-bench, {history:,}-token history",
            tau,
            lambda c: fixed_tokens(c, counter) + history,
            False,
        ),
    ]
    latency = args.model_latency_ms / 1000
    ours: dict[str, tuple[dict[str, Any], float, str | None]] = {
        f"ours: {RECOMMENDED}": (SETTINGS[RECOMMENDED], latency, None),
        f"ours: {RECOMMENDED}, in-memory store": (SETTINGS[RECOMMENDED], latency, "memory://"),
    }
    if DEFAULT != RECOMMENDED:
        ours[f"ours: {DEFAULT}"] = (SETTINGS[DEFAULT], latency, None)
    if latency:
        ours[f"ours: {RECOMMENDED}, instant model calls"] = (SETTINGS[RECOMMENDED], 0.0, None)
    table = Table(
        f"Side by side at a {BUDGET:,}-token prompt budget (tau-bench also at a "
        f"{history:,}-token history budget: the system prompt plus {history:,}): tokens",
        COLUMNS,
    )
    timing = Table(
        "Time per step: ours = the whole host turn around each model call (store appends, "
        "snapshot, prompt build, hooks and signals, the plugin; not the model); the peers = "
        "their call (a summarizer call inline included)",
        TIME_COLUMNS,
    )
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name, conversations, budget_of, full in cases:
        conv_tokens = sum(conversation_tokens(c, counter) for c in conversations)
        budgets = [budget_of(c) for c in conversations]
        systems: list[tuple[str, Callable[..., Any]]] = []
        for label, (config, wait, memory) in ours.items():
            if not full and (wait != latency or not label.startswith(f"ours: {RECOMMENDED}")):
                continue
            systems.append(
                (
                    label,
                    functools.partial(
                        run_ours,
                        config=config,
                        counter=counter,
                        label=label,
                        model_latency_s=wait,
                        memory=memory,
                    ),
                )
            )
        for wait in regimes(latency) if full else (latency,):
            suffix = ", instant model calls" if wait != latency else ""
            systems.append(
                (
                    f"{LANGCHAIN} (keep {KEEP_MESSAGES} msgs){suffix}",
                    functools.partial(run_langchain, lc, counter=counter, model_latency_s=wait),
                )
            )
            if wait == latency:
                for store in CHECKPOINTERS:
                    systems.append(
                        (
                            agent_row(store),
                            functools.partial(
                                run_langchain_agent,
                                lc,
                                counter=counter,
                                checkpointer=store,
                                model_latency_s=wait,
                            ),
                        )
                    )
            if full:
                systems.append(
                    (
                        f"{LANGMEM} (max_summary_tokens {LANGMEM_SUMMARY_TOKENS}){suffix}",
                        functools.partial(run_langmem, lc, counter=counter, model_latency_s=wait),
                    )
                )
        by_label = dict(systems)
        runs: dict[str, list[SystemRun]] = {label: [] for label in by_label}
        for i, label in interleaved(len(conversations), list(by_label)):
            if all(len(r) == i for r in runs.values()):  # the conversation's first system
                progress(f"{name}: conversation {i + 1} of {len(conversations)}")
            run = by_label[label](conversations[i], budget=budgets[i])
            runs[label].append(await run if inspect.isawaitable(run) else run)
        results[name] = {}
        for label, rs in runs.items():
            a = aggregate(rs, conv_tokens)
            results[name][label] = a
            table.add(
                f"{name} ({len(conversations)})",
                label,
                a["steps"],
                round(a["mean"]),
                a["max"],
                a["over"],
                a["calls"],
                round(a["input_ratio"], 2),
                round(a["verbatim"], 1),
                a["violations"],
            )
            timing.add(
                f"{name} ({len(conversations)})",
                label,
                slash(a["p50_us"], a["mean_us"], a["p99_us"]),
                a["blocked"],
                slash(a["turn_p50_us"], a["turn_mean_us"], a["turn_p99_us"]),
                slash(a["wait_mean_us"], a["wait_max_us"]),
                "-"
                if a["plugin_p50_us"] is None
                else slash(a["plugin_p50_us"], a["plugin_p99_us"]),
                "-" if a["host_p50_us"] is None else slash(a["host_p50_us"], a["host_p99_us"]),
            )
        if not full:
            continue
        window = [baseline_runs(c, counter)[1] for c in conversations]
        steps = [x for r in window for x in r.steps]
        table.add(
            f"{name} ({len(conversations)})",
            "(reference: sliding window, no summary)",
            len(steps),
            round(mean([x.tokens for x in steps])),
            max(x.tokens for x in steps),
            sum(1 for x in steps if x.tokens > BUDGET),
            "-",
            "-",
            round(mean([x.verbatim for x in steps]), 1),
            sum(x.violations for x in steps),
        )

    turn_table = Table(
        "The whole host turn against LangChain SummarizationMiddleware.before_model on the same "
        "steps (us): steps that wait for no summarizer; the waiting ones counted and timed apart",
        TURN_COLUMNS,
    )
    for name, by, regime, suffix in by_regime(results, latency):
        peer = by.get(f"{LANGCHAIN} (keep {KEEP_MESSAGES} msgs){suffix}")
        if peer is None:
            continue
        for label, a in by.items():
            if not label.startswith(f"ours: {RECOMMENDED}") or (
                label.endswith(", instant model calls") != bool(suffix)
            ):
                continue
            agent = None if suffix else by.get(agent_label(label))
            turn_table.add(name, regime, label.removeprefix("ours: "), *turn_row(a, peer, agent))

    verdict = Table(
        "Against each peer (ours = the recommended setting): is ours at least as good on each "
        "column?",
        VERDICT_COLUMNS,
    )
    for name, by, regime, suffix in by_regime(results, latency):
        o = by.get(f"ours: {RECOMMENDED}{suffix}")
        if o is None:
            continue
        for label, a in by.items():
            if label.startswith("ours") or not label.endswith(f"){suffix}"):
                continue
            checks = verdict_checks(o, a)
            verdict.add(name, regime, label.split(" (")[0], *checks.values(), peer_dominates(o, a))
    notes = [
        f"Budget {BUDGET} tokens for the whole prompt. Ours: host context_window {BUDGET}, "
        "reserve_for_reply 0. LangChain: trigger=('tokens', 4000 - system prompt tokens), "
        f"keep=('messages', {KEEP_MESSAGES}), the system prompt outside the state (as create_agent "
        f"has it). LangMem: max_tokens={BUDGET}, max_summary_tokens={LANGMEM_SUMMARY_TOKENS}, the "
        f"system prompt as its first message. The {history:,}-token history rows: the prompt "
        f"budget of each conversation is its system prompt's tokens plus {history:,} (ours: the "
        "host's context_window; LangChain: the trigger; only ours recommended, on SQLite and "
        "in memory, and LangChain, with the given model calls).",
        "Same token counter everywhere, caching nothing (tiktoken cl100k_base, OpenAI chat "
        "formula; every count encodes): the host counts a message once, when it stores it, and "
        "the prompt's other parts when it builds it; the middleware and LangMem count the "
        "messages they are given at every call, as they do with any counter. Same fake instant "
        "summarizer answering ~300 tokens (extractive).",
        "tau-bench trajectories have a ~1,260-token policy system message: it is core memory for "
        "every system (never summarized).",
        "The sliding-window row is a reference floor for budget adherence (newest messages that "
        "fit, tool groups whole), not a peer.",
        "Per-step time: peers = the middleware / function call, summarizer call included (they "
        "summarize inline); ours = the whole host turn around each model call (what an agent "
        "waits for): from the end of the previous model call, or the turn's start, until the "
        "prompt is ready, plus, for a turn's last call, the rest of the turn (the reply's "
        "append, agent:turn:after): the store appends, the snapshot, the prompt build, every "
        "hook and signal and the plugin's work (a blocking compression included; background "
        "compressions run off the turn, but share the event loop, so their work between awaits "
        "is counted where a timed step waits). Two more figures of ours: the time inside the "
        "plugin's own receivers and hooks, and that plus the host's dispatch of them.",
        f"Model calls: in our host each recorded model call lasts {args.model_latency_ms:g} ms "
        "(a floor: real calls take 0.3-30 s), which is when our background compressions run; "
        "the row 'instant model calls' has none, so a background run started on one step is "
        "often still running on the next, and a blocking compression must wait for it. The "
        "peers' steps are followed by the same call (a blocking sleep, untimed): idle time "
        "between steps leaves the next one colder caches and a lower clock, for every system "
        "alike; the 'instant model calls' rows run every system back to back.",
        f"{LANGCHAIN_AGENT} rows: the same middleware inside LangChain's own agent "
        f"({AGENT_GRAPH}, with an in-memory or a SQLite checkpointer, a file like ours), "
        "replaying the same conversation: its chat model answers with the recorded replies "
        "(after the same untimed model call), its tools with the recorded results. Its step is "
        "the agent's whole step between model calls (the tool node, the state update, the "
        "checkpoint writes, the middleware's node), timed as our whole host turn is; the "
        "middleware rows time its before_model call alone. The whole-turn table sets each of "
        "our rows beside the agent with the same kind of store.",
        "Order: each conversation is run by every system in turn, the order of the systems "
        "turned by one at each conversation, so every system's steps spread over the same "
        "stretch of the run and a machine that slows or speeds up over it moves all alike.",
        "Steps waiting on a compression: a peer's steps with an inline summarizer call; ours, "
        "steps whose before_model_call made a blocking (hard) compression request (it waited "
        "for a run, its own or one it joined). With a real summarizer each such step waits for "
        "a model call (seconds); the others do not.",
        "Per-turn cost: the time of the steps that do not wait for a summarizer, on which every "
        "system does the same work (decide whether to compress, hand the prompt over); it is "
        "what the memory adds to every turn (the hot path of bench/overhead.py). The waiting "
        "steps are counted and timed apart: with the fake instant summarizer their time is the "
        "pipeline's own CPU (ours: lease, redaction, prompt, fit, commit; the marker and the "
        "lease release follow after the step); with a real "
        "one, the model call.",
        "The verdict compares the recommended setting of ours with each peer under the same "
        "model calls (the given duration, and instant calls); 'peer "
        "better on every column' is yes when the peer is at least as good as ours on all of the "
        "verdict's columns at once.",
    ]
    write_results(
        "peers",
        "Side by side with LangChain v1 SummarizationMiddleware and LangMem",
        [table, timing, turn_table, verdict],
        out=out,
        versions_used=v,
        settings=step_settings(args),
        runtime_s=time.perf_counter() - started,
        notes=notes,
        extra=results,
    )


if __name__ == "__main__":
    asyncio.run(main())
