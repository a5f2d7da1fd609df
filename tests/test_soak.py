"""Fault-injection soak: many sessions at once through one host on SQLite, with a summarizer that
fails most of the time (``tests/faults.py``), checking the design's invariants after every turn.

The summarizer (:func:`faults.faulty_llm`) raises a provider error on 30% of calls, times out on
10% (half at once, half hanging until the call's timeout), answers garbage on 10% and a cut-off
(``finish_reason="length"``) answer on 5%; a few more answers are empty, of the wrong JSON types or
far over budget, and 10% arrive late. Small thresholds and a small context window make the turn
trigger and both watermarks fire often; some turns call tools (up to three calls in parallel,
sometimes two rounds); some turns also ask for a compression (``session:compress``, manual / auto /
hard).

Asserted: no turn fails (outcome never ``error``), no message is lost, no tool message is orphaned
(:class:`invariants.InvariantChecker` after every turn, incrementally, and the host never had to
leave an unpaired tool message out of a prompt), every compression request is answered by exactly
one final ``session:compressing`` status after its ``start``, and after ``host.stop()`` the file,
opened again, holds every message appended, in order, and every summary record holds nothing of
a failed answer or an error text and fits its token budget.

Size: 20 sessions x 50 turns with a fixed seed in CI; 200 x 100 with ``--soak-full`` or
``MEMORY_SUMMARY_SOAK=full``. ``-s`` prints the counts.

Also here: the same fault plan served by the fake OpenAI-compatible server to the real litellm
path; summarizers that ignore their timeout (the plugin's own guard must end the call, a hard
compression must keep its deadline); and a hard compression while a background run of the same
session is queued behind the concurrency cap (what made the full-size soak slow).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAIServer
from faults import LEAK_MARKERS, FaultPlan, faulty_llm, openai_replies
from invariants import InvariantChecker, check_sent

from host_stub import signals
from host_stub.config import HostConfig
from host_stub.host import Host
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message, ToolCall, ToolCallFunction
from host_stub.services import SUMMARY_NAMESPACE
from host_stub.testing import FakeLLM, simple_count

FINAL = ("done", "error", "skipped")
SEED = 20261129

#: The issue's rates (30% errors, 10% timeouts, 10% garbage, 5% truncation), plus a few empty,
#: wrongly typed and oversized answers, and 10% late (but valid) answers.
SOAK_PLAN = FaultPlan(
    error=0.30,
    timeout=0.05,
    hang=0.05,
    garbage=0.10,
    length=0.05,
    empty=0.02,
    wrong_types=0.02,
    oversized=0.01,
    slow=0.10,
    seed=SEED,
)

SOAK_PLUGIN = {
    "threshold": 10,
    "keep_recent": 4,
    "debounce_turns": 1,
    "cooldown_s": 0,
    "summary_timeout_s": 0.05,
    "hard_deadline_s": 1.0,
    "max_concurrent_summaries": 8,
    "shutdown_grace_s": 120,
    # A small summary budget (the 512-token floor): every merge has to fit it.
    "summary_token_ratio": 0.05,
}
SOAK_HOST = {"context_window": 4000, "reserve_for_reply": 256}


@dataclass
class SoakSize:
    sessions: int
    turns: int


CI_SIZE = SoakSize(sessions=20, turns=50)
FULL_SIZE = SoakSize(sessions=200, turns=100)


def soak_size(config: pytest.Config) -> SoakSize:
    full = config.getoption("--soak-full") or os.environ.get("MEMORY_SUMMARY_SOAK") == "full"
    return FULL_SIZE if full else CI_SIZE


class _LogCounter(logging.Handler):
    """Counts what the host and the plugin log: errors (a swallowed failure) and the host's
    warning that it left unpaired tool messages out of a prompt (an orphan in the store)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors: list[str] = []
        self.unpaired: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= logging.ERROR:
            self.errors.append(f"{record.name}: {message}\n{record.exc_text or ''}")
        elif "unpaired tool messages" in message:
            self.unpaired.append(message)


