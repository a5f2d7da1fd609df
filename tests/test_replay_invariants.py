"""Replay real conversations through a host with the plugin and check the design's invariants
after every turn (see ``tests/invariants.py``).

Every tau-bench airline dev trajectory (100, with tool calls) and two LoCoMo dev conversations are
replayed (``Host.run_turn(..., recorded=...)``: the recorded assistant and tool messages stand in
for the model) on the SQLite backend, with a config that compresses often: a low ``threshold``, a
small ``keep_recent``, no debounce, and a host context window of 4000 tokens so the soft and hard
watermarks fire too. Two summarizers:

* none configured (``FakeLLM(default_model=None)``): the offline rules engine;
* a 50 ms LLM returning valid JSON built from the request, while turns keep arriving without
  waiting for it (compressions run in the background, several sessions at once).

After ``host.stop()`` (which drains the background work) the file is opened again and checked
once more: every replayed message is still there, in order, active or archived for a reason the
invariants allow.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from datasets import require
from invariants import InvariantChecker, InvariantError, check_sent, tool_pairing_problems

from host_stub import signals
from host_stub.config import HostConfig
from host_stub.datasets import Conversation, load_locomo, load_tau_bench
from host_stub.host import Host
from host_stub.memory.inmemory import InMemoryMemory
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message, ToolCall, ToolCallFunction, text_of
from host_stub.services import SUMMARY_NAMESPACE
from host_stub.testing import FakeLLM
from host_stub.transcripts import split_turns

TAU_PLUGIN = {"threshold": 12, "keep_recent": 6, "debounce_turns": 1}
LOCOMO_PLUGIN = {"threshold": 30, "keep_recent": 10, "debounce_turns": 1}
CONTEXT_WINDOW = 4000
FINAL = ("done", "error", "skipped")


# -- the rig ------------------------------------------------------------------------------------


@dataclass
class Rig:
    host: Host
    llm: FakeLLM
    path: Path
    statuses: list[dict[str, Any]] = field(default_factory=list)
    #: ``agent:turn:after`` and ``session:compressing`` in the order the bus delivered them.
    events: list[tuple[str, str, str]] = field(default_factory=list)
    checkers: dict[str, InvariantChecker] = field(default_factory=dict)
    turns: int = 0
    prompts: int = 0

    @property
    def plugin(self) -> Any:
        return self.host.get_plugin("memory-summary")

    def finals(self, status: str | None = None) -> list[dict[str, Any]]:
        return [
            s
            for s in self.statuses
            if s["status"] in FINAL and (status is None or s["status"] == status)
        ]

    def turns_during_compressions(self) -> int:
        """Turns that ended while a compression of their session was running (started, no final
        status yet): proof that turns do not wait for the summarizer."""
        running: dict[str, set[str]] = defaultdict(set)
        overlapping = 0
        for kind, session_id, value in self.events:
            if kind == "turn":
                overlapping += bool(running[session_id])
            elif value == "start":
                running[session_id].add(kind)
            else:
                running[session_id].discard(kind)
        return overlapping

    def start_reasons(self) -> Counter[str]:
        return Counter(s["reason"] for s in self.statuses if s["status"] == "start")


def make_rig(tmp_path: Path, llm: FakeLLM, plugin: dict[str, Any], name: str = "replay.db") -> Rig:
    path = tmp_path / name
    memory = SQLiteMemory(path, token_counter=lambda m: llm.count_tokens([m]))
    config = HostConfig.model_validate(
        {
            "plugins": {"allow": ["memory-summary"]},
            "host": {"context_window": CONTEXT_WINDOW},
            "plugin": {"memory-summary": plugin},
        }
    )
    host = Host(config, memory=memory, llm=llm)
    rig = Rig(host=host, llm=llm, path=path)

    async def on_compressing(sender: Any, **payload: Any) -> None:
        rig.statuses.append(payload)
        status = "start" if payload["status"] == "start" else "final"
        rig.events.append((payload["request_id"], payload["session_id"], status))

    async def on_turn(sender: Any, **payload: Any) -> None:
        rig.events.append(("turn", payload["session_id"], payload["outcome"]))

    host.bus.connect(signals.SESSION_COMPRESSING, on_compressing)
    host.bus.connect(signals.AGENT_TURN_AFTER, on_turn)
    return rig


async def replay(rig: Rig, conversation: Conversation, session_id: str) -> None:
    """Replay one conversation turn by turn, checking the invariants after each turn and what
    the host sent before each recorded reply."""
    checker = rig.checkers[session_id] = InvariantChecker(rig.host.memory, session_id)
    for n, (inputs, recorded) in enumerate(split_turns(conversation.messages)):
        result = await rig.host.run_turn(session_id, inputs, recorded=recorded)
        assert result.error is None and result.outcome in ("replied", "silent"), (
            f"{session_id} turn {n}: {result.outcome} {result.error}"
        )
        assert len(result.messages) == len(inputs) + len(recorded)
        check_sent(result.sent, where=f"{session_id} turn {n}")
        rig.prompts += len(result.sent)
        rig.turns += 1
        await checker.check(result.messages)


async def final_check(rig: Rig, conversations: dict[str, Conversation]) -> dict[str, Any]:
    """After ``host.stop()``: open the file again; per session, the incremental checker (same
    state, new connection) and a fresh one both pass, and the stored messages, markers left out,
    are exactly the replayed conversation in order. Returns the records."""
    reopened = SQLiteMemory(rig.path, token_counter=lambda m: 1)
    records: dict[str, Any] = {}
    try:
        sessions = {s.session_id: s for s in await reopened.list_sessions()}
        assert set(sessions) == set(conversations)
        for session_id, conversation in conversations.items():
            checker = rig.checkers[session_id]
            checker.memory = reopened
            await checker.check()
            await InvariantChecker(reopened, session_id).check()
            active = await reopened.get_history(session_id)
            archived = await reopened.get_archived(session_id)
            stored = sorted([*active, *archived], key=lambda m: m.seq or 0)
            info = sessions[session_id]
            assert [m.seq for m in stored] == list(range(1, info.last_seq + 1)), "seq gap"
            real = [m for m in stored if not m.is_marker]
            assert [(m.role, m.content) for m in real] == [
                (m.role, m.content) for m in conversation.messages
            ], f"{session_id}: stored messages differ from the replayed conversation"
            assert {m.archived for m in archived} <= {"summarized", "window", "fallback-trim"}
            entry = await reopened.get_metadata(SUMMARY_NAMESPACE, session_id)
            records[session_id] = entry.value if entry is not None else None
    finally:
        await reopened.close()
    return records


def assert_one_final_per_request(rig: Rig) -> None:
    """Every request id got exactly one final status, after at most one ``start``."""
    by_id: dict[str, list[str]] = defaultdict(list)
    for s in rig.statuses:
        by_id[s["request_id"]].append(s["status"])
    for request_id, seen in by_id.items():
        finals = [x for x in seen if x in FINAL]
        assert len(finals) == 1, f"{request_id}: {seen}"
        assert seen.count("start") <= 1 and (seen[0] == "start" or len(seen) == 1), (
            f"{request_id}: {seen}"
        )


def assert_no_logged_errors(caplog: pytest.LogCaptureFixture) -> None:
    """A failure the bus or the plugin swallowed (so the turn survives) still shows in the log."""
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, "\n".join(
        f"{r.name}: {r.getMessage()}\n{r.exc_text or ''}" for r in errors[:3]
    )


def tau_conversations() -> list[Conversation]:
    return load_tau_bench(require("tau_bench/airline_dev.json"))


def locomo_conversations(n: int = 2) -> list[Conversation]:
    return load_locomo(require("locomo/locomo_dev.json"))[:n]


def json_summarizer(sent: list[dict[str, Any]]) -> str:
    """A summarizer answering valid JSON built from its request: the transcript's line count,
    its last line, and the identifier-looking tokens it contains."""
    user = sent[-1]["content"]
    match = re.search(r"<transcript>\n(.*)\n</transcript>", user, re.S)
    assert match is not None, "the summarizer request has no <transcript> block"
    lines = [line for line in match.group(1).splitlines() if line.strip()]
    identifiers = sorted(
        set(re.findall(r"\b[A-Z0-9]{6}\b|\b[a-z]+_[a-z]+_\d{3,5}\b", match.group(1)))
    )
    return json.dumps(
        {
            "summary": f"{len(lines)} transcript lines; the last: {lines[-1][:120]}",
            "conversation_goal": "replayed conversation",
            "stable_facts": [line[:70] for line in lines[-3:]],
            "decisions": [],
            "identifiers": identifiers[:20],
        }
    )


# -- the checker itself is specific ---------------------------------------------------------------


def _call(cid: str) -> ToolCall:
    return ToolCall(id=cid, function=ToolCallFunction(name="lookup", arguments="{}"))


class Misreporting:
    """A broken store, seen through the public reads: what ``history``, ``archived`` and
    ``entry`` (when set) make of the real store's answers is what the checker is told."""

    def __init__(self, inner: InMemoryMemory) -> None:
        self.inner = inner
        self.history: Callable[[list[Message]], list[Message]] | None = None
        self.archived: Callable[[list[Message]], list[Message]] | None = None
        self.entry: Callable[[Any], Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get_history(self, session_id: str, limit: int | None = None) -> list[Message]:
        got = await self.inner.get_history(session_id, limit)
        return got if self.history is None else self.history(got)

    async def get_archived(
        self, session_id: str, *, epoch: int | None = None, limit: int | None = None
    ) -> list[Message]:
        got = await self.inner.get_archived(session_id, epoch=epoch, limit=limit)
        return got if self.archived is None else self.archived(got)

    async def get_metadata(self, namespace: str, key: str) -> Any:
        got = await self.inner.get_metadata(namespace, key)
        return got if self.entry is None or got is None else self.entry(got)


async def test_checker_catches_each_violation() -> None:
    """The checker is not vacuous: each invariant, broken on purpose, is reported."""
    memory = InMemoryMemory(token_counter=lambda m: 1)
    checker = InvariantChecker(memory, "s")
    stored = await memory.append(
        "s",
        [
            Message(role="system", content="core"),
            Message(role="user", content="u1"),
            Message(role="assistant", tool_calls=[_call("c1")]),
            Message(role="tool", tool_call_id="c1", content="r1"),
            Message(role="assistant", content="a1"),
            Message(role="user", content="u2"),
        ],
    )
    await checker.check(stored)

    # Archived as 'window': allowed. A summary covering through 4 with 1..4 archived: allowed.
    ok = await memory.commit_compression("s", {"epoch": 0, "covered_up_to_seq": 4}, 0, 4, epoch=0)
    assert ok
    await checker.check()

    # Coverage moves forward (allowed), then back (not).
    await memory.save_metadata(SUMMARY_NAMESPACE, "s", {"epoch": 0, "covered_up_to_seq": 5})
    await memory.trim_history("s", up_to_seq=5, reason="summarized")
    await checker.check()
    await memory.save_metadata(SUMMARY_NAMESPACE, "s", {"epoch": 0, "covered_up_to_seq": 4})
    with pytest.raises(InvariantError, match="covered_up_to_seq went back"):
        await checker.check()

    # A fresh store per violation below.
    async def fresh(messages: list[Message]) -> tuple[InMemoryMemory, InvariantChecker]:
        mem = InMemoryMemory(token_counter=lambda m: 1)
        chk = InvariantChecker(mem, "s")
        await chk.check(await mem.append("s", messages))
        return mem, chk

    async def fresh_broken(messages: list[Message]) -> tuple[Misreporting, InvariantChecker]:
        broken = Misreporting(InMemoryMemory(token_counter=lambda m: 1))
        chk = InvariantChecker(broken, "s")
        await chk.check(await broken.append("s", messages))
        return broken, chk

    convo = [
        Message(role="system", content="core"),
        Message(role="user", content="u1"),
        Message(role="assistant", tool_calls=[_call("c1")]),
        Message(role="tool", tool_call_id="c1", content="r1"),
        Message(role="assistant", content="a1"),
        Message(role="user", content="u2"),
    ]
    mem, chk = await fresh(convo)
    await mem.trim_history("s", up_to_seq=3, reason="summarized")  # no record covers it
    with pytest.raises(InvariantError, match="covers only up to seq 0"):
        await chk.check()

    mem, chk = await fresh(convo)
    await mem.trim_history("s", up_to_seq=3, reason="window")  # leaves the result orphaned
    with pytest.raises(InvariantError, match="tool result without its call"):
        await chk.check()

    mem, chk = await fresh(convo)
    await mem.save_metadata(SUMMARY_NAMESPACE, "s", {"epoch": 0, "covered_up_to_seq": 2})
    with pytest.raises(InvariantError, match="still active but the summary covers it"):
        await chk.check()

    mem, chk = await fresh(convo)
    await mem.delete_messages("s", [5])
    with pytest.raises(InvariantError, match="reason 'deleted'"):
        await chk.check()

    broken, chk = await fresh_broken(convo)
    # A store that archives core memory: the system message (seq 1) moved to the archive.
    [system] = [m for m in await broken.get_history("s") if m.seq == 1]
    broken.history = lambda ms: [m for m in ms if m.seq != 1]
    broken.archived = lambda ms: [system.model_copy(update={"archived": "window"}), *ms]
    with pytest.raises(InvariantError, match="system message archived by a compression"):
        await chk.check()

    broken, chk = await fresh_broken(convo)
    broken.history = lambda ms: [m for m in ms if m.seq != 5]  # a store that loses a row
    with pytest.raises(InvariantError, match="seq 5 was active at the last check"):
        await chk.check()

    broken, chk = await fresh_broken(convo)
    await broken.save_metadata(SUMMARY_NAMESPACE, "s", {"epoch": 0, "covered_up_to_seq": 0})
    await chk.check()
    broken.entry = lambda e: e.model_copy(update={"version": 0})
    with pytest.raises(InvariantError, match="version went back"):
        await chk.check()

    mem = InMemoryMemory(token_counter=lambda m: 1)
    chk = InvariantChecker(mem, "s")
    await mem.append("s", convo[:3])  # a call whose result never came
    with pytest.raises(InvariantError, match="call without all its results"):
        await chk.check()

    # Appended messages the test names must be found, unchanged.
    mem, chk = await fresh(convo)
    ghost = Message(role="user", content="never stored", seq=7, epoch=0)
    with pytest.raises(InvariantError, match="appended seq 7"):
        await chk.check([ghost])

    # What the host sends.
    check_sent([[{"role": "user", "content": "hi"}]])
    with pytest.raises(InvariantError, match="tool result without its call"):
        check_sent([[{"role": "tool", "tool_call_id": "x", "content": "r"}]])
    with pytest.raises(InvariantError, match="call without all its results"):
        check_sent([[m.to_openai() for m in convo[1:3]]])
    assert tool_pairing_problems(convo) == []


async def test_checker_reads_the_archive_incrementally(tmp_path: Path) -> None:
    """Per check the checker reads a page near the unresolved seqs, not the whole archive."""
    memory = SQLiteMemory(tmp_path / "inc.db", token_counter=lambda m: 1)
    checker = InvariantChecker(memory, "s")
    whole = 0
    try:
        for i in range(200):
            await checker.check(await memory.append("s", [Message(role="user", content=f"u{i}")]))
            if i % 5 == 4:
                await memory.trim_history("s", keep_recent=2)
            whole += len(await memory.get_archived("s"))
    finally:
        await memory.close()
    assert checker.checks == 200
    assert checker.archived_read < whole / 5, (checker.archived_read, whole)


@pytest.mark.parametrize(
    "backend",
    [
        "memory",
        "sqlite",
    ],
)
async def test_archive_limit_larger_than_the_archive_returns_all_of_it(
    backend: str, tmp_path: Path
) -> None:
    """The checker's incremental archive read asks for the newest ``limit`` archived messages;
    a limit above the archive's size must return the whole archive."""
    if backend == "memory":
        memory: Any = InMemoryMemory(token_counter=lambda m: 1)
    else:
        memory = SQLiteMemory(tmp_path / "limit.db", token_counter=lambda m: 1)
    try:
        await memory.append("s", [Message(role="user", content=f"u{i}") for i in range(15)])
        await memory.trim_history("s", keep_recent=2)  # 13 archived
        assert [m.seq for m in await memory.get_archived("s", limit=16)] == list(range(1, 14))
        assert [m.seq for m in await memory.get_history("s", limit=20)] == [14, 15]
    finally:
        await memory.close()


# -- replays: the rules engine --------------------------------------------------------------------


@pytest.mark.slow
async def test_tau_bench_replays_keep_the_invariants_with_the_rules_engine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conversations = tau_conversations()
    assert len(conversations) == 100
    rig = make_rig(tmp_path, FakeLLM(default_model=None), TAU_PLUGIN)
    by_session = {f"tau-{i:03d}-{c.name}": c for i, c in enumerate(conversations)}
    # CPU time of this process (its worker threads included), not wall time: other processes'
    # load makes the wall clock run on, not this work grow.
    started = time.process_time()
    async with rig.host:
        for session_id, conversation in by_session.items():
            await replay(rig, conversation, session_id)
    elapsed = time.process_time() - started
    records = await final_check(rig, by_session)

    assert rig.turns == sum(len(split_turns(c.messages)) for c in conversations)
    assert rig.llm.calls == []  # no model configured: nothing was sent to one
    done = rig.finals("done")
    assert not rig.finals("error"), rig.finals("error")[:3]
    assert len(done) >= 100, f"only {len(done)} compressions in {rig.turns} turns"
    # The turn trigger and the soft watermark fired (the trajectories' 1500-token system prompt
    # plus the reply reserve put every session near the 70% mark from its first call).
    reasons = rig.start_reasons()
    assert reasons["turn"] > 0 and reasons["auto"] > 0, reasons
    compressed = [r for r in records.values() if r and r["compressions"] > 0]
    assert len(compressed) >= 80, f"only {len(compressed)} of 100 sessions compressed"
    # Requests that joined one run all report it: count each compression once.
    assert sum(r["compressions"] for r in compressed) == len(
        {
            (s["session_id"], s["stats"]["covered_up_to_seq"])
            for s in done
            if s["stats"].get("covered_up_to_seq")
        }
    )
    # No model configured: the rules engine is the summarizer, not a fallback.
    assert all(r["fallback"] is None and r["model"] is None for r in compressed)
    assert_one_final_per_request(rig)
    assert_no_logged_errors(caplog)
    assert elapsed < 60, f"100 replays took {elapsed:.1f}s of CPU"


async def test_locomo_replays_keep_the_invariants_with_the_rules_engine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conversations = locomo_conversations(2)
    rig = make_rig(tmp_path, FakeLLM(default_model=None), LOCOMO_PLUGIN)
    by_session = {f"locomo-{c.name}": c for c in conversations}
    async with rig.host:
        for session_id, conversation in by_session.items():
            await replay(rig, conversation, session_id)
    records = await final_check(rig, by_session)
    assert not rig.finals("error")
    for session_id, conversation in by_session.items():
        record = records[session_id]
        assert record is not None and record["compressions"] >= 10, (session_id, record)
        # Most of the conversation is behind the summary, the newest part is kept verbatim.
        assert record["covered_up_to_seq"] >= len(conversation.messages) - 60
    assert rig.start_reasons()["turn"] > 0
    assert_one_final_per_request(rig)
    assert_no_logged_errors(caplog)


# -- replays: a slow summarizer and turns that do not wait ---------------------------------------


async def _replay_concurrently(rig: Rig, by_session: dict[str, Conversation]) -> None:
    await asyncio.gather(*(replay(rig, c, s) for s, c in by_session.items()))


def _assert_summarized_by_the_llm(
    rig: Rig, records: dict[str, Any], archived: dict[str, list[Message]]
) -> None:
    """Every archived message went through the summarizer: its reason is ``summarized`` (no
    trim fallback), the records say the model made them, and every archived user message's text
    was in some transcript the summarizer received."""
    transcripts = "\n".join(call["messages"][-1]["content"] for call in rig.llm.calls)
    assert sum(1 for messages in archived.values() if messages) >= 0.75 * len(archived)
    for session_id, messages in archived.items():
        if not messages:  # a short conversation that never reached the threshold
            continue
        assert {m.archived for m in messages} == {"summarized"}, session_id
        record = records[session_id]
        assert record["fallback"] is None and record["model"] == "fake/summarizer", record
        for m in messages:
            if m.role == "user" and not m.is_marker:
                head = text_of(m.content).strip().splitlines()[0][:60]
                assert head in transcripts, f"{session_id} seq {m.seq} archived, never summarized"


async def _archived(rig: Rig, sessions: list[str]) -> dict[str, list[Message]]:
    reopened = SQLiteMemory(rig.path, token_counter=lambda m: 1)
    try:
        return {s: [m for m in await reopened.get_archived(s) if not m.is_marker] for s in sessions}
    finally:
        await reopened.close()


async def test_tau_bench_replays_with_a_slow_summarizer_and_turns_that_do_not_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conversations = tau_conversations()[:20]
    llm = FakeLLM(delay=0.05, default=json_summarizer)
    rig = make_rig(tmp_path, llm, TAU_PLUGIN)
    by_session = {f"tau-{i:03d}-{c.name}": c for i, c in enumerate(conversations)}
    async with rig.host:
        await _replay_concurrently(rig, by_session)
    records = await final_check(rig, by_session)
    archived = await _archived(rig, list(by_session))
    assert not rig.finals("error"), rig.finals("error")[:3]
    assert len(rig.finals("done")) >= 25  # 20 sessions, most compressed more than once
    assert rig.turns_during_compressions() >= 20  # turns did not wait for the summarizer
    reasons = rig.start_reasons()
    assert reasons["turn"] > 0 and reasons["auto"] > 0, reasons
    _assert_summarized_by_the_llm(rig, records, archived)
    assert_one_final_per_request(rig)
    assert_no_logged_errors(caplog)


async def test_locomo_replays_with_a_slow_summarizer_and_turns_that_do_not_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conversations = locomo_conversations(2)
    llm = FakeLLM(delay=0.05, default=json_summarizer)
    rig = make_rig(tmp_path, llm, LOCOMO_PLUGIN)
    by_session = {f"locomo-{c.name}": c for c in conversations}
    async with rig.host:
        await _replay_concurrently(rig, by_session)
    records = await final_check(rig, by_session)
    archived = await _archived(rig, list(by_session))
    assert not rig.finals("error"), rig.finals("error")[:3]
    for session_id in by_session:
        assert records[session_id]["compressions"] >= 10
    assert rig.turns_during_compressions() >= 20
    _assert_summarized_by_the_llm(rig, records, archived)
    assert_one_final_per_request(rig)
    assert_no_logged_errors(caplog)


# -- replays where only the watermarks compress ----------------------------------------------------


def sent_ratios(result: Any) -> list[float]:
    """Usage ratio of each prompt the host actually sent in a turn: per model call the measure
    it built the prompt from (the ``rebuilt`` one when a hard compression ran before the call)."""
    usage = result.usage
    return [
        u.usage_ratio
        for i, u in enumerate(usage)
        if not (i + 1 < len(usage) and usage[i + 1].rebuilt)
    ]


async def drain(rig: Rig) -> None:
    """Wait for the plugin's background work (the tasks it holds by strong reference)."""
    while pending := rig.plugin.scheduler.pending():
        await asyncio.gather(*pending)


#: The defaults: no turn trigger, the soft and hard watermarks compress, the kept window is what
#: fits the fill target.
WATERMARK_ONLY: dict[str, Any] = {"debounce_turns": 1}


@pytest.mark.parametrize(
    ("engine", "marks"),
    [("rules", "soft+hard"), ("slow-llm", "soft+hard"), ("rules", "hard"), ("slow-llm", "hard")],
)
async def test_locomo_watermark_replays_keep_the_invariants(
    engine: str, marks: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Soft (background) and hard (blocking, before the call) watermark compressions, cut by
    tokens rather than by count, under the invariants; with no cooldown between watermark
    attempts the prompt always fits the window."""
    conversation = locomo_conversations(1)[0]
    llm = (
        FakeLLM(default_model=None)
        if engine == "rules"
        else FakeLLM(delay=0.05, default=json_summarizer)
    )
    plugin = {**WATERMARK_ONLY, "cooldown_s": 0}
    if marks == "hard":
        plugin["auto_compress_threshold"] = 0
    rig = make_rig(tmp_path, llm, plugin)
    session_id = f"locomo-{conversation.name}"
    checker = rig.checkers[session_id] = InvariantChecker(rig.host.memory, session_id)
    ratios: list[float] = []
    async with rig.host:
        for inputs, recorded in split_turns(conversation.messages):
            result = await rig.host.run_turn(session_id, inputs, recorded=recorded)
            assert result.error is None
            check_sent(result.sent)
            ratios += sent_ratios(result)
            await checker.check(result.messages)
    await final_check(rig, {session_id: conversation})
    reasons = Counter(
        (s["stats"].get("trigger"), s["status"]) for s in rig.finals() if s["status"] == "done"
    )
    if marks == "hard":
        assert reasons[("hard", "done")] >= 10 and rig.start_reasons()["auto"] == 0, reasons
    else:
        assert reasons[("auto", "done")] >= 10, reasons
    assert rig.start_reasons()["turn"] == 0
    assert max(ratios) < 1.0, f"a prompt of {max(ratios):.2f} x the window was sent"
    assert not rig.finals("error")
    assert_one_final_per_request(rig)
    assert_no_logged_errors(caplog)


async def test_a_min_gain_skip_never_lets_the_prompt_outgrow_the_window(tmp_path: Path) -> None:
    conversation = locomo_conversations(1)[0]
    rig = make_rig(tmp_path, FakeLLM(default_model=None), WATERMARK_ONLY)  # cooldown 30 s
    ratios: list[float] = []
    async with rig.host:
        for inputs, recorded in split_turns(conversation.messages):
            result = await rig.host.run_turn("s", inputs, recorded=recorded)
            ratios += sent_ratios(result)
    # Watermark compressions aim below the mark by min_gain, so skips for a small gain (if any)
    # only wait for the history to grow; they never switch compression off.
    assert len(rig.finals("done")) >= 3
    assert not [s for s in rig.finals("skipped") if s["reason"].startswith("blocked")]
    assert max(ratios) < 1.0, (
        f"prompts of up to {max(ratios):.1f} x the window were sent; "
        f"{len(rig.finals('done'))} compressions"
    )


async def test_a_watermark_compression_brings_usage_under_its_mark_with_core_memory_in_history(
    tmp_path: Path,
) -> None:
    """A 1000-token system message in the history (as every tau-bench trajectory has) plus
    200-token user and assistant messages: after each watermark compression the next prompt is
    at or under the mark that fired (the kept window can always shrink to the newest message)."""
    llm = FakeLLM(default_model=None)
    plugin = {**WATERMARK_ONLY, "keep_recent": 30, "threshold": 100_000, "cooldown_s": 0}
    rig = make_rig(tmp_path, llm, plugin)
    core = Message(role="system", content="Policy: " + "rule " * 795)
    assert 990 <= llm.count_tokens([core]) <= 1010
    after: list[tuple[str, float]] = []
    async with rig.host:
        pending: str | None = None
        for i in range(16):
            inputs = [Message(role="user", content=f"question {i} " + "word " * 155)]
            if i == 0:
                inputs.insert(0, core)
            reply = Message(role="assistant", content=f"answer {i} " + "word " * 155)
            done_before = len(rig.finals("done"))
            result = await rig.host.run_turn("s", inputs, recorded=[reply])
            ratios = sent_ratios(result)
            if pending is not None:
                after.append((pending, ratios[0]))
                pending = None
            if len(rig.finals("done")) > done_before:
                pending = rig.finals("done")[-1]["stats"]["trigger"]
                if result.usage[-1].rebuilt:  # a hard compression before this very call
                    after.append(("hard", ratios[-1]))
                    pending = None
            await drain(rig)  # each background compression ends before the next turn
    assert after, "no watermark compression happened"
    marks = {"auto": 0.7, "hard": 0.9}
    over = [(trigger, round(ratio, 3)) for trigger, ratio in after if ratio > marks[trigger] + 0.01]
    assert not over, f"usage after the compression above its mark: {over}"


async def test_event_markers_never_start_a_turn_compression(tmp_path: Path) -> None:
    conversation = locomo_conversations(1)[0]
    rig = make_rig(tmp_path, FakeLLM(default_model=None), LOCOMO_PLUGIN)
    async with rig.host:
        for inputs, recorded in split_turns(conversation.messages):
            await rig.host.run_turn("s", inputs, recorded=recorded)
            await drain(rig)  # each background compression ends before the next turn
    assert len(rig.finals("done")) >= 10
    spurious = [s for s in rig.finals("skipped") if "below threshold" in s["reason"]]
    assert not spurious, f"{len(spurious)} turn requests skipped: {spurious[0]['reason']}"
