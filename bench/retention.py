"""Fact retention with the offline ``rules`` summarizer at a fixed 4,000-token budget, against a
sliding window of the same budget.

- LoCoMo (QA categories 1-4): after the whole conversation, is each QA's evidence still in the
  context the next model call would get (summary + kept window, built by the real host with
  ``dry_run``)? Measured as the share of the evidence turns' content words, and of the answer's
  tokens, present in it.
- tau-bench airline: at every cut (every compression the plugin committed; every turn that made
  the sliding window drop a message), the share of the ground-truth action argument values
  (identifiers of 5+ characters from ``info.task.actions``) seen so far that are still in the
  context after the cut; plus tool-pair violations in the active history after every cut and in
  every prompt sent.

    python bench/retention.py [--data DIR] [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BUDGET,
    SYSTEM_PROMPT,
    Table,
    TokenCounter,
    answer_tokens,
    content_words,
    make_rig,
    mean,
    out_dir,
    parser,
    print_versions,
    progress,
    require_data,
    sliding_window,
    tool_pair_violations,
    versions,
    words,
    write_results,
)
from fakes import bench_llm  # noqa: E402
from replay import (  # noqa: E402
    SystemRun,
    baseline_runs,
    changes_of,
    prefix_reuse_of,
    replay_through_host,
    summary_changes_of,
)
from settings import DEFAULT, RECOMMENDED, SETTINGS, quick_settings  # noqa: E402

from host_stub.datasets import (  # noqa: E402
    Conversation,
    load_locomo,
    load_tau_bench,
    tau_action_identifiers,
)
from host_stub.messages import text_of  # noqa: E402
from host_stub.transcripts import split_turns  # noqa: E402

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_PREFIX = re.compile(r"^\[[^\]]*\]\s*[^:]{1,40}:\s*")
_DIA = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


def prompt_text(prompt: list[dict[str, Any]]) -> str:
    parts = []
    for m in prompt:
        parts.append(text_of(m.get("content")))
        for call in m.get("tool_calls") or []:
            parts.append(str(call.get("function", {}).get("arguments", "")))
    return "\n".join(parts)


def evidence_indexes(conversation: Conversation, evidence: list[str]) -> list[int]:
    out = []
    for item in evidence:
        for match in _DIA.finditer(str(item)):
            key = f"D{match.group(1)}:{match.group(2)}"
            if key in conversation.turn_index:
                out.append(conversation.turn_index[key])
    return sorted(set(out))


# -- LoCoMo ----------------------------------------------------------------------------------------


@dataclass
class QAScore:
    category: int
    evidence_recall: float
    answer_recall: float
    answer_present: bool
    evidence_verbatim: float


def score_locomo(
    conversation: Conversation, context: str, verbatim_indexes: set[int]
) -> list[QAScore]:
    present = set(words(context))
    scores = []
    for qa in conversation.qa:
        category = qa.get("category")
        if category not in CATEGORIES or "answer" not in qa:
            continue
        indexes = evidence_indexes(conversation, qa.get("evidence", []))
        if not indexes or indexes[-1] >= len(conversation.messages):
            continue  # no usable evidence, or (--quick) beyond the replayed part
        wanted: set[str] = set()
        for i in indexes:
            wanted |= content_words(_PREFIX.sub("", text_of(conversation.messages[i].content)))
        answer = answer_tokens(str(qa["answer"]))
        scores.append(
            QAScore(
                category=category,
                evidence_recall=len(wanted & present) / len(wanted) if wanted else 1.0,
                answer_recall=len(answer & present) / len(answer) if answer else 1.0,
                answer_present=answer <= present,
                evidence_verbatim=sum(1 for i in indexes if i in verbatim_indexes) / len(indexes),
            )
        )
    return scores


async def plugin_final_context(
    conversation: Conversation,
    config: dict[str, Any],
    counter: TokenCounter,
    window: int = BUDGET,
) -> tuple[str, str, set[int], dict[str, Any], SystemRun]:
    """Replay with the rules engine at a ``window``-token context; the dry-run prompt after the
    last turn: its whole text, its text without the summary, and which conversation messages it
    holds verbatim; and the replay's model calls."""
    llm = bench_llm(counter=counter, default_model=None)  # no summarizer model: the rules engine
    rig = await make_rig(llm, config, context_window=window)
    try:
        run = await replay_through_host(rig, conversation, conversation.name, drain=True)
        _, prompt, usage, _ = await rig.host.build_prompt(conversation.name, dry_run=True)
        active = [
            m for m in await rig.host.memory.get_history(conversation.name) if not m.is_marker
        ]
        n = len(conversation.messages)
        kept = {(m.seq or 0) - 1 for m in active if m.seq is not None and (m.seq or 0) <= n}
        summary_free = [
            m
            for m in prompt
            if not (m["role"] == "system" and "conversation-summary" in str(m["content"]))
        ]
        info = {
            "compressions": len(rig.finals("done")),
            "errors": len(rig.finals("error")),
            "final_tokens": usage.used,
            "summary_tokens": usage.breakdown.summary,
        }
    finally:
        await rig.close()
    return prompt_text(prompt), prompt_text(summary_free), kept, info, run


