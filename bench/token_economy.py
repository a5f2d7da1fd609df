"""Token economy on every LoCoMo dev conversation at a 4,000-token context budget.

Each conversation is replayed through the real host (SQLite file, the plugin from its entry
point, host ``context_window = 4000``, ``reserve_for_reply = 0``: the 4,000 tokens are the
prompt's budget) with the fake instant summarizer. Per model call: the context tokens the host
measured before the call (``TurnResult.usage``), against no compression and a sliding window of
the same budget computed from the conversation alone. Then a sweep over plugin settings.

    python bench/token_economy.py [--data DIR] [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BUDGET,
    Table,
    TokenCounter,
    make_rig,
    out_dir,
    parser,
    print_versions,
    progress,
    require_data,
    versions,
    write_results,
)
from fakes import bench_llm, summarizer_stats  # noqa: E402
from replay import (  # noqa: E402
    SystemRun,
    baseline_runs,
    conversation_tokens,
    replay_through_host,
    summarize_steps,
)
from settings import DEFAULT, RECOMMENDED, SETTINGS, quick_settings  # noqa: E402

from host_stub.datasets import Conversation, load_locomo  # noqa: E402


async def run_plugin(
    conversation: Conversation, config: dict[str, Any], counter: TokenCounter
) -> SystemRun:
    llm = bench_llm(counter=counter)
    rig = await make_rig(llm, config)
    try:
        run = await replay_through_host(rig, conversation, conversation.name)
        await rig.drain()
        run.summarizer_calls = summarizer_stats(llm).calls
        run.summarizer_input_tokens = summarizer_stats(llm).input_tokens
        run.extra["compressions"] = len(rig.finals("done"))
        run.extra["errors"] = len(rig.finals("error"))
    finally:
        await rig.close()
    return run


def plot(per_conv: dict[str, dict[str, SystemRun]], out: Path, recommended: str) -> list[str]:
    try:
        import matplotlib
    except ModuleNotFoundError:
        return ["matplotlib not installed: no plot (pip install 'plugin-memory-summary[plot]')"]
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(per_conv)
    fig, axes = plt.subplots(
        len(names), 1, figsize=(9, 2.3 * len(names)), sharex=False, squeeze=False
    )
    styles = {
        "no compression": ("#999999", "-"),
        "sliding window": ("#1f77b4", "-"),
        f"plugin: {DEFAULT}": ("#ff7f0e", "-"),
        f"plugin: {recommended}": ("#2ca02c", "-"),
    }
    for ax, name in zip(axes[:, 0], names, strict=True):
        for label, run in per_conv[name].items():
            if label not in styles:
                continue
            color, ls = styles[label]
            ax.plot(
                [s.tokens for s in run.steps], color=color, linestyle=ls, linewidth=1, label=label
            )
        ax.axhline(BUDGET, color="red", linewidth=0.8, linestyle="--", label="budget")
        ax.set_ylim(0, BUDGET * 1.5)
        ax.set_ylabel("tokens sent")
        ax.set_title(f"LoCoMo {name} (no compression leaves the chart)", fontsize=9)
    axes[-1, 0].set_xlabel("model call (step)")
    axes[0, 0].legend(fontsize=7, loc="upper left", ncol=3)
    fig.tight_layout()
    fig.savefig(out / "tokens_per_turn.svg")
    fig.savefig(out / "tokens_per_turn.png", dpi=80)
    plt.close(fig)
    return [f"plot: {out.name}/tokens_per_turn.svg and .png"]


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args()
    path = require_data(args.data, "locomo/locomo_dev.json")
    out = out_dir(args.out)
    v = versions(["matplotlib"])
    print_versions(v)
    started = time.perf_counter()
    counter = TokenCounter()
    conversations = load_locomo(path)
    settings = SETTINGS
    if args.quick:
        conversations = [
            Conversation(c.name, c.messages[:160], c.qa, c.turn_index) for c in conversations[:1]
        ]
        settings = quick_settings()
    recommended = RECOMMENDED if RECOMMENDED in settings else DEFAULT

    per_conv: dict[str, dict[str, SystemRun]] = {}
    sweep: dict[str, list[SystemRun]] = {name: [] for name in settings}
    conv_tokens: dict[str, int] = {}
    for conv in conversations:
        conv_tokens[conv.name] = conversation_tokens(conv, counter)
        none, window, _ = baseline_runs(conv, counter)
        runs = {"no compression": none, "sliding window": window}
        for name, config in settings.items():
            progress(f"{conv.name}: {name}")
            run = await run_plugin(conv, config, counter)
            sweep[name].append(run)
            if name in (DEFAULT, recommended):
                runs[f"plugin: {name}"] = run
        per_conv[conv.name] = runs

    main_table = Table(
        f"Per conversation, {BUDGET}-token budget (context tokens per model call as the host "
        "measured them)",
        [
            "conversation",
            "system",
            "steps",
            "mean tokens",
            "max tokens",
            "steps over budget",
            "summarizer calls",
            "summarizer input / conversation",
            "verbatim msgs (mean)",
            "verbatim msgs (last)",
        ],
    )
    for name, runs in per_conv.items():
        for label, run in runs.items():
            s = summarize_steps([run])
            main_table.add(
                name,
                label,
                s["steps"],
                round(s["mean"]),
                s["max"],
                s["over"],
                run.summarizer_calls if label.startswith("plugin") else "-",
                round(run.summarizer_input_tokens / conv_tokens[name], 2)
                if label.startswith("plugin")
                else "-",
                round(s["verbatim"], 1),
                run.steps[-1].verbatim if run.steps else 0,
            )
    total_tokens = sum(conv_tokens.values())
    sweep_table = Table(
        f"Settings sweep, all {len(conversations)} conversations together ({total_tokens:,} "
        "conversation tokens)",
        [
            "setting",
            "mean tokens",
            "max tokens",
            "steps over budget",
            "compressions",
            "summarizer calls",
            "summarizer input / conversation",
            "verbatim msgs (mean)",
        ],
    )
    extra: dict[str, Any] = {"settings": settings, "conversation_tokens": conv_tokens}
    for name, runs in sweep.items():
        s = summarize_steps(runs)
        calls = sum(r.summarizer_calls for r in runs)
        sweep_table.add(
            name,
            round(s["mean"]),
            s["max"],
            s["over"],
            sum(r.extra["compressions"] for r in runs),
            calls,
            round(sum(r.summarizer_input_tokens for r in runs) / total_tokens, 2),
            round(s["verbatim"], 1),
        )
        if any(r.extra["errors"] for r in runs):
            extra.setdefault("errors", {})[name] = sum(r.extra["errors"] for r in runs)
    for label in ("no compression", "sliding window"):
        s = summarize_steps([runs[label] for runs in per_conv.values()])
        sweep_table.add(
            f"({label})",
            round(s["mean"]),
            s["max"],
            s["over"],
            "-",
            "-",
            "-",
            round(s["verbatim"], 1),
        )
    notes = plot(per_conv, out, recommended)
    notes += [
        f"Budget {BUDGET} tokens = host context_window {BUDGET} with reserve_for_reply 0; "
        "tokens are "
        "TokenUsage.used as the host measured before each model call (summary block + history + "
        "system prompt), counted with tiktoken cl100k_base (OpenAI chat formula).",
        "Summarizer: a fake instant LLM answering a ~300-token extractive summary; calls and input "
        "tokens are what the plugin sent it.",
        "Sliding window: newest messages fitting the same budget, computed from the conversation.",
    ]
    write_results(
        "token_economy",
        "Token economy on LoCoMo at a 4,000-token budget",
        [main_table, sweep_table],
        out=out,
        versions_used=v,
        settings={
            "budget": BUDGET,
            "reserve_for_reply": 0,
            "conversations": len(conversations),
            "quick": args.quick,
        },
        runtime_s=time.perf_counter() - started,
        notes=notes,
        extra=extra,
    )


if __name__ == "__main__":
    asyncio.run(main())
