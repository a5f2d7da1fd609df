"""LangChain's own agent with this memory and with LangChain's: the same recorded conversations
replayed through ``create_agent`` (in-memory checkpointer) once with
``MemoryMiddleware`` (plugin_memory_summary.adapters.langchain, SQLite store) and once with
``SummarizationMiddleware``, the same fake instant summarizer (same summary size), the same
token counter and the same 4,000-token budget.

Per system: the context each model call got (mean / max tokens, steps over the budget), the
summarizer's calls and input (per conversation token), tool messages orphaned in what a call got
(a call without its result or a result without its call), what of the conversation the model
still gets (tau-bench: the identifiers of the actions seen so far that each call's messages still
hold; LoCoMo: the evidence words of each question in the last call's messages, as
``bench/retention.py`` measures them), and the whole agent step between two model calls
(p50 / p99: LangChain's graph, its tool node, its checkpointer and the middleware; see
``bench/peer_agent.py``). A third row runs the same agent with no memory at all (its whole
state sent at every call): the floor of the step, what LangChain's graph and checkpointer cost
with the whole history kept in the agent's state, as this memory keeps it (the summarizing
middleware deletes it). The systems run interleaved, conversation by conversation.

Needs the ``langchain`` extra (in ``dev``):

    python bench/adapters.py [--data DIR] [--quick] [--out DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BUDGET,
    Table,
    TokenCounter,
    fmt,
    mean,
    out_dir,
    parser,
    percentile,
    print_versions,
    progress,
    require_data,
    tool_pair_violations,
    us,
    versions,
    write_results,
)
from fakes import bench_llm, summarizer_stats  # noqa: E402
from peer_agent import replay_agent  # noqa: E402
from peer_runs import KEEP_MESSAGES, LCAdapter, make_fake_model, split_system  # noqa: E402
from replay import conversation_tokens  # noqa: E402
from retention import prompt_text, score_locomo  # noqa: E402

from host_stub.datasets import (  # noqa: E402
    Conversation,
    load_locomo,
    load_tau_bench,
    tau_action_identifiers,
)

OURS = "create_agent + MemoryMiddleware (this plugin)"
THEIRS = "create_agent + SummarizationMiddleware"
#: The floor: the same agent with no memory at all (its whole state sent at every call): what
#: LangChain's own graph and checkpointer cost with the full history kept, as this memory keeps it.
NONE = "create_agent, no memory (the whole state sent)"
PACKAGES = ("langchain", "langchain-core", "langgraph")


def import_langchain() -> dict[str, Any]:
    try:
        from langchain.agents import create_agent
        from langchain.agents.middleware import AgentMiddleware, SummarizationMiddleware
        from langchain_core.language_models.chat_models import BaseChatModel
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
        from langchain_core.outputs import ChatGeneration, ChatResult
        from langchain_core.tools import BaseTool
        from langgraph.checkpoint.memory import InMemorySaver

        from plugin_memory_summary.adapters import AgentMemory
        from plugin_memory_summary.adapters.langchain import MemoryMiddleware
    except ImportError as exc:
        print(
            f"LangChain is not installed ({exc.name}): pip install -e '.[langchain]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    return {
        "create_agent": create_agent,
        "SummarizationMiddleware": SummarizationMiddleware,
        "AgentMiddleware": AgentMiddleware,
        "BaseChatModel": BaseChatModel,
        "AIMessage": AIMessage,
        "HumanMessage": HumanMessage,
        "SystemMessage": SystemMessage,
        "ToolMessage": ToolMessage,
        "ChatGeneration": ChatGeneration,
        "ChatResult": ChatResult,
        "BaseTool": BaseTool,
        "InMemorySaver": InMemorySaver,
        "AgentMemory": AgentMemory,
        "MemoryMiddleware": MemoryMiddleware,
    }


@dataclass
class Run:
    """One system on one conversation: per model call what it got, and the step times."""

    tokens: list[int] = field(default_factory=list)
    orphans: list[int] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    waited: list[bool] = field(default_factory=list)
    ids_seen: int = 0
    ids_kept: int = 0
    evidence: list[float] = field(default_factory=list)
    summarizer_calls: int = 0
    summarizer_input: int = 0


def wire(sent: list[Any], adapter: LCAdapter) -> list[dict[str, Any]]:
    return [adapter.to_openai(m) for m in sent]


def measure(
    run: Run, conversation: Conversation, sent_calls: list[list[Any]], adapter: LCAdapter
) -> None:
    """What each model call got: tokens, orphans, and what of the conversation it still holds."""
    ids = tau_action_identifiers(conversation) if not conversation.qa else set()
    arrived: list[str] = []  # the conversation's text as the calls' own new messages brought it
    known: set[str] = set()
    for sent in sent_calls:
        messages = wire(sent, adapter)
        run.tokens.append(adapter.count(sent))
        run.orphans.append(tool_pair_violations(messages))
        if ids:
            for message, original in zip(messages, sent, strict=True):
                if str(original.id) not in known:
                    known.add(str(original.id))
                    arrived.append(prompt_text([message]))
            seen = {i for i in ids if any(i in t for t in arrived)}
            text = prompt_text(messages)
            run.ids_seen += len(seen)
            run.ids_kept += sum(1 for i in seen if i in text)
    if conversation.qa and sent_calls:
        text = prompt_text(wire(sent_calls[-1], adapter))
        run.evidence = [s.evidence_recall for s in score_locomo(conversation, text, set())]


def run_theirs(
    lc: dict[str, Any], conversation: Conversation, counter: TokenCounter, latency: float
) -> Run:
    adapter = LCAdapter(lc, counter)
    log = _CallLog()
    system_text, _ = split_system(conversation)
    system = lc["SystemMessage"](content=system_text, id="system")
    middleware = lc["SummarizationMiddleware"](
        make_fake_model(lc, adapter, log),  # type: ignore[arg-type]
        trigger=("tokens", BUDGET - adapter.count([system])),
        keep=("messages", KEEP_MESSAGES),
        token_counter=adapter.count,
    )
    replay = replay_agent(
        lc,
        conversation.messages,
        to_lc=adapter.to_lc,
        system_prompt=system_text,
        middleware=middleware,
        checkpointer=lc["InMemorySaver"](),
        summarizer_calls=lambda: log.calls,
        model_latency_s=latency,
        thread_id=conversation.name,
    )
    run = Run(step_times=replay.step_times, waited=replay.waited)
    measure(run, conversation, replay.sent, adapter)
    run.summarizer_calls, run.summarizer_input = log.calls, log.input_tokens
    return run


class _CallLog:
    calls = 0
    input_tokens = 0


def run_ours(
    lc: dict[str, Any], conversation: Conversation, counter: TokenCounter, latency: float
) -> Run:
    adapter = LCAdapter(lc, counter)
    llm = bench_llm(counter=counter)
    system_text, _ = split_system(conversation)
    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as tmp:
        memory = lc["AgentMemory"](
            f"sqlite:///{Path(tmp) / 'memory.db'}",
            model="bench-model",
            context_window=BUDGET,
            reserve_for_reply=0,
            llm=llm,
        )
        with memory:
            replay = replay_agent(
                lc,
                conversation.messages,
                to_lc=adapter.to_lc,
                system_prompt=system_text,
                middleware=lc["MemoryMiddleware"](memory),
                checkpointer=lc["InMemorySaver"](),
                summarizer_calls=lambda: summarizer_stats(llm).calls,
                model_latency_s=latency,
                thread_id=conversation.name,
            )
            memory.settle(60)
    run = Run(step_times=replay.step_times, waited=replay.waited)
    measure(run, conversation, replay.sent, adapter)
    stats = summarizer_stats(llm)
    run.summarizer_calls, run.summarizer_input = stats.calls, stats.input_tokens
    return run


def run_none(
    lc: dict[str, Any], conversation: Conversation, counter: TokenCounter, latency: float
) -> Run:
    adapter = LCAdapter(lc, counter)
    system_text, _ = split_system(conversation)
    replay = replay_agent(
        lc,
        conversation.messages,
        to_lc=adapter.to_lc,
        system_prompt=system_text,
        middleware=_NoMemory(lc),
        checkpointer=lc["InMemorySaver"](),
        summarizer_calls=lambda: 0,
        model_latency_s=latency,
        thread_id=conversation.name,
    )
    run = Run(step_times=replay.step_times, waited=replay.waited)
    measure(run, conversation, replay.sent, adapter)
    return run


def _NoMemory(lc: dict[str, Any]) -> Any:  # noqa: N802 (a class made on demand)
    """A middleware that does nothing (``replay_agent`` takes one)."""
    return type("NoMemory", (lc["AgentMiddleware"],), {})()


def aggregate(runs: list[Run], conv_tokens: int) -> dict[str, Any]:
    tokens = [t for r in runs for t in r.tokens]
    times = [t for r in runs for t in r.step_times]
    seen = sum(r.ids_seen for r in runs)
    evidence = [e for r in runs for e in r.evidence]
    return {
        "steps": len(tokens),
        "mean": mean(tokens),
        "max": max(tokens),
        "over": sum(1 for t in tokens if t > BUDGET),
        "calls": sum(r.summarizer_calls for r in runs),
        "input_ratio": sum(r.summarizer_input for r in runs) / conv_tokens,
        "orphans": sum(sum(r.orphans) for r in runs),
        "ids_kept": sum(r.ids_kept for r in runs) / seen if seen else None,
        "evidence": mean(evidence) if evidence else None,
        "p50_us": us(percentile(times, 50)),
        "p99_us": us(percentile(times, 99)),
        "waited": sum(1 for r in runs for w in r.waited if w),
    }


COLUMNS = [
    "data set",
    "system",
    "model calls",
    "context mean / max (tokens)",
    "calls over budget",
    "summarizer calls",
    "summarizer input / conversation",
    "orphaned tool messages",
    "kept: action ids (tau) / evidence words (LoCoMo)",
    "whole step p50 / p99 (us)",
    "steps that summarized",
]

VERDICT_COLUMNS = [
    "data set",
    "orphans: ours 0",
    "calls over budget: ours at or below",
    "kept: ours at or above",
    "step p50: ours within 10%",
    "step p99: ours within 10%",
    "step p50 / p99 over the agent without memory: ours / theirs (us)",
]


def row(name: str, label: str, a: dict[str, Any]) -> list[Any]:
    kept = a["ids_kept"] if a["ids_kept"] is not None else a["evidence"]
    return [
        name,
        label,
        a["steps"],
        f"{fmt(a['mean'])} / {fmt(a['max'])}",
        a["over"],
        a["calls"],
        fmt(a["input_ratio"]),
        a["orphans"],
        fmt(kept) if kept is not None else "-",
        f"{fmt(a['p50_us'])} / {fmt(a['p99_us'])}",
        a["waited"],
    ]


def verdict(
    name: str, ours: dict[str, Any], theirs: dict[str, Any], none: dict[str, Any]
) -> list[Any]:
    def kept(a: dict[str, Any]) -> float:
        return float(a["ids_kept"] if a["ids_kept"] is not None else a["evidence"] or 0.0)

    def within(key: str) -> str:
        ratio = ours[key] / theirs[key] if theirs[key] else float("inf")
        return f"{'yes' if ratio <= 1.10 else 'no'} ({ratio:.2f}x)"

    return [
        name,
        "yes" if ours["orphans"] == 0 else f"no ({ours['orphans']})",
        "yes" if ours["over"] <= theirs["over"] else "no",
        "yes" if kept(ours) >= kept(theirs) else "no",
        within("p50_us"),
        within("p99_us"),
        " / ".join(
            f"{fmt(a['p50_us'] - none['p50_us'])}, {fmt(a['p99_us'] - none['p99_us'])}"
            for a in (ours, theirs)
        ),
    ]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--model-latency-ms",
        type=float,
        default=20.0,
        help="how long each recorded model call lasts (not timed; 0 = instant)",
    )
    p.add_argument("--tau", type=int, default=None, help="tau-bench trajectories (default all)")
    p.add_argument("--locomo", type=int, default=3, help="LoCoMo conversations (default 3)")
    p.add_argument("--name", default="adapters", help="results file name (default adapters)")
    args = p.parse_args()
    latency = args.model_latency_ms / 1000
    lc = import_langchain()
    locomo_path = require_data(args.data, "locomo/locomo_dev.json")
    tau_path = require_data(args.data, "tau_bench/airline_dev.json")
    out = out_dir(args.out)
    v = versions(PACKAGES)
    print_versions(v)
    started = time.perf_counter()
    counter = TokenCounter(cached=False)
    locomo, tau = load_locomo(locomo_path), load_tau_bench(tau_path)
    if args.quick:
        locomo, tau = [replace(c, messages=c.messages[:160]) for c in locomo[:1]], tau[:4]
    else:
        locomo, tau = locomo[: args.locomo], tau[: args.tau]
    systems: dict[str, Callable[[dict[str, Any], Conversation, TokenCounter, float], Run]] = {
        OURS: run_ours,
        THEIRS: run_theirs,
        NONE: run_none,
    }
    table = Table(
        f"LangChain's create_agent with each memory, a {BUDGET:,}-token budget, the same fake "
        "instant summarizer",
        COLUMNS,
    )
    verdicts = Table(
        "This memory against SummarizationMiddleware in the same agent", VERDICT_COLUMNS
    )
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name, conversations in (("tau-bench", tau), ("LoCoMo", locomo)):
        conv_tokens = sum(conversation_tokens(c, counter) for c in conversations)
        runs: dict[str, list[Run]] = {label: [] for label in systems}
        for i, conversation in enumerate(conversations):
            order = list(systems) if i % 2 == 0 else list(reversed(systems))
            for label in order:
                progress(f"{name} {i + 1}/{len(conversations)}: {label}")
                runs[label].append(systems[label](lc, conversation, counter, latency))
        results[name] = {label: aggregate(r, conv_tokens) for label, r in runs.items()}
        for label in systems:
            table.add(*row(name, label, results[name][label]))
        verdicts.add(
            *verdict(name, results[name][OURS], results[name][THEIRS], results[name][NONE])
        )
    write_results(
        args.name,
        "LangChain's create_agent: this memory's middleware against SummarizationMiddleware",
        [table, verdicts],
        out=out,
        versions_used=v,
        settings={
            "budget": BUDGET,
            "model call": f"{args.model_latency_ms:g} ms",
            "keep (SummarizationMiddleware)": f"{KEEP_MESSAGES} messages",
            "checkpointer": "in-memory",
            "memory store": "SQLite file",
            "conversations": f"tau-bench {len(tau)}, LoCoMo {len(locomo)}",
        },
        runtime_s=time.perf_counter() - started,
        extra={"results": json.loads(json.dumps(results, default=str))},
    )


if __name__ == "__main__":
    main()