def window_final_context(
    conversation: Conversation, counter: TokenCounter, budget: int = BUDGET
) -> tuple[str, set[int]]:
    wire = [m.to_openai() for m in conversation.messages]
    history_idx = [i for i, m in enumerate(wire) if m["role"] != "system"]
    history = [wire[i] for i in history_idx]
    fixed = counter.text(SYSTEM_PROMPT) + sum(
        counter.stored(m) for m in wire if m["role"] == "system"
    )
    start = sliding_window(history, budget, fixed, [counter.stored(m) for m in history])
    kept = set(history_idx[start:])
    system = [m for m in wire if m["role"] == "system"]
    return prompt_text(
        [{"role": "system", "content": SYSTEM_PROMPT}, *system, *history[start:]]
    ), kept


def locomo_rows(label: str, scores: list[QAScore]) -> list[list[Any]]:
    rows = []
    by_cat: dict[Any, list[QAScore]] = defaultdict(list)
    for s in scores:
        by_cat[s.category].append(s)
    for cat in [*sorted(by_cat), "all"]:
        items = scores if cat == "all" else by_cat[cat]
        rows.append(
            [
                label,
                "all (1-4)" if cat == "all" else f"{cat} {CATEGORIES[cat]}",
                len(items),
                round(mean([s.evidence_recall for s in items]), 3),
                round(mean([s.answer_recall for s in items]), 3),
                round(mean([float(s.answer_present) for s in items]), 3),
                round(mean([s.evidence_verbatim for s in items]), 3),
            ]
        )
    return rows


# -- tau-bench -------------------------------------------------------------------------------------


def ids_in(text: str, ids: set[str]) -> set[str]:
    return {i for i in ids if i in text}


@dataclass
class TauScore:
    cuts: int = 0
    seen: int = 0
    kept: int = 0
    history_violations: int = 0
    sent_violations: int = 0
    steps: int = 0
    per_cut: list[float] = field(default_factory=list)

    def add(self, other: TauScore) -> None:
        self.cuts += other.cuts
        self.seen += other.seen
        self.kept += other.kept
        self.history_violations += other.history_violations
        self.sent_violations += other.sent_violations
        self.steps += other.steps
        self.per_cut += other.per_cut


async def tau_plugin(
    conversation: Conversation, config: dict[str, Any], counter: TokenCounter
) -> tuple[TauScore, SystemRun]:
    ids = tau_action_identifiers(conversation)
    llm = bench_llm(counter=counter, default_model=None)
    rig = await make_rig(llm, config)
    score = TauScore()
    session = conversation.name
    appended: list[str] = []
    last_version = [0]

    async def after_turn(result: Any) -> None:
        appended.extend(prompt_text([m.to_openai()]) for m in result.messages)
        score.steps += len(result.sent)
        score.sent_violations += sum(tool_pair_violations(p) for p in result.sent)
        snap = await rig.host.memory.snapshot(session)
        version = snap.record.version if snap.record else 0
        if version == last_version[0]:
            return
        last_version[0] = version
        score.cuts += 1
        active = [m.to_openai() for m in snap.messages if not m.is_marker and m.role != "system"]
        score.history_violations += tool_pair_violations(active)
        _, prompt, _, _ = await rig.host.build_prompt(session, dry_run=True)
        seen = ids_in("\n".join(appended), ids)
        kept = ids_in(prompt_text(prompt), seen)
        score.seen += len(seen)
        score.kept += len(kept)
        if seen:
            score.per_cut.append(len(kept) / len(seen))

    try:
        run = await replay_through_host(
            rig, conversation, session, drain=True, after_turn=after_turn
        )
    finally:
        await rig.close()
    return score, run


