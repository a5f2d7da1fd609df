"""Summaries written by a model behind any OpenAI-compatible URL: LoCoMo messages and the demo
conversation replayed through the real host, the model as the summarizer (the recorded replies
stand in for the chat model), and the same replays with the offline rules engine for comparison.

Per data set: compressions; how many used the model's answer (a digest the rules engine merged
counts as used; "all answers used" means no fallback at all); why the others fell back, by kind;
summarizer latency per call; JSON debris in any stored summary (every record is read after every
compression); the model's lines kept in the records (its digest sentences, which passed the
grounding check) and its items left out as ungrounded (not found in what they digest), a sample
of each; and the early facts kept: the demo's 8 early facts in the final summary, and for
LoCoMo the evidence words of the QAs whose evidence lies in the first half of the replayed
messages, in the kept text (summary block + active messages), as bench/retention.py measures.

    python bench/model_replay.py --api-base URL --model openai/NAME [--api-key KEY]
        [--messages 200] [--demo-turns 300] [--locomo-window 4000] [--timeout S]
        [--model-window N]
        [--data DIR] [--quick] [--out DIR]
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BUDGET,
    SYSTEM_PROMPT,
    Table,
    TokenCounter,
    mean,
    out_dir,
    parser,
    percentile,
    print_versions,
    progress,
    require_data,
    run,
    versions,
    write_results,
)
from retention import prompt_text, score_locomo, window_final_context  # noqa: E402

from host_stub import signals  # noqa: E402
from host_stub.config import HostConfig  # noqa: E402
from host_stub.datasets import Conversation, load_locomo  # noqa: E402
from host_stub.host import Host  # noqa: E402
from host_stub.messages import Message  # noqa: E402
from host_stub.transcripts import split_turns  # noqa: E402
from plugin_memory_summary.extras.demo import DEMO_CONFIG, EARLY_FACTS, generate_conversation  # noqa: E402
from plugin_memory_summary.extras.report.models import CompressionEvent  # noqa: E402
from plugin_memory_summary.extras.report.reasons import (  # noqa: E402
    dropped_items,
    fallback_kinds,
    ungrounded_samples,
)
from plugin_memory_summary.extras.report.replay import replay_series  # noqa: E402

PLUGIN = "memory-summary"
SESSION = "bench"
#: Examples of kept and dropped lines written per run.
SAMPLES = 5

#: A stored line that is JSON, not text: a ``"key": value`` pair, a line of brackets, a fence,
#: an escaped line break, an object or list opening mid-line. Independent of the plugin's own
#: gate, so the gate is checked, not trusted.
_DEBRIS = re.compile(
    r'"[^"\n]{1,40}"\s*:\s*["\[{\d]|^\s*[-*]?\s*[\[\]{}],?\s*$|```|\\n|\{\s*"|\[\s*\{|[}\]]\s*,\s*$'
)


def debris_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if _DEBRIS.search(line)]


#: A model's digest in a record line: after its label (``[#1-16] Summary: ...``, or mid-line
#: after another speaker's sentence) up to the next speaker's label.
_MODEL_LINE = re.compile(
    r"(?:\] |[.!?。！？] )(?:Summary|摘要): "
    r"(.+?)(?= [A-Z][\w'.-]{0,30}(?: [A-Z][\w'.-]{0,30})?: |$)"
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=\S)|(?<=[。！？])")


def model_lines(text: str) -> list[str]:
    """The sentences of a record that a summarizer model wrote (its ``Summary:`` lines)."""
    found: list[str] = []
    for line in text.splitlines():
        for match in _MODEL_LINE.finditer(line):
            found += [s.strip() for s in _SENTENCE.split(match.group(1)) if s.strip()]
    return found


@dataclass
class Replay:
    """One replay: its compressions, the debris found in any record it stored, the final
    summary and kept text."""

    label: str
    events: list[CompressionEvent] = field(default_factory=list)
    debris: list[str] = field(default_factory=list)
    #: The model's sentences found in any record it stored, in the order first seen.
    model_lines: list[str] = field(default_factory=list)
    summary: str = ""
    kept_text: str = ""
    kept: set[int] = field(default_factory=set)
    window: int | None = None
    seconds: float = 0.0

    @property
    def used(self) -> int:
        return sum(1 for e in self.events if e.answers_used)

    @property
    def clean(self) -> int:
        return sum(1 for e in self.events if e.answers_used and not e.fallback)

    @property
    def latencies(self) -> list[float]:
        return [t for e in self.events for t in e.llm_seconds]

    @property
    def left_out(self) -> Counter[str]:
        """Items of the model's answers left out, by kind (``ungrounded``, ``meta-talk``, ...)."""
        counts: Counter[str] = Counter()
        for e in self.events:
            counts.update(dropped_items(e.reason))
        return counts

    @property
    def ungrounded(self) -> list[str]:
        """Examples of the items left out as ungrounded (one per answer that had any)."""
        return [s for e in self.events for s in ungrounded_samples(e.reason)]


