"""Property-based, stateful: random interleavings of everything that can happen to two sessions
of one host, with the design's invariants checked after every step.

A :class:`hypothesis.stateful.RuleBasedStateMachine` owns one host (the plugin loaded from its
entry point), a :func:`faults.faulty_llm` summarizer that answers well unless a rule says
otherwise, and its own asyncio event loop (created in ``__init__``, closed in ``teardown``). Rules:
append plain messages; append a tool-call group (1-3 parallel calls with their results, in any
order); run a turn (recorded replies, tool rounds included); ask for a compression (manual / auto
/ hard; through ``session:compress`` or awaited); clear the session (or every session); delete a
few messages (a rollback of the newest ones, or an edit of one message, archived or not); make
the next summarizer reply fail (error, timeout, hang, garbage, length, empty, wrong types,
oversized); make it slow (its future is resolved by a later ``resolve_slow`` or at teardown, so
compressions overlap with turns, clears and deletes); let hanging calls time out; let background
work run; switch between the two sessions.

After every step (``@invariant``), per session: :class:`invariants.InvariantChecker` (incremental;
a new one after a clear, its version floor carried over; ``allow_user_archive`` once the test
deleted messages), no summary of an earlier epoch ever comes back (no tag of a cleared
generation in the stored summary, nor in anything sent to a model afterwards), no turn fails and
none waits for a held (slow) summarizer reply, and no request id gets two final statuses. At
teardown, once every slow reply is resolved and every hang fired: every request got exactly one
final status after its ``start``, and a fresh checker passes. The rule ``during_a_slow_compression``
makes the overlaps the design's guards exist for (a clear, a delete, a turn or another request
while a summarizer reply is late) frequent rather than lucky.

Fast by construction: the summarizer is driven by futures (nothing sleeps), the in-memory store
for most examples, a SQLite file (with ``fallback = "trim"``) for a few.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from faults import LEAK_MARKERS, FaultPlan, faulty_llm
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)
from invariants import InvariantChecker, check_sent

from host_stub import signals
from host_stub.config import HostConfig
from host_stub.host import Host
from host_stub.memory.inmemory import InMemoryMemory
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message, ToolCall, ToolCallFunction
from host_stub.services import SUMMARY_NAMESPACE

FINAL = ("done", "error", "skipped")
SESSIONS = ("A", "B")
HARD_DEADLINE = 0.2
#: A held (slow) or hanging summarizer call waits this long before it times out by itself; the
#: test resolves or fires it well before.
SUMMARY_TIMEOUT = 30.0
#: A turn may block for a hard compression (its deadline, plus the rules engine's CPU time on a
#: loaded machine); a turn that waited for a held summarizer reply would take SUMMARY_TIMEOUT.
TURN_LIMIT = 8.0

PLUGIN = {
    "threshold": 5,
    "keep_recent": 2,
    "debounce_turns": 1,
    "cooldown_s": 0,
    "summary_timeout_s": SUMMARY_TIMEOUT,
    "hard_deadline_s": HARD_DEADLINE,
    "max_concurrent_summaries": 2,
    "shutdown_grace_s": 30,
}
HOST = {"context_window": 3000, "reserve_for_reply": 128}

FAILURES = ("error", "timeout", "hang", "garbage", "length", "empty", "wrong_types", "oversized")
#: Background fault rates (hangs and slow replies only when a rule asks: they wait for the test).
PLANS = {
    "none": FaultPlan(),
    "some": FaultPlan(
        error=0.15,
        timeout=0.05,
        garbage=0.05,
        length=0.05,
        empty=0.03,
        wrong_types=0.03,
        oversized=0.02,
    ),
    "heavy": FaultPlan(
        error=0.3,
        timeout=0.1,
        garbage=0.1,
        length=0.05,
        empty=0.05,
        wrong_types=0.05,
        oversized=0.05,
    ),
}
#: What ``script_next_reply`` may make of the next summarizer call (slow ones more often).
NEXT_REPLIES = st.sampled_from([*FAILURES, "slow", "slow", "slow", "ok"])
SIZES = st.sampled_from([0, 1, 1, 1, 2])  # tiny, small, large (a large one is ~600 tokens)
_TAG = re.compile(r"\[([AB])(\d+)T\d+\]")


def _body(tag: str, size: int) -> str:
    return tag + " " + ["ok", "some words about the order " * 3, "lorem ipsum " * 200][size]


class MemoryMachine(RuleBasedStateMachine):
    backend = "memory"
    fallback = "rules"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp: Path | None = None
        self.llm = faulty_llm(FaultPlan(seed=0), hold_slow=True)
        if self.backend == "sqlite":
            self.tmp = Path(tempfile.mkdtemp(prefix="stateful-"))
            memory: Any = SQLiteMemory(
                self.tmp / "s.db", token_counter=lambda m: self.llm.count_tokens([m])
            )
        else:
            memory = InMemoryMemory(token_counter=lambda m: self.llm.count_tokens([m]))
        config = HostConfig.model_validate(
            {
                "plugins": {"allow": ["memory-summary"]},
                "host": HOST,
                "plugin": {"memory-summary": {**PLUGIN, "fallback": self.fallback}},
            }
        )
        self.host = Host(config, memory=memory, llm=self.llm)
        self.statuses: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.host.bus.connect(signals.SESSION_COMPRESSING, self._on_status)
        self.host.bus.connect(signals.SESSION_COMPRESS, self._on_request)
        self.run(self.host.start())
        self.session = SESSIONS[0]
        self.checkers = {s: InvariantChecker(self.host.memory, s) for s in SESSIONS}
        #: Per session: its clear generation (the tag of every message it appends) and counter.
        self.gen = {s: 0 for s in SESSIONS}
        self.n = {s: 0 for s in SESSIONS}
        self.deleted = {s: False for s in SESSIONS}
        self.rng = random.Random(0)
        self.stopped = False
        #: Overlaps the example produced (reported as events).
        self.overlaps: dict[str, int] = defaultdict(int)
        self.slowest_turn = 0.0

    # -- plumbing -----------------------------------------------------------------------------
    async def _on_status(self, sender: Any, **payload: Any) -> None:
        self.statuses.append(payload)

    async def _on_request(self, sender: Any, **payload: Any) -> None:
        self.requests.append(payload)

    def run(self, coro: Any, limit: float = 30.0) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, limit))

    @property
    def plugin(self) -> Any:
        return self.host.get_plugin("memory-summary")

    def tag(self) -> str:
        s = self.session
        self.n[s] += 1
        return f"[{s}{self.gen[s]}T{self.n[s]}]"

    def old_tags(self, session: str, text: str) -> list[str]:
        return [
            m.group(0)
            for m in _TAG.finditer(text)
            if m.group(1) == session and int(m.group(2)) < self.gen[session]
        ]

    def tool_round(self, k: int, size: int, text: bool) -> list[Message]:
        tag = self.tag()
        calls = [
            ToolCall(
                id=f"call_{tag}_{i}",
                function=ToolCallFunction(name=f"tool_{i}", arguments=json.dumps({"q": tag})),
            )
            for i in range(k)
        ]
        results = [
            Message(role="tool", tool_call_id=c.id, name=c.function.name, content=_body(tag, size))
            for c in calls
        ]
        self.rng.shuffle(results)
        call = Message(role="assistant", content=tag if text else None, tool_calls=calls)
        return [call, *results]

    # -- rules ----------------------------------------------------------------------------------
    @initialize(
        turns=st.tuples(st.integers(0, 8), st.integers(0, 8)),
        plan=st.sampled_from(sorted(PLANS)),
        seed=st.integers(0, 2**32 - 1),
    )
    def prefill(self, turns: tuple[int, int], plan: str, seed: int) -> None:
        """How often the summarizer fails on its own (on top of ``script_next_reply``), and some
        history in each session first, so compressions start early."""
        self.llm.sampler = replace(PLANS[plan], seed=seed).sampler()
        for session, n in zip(SESSIONS, turns, strict=True):
            self.session = session
            for _ in range(n):
                self.turn(rounds=[], size=1, reply=True)
        self.session = SESSIONS[0]

    @rule(n=st.integers(1, 3), size=SIZES)
    def append_plain(self, n: int, size: int) -> None:
        messages = [
            Message(role="user" if i % 2 == 0 else "assistant", content=_body(self.tag(), size))
            for i in range(n)
        ]
        stored = self.run(self.host.memory.append(self.session, messages))
        self.checkers[self.session].expect(stored)

    @rule(k=st.integers(1, 3), size=SIZES, text=st.booleans())
    def append_tool_group(self, k: int, size: int, text: bool) -> None:
        stored = self.run(self.host.memory.append(self.session, self.tool_round(k, size, text)))
        self.checkers[self.session].expect(stored)

    @rule(
        rounds=st.lists(st.integers(1, 3), max_size=2),
        size=SIZES,
        reply=st.booleans(),
    )
    def turn(self, rounds: list[int], size: int, reply: bool) -> None:
        session = self.session
        user = Message(role="user", content=_body(self.tag(), size))
        recorded: list[Message] = []
        for k in rounds:
            recorded += self.tool_round(k, size, text=False)
        if reply or not rounds:
            recorded.append(Message(role="assistant", content=_body(self.tag(), 0)))
        if session in self.plugin.scheduler.running:
            self.overlaps["turn during a compression"] += 1
        started = time.monotonic()
        try:
            result = self.run(self.host.run_turn(session, user, recorded=recorded), TURN_LIMIT)
        except TimeoutError:
            raise AssertionError(f"the turn blocked for more than {TURN_LIMIT}s") from None
        elapsed = time.monotonic() - started
        self.slowest_turn = max(self.slowest_turn, elapsed)
        assert result.outcome == "replied" and result.error is None, (result.outcome, result.error)
        assert len(result.messages) == 1 + len(recorded)
        check_sent(result.sent, where=f"session {session}")
        sent = json.dumps(result.sent)
        stale = self.old_tags(session, sent)
        assert not stale, f"cleared messages of {session} reached the model: {stale[:3]}"
        self.checkers[session].expect(result.messages)

    @rule(reason=st.sampled_from(["manual", "auto", "hard"]), awaited=st.booleans())
    def request_compression(self, reason: str, awaited: bool) -> None:
        # Awaited only when no summarizer call is (or may soon be) held: a request joins the
        # session's running compression, and a held reply is only resolved by a later rule.
        blocked = (
            self.llm.waiting_slow
            or self.llm.hanging
            or {"slow", "hang"} & set(self.llm.sampler.forced)
        )
        if awaited and not blocked:
            final = self.run(self.plugin.request(self.session, reason))
            assert final["status"] in FINAL, final
        else:
            self.run(self.host.request_compression(self.session, reason))

    @rule(everything=st.booleans())
    def clear(self, everything: bool) -> None:
        if self.plugin.scheduler.running:
            self.overlaps["clear during a compression"] += 1
        self.run(self.host.clear(None if everything else self.session))
        for s in SESSIONS if everything else (self.session,):
            self.gen[s] += 1
            old = self.checkers[s]
            new = InvariantChecker(self.host.memory, s)
            new.version = old.version  # the record's metadata version never goes back
            new.allow_user_archive = self.deleted[s]
            self.checkers[s] = new

    @rule(rollback=st.booleans(), pick=st.integers(0, 10_000))
    def delete_messages(self, rollback: bool, pick: int) -> None:
        """A rollback of the newest messages (from a point that splits no tool-call group), or an
        edit of one user message or plain reply, active or archived. (What is there depends on
        the background work, so the choice is ``pick`` modulo the candidates: hypothesis draws
        the same whatever the store holds.)"""
        session = self.session
        memory = self.host.memory
        epoch = self.run(memory.get_epoch(session))
        active = [m for m in self.run(memory.get_history(session)) if not m.is_marker]
        archived = [
            m
            for m in self.run(memory.get_archived(session, epoch=epoch))
            if not m.is_marker and m.archived != "deleted"
        ]
        if rollback:
            starts = [i for i, m in enumerate(active) if m.role != "tool"][-4:]
            if not starts:
                return
            seqs = [m.seq for m in active[starts[pick % len(starts)] :]]
        else:
            editable = [
                m
                for m in [*archived, *active]
                if m.role == "user" or (m.role == "assistant" and not m.tool_calls)
            ]
            if not editable:
                return
            seqs = [editable[pick % len(editable)].seq]
        if session in self.plugin.scheduler.running:
            self.overlaps["delete during a compression"] += 1
        checker = self.checkers[session]
        checker.allow_user_archive = self.deleted[session] = True
        deleted = self.run(self.host.delete_messages(session, seqs))
        assert sorted(deleted) == sorted(seqs)
        for seq in deleted:
            if seq in checker.archived:
                checker.archived[seq] = "deleted"  # a user action may re-archive an archived one

    @rule(
        action=st.sampled_from(["clear", "delete", "turn", "compress"]),
        pick=st.integers(0, 10_000),
    )
    def during_a_slow_compression(self, action: str, pick: int) -> None:
        """A compression whose summarizer reply is late, and meanwhile a clear, a delete, a turn
        or another request; then the reply arrives (the overlap the design's guards are for)."""
        if self.session not in self.plugin.scheduler.running:
            held = len(self.llm.waiting_slow)
            self.llm.force("slow")
            request_id = self.run(self.host.request_compression(self.session, "manual"))

            async def reached_the_summarizer() -> None:
                for _ in range(200):
                    if len(self.llm.waiting_slow) > held or any(
                        s["request_id"] == request_id and s["status"] in FINAL
                        for s in self.statuses
                    ):
                        return  # waiting for its reply, or over (nothing to compress)
                    await asyncio.sleep(0.001)

            self.run(reached_the_summarizer())
        if action == "clear":
            self.clear(everything=False)
        elif action == "delete":
            self.delete_messages(rollback=pick % 2 == 0, pick=pick // 2)
        elif action == "turn":
            self.turn(rounds=[1 + pick % 3], size=1, reply=True)
        else:
            self.request_compression(reason=["manual", "auto", "hard"][pick % 3], awaited=False)
        self.resolve_slow(everything=True)

    @rule(kind=NEXT_REPLIES)
    def script_next_reply(self, kind: str) -> None:
        """The next summarizer call fails this way, or is slow (held until ``resolve_slow``)."""
        self.llm.force(kind)

    # No preconditions on what is waiting: that depends on timing, and hypothesis must draw the
    # same steps whatever the background work did.
    @rule(everything=st.booleans())
    def resolve_slow(self, everything: bool) -> None:
        self.llm.resolve_slow(None if everything else 1)
        self.settle()

    @rule()
    def fire_hangs(self) -> None:
        self.llm.fire_hangs()
        self.settle()

    @rule()
    def settle(self) -> None:
        """Let the background work run until it is done or waits on the summarizer."""

        async def wait() -> None:
            pending = set(self.plugin.scheduler.pending())
            if pending:
                await asyncio.wait(pending, timeout=0.02 if self.backend == "memory" else 0.05)
            else:
                await asyncio.sleep(0)

        self.run(wait())

    @rule()
    def switch_session(self) -> None:
        self.session = SESSIONS[1 - SESSIONS.index(self.session)]

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def design_invariants(self) -> None:
        if self.stopped:
            return
        for session in SESSIONS:
            self.run(self.checkers[session].check())
            entry = self.run(self.host.memory.get_metadata(SUMMARY_NAMESPACE, session))
            if entry is not None and entry.value is not None:
                stored = json.dumps(entry.value, ensure_ascii=False)
                stale = self.old_tags(session, stored)
                assert not stale, f"a summary of cleared messages of {session} is back: {stale[:3]}"
                leaked = [m for m in LEAK_MARKERS if m in stored]
                assert not leaked, f"a failed answer or error text was stored: {leaked}"
        finals: dict[str, int] = defaultdict(int)
        for s in self.statuses:
            if s["status"] in FINAL:
                finals[s["request_id"]] += 1
        twice = [r for r, n in finals.items() if n > 1]
        assert not twice, f"request ids with two final statuses: {twice[:3]}"
        self._events()

    def _events(self) -> None:
        """What the example exercised so far (``--hypothesis-show-statistics``)."""
        for s in self.statuses:
            if s["status"] == "start":
                event(f"trigger {s['reason']}")
            else:
                event(f"compression {s['status']}")
                if s["stats"].get("fallback"):
                    event(f"fallback {s['stats']['fallback']}")
        for kind, n in self.llm.counts.items():
            if n:
                event(f"summarizer reply {kind}")
        if max(self.gen.values()):
            event("clear")
        if any(self.deleted.values()):
            event("delete")
        for what in self.overlaps:
            event(what)
        if self.slowest_turn > HARD_DEADLINE:
            event("a turn blocked longer than the hard deadline")

    # -- the end --------------------------------------------------------------------------------
    async def _finish(self) -> None:
        for _ in range(200):
            self.llm.resolve_slow()
            self.llm.fire_hangs()
            pending = set(self.plugin.scheduler.pending())
            if not pending and not self.llm.waiting_slow and not self.llm.hanging:
                break
            await asyncio.wait(pending or {asyncio.ensure_future(asyncio.sleep(0))}, timeout=0.05)
        else:
            raise AssertionError("background work did not end once the summarizer answered")
        for session in SESSIONS:
            await self.checkers[session].check()
            fresh = InvariantChecker(self.host.memory, session)
            fresh.allow_user_archive = self.deleted[session]
            await fresh.check()
        seen: dict[str, list[str]] = defaultdict(list)
        for s in self.statuses:
            seen[s["request_id"]].append(s["status"])
        bad = {r: v for r, v in seen.items() if v[0] != "start" or len(v) != 2 or v[1] not in FINAL}
        assert not bad, (
            f"requests not answered by exactly one final status: {list(bad.items())[:3]}"
        )
        missing = [r["request_id"] for r in self.requests if r["request_id"] not in seen]
        assert not missing, f"session:compress requests never answered: {missing[:3]}"
        assert self.llm.in_flight == 0

    def teardown(self) -> None:
        try:
            if not self.stopped:
                try:
                    self.run(self._finish())
                finally:
                    self.stopped = True
                    self.run(self.host.stop())
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)


class SQLiteMachine(MemoryMachine):
    backend = "sqlite"
    fallback = "trim"


COMMON = {
    "stateful_step_count": 40,
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}

TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = settings(max_examples=30, **COMMON)

TestSQLiteMachine = SQLiteMachine.TestCase
TestSQLiteMachine.settings = settings(max_examples=8, **COMMON)