def tau_window(conversation: Conversation, counter: TokenCounter, *, keep_groups: bool) -> TauScore:
    ids = tau_action_identifiers(conversation)
    score = TauScore()
    wire = [m.to_openai() for m in conversation.messages]
    base = counter.text(SYSTEM_PROMPT)
    pos = 0
    last_start = 0
    for inputs, recorded in split_turns(conversation.messages):
        pos += len(inputs) + len(recorded)
        before = wire[:pos]
        system = [m for m in before if m["role"] == "system"]
        history = [m for m in before if m["role"] != "system"]
        fixed = base + sum(counter.stored(m) for m in system)
        start = sliding_window(
            history, BUDGET, fixed, [counter.stored(m) for m in history], keep_groups=keep_groups
        )
        if start == last_start:
            continue
        last_start = start
        score.cuts += 1
        score.history_violations += tool_pair_violations(history[start:])
        seen = ids_in(prompt_text(before), ids)
        kept = ids_in(prompt_text(system + history[start:]), seen)
        score.seen += len(seen)
        score.kept += len(kept)
        if seen:
            score.per_cut.append(len(kept) / len(seen))
    return score


def tau_chain(trajectories: list[Conversation]) -> Conversation:
    """The trajectories back to back as one long tool chat (the first system message only)."""
    messages: list[Any] = []
    for t in trajectories:
        messages += [m for m in t.messages if m.role != "system"] if messages else list(t.messages)
    return Conversation("tau-long", messages)


async def tau_long_chat(
    trajectories: list[Conversation], config: dict[str, Any], counter: TokenCounter
) -> tuple[int, int, int, int, int, SystemRun]:
    """The trajectories back to back as one long tool chat: of the ground-truth action
    identifiers that are in archived messages at the end, how many the final prompt still holds;
    tool-pair violations in every prompt sent; prompts over the budget. Returns (archived ids,
    kept, violations, over budget, compressions, the replay's model calls)."""
    ids: set[str] = set()
    for t in trajectories:
        ids |= tau_action_identifiers(t)
    conversation = tau_chain(trajectories)
    rig = await make_rig(bench_llm(counter=counter, default_model=None), config)
    violations = over = 0

    async def after_turn(result: Any) -> None:
        nonlocal violations, over
        violations += sum(tool_pair_violations(p) for p in result.sent)
        over += sum(1 for u in sent_usage(result.usage) if u.used > BUDGET)

    try:
        run = await replay_through_host(
            rig, conversation, "tau-long", drain=True, after_turn=after_turn
        )
        _, prompt, _, _ = await rig.host.build_prompt("tau-long", dry_run=True)
        archived = await rig.host.memory.get_archived("tau-long")
        archived_text = "\n".join(prompt_text([m.to_openai()]) for m in archived)
        seen = ids_in(archived_text, ids)
        kept = ids_in(prompt_text(prompt), seen)
        compressions = len(rig.finals("done"))
    finally:
        await rig.close()
    return len(seen), len(kept), violations, over, compressions, run


def sent_usage(usage: list[Any]) -> list[Any]:
    """The usage of each prompt a turn sent: a measure that a blocking compression replaced
    (the next one is ``rebuilt``) was never sent."""
    return [u for i, u in enumerate(usage) if not (i + 1 < len(usage) and usage[i + 1].rebuilt)]


def tau_row(label: str, score: TauScore, trajectories: int) -> list[Any]:
    return [
        label,
        trajectories,
        score.cuts,
        score.seen,
        round(score.kept / score.seen, 3) if score.seen else float("nan"),
        round(mean(score.per_cut), 3) if score.per_cut else float("nan"),
        score.history_violations,
        score.sent_violations if score.steps else "-",
    ]


#: The columns of a long tool chat's row after the one naming it (see ``_long_chat_cells``).
LONG_CHAT_COLUMNS = [
    "ids archived",
    "ids kept",
    "share kept",
    "tool-pair violations",
    "calls over budget",
    "compressions",
]