def host_config(
    base: dict[str, Any], args: Any, *, model: bool, window: int | None, db: Path
) -> HostConfig:
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    host = data.setdefault("host", {})
    host["memory"] = f"sqlite:///{db}"
    if window:
        host["context_window"] = window
    if model:
        host.update(model=args.model, api_base=args.api_base)
        # A local server that checks no key accepts any (the CLI sends the same placeholder).
        host["api_key"] = args.api_key or os.environ.get("OPENAI_API_KEY") or "no-key"
        if args.model_window:
            host["models"] = {args.model: {"context_window": args.model_window}}
    plugin = dict((data.get("plugin") or {}).get(PLUGIN) or {})
    if model and args.timeout:
        plugin["summary_timeout_s"] = args.timeout
    data["plugins"] = {"allow": [PLUGIN]}
    data["plugin"] = {PLUGIN: plugin}
    return HostConfig.model_validate(data)


async def replay(label: str, config: HostConfig, messages: list[Message]) -> Replay:
    out = Replay(label)
    host = Host(config)
    await host.start()
    plugin = host.plugins[PLUGIN].plugin
    model = config.host.model
    if model and config.host.api_base and not host.llm.knows_window(model):
        await host.llm.probe_server_window(model)
    out.window = host.llm.context_window(model) if model else None

    async def on_status(sender: Any, **payload: Any) -> None:
        if payload.get("session_id") != SESSION or payload["status"] not in ("done", "error"):
            return
        record = await plugin.show(SESSION)
        text = record.text if record is not None else ""
        for line in debris_lines(text):
            if line not in out.debris:
                out.debris.append(line)
        for line in model_lines(text):
            if line not in out.model_lines:
                out.model_lines.append(line)

    host.bus.connect(signals.SESSION_COMPRESSING, on_status)
    started = time.perf_counter()
    seen: list[CompressionEvent] = []

    def on_event(event: CompressionEvent) -> None:
        seen.append(event)
        used = f"{event.answers_used} of {event.llm_calls} answers used" if event.llm_calls else ""
        progress(f"  {label}: compression {len(seen)} at turn {event.turn} {used}")

    try:
        series = await replay_series(host, SESSION, split_turns(messages), on_event=on_event)
        out.events = series.compressions
        record = await plugin.show(SESSION)
        out.summary = record.text if record is not None else ""
        _, prompt, _, _ = await host.build_prompt(SESSION, dry_run=True)
        out.kept_text = prompt_text(prompt)
        active = [m for m in await host.memory.get_history(SESSION) if not m.is_marker]
        out.kept = {(m.seq or 0) - 1 for m in active if m.seq is not None}
    finally:
        host.bus.disconnect(signals.SESSION_COMPRESSING, on_status)
        await host.stop()
    out.seconds = time.perf_counter() - started
    return out


def _sample(lines: list[str], chars: int = 100) -> str:
    """The first of ``lines``, on one line and cut to ``chars``; ``-`` when there is none."""
    if not lines:
        return "-"
    line = " ".join(lines[0].split())
    return line if len(line) <= chars else line[: chars - 1] + "…"