@dataclass
class Soak:
    host: Host
    llm: FakeLLM
    path: Path
    statuses: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    checkers: dict[str, InvariantChecker] = field(default_factory=dict)
    appended: dict[str, list[tuple[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    counts: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def plugin(self) -> Any:
        return self.host.get_plugin("memory-summary")


def make_soak(path: Path, llm: FakeLLM, plugin: dict[str, Any] | None = None) -> Soak:
    memory = SQLiteMemory(path, token_counter=lambda m: llm.count_tokens([m]))
    config = HostConfig.model_validate(
        {
            "plugins": {"allow": ["memory-summary"]},
            "host": SOAK_HOST,
            "plugin": {"memory-summary": plugin or SOAK_PLUGIN},
        }
    )
    host = Host(config, memory=memory, llm=llm)
    soak = Soak(host=host, llm=llm, path=path)

    async def on_compressing(sender: Any, **payload: Any) -> None:
        soak.statuses.append(payload)

    async def on_compress(sender: Any, **payload: Any) -> None:
        soak.requests.append(payload)

    host.bus.connect(signals.SESSION_COMPRESSING, on_compressing)
    host.bus.connect(signals.SESSION_COMPRESS, on_compress)
    return soak


# -- what the sessions say ------------------------------------------------------------------------

_WORDS = "order refund seat baggage invoice flight hotel transfer upgrade receipt".split()


def _text(rng: random.Random, tag: str, low: int, high: int) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))
    return f"{tag} {words}"


def _tool_round(rng: random.Random, tag: str, round_no: int) -> tuple[Message, list[Message]]:
    """An assistant message with 1-3 parallel tool calls and their results (in any order)."""
    n = rng.choice([1, 1, 2, 3])
    calls = [
        ToolCall(
            id=f"call_{tag}_{round_no}_{k}",
            function=ToolCallFunction(
                name=rng.choice(["lookup_order", "get_flight", "search_hotel"]),
                arguments=json.dumps({"id": f"ORD{rng.randint(100, 999)}X", "k": k}),
            ),
        )
        for k in range(n)
    ]
    results = []
    for call in calls:
        big = rng.random() < 0.05  # now and then a huge tool result pushes the watermarks
        body = {"ok": rng.random() > 0.1, "data": "d" * (rng.randint(3000, 6000) if big else 40)}
        results.append(
            Message(
                role="tool",
                tool_call_id=call.id,
                name=call.function.name,
                content=json.dumps(body),
            )
        )
    rng.shuffle(results)
    assistant = Message(
        role="assistant",
        content=_text(rng, f"{tag} checking", 0, 6) if rng.random() < 0.3 else None,
        tool_calls=calls,
    )
    return assistant, results


def script_turn(rng: random.Random, session: int, n: int) -> tuple[list[Message], list[Message]]:
    """One turn's inputs and recorded replies."""
    tag = f"[S{session}T{n}]"
    inputs = [Message(role="user", content=_text(rng, tag, 3, 60))]
    recorded: list[Message] = []
    kind = rng.random()
    if kind < 0.03:
        return inputs, []  # no reply at all: a silent turn
    if kind < 0.38:
        rounds = 2 if kind < 0.10 else 1
        for r in range(rounds):
            call, results = _tool_round(rng, tag, r)
            recorded += [call, *results]
    recorded.append(Message(role="assistant", content=_text(rng, f"{tag} reply", 2, 80)))
    return inputs, recorded


async def run_session(soak: Soak, index: int, turns: int, seed: int) -> None:
    rng = random.Random(f"{seed}:{index}")
    session_id = f"soak-{index:03d}"
    checker = soak.checkers[session_id] = InvariantChecker(soak.host.memory, session_id)
    for n in range(turns):
        inputs, recorded = script_turn(rng, index, n)
        result = await soak.host.run_turn(session_id, inputs, recorded=recorded)
        soak.outcomes[result.outcome] += 1
        assert result.outcome != "error" and result.error is None, (
            f"{session_id} turn {n}: {result.outcome} {result.error}"
        )
        assert len(result.messages) == len(inputs) + len(recorded), f"{session_id} turn {n}"
        soak.appended[session_id] += [(m.role, m.content) for m in result.messages]
        check_sent(result.sent, where=f"{session_id} turn {n}")
        await checker.check(result.messages)
        soak.counts["turns"] += 1
        soak.counts["messages"] += len(result.messages)
        soak.counts["tool_groups"] += sum(1 for m in recorded if m.tool_calls)
        soak.counts["parallel_groups"] += sum(
            1 for m in recorded if m.tool_calls and len(m.tool_calls) > 1
        )
        roll = rng.random()
        if roll < 0.06:
            reason = rng.choice(["manual", "auto", "hard"])
            await soak.host.request_compression(session_id, reason)
            soak.counts[f"asked_{reason}"] += 1
        elif roll < 0.08:
            final = await soak.plugin.compress(session_id)  # awaited, like the API does
            assert final["status"] in FINAL, final
            soak.counts["asked_awaited"] += 1
        if rng.random() < 0.3:
            await asyncio.sleep(0)  # let background compressions interleave differently


def assert_every_request_answered(soak: Soak) -> Counter[str]:
    """Every request id that got ``start`` got exactly one final status, after it; every
    ``session:compress`` request got its ``start``. Returns the finals by status."""
    by_id: dict[str, list[str]] = defaultdict(list)
    for s in soak.statuses:
        by_id[s["request_id"]].append(s["status"])
    problems = []
    for request_id, seen in by_id.items():
        finals = [x for x in seen if x in FINAL]
        if seen[0] != "start" or seen.count("start") != 1 or len(finals) != 1 or len(seen) != 2:
            problems.append(f"{request_id}: {seen}")
    for r in soak.requests:
        if r["request_id"] not in by_id:
            problems.append(f"{r['request_id']} ({r['reason']}): no status at all")
    assert not problems, f"{len(problems)} requests badly answered: {problems[:5]}"
    return Counter(s["status"] for s in soak.statuses if s["status"] in FINAL)


async def final_check(soak: Soak) -> dict[str, int]:
    """After ``host.stop()``: the file opened again; per session the running checker (same state,
    new connection) and a fresh one pass, and the stored messages, markers left out, are exactly
    the appended ones in order."""
    reopened = SQLiteMemory(soak.path, token_counter=lambda m: 1)
    found = Counter[str]()
    try:
        sessions = {s.session_id: s for s in await reopened.list_sessions()}
        assert set(sessions) == set(soak.checkers)
        for session_id, checker in soak.checkers.items():
            checker.memory = reopened
            await checker.check()
            await InvariantChecker(reopened, session_id).check()
            active = await reopened.get_history(session_id)
            archived = await reopened.get_archived(session_id)
            stored = sorted([*active, *archived], key=lambda m: m.seq or 0)
            assert [m.seq for m in stored] == list(range(1, sessions[session_id].last_seq + 1))
            real = [(m.role, m.content) for m in stored if not m.is_marker]
            assert real == soak.appended[session_id], f"{session_id}: messages lost or changed"
            found["messages"] += len(real)
            found["active"] += sum(1 for m in active if not m.is_marker)
            for m in archived:
                if not m.is_marker:
                    found[f"archived_{m.archived}"] += 1
            assert {m.archived for m in archived} <= {"summarized", "window", "fallback-trim"}
            entry = await reopened.get_metadata(SUMMARY_NAMESPACE, session_id)
            if entry is not None and entry.value is not None:
                found["records"] += 1
                assert_clean_record(session_id, entry.value)
    finally:
        await reopened.close()
    return dict(found)


#: Failed answers and error texts (and the plugin's own error reasons): never in a record.
FORBIDDEN_IN_RECORDS = (*LEAK_MARKERS, "timed out", "Timeout")
#: The summary budget of the soak's config: max(512, (4000 - fixed) x 0.05), under every cap.
SOAK_BUDGET = 512


def assert_clean_record(session_id: str, record: dict[str, Any]) -> None:
    """A stored summary holds nothing of a failed answer or an error, and fits its budget even
    when the summarizer answered far over it."""
    stored = json.dumps(record, ensure_ascii=False)
    leaked = [f for f in FORBIDDEN_IN_RECORDS if f in stored]
    assert not leaked, f"{session_id}: the summary record holds {leaked}: {stored[:300]}"
    tokens = simple_count(record.get("text") or "")
    assert tokens <= SOAK_BUDGET, (
        f"{session_id}: a summary of {tokens} tokens (budget {SOAK_BUDGET})"
    )


@pytest.mark.slow
@pytest.mark.soak
async def test_soak_with_a_failing_summarizer(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    size = soak_size(request.config)
    llm = faulty_llm(SOAK_PLAN)
    soak = make_soak(tmp_path / "soak.db", llm)
    logs = _LogCounter()
    watched = [logging.getLogger(n) for n in ("host_stub", "plugin_memory_summary")]
    for logger in watched:
        logger.addHandler(logs)
    started = time.monotonic()
    try:
        async with soak.host:
            await asyncio.gather(
                *(run_session(soak, i, size.turns, SEED) for i in range(size.sessions))
            )
            turns_done = time.monotonic() - started
    finally:
        for logger in watched:
            logger.removeHandler(logs)
    elapsed = time.monotonic() - started
    found = await final_check(soak)
    finals = assert_every_request_answered(soak)

    statuses = [s for s in soak.statuses if s["status"] in FINAL]
    fallbacks = Counter(s["stats"].get("fallback") for s in statuses if s["stats"].get("fallback"))
    triggers = Counter(s["reason"] for s in soak.statuses if s["status"] == "start")
    checks = sum(c.checks for c in soak.checkers.values())
    asked = {k: v for k, v in soak.counts.items() if k.startswith("asked")}
    print(
        f"\nsoak {size.sessions} sessions x {size.turns} turns ({SOAK_PLAN.describe()}): "
        f"{elapsed:.1f}s ({turns_done:.1f}s of turns)\n"
        f"  turns {soak.counts['turns']} {dict(soak.outcomes)}, messages {soak.counts['messages']}, "
        f"tool groups {soak.counts['tool_groups']} ({soak.counts['parallel_groups']} parallel)\n"
        f"  compressions: requests {sum(triggers.values())} {dict(triggers)}; "
        f"done {finals['done']}, error {finals['error']}, skipped {finals['skipped']}; "
        f"fallbacks {dict(fallbacks)}\n"
        f"  asked by the test: {asked}\n"
        f"  summarizer calls {len(llm.calls)}: {dict(llm.counts)}\n"
        f"  stored {found}\n"
        f"  invariant checks {checks}, archived messages read {sum(c.archived_read for c in soak.checkers.values())}"
    )

    assert soak.counts["turns"] == size.sessions * size.turns
    assert soak.outcomes["error"] == 0 and soak.outcomes["aborted"] == 0, soak.outcomes
    assert not logs.unpaired, logs.unpaired[:3]
    assert not logs.errors, logs.errors[:3]
    assert found["messages"] == soak.counts["messages"]
    # The faults were really served, and compressions happened in spite of them.
    for kind in ("error", "timeout", "hang", "garbage", "length", "slow"):
        assert llm.counts[kind] > 0, (kind, llm.counts)
    assert finals["done"] >= size.sessions and finals["error"] > 0, finals
    assert fallbacks["rules"] > 0
    assert triggers["turn"] > 0 and triggers["manual"] > 0 and triggers["hard"] > 0, triggers
    assert found.get("archived_summarized", 0) > found["active"], found
    assert llm.in_flight == 0


# -- summarizers that ignore their timeout ----------------------------------------------------------


async def test_a_summarizer_that_ignores_its_timeout_is_cut_by_the_plugins_guard(
    tmp_path: Path,
) -> None:
    """A hang that ignores the ``timeout`` argument (a client without one) is cancelled by the
    plugin's own guard; the rules engine merges instead and the status says why."""
    llm = faulty_llm(FaultPlan(seed=1), deaf_hangs=True)
    soak = make_soak(
        tmp_path / "deaf.db",
        llm,
        {**SOAK_PLUGIN, "threshold": 1000, "summary_timeout_s": 0.05},
    )
    async with soak.host:
        for n in range(8):
            inputs, recorded = script_turn(random.Random(n), 0, n)
            await soak.host.run_turn("s", inputs, recorded=recorded)
        llm.force("hang")
        final = await soak.plugin.compress("s")
    # The deaf hang ends only when cancelled: the guard did it (no wall-clock budget needed).
    assert llm.outcomes[("hang", "cancelled")] == 1
    assert final["status"] == "error" and "timed out" in final["reason"], final
    assert final["stats"]["fallback"] == "rules"


async def test_a_hard_compression_meets_its_deadline_with_a_summarizer_that_ignores_timeouts(
    tmp_path: Path,
) -> None:
    """A hard compression blocks the turn at most ``hard_deadline_s`` (past it the rules engine
    finishes), even when the summarizer does not honour the timeout it is given."""
    llm = faulty_llm(FaultPlan(seed=2), deaf_hangs=True)
    deadline = 0.3
    soak = make_soak(
        tmp_path / "deaf-hard.db",
        llm,
        {**SOAK_PLUGIN, "threshold": 1000, "summary_timeout_s": 30, "hard_deadline_s": deadline},
    )
    async with soak.host:
        try:
            for n in range(8):
                inputs, recorded = script_turn(random.Random(n), 0, n)
                await soak.host.run_turn("s", inputs, recorded=recorded)
            llm.force("hang")
            final = await soak.plugin.request("s", "hard", deadline_s=deadline)
            # The summarizer never answered (a deaf hang ends only when fired or cancelled): the
            # request returned because its deadline passed, however slow the machine.
            unanswered = len(llm.hanging) + llm.outcomes[("hang", "cancelled")]
        finally:
            llm.fire_hangs()
    assert final["status"] in ("done", "error"), final
    assert unanswered >= 1 and llm.outcomes[("hang", "answered")] == 0


# -- found by the full-size soak --------------------------------------------------------------------


async def test_a_hard_compression_bypasses_the_concurrency_cap_when_a_queued_run_exists(
    tmp_path: Path,
) -> None:
    """Session ``x`` holds the only summarizer slot (its reply is late); session ``y`` has a
    background compression queued behind it. A turn of ``y`` over the hard watermark must still
    compress before its model call (hard requests bypass the cap), not wait for the queue."""
    llm = faulty_llm(FaultPlan(seed=3), hold_slow=True)
    soak = make_soak(
        tmp_path / "cap.db",
        llm,
        {
            **SOAK_PLUGIN,
            "threshold": 1000,
            "keep_recent": 2,
            "summary_timeout_s": 20,
            "hard_deadline_s": 0.3,
            "auto_compress_threshold": 0,
            "max_concurrent_summaries": 1,
            # y's history is sized against the window without tool definitions
            "recall_tokens": 0,
        },
    )
    async with soak.host as host:
        try:
            for n in range(10):  # x: a little history; y: ~84% of the window
                await host.run_turn(
                    "x", f"x {n}", recorded=[Message(role="assistant", content="ok")]
                )
                await host.run_turn(
                    "y",
                    f"y {n} " + "lorem " * 200,
                    recorded=[Message(role="assistant", content="ok")],
                )
            llm.force("slow")
            await host.request_compression("x", "manual")  # takes the only slot, answers late
            while not llm.waiting_slow:
                await asyncio.sleep(0.001)
            await host.request_compression("y", "manual")  # queued behind the cap
            await asyncio.sleep(0.01)
            assert set(soak.plugin.scheduler.running) == {"x", "y"}
            result = await host.run_turn(
                "y", "big " * 400, recorded=[Message(role="assistant", content="ok")]
            )
            first = result.usage[0].usage_ratio
            sent = result.usage[-1].usage_ratio
        finally:
            llm.resolve_slow()
    assert first >= 0.9  # the hard watermark fired before the call
    hard_ids = {s["request_id"] for s in soak.statuses if s["reason"] == "hard"}
    hard = [(s["status"], s["reason"]) for s in soak.statuses if s["request_id"] in hard_ids]
    assert sent < 0.9, f"a prompt of {sent:.2f} x the window was sent; hard statuses: {hard}"


# -- the same faults through the real litellm path ---------------------------------------------------


async def test_litellm_path_with_faults_at_high_rates(
    tmp_path: Path, fake_openai: FakeOpenAIServer
) -> None:
    """The fault plan served by the fake OpenAI-compatible server at high rates; the summarizer
    goes through ``LiteLLMService`` and litellm's HTTP client. Few turns, small timeouts."""
    from host_stub.llm import LiteLLMService, ensure_litellm

    ensure_litellm()
    timeout = 0.5
    plan = FaultPlan(
        error=0.2,
        timeout=0.08,
        hang=0.04,
        empty=0.08,
        garbage=0.12,
        wrong_types=0.12,
        oversized=0.08,
        length=0.12,
        seed=SEED,
    )
    replies = openai_replies(plan, timeout_s=timeout)
    fake_openai.default_reply = replies
    model = "openai/fake-model"
    llm = LiteLLMService(
        default_model=model,
        api_base=fake_openai.base_url,
        api_key="sk-test",
        model_overrides={model: {"context_window": 8000, "max_output_tokens": 2000}},
    )
    memory = SQLiteMemory(
        tmp_path / "litellm.db", token_counter=lambda m: len(str(m.content)) // 4 + 4
    )
    config = HostConfig.model_validate(
        {
            "plugins": {"allow": ["memory-summary"]},
            "host": {"context_window": 8000, "reserve_for_reply": 256},
            "plugin": {
                "memory-summary": {
                    **SOAK_PLUGIN,
                    "threshold": 1000,
                    "keep_recent": 2,
                    "summary_timeout_s": timeout,
                    "auto_compress_threshold": 0,
                    "hard_compress_threshold": 0,
                }
            },
        }
    )
    host = Host(config, memory=memory, llm=llm)
    statuses: list[dict[str, Any]] = []

    async def on_compressing(sender: Any, **payload: Any) -> None:
        statuses.append(payload)

    host.bus.connect(signals.SESSION_COMPRESSING, on_compressing)
    checker = InvariantChecker(memory, "s")
    finals: list[dict[str, Any]] = []
    appended: list[tuple[str, Any]] = []
    rng = random.Random(SEED)
    async with host:
        for n in range(24):
            inputs, recorded = script_turn(rng, 0, n)
            result = await host.run_turn("s", inputs, recorded=recorded)
            assert result.outcome != "error" and result.error is None, result.error
            appended += [(m.role, m.content) for m in result.messages]
            check_sent(result.sent)
            await checker.check(result.messages)
            final = await host.get_plugin("memory-summary").compress("s")
            assert final["status"] in FINAL, final
            finals.append(final)
            await checker.check()
    served = replies.sampler.counts  # type: ignore[attr-defined]
    assert sum(served.values()) == len(fake_openai.requests) >= 20
    assert served["ok"] > 0 and sum(v for k, v in served.items() if k != "ok") >= 10, served
    errors = [f for f in finals if f["status"] == "error"]
    done = [f for f in finals if f["status"] == "done"]
    assert errors and done, Counter(f["status"] for f in finals)
    assert all(f["stats"]["fallback"] == "rules" for f in errors if "stats" in f and f["stats"])
    # Nothing of a bad answer was stored.
    record = await _record(tmp_path / "litellm.db")
    stored = json.dumps(record)
    for forbidden in (*LEAK_MARKERS, "word8000", "ID000500"):
        assert forbidden not in stored, forbidden
    reopened = SQLiteMemory(tmp_path / "litellm.db", token_counter=lambda m: 1)
    try:
        await InvariantChecker(reopened, "s").check()
        everything = sorted(
            [*await reopened.get_history("s"), *await reopened.get_archived("s")],
            key=lambda m: m.seq or 0,
        )
        assert [(m.role, m.content) for m in everything if not m.is_marker] == appended
    finally:
        await reopened.close()
    by_id = Counter(s["request_id"] for s in statuses if s["status"] in FINAL)
    assert set(by_id.values()) == {1} and len(by_id) == len(finals)


async def _record(path: Path) -> dict[str, Any] | None:
    memory = SQLiteMemory(path, token_counter=lambda m: 1)
    try:
        entry = await memory.get_metadata(SUMMARY_NAMESPACE, "s")
        return entry.value if entry is not None else None
    finally:
        await memory.close()