def _long_chat_cells(seen: int, kept: int, bad: Any, over: Any, done: Any) -> list[Any]:
    """A long tool chat's row after its name: ids archived, kept, the share kept, violations,
    calls over budget, compressions."""
    return [seen, kept, round(kept / seen, 3) if seen else "-", bad, over, done]


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args()
    locomo_path = require_data(args.data, "locomo/locomo_dev.json")
    tau_path = require_data(args.data, "tau_bench/airline_dev.json")
    out = out_dir(args.out)
    v = versions()
    print_versions(v)
    started = time.perf_counter()
    counter = TokenCounter()
    conversations = load_locomo(locomo_path)
    trajectories = load_tau_bench(tau_path)
    settings = SETTINGS
    if args.quick:
        conversations = [
            Conversation(c.name, c.messages[:160], c.qa, c.turn_index) for c in conversations[:1]
        ]
        trajectories = trajectories[:8]
        settings = quick_settings()
    recommended = RECOMMENDED if RECOMMENDED in settings else DEFAULT

    # LoCoMo: every setting, plus the sliding window.
    by_setting: dict[str, list[QAScore]] = {name: [] for name in settings}
    no_summary: dict[str, list[QAScore]] = {name: [] for name in settings}
    window_scores: list[QAScore] = []
    infos: dict[str, list[dict[str, Any]]] = defaultdict(list)
    #: (data, system) -> the model calls of every replay, for the prompt-prefix reuse.
    calls: dict[tuple[str, str], list[SystemRun]] = defaultdict(list)
    for conv in conversations:
        for name, config in settings.items():
            progress(f"locomo {conv.name}: {name}")
            context, kept_text, kept, info, run = await plugin_final_context(conv, config, counter)
            by_setting[name] += score_locomo(conv, context, kept)
            no_summary[name] += score_locomo(conv, kept_text, kept)
            infos[name].append(info)
            calls["locomo", f"plugin: {name}"].append(run)
        w_context, w_kept = window_final_context(conv, counter)
        window_scores += score_locomo(conv, w_context, w_kept)
        none, window, _ = baseline_runs(conv, counter)
        calls["locomo", "sliding window"].append(window)
        calls["locomo", "no compression"].append(none)

    columns = [
        "system",
        "category",
        "QAs",
        "evidence words present",
        "answer tokens present",
        "answer fully present",
        "evidence turns verbatim",
    ]
    locomo_table = Table(
        f"LoCoMo, context after the last turn ({len(conversations)} conversations, QA "
        "categories 1-4)",
        columns,
    )
    for row in locomo_rows(f"plugin: {recommended}", by_setting[recommended]):
        locomo_table.add(*row)
    for row in locomo_rows("sliding window", window_scores):
        locomo_table.add(*row)

    sweep = Table(
        "LoCoMo retention by setting (all categories 1-4); 'without summary' = the same "
        "context with the summary block removed",
        [
            "setting",
            "evidence words present",
            "answer tokens present",
            "answer fully present",
            "without summary: evidence words",
            "without summary: answer fully present",
            "final context tokens (mean)",
            "compressions",
        ],
    )
    for name in settings:
        s, k = by_setting[name], no_summary[name]
        sweep.add(
            name,
            round(mean([x.evidence_recall for x in s]), 3),
            round(mean([x.answer_recall for x in s]), 3),
            round(mean([float(x.answer_present) for x in s]), 3),
            round(mean([x.evidence_recall for x in k]), 3),
            round(mean([float(x.answer_present) for x in k]), 3),
            round(mean([i["final_tokens"] for i in infos[name]])),
            sum(i["compressions"] for i in infos[name]),
        )
    sweep.add(
        "(sliding window)",
        round(mean([x.evidence_recall for x in window_scores]), 3),
        round(mean([x.answer_recall for x in window_scores]), 3),
        round(mean([float(x.answer_present) for x in window_scores]), 3),
        "-",
        "-",
        "-",
        "-",
    )

    # The same margin at a larger window: the defaults against a sliding window of that budget.
    sizes = Table(
        "LoCoMo by context window (all categories 1-4): the shipped defaults against a sliding "
        "window of the same budget",
        [
            "context window",
            "plugin: evidence words",
            "window: evidence words",
            "margin (points)",
            "plugin: answer tokens",
            "window: answer tokens",
        ],
    )
    for size in (BUDGET, 2 * BUDGET):
        ours: list[QAScore] = []
        theirs: list[QAScore] = []
        for conv in conversations:
            progress(f"locomo {conv.name}: defaults at {size}")
            if size == BUDGET:
                ours = by_setting[DEFAULT]
                theirs = window_scores
                break
            context, _, kept, _, _ = await plugin_final_context(conv, {}, counter, size)
            ours += score_locomo(conv, context, kept)
            w_context, w_kept = window_final_context(conv, counter, size)
            theirs += score_locomo(conv, w_context, w_kept)
        ev, wev = mean([x.evidence_recall for x in ours]), mean([x.evidence_recall for x in theirs])
        sizes.add(
            size,
            round(ev, 3),
            round(wev, 3),
            round(100 * (ev - wev), 1),
            round(mean([x.answer_recall for x in ours]), 3),
            round(mean([x.answer_recall for x in theirs]), 3),
        )

    # tau-bench: the default and the recommended setting, the window with and without groups.
    tau_table = Table(
        f"tau-bench airline ({len(trajectories)} trajectories): identifiers seen before each "
        "cut still present after it",
        [
            "system",
            "trajectories",
            "cuts",
            "ids seen (sum over cuts)",
            "ids kept (pooled)",
            "ids kept (mean per cut)",
            "tool-pair violations after cuts",
            "tool-pair violations in prompts sent",
        ],
    )
    tau_scores: dict[str, TauScore] = {}
    for name in dict.fromkeys([DEFAULT, recommended]):
        total = TauScore()
        progress(f"tau-bench: {name}")
        for traj in trajectories:
            score, run = await tau_plugin(traj, settings[name], counter)
            total.add(score)
            calls["tau", f"plugin: {name}"].append(run)
        tau_scores[name] = total
        tau_table.add(*tau_row(f"plugin: {name}", total, len(trajectories)))
    for label, groups in (
        ("sliding window (tool groups whole)", True),
        ("naive sliding window", False),
    ):
        total = TauScore()
        for traj in trajectories:
            total.add(tau_window(traj, counter, keep_groups=groups))
        tau_table.add(*tau_row(label, total, len(trajectories)))
    for traj in trajectories:
        none, window, _ = baseline_runs(traj, counter)
        calls["tau", "sliding window"].append(window)
        calls["tau", "no compression"].append(none)

    long_table = Table(
        "tau-bench airline: 25 trajectories back to back as one long tool chat; action "
        "identifiers that are archived at the end and still in the final prompt",
        ["system", *LONG_CHAT_COLUMNS],
    )
    chain = trajectories[: min(25, len(trajectories))]
    for name in dict.fromkeys([DEFAULT, recommended]):
        progress(f"tau-bench long chat: {name}")
        seen, kept_ids, bad, over, done, run = await tau_long_chat(chain, settings[name], counter)
        calls["tau-long", f"plugin: {name}"].append(run)
        long_table.add(f"plugin: {name}", *_long_chat_cells(seen, kept_ids, bad, over, done))

    # Tier 1's share: the same chat with old tool output left whole in the prompt.
    progress("tau-bench long chat: no tier-1 pruning")
    unpruned = {**settings[DEFAULT], "prune_keep_tool_groups": None, "tool_result_max_share": 0}
    seen, kept_ids, bad, over, done, _ = await tau_long_chat(chain, unpruned, counter)
    long_table.add(
        "plugin: default without tier-1 pruning",
        *_long_chat_cells(seen, kept_ids, bad, over, done),
    )

    # The same chat on every slice of 25 trajectories: data the defaults were not tuned on.
    slices = Table(
        "tau-bench airline: every slice of 25 trajectories back to back as one long tool chat "
        "(shipped defaults); the first slice is the chat above",
        ["trajectories", *LONG_CHAT_COLUMNS],
    )
    pooled = [0, 0]
    for start in range(0, len(trajectories), 25):
        part = trajectories[start : start + 25]
        progress(f"tau-bench long chat: trajectories {start}-{start + len(part)}")
        seen, kept_ids, bad, over, done, _ = await tau_long_chat(part, settings[DEFAULT], counter)
        pooled[0] += seen
        pooled[1] += kept_ids
        slices.add(
            f"{start}-{start + len(part)}", *_long_chat_cells(seen, kept_ids, bad, over, done)
        )
    slices.add("all slices (pooled)", *_long_chat_cells(pooled[0], pooled[1], "-", "-", "-"))

    none, window, _ = baseline_runs(tau_chain(chain), counter)
    calls["tau-long", "sliding window"].append(window)
    calls["tau-long", "no compression"].append(none)
    data_names = {
        "locomo": f"LoCoMo ({len(conversations)} conversations)",
        "tau": f"tau-bench ({len(trajectories)} trajectories, one session each)",
        "tau-long": f"tau-bench, {len(chain)} trajectories as one long tool chat",
    }
    reuse_table = Table(
        "Prompt-prefix reuse: per model call after a session's first, the prompt tokens that "
        "repeat the previous call's prompt from its start (what a provider's prompt cache "
        "could serve), the tokens of messages new since that call, and the rest, sent again",
        [
            "data",
            "system",
            "calls",
            "prefix reused (pooled)",
            "prefix reused (median per call)",
            "new messages",
            "sent again",
        ],
    )
    reuse: dict[str, dict[str, Any]] = defaultdict(dict)
    for (data, system), runs in calls.items():
        row = prefix_reuse_of(runs)
        reuse[data][system] = asdict(row) | {"resent": row.resent}
        reuse_table.add(
            data_names[data],
            system,
            row.calls,
            round(row.reused, 3),
            round(row.median, 3),
            round(row.new, 3),
            round(row.resent, 3),
        )
    change_table = Table(
        "Where each call's prompt first differs from the previous call's (calls after a "
        "session's first), and the tokens sent again after that point, as a share of all the "
        "calls' prompt tokens",
        ["data", "system", "first change", "calls", "sent again (share of all prompt tokens)"],
    )
    block_table = Table(
        "The plugin's calls whose prompt first differs at the summary block (a compression), "
        "means per call, in tokens",
        [
            "data",
            "system",
            "calls",
            "prompt",
            "summary block",
            "block reused from its start",
            "block in lines the previous block had",
        ],
    )
    for (data, system), runs in calls.items():
        if system == "no compression":
            continue
        for where, (n, share) in sorted(changes_of(runs).items()):
            change_table.add(data_names[data], system, where or "(only grew)", n, round(share, 3))
        block = summary_changes_of(runs)
        if block["calls"]:
            block_table.add(
                data_names[data],
                system,
                block["calls"],
                round(block["prompt"]),
                round(block["block"]),
                round(block["block_reused"]),
                round(block["block_lines_kept"]),
            )

    notes = [
        f"Budget: host context_window {BUDGET}, reserve_for_reply 0; summarizer: none configured, "
        "so every compression is the rules engine (deterministic, extractive).",
        "LoCoMo: evidence words = content words (stop words and words under 3 letters removed) of "
        "the evidence turns without their date/speaker prefix; present = found as a word anywhere "
        "in the context the host would send next (dry_run build_prompt).",
        "tau-bench: a cut of the plugin = a committed compression, measured after the turn it "
        "followed (background work drained); a cut of the window = a turn end at which it dropped "
        "a message. Context after a cut = the whole prompt (system, summary, kept messages, tool "
        "arguments).",
        "Prompt-prefix reuse: the host's token:usage reused_tokens / message_tokens of every "
        "prompt sent (tool definitions left out); the sliding window and no compression are "
        "measured with the same function on the prompts they would send. Calls are those after "
        "a session's first; pooled = reused tokens / prompt tokens over all of them.",
    ]
    errors = {n: sum(i["errors"] for i in infos[n]) for n in settings}
    write_results(
        "retention",
        "Fact retention, rules summarizer, 4,000-token budget",
        [
            locomo_table,
            sweep,
            sizes,
            tau_table,
            long_table,
            slices,
            reuse_table,
            change_table,
            block_table,
        ],
        out=out,
        versions_used=v,
        settings={"budget": BUDGET, "engine": "rules", "quick": args.quick},
        runtime_s=time.perf_counter() - started,
        notes=notes,
        extra={"settings": settings, "compression_errors": errors, "prefix_reuse": reuse},
    )


if __name__ == "__main__":
    asyncio.run(main())