def row(data: str, r: Replay, facts: str) -> list[Any]:
    n = len(r.events)
    calls = sum(e.llm_calls for e in r.events)
    lat = r.latencies
    return [
        data,
        r.label,
        n,
        f"{r.used} ({r.used / n:.0%})" if n and calls else "-",
        f"{r.clean} ({r.clean / n:.0%})" if n and calls else "-",
        f"{sum(e.answers_used for e in r.events)} of {calls}" if calls else "-",
        len(r.debris),
        round(percentile(lat, 50), 2) if lat else "-",
        round(percentile(lat, 99), 2) if lat else "-",
        facts,
        round(r.seconds, 1),
    ]


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--api-base", required=True, help="the OpenAI-compatible server's URL")
    p.add_argument("--model", required=True, help="litellm model string, e.g. openai/NAME")
    p.add_argument("--api-key", default=None, help="key for the server (default: none needed)")
    p.add_argument("--messages", type=int, default=200, help="LoCoMo messages replayed")
    p.add_argument("--demo-turns", type=int, default=300, help="turns of the demo conversation")
    p.add_argument("--locomo-window", type=int, default=BUDGET, help="host window for LoCoMo")
    p.add_argument("--demo-window", type=int, default=None, help="host window for the demo")
    p.add_argument("--timeout", type=float, default=None, help="summary_timeout_s")
    p.add_argument(
        "--model-window",
        type=int,
        default=None,
        help="the server's context window, for a server that does not report it "
        '([host.models."MODEL"] context_window)',
    )
    args = p.parse_args()
    locomo_path = require_data(args.data, "locomo/locomo_dev.json")
    if args.quick:
        args.messages = min(args.messages, 40)
        args.demo_turns = min(args.demo_turns, 40)
        args.locomo_window = min(args.locomo_window, 900)
        args.demo_window = args.demo_window or 2500
    out = out_dir(args.out)
    v = versions()
    print_versions(v)
    started = time.perf_counter()
    conv = load_locomo(locomo_path)[0]
    locomo = Conversation(conv.name, conv.messages[: args.messages], conv.qa, conv.turn_index)
    early = Conversation(conv.name, conv.messages[: args.messages // 2], conv.qa, conv.turn_index)
    demo = [Message.model_validate(m) for m in generate_conversation(turns=args.demo_turns)]
    locomo_base = {"host": {"system_prompt": SYSTEM_PROMPT, "reserve_for_reply": 0}}
    demo_base = tomllib.loads(DEMO_CONFIG)

    locomo_label = f"LoCoMo, {len(locomo.messages)} messages"
    runs: dict[str, list[Replay]] = {}
    scores: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-model-") as tmp:
        for data, base, window, messages in (
            (locomo_label, locomo_base, args.locomo_window, locomo.messages),
            (f"demo, {args.demo_turns} turns", demo_base, args.demo_window, demo),
        ):
            runs[data] = []
            for with_model in (True, False):
                label = args.model if with_model else "rules engine (offline)"
                progress(f"{data}: {label}")
                db = Path(tmp) / f"{len(runs)}-{with_model}.db"
                config = host_config(base, args, model=with_model, window=window, db=db)
                runs[data].append(await replay(label, config, messages))

    table = Table(
        "Compressions with the summarizer model and with the rules engine (used = the model's "
        "answer was merged into the summary; all used = no fallback in the compression)",
        [
            "data",
            "summarizer",
            "compressions",
            "model's answer used",
            "all answers used",
            "answers used / calls",
            "debris lines stored",
            "latency p50 s",
            "latency p99 s",
            "early facts kept",
            "replay s",
        ],
    )
    lines_table = Table(
        "The model's lines: kept in the records, and its items left out as ungrounded (not "
        "found in the batch they digest, the previous summary or the pinned facts)",
        [
            "data",
            "summarizer",
            "model lines kept",
            "left out as ungrounded",
            "left out otherwise",
            "a line kept",
            "an item left out as ungrounded",
        ],
    )
    extra: dict[str, Any] = {"runs": {}}
    for data, replays in runs.items():
        for r in replays:
            if data.startswith("LoCoMo"):
                qa = score_locomo(early, r.kept_text, r.kept)
                scores[id(r)] = mean([s.evidence_recall for s in qa])
                facts = f"{scores[id(r)]:.0%} evidence words ({len(qa)} early QAs)"
            else:
                kept = [label for label, value in EARLY_FACTS.items() if value in r.summary]
                facts = f"{len(kept)} of {len(EARLY_FACTS)}"
            table.add(*row(data, r, facts))
            extra["runs"][f"{data}: {r.label}"] = {
                "compressions": len(r.events),
                "model_answer_used": r.used,
                "all_answers_used": r.clean,
                "summarizer_calls": sum(e.llm_calls for e in r.events),
                "answers_used": sum(e.answers_used for e in r.events),
                "latencies_s": r.latencies,
                "summarizer_window": r.window,
                "debris": r.debris,
                "early_facts": facts,
                "reasons": [e.reason for e in r.events if e.fallback],
                "model_lines_kept": len(r.model_lines),
                "model_lines_sample": r.model_lines[:SAMPLES],
                "left_out": dict(r.left_out),
                "ungrounded_left_out": r.left_out["ungrounded"],
                "ungrounded_sample": r.ungrounded[:SAMPLES],
                "final_summary": r.summary,
            }
            if any(e.llm_calls for e in r.events):
                left = r.left_out
                lines_table.add(
                    data,
                    r.label,
                    len(r.model_lines),
                    left["ungrounded"],
                    sum(left.values()) - left["ungrounded"],
                    _sample(r.model_lines),
                    _sample(r.ungrounded),
                )
    counter = TokenCounter()
    w_context, w_kept = window_final_context(locomo, counter, args.locomo_window)
    window_qa = score_locomo(early, w_context, w_kept)
    table.add(
        locomo_label,
        f"sliding window of {args.locomo_window:,} tokens",
        *["-"] * 7,
        f"{mean([s.evidence_recall for s in window_qa]):.0%} evidence words "
        f"({len(window_qa)} early QAs)",
        "-",
    )
    reasons = Table(
        "Why compressions fell back, by kind (a compression counts once per kind)",
        ["data", "kind", "compressions", "first reason of the kind"],
    )
    for data, replays in runs.items():
        for kind, count, example in fallback_kinds(
            e.reason for e in replays[0].events if e.fallback
        ):
            reasons.add(data, kind, count, example)
    if not reasons.rows:
        reasons.add("all", "(none)", 0, "no compression fell back")
    model_rows = [r for replays in runs.values() for r in replays[:1]]
    write_results(
        "model_replay",
        "Summaries by a model behind an OpenAI-compatible URL",
        [table, reasons, lines_table],
        out=out,
        versions_used=v,
        settings={
            "model": args.model,
            "api_base": args.api_base,
            "LoCoMo messages": len(locomo.messages),
            "LoCoMo window": args.locomo_window,
            "demo turns": args.demo_turns,
            "demo window": args.demo_window or tomllib.loads(DEMO_CONFIG)["host"]["context_window"],
            "summarizer window": model_rows[0].window,
            "summary_timeout_s": args.timeout or "plugin default",
        },
        runtime_s=time.perf_counter() - started,
        notes=[
            "Debris lines: lines of a stored summary (read after every compression) that are "
            "JSON rather than text, found by a pattern of the bench's own.",
            "Model lines kept: the model's digest sentences found in any record stored after a "
            "compression (each passed the grounding check); left out as ungrounded: items of its "
            "answers not found in what they digest (a name, number, date or code absent, two "
            "names no sentence gives together, or too few of their words), counted from the "
            "runs' reasons; left out otherwise: meta-talk, answers that say nothing, JSON "
            "fragments, invented identifiers.",
            "LoCoMo early facts: evidence words of the QAs whose evidence lies in the first half "
            "of the replayed messages, present in the kept text (summary block + active "
            "messages) after the last turn.",
        ],
        extra=extra,
    )


if __name__ == "__main__":
    run(main)
