"""The compression pipeline, as named steps: plan, summarize, build the record, commit, report.

``compress_once`` is one attempt under the session's lease (the scheduler runs it); ``rebuild``
shares the record and commit steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from host_stub.messages import Message, text_of
from host_stub.services import (
    HostProtocol,
    LeaseToken,
    LLMService,
    MemoryService,
    MessageArchiveService,
    Snapshot,
    YieldsToTurns,
)

from ..base import (
    LOST_RACE,
    CompressionPlan,
    MemorySummaryConfig,
    Result,
    Status,
    conversation_messages,
    counters_after_run,
    plan_compression,
    result,
)
from ..prompt import SessionState, SessionTable, TokenBook, configured_replacements, pruned_costs
from ..record import SummaryRecord, build_record, dump_record, read_record
from ..safety import Redactor
from ..summarizer import BUSY, GAVE_UP, ModelBusy, SummarizerCalls
from .slot import SummarizerSlot

if TYPE_CHECKING:
    from ..summarizer import SummarizeOutcome

__all__ = ["Pipeline"]

log = logging.getLogger("plugin_memory_summary")

#: How long a background compression waits at most, before each of its CPU steps (the plan;
#: the work on an answer, the new record and its block), for the host's turns waiting on the
#: store to go first (hosts with ``YieldsToTurns``; a blocking compression never waits).
TURNS_FIRST_S = 0.02


@dataclass
class _Run:
    """One attempt's inputs, read once: the snapshot and what the plan made of it."""

    session_id: str
    reason: str
    snap: Snapshot
    record: SummaryRecord | None
    window: int
    budget: int
    plan: CompressionPlan
    started: float
    #: Tokens the previous summary takes in the context now.
    old_summary_tokens: int = 0
    lang: str = "en"
    stats: dict[str, Any] = field(default_factory=dict)
    #: The session's lease the run holds: its writes are refused once a newer holder took it.
    lease: LeaseToken | None = None

    @property
    def batches(self) -> list[list[Message]]:
        return self.plan.batches

    @property
    def covered(self) -> int:
        """Newest seq the plan archives (summarized, or trimmed when a fallback stops short)."""
        return self.batches[-1][-1].seq or 0

    @property
    def expected_version(self) -> int:
        return self.snap.record.version if self.snap.record else 0


class Pipeline:
    def __init__(
        self,
        config: MemorySummaryConfig,
        *,
        host: HostProtocol,
        memory: MemoryService,
        llm: LLMService,
        archive: MessageArchiveService | None,
        tokens: TokenBook,
        sessions: SessionTable,
        redactor: Redactor,
        name: str,
    ) -> None:
        self.config = config
        self.host = host
        self.memory = memory
        self.llm = llm
        self.archive = archive
        self.tokens = tokens
        self.sessions = sessions
        self.redactor = redactor
        self.name = name
        self.prune_memo: dict[tuple[object, ...], tuple[str, int]] = {}

    # -- decisions on plain data ---------------------------------------------------------------
    def context_window(self, session_id: str) -> int:
        state = self.sessions.peek(session_id)
        if state is not None and state.context_window:
            return state.context_window
        return self.host.context_window()

    def language(self, conv: list[Message]) -> str:
        """The configured language, or the one of the conversation's own words (tool payloads,
        often English JSON, left out)."""
        if self.config.language != "auto":
            return self.config.language
        from ..summarizer import detect_language

        return detect_language(
            text_of(m.content)
            for m in conv[-40:]
            if m.role in ("user", "assistant") and not m.tool_calls
        )

    def prune(self, messages: list[Message], window: int) -> dict[int, str]:
        """Tier 1 (``prompt.pruning.configured_replacements``): the same answer for the host's
        prompt and for the plan."""
        return configured_replacements(
            self.config, messages, window, self.tokens.count, self.tokens.recall, self.prune_memo
        )

    def plan(
        self,
        messages: list[Message],
        reason: str,
        breakdown: dict[str, int],
        window: int,
        budget: int,
    ) -> CompressionPlan:
        cfg = self.config
        # Planned on what the prompt shows: a pruned tool result costs its placeholder.
        messages = pruned_costs(messages, self.prune(messages, window), self.tokens.count)
        soft, hard = cfg.auto_compress_threshold, cfg.hard_compress_threshold
        mark = {"auto": soft, "hard": hard}.get(reason)
        # Past the hard mark the soft one fired too: one blocking run aims under the lower mark.
        aim = min(soft, hard) if reason == "hard" and soft > 0 else None
        return plan_compression(
            messages,
            reason=reason,
            threshold=cfg.threshold,
            keep_recent=cfg.keep_recent,
            keep_recent_tokens=cfg.keep_recent_tokens,
            context_window=window,
            mark=mark,
            aim=aim,
            fill_target=cfg.fill_target,
            min_gain=cfg.min_gain,
            breakdown=breakdown,
            summary_budget_tokens=budget,
            batch_tokens=self.tokens.batch_tokens(budget),
            max_batches=cfg.max_batches_per_run,
        )

    def cool_down(
        self, session_id: str, state: SessionState, why: str, newest_seq: int | None
    ) -> None:
        """No compression can help: wait, but only while the history stays as it is (a new
        message re-plans)."""
        cfg = self.config
        state.cooldown_until = time.monotonic() + cfg.cooldown_s
        state.blocked_seq = newest_seq
        if not state.warned:
            state.warned = True
            b = state.breakdown
            log.warning(
                "session %s: no compression can bring usage under the watermark: %s "
                "(system prompt %d, tool definitions %d, reply reserve %d); cooling down %.0fs",
                session_id,
                why,
                b.get("system", 0),
                b.get("tool_defs", 0),
                b.get("reserved_for_reply", 0),
                cfg.cooldown_s,
            )

    # -- one attempt ---------------------------------------------------------------------------
    async def compress_once(
        self,
        session_id: str,
        reason: str,
        deadline: float | None,
        snapshot: Snapshot | None,
        markers: list[Message],
        slot: SummarizerSlot | None = None,
        lease: LeaseToken | None = None,
    ) -> Result:
        """One attempt; the event marker of a committed run goes to ``markers`` (written after
        the result by the scheduler). ``slot`` is held while the summarizer works and given
        back before the commit, so the cap counts summarizer work, not store round trips (an
        attempt after a lost race takes it again)."""
        started = time.monotonic()
        snap = snapshot if snapshot is not None else await self.memory.snapshot(session_id)
        # A background run lets the host's turns go first before each of its CPU steps; a
        # blocking one is what its turn waits for.
        pause = self._turns_first if deadline is None else None
        if pause is not None:
            await pause()
        run = self._plan_run(session_id, reason, snap, started)
        if not isinstance(run, _Run):
            return run
        run.lease = lease
        if self.config.strategy == "window":
            return await self._trim(run, "window", "done", "window")
        outcome = await self._summarize(run, deadline, slot, pause)
        status: Status = "error" if outcome.errors else "done"
        why = "; ".join(outcome.errors + outcome.notes) or reason
        if outcome.batches_done == 0:
            return await self._trim(run, "fallback-trim", status, why)
        summarized = [m for b in run.batches[: outcome.batches_done] for m in b]
        new = self._record_of(run, outcome, summarized)
        # The block the next prompt injects, made before the commit and kept right after it
        # (nothing runs in between): a prompt built as soon as the new record can be read finds
        # it ready instead of rendering and counting it on the turn.
        prepared = self.tokens.prepare_block(new, run.budget)
        committed = await self._commit(run, new)
        if committed is not None:
            return committed
        self.tokens.keep_block(run.session_id, run.expected_version + 1, prepared)
        return self._report(run, new, summarized, markers, status, why)

    async def _turns_first(self) -> None:
        """Let the host's turns waiting on the store go first (for at most
        :data:`TURNS_FIRST_S`), when the host offers it."""
        if isinstance(self.host, YieldsToTurns):
            await self.host.after_turns(TURNS_FIRST_S)

    def _plan_run(
        self, session_id: str, reason: str, snap: Snapshot, started: float
    ) -> _Run | Result:
        """Step 1: the plan on the snapshot, or the ``skipped`` result when none can help."""
        state = self.sessions.refresh(snap)
        record = read_record(snap.record, snap.epoch)
        conv = conversation_messages(snap.messages)
        window = self.context_window(session_id)
        budget = self.tokens.budget(window, state.breakdown, state.core_tokens)
        plan = self.plan(snap.messages, reason, state.breakdown, window, budget)
        if plan.skip is not None:
            if plan.blocked is not None:
                self.cool_down(session_id, state, plan.blocked, conv[-1].seq)
            return result("skipped", plan.skip, {} if plan.gain is None else {"gain": plan.gain})
        # What these messages and the summary take in the context now.
        old_summary = self.tokens.count(record.text) if record else 0
        run = _Run(session_id, reason, snap, record, window, budget, plan, started, old_summary)
        run.stats = {
            "trigger": reason,
            "messages_summarized": 0,
            "tokens_before": sum(m.tokens or 0 for m in conv) + old_summary,
            "model": None,
            "cost": 0.0,
            "fallback": None,
        }
        return run

    async def _summarize(
        self,
        run: _Run,
        deadline: float | None,
        slot: SummarizerSlot | None,
        pause: Callable[[], Awaitable[object]] | None = None,
    ) -> SummarizeOutcome:
        """Step 2: fold the planned batches into the previous summary (under a slot).

        The summarizer is called through ``summarizer.speed.SummarizerCalls``: a model not known
        to answer in time takes one run's calls at a time, and none while its server is taken to
        be busy with a call given up on. A run waits for that at most ``summary_timeout_s`` (a
        blocking one, half of what is left of its deadline), else the rules engine does its
        work; after a call given up on, the rules engine merges the rest of the run."""
        from ..summarizer import summarize_batches

        lang = run.lang = self.language(conversation_messages(run.snap.messages))
        model = self.tokens.summary_model()
        book = self.tokens.speed
        timeout_s = self.config.summary_timeout_s
        speed = book.for_run(deadline)
        calls = SummarizerCalls(self.llm, speed, self.tokens.count)
        if slot is not None:
            await slot.acquire()
        try:
            use = model
            if model is not None:
                wait = timeout_s if deadline is None else (deadline - time.monotonic()) / 2
                if not await book.take_turn(model, speed, max(0.0, wait)):
                    use = None  # the rules engine, now, instead of a call that would pile up
            outcome = await summarize_batches(
                run.record.payload if run.record else None,
                run.batches,
                llm=calls,
                model=use,
                config=self.config,
                budget=run.budget,
                lang=lang,
                redactor=self.redactor,
                count_tokens=self.tokens.count,
                deadline=deadline,
                text_budget=run.budget - self.tokens.framing_tokens(lang),
                speed=speed,
                pause=pause,
            )
        finally:
            if model is not None:
                book.release_turn(model, speed)
            if slot is not None:
                slot.release()
        if model is not None and use is None:
            outcome.fallback = "rules"
            outcome.notes.append(BUSY)
        elif calls.refused:
            # Calls not sent are not calls, and their reason is said once (the run's errors keep
            # the timeout that made it give up on the model).
            refused = f"{ModelBusy.__name__}: "
            outcome.llm_calls -= calls.refused
            outcome.errors = [e for e in outcome.errors if not e.startswith(refused)]
            note = speed.gave_up or GAVE_UP
            if note not in outcome.notes:
                outcome.notes.append(note)
        engine = "llm" if model and not outcome.fallback else "rules"
        run.stats.update(model=model, engine=engine, cost=outcome.cost, fallback=outcome.fallback)
        run.stats.update(llm_calls=outcome.llm_calls, answers_used=outcome.model_batches)
        run.stats["llm_seconds"] = [round(t, 3) for t in outcome.latencies]
        return outcome

    def _record_of(
        self, run: _Run, outcome: SummarizeOutcome, summarized: list[Message]
    ) -> SummaryRecord:
        """Step 3: the new record, covering the batches the summarizer folded."""
        record = run.record
        model = run.stats["model"]
        return build_record(
            record,
            outcome.payload,
            lang=run.lang,
            covered_up_to_seq=run.batches[outcome.batches_done - 1][-1].seq or 0,
            epoch=run.snap.epoch,
            compressed_at_seq=run.snap.last_seq or 0,
            messages_summarized=(record.messages_summarized if record else 0) + len(summarized),
            compressions=(record.compressions if record else 0) + 1,
            model=model if outcome.llm_calls and not outcome.errors else None,
            cost=(record.cost if record else 0.0) + outcome.cost,
            fallback=outcome.fallback,
        )

    async def _commit(self, run: _Run, new: SummaryRecord) -> Result | None:
        """Step 4: write the record and archive what it covers, atomically; ``None`` when it
        won, else the result of losing (a clear won, or another writer: read again)."""
        won = await self.memory.commit_compression(
            run.session_id,
            dump_record(new),
            expected_version=run.expected_version,
            archive_through_seq=new.covered_up_to_seq,
            epoch=run.snap.epoch,
            lease=run.lease,
        )
        if won:
            if new.covered_up_to_seq < run.covered:
                # The fallback stopped early: the rest of the plan is only archived.
                await self.memory.trim_history(
                    run.session_id, up_to_seq=run.covered, reason="fallback-trim", lease=run.lease
                )
            return None
        if await self.memory.get_epoch(run.session_id) != run.snap.epoch:
            return result("skipped", "session cleared during compression")
        return result(LOST_RACE, "")

    def _report(
        self,
        run: _Run,
        new: SummaryRecord,
        summarized: list[Message],
        markers: list[Message],
        status: Status,
        why: str,
    ) -> Result:
        """Step 5: the block the next prompt injects, the event marker, the stats."""
        # Kept by ``compress_once`` (made before the commit); the record's version grows by one
        # on every write, so the commit made it expected + 1.
        _, block_tokens = self.tokens.block(
            run.session_id, run.expected_version + 1, new, run.budget
        )
        summary_tokens = self.tokens.count(new.text)
        run.stats.update(
            messages_summarized=len(summarized),
            summary_tokens=summary_tokens,
            block_tokens=block_tokens,  # what the injected block takes, framing included
            covered_up_to_seq=new.covered_up_to_seq,
        )
        if self.archive is not None:
            markers.append(
                Message(
                    role="system",
                    kind="event-marker",
                    content=(
                        f"[memory-summary] {len(summarized)} messages summarized "
                        f"(through seq {new.covered_up_to_seq})"
                    ),
                    metadata={
                        "plugin": self.name,
                        "covered_up_to_seq": new.covered_up_to_seq,
                        "trigger": run.reason,
                    },
                )
            )
        tokens_after = (
            run.stats["tokens_before"]
            - run.plan.archived_tokens
            - run.old_summary_tokens
            + summary_tokens
        )
        # Archived through ``covered``: summarized to the record's seq, trimmed past it if short.
        after = counters_after_run(run.snap.messages, run.covered, len(markers))
        return self._finish(run, tokens_after, status, why, after)

    async def _trim(
        self,
        run: _Run,
        archive_reason: Literal["window", "fallback-trim"],
        status: Status,
        why: str,
    ) -> Result:
        """The ``window`` strategy, or a fallback with no batch summarized: archive the plan's
        messages, no summary."""
        archived = await self.memory.trim_history(
            run.session_id, up_to_seq=run.covered, reason=archive_reason, lease=run.lease
        )
        run.stats.update(messages_archived=len(archived))
        tokens_after = run.stats["tokens_before"] - run.plan.archived_tokens
        after = counters_after_run(run.snap.messages, run.covered, 0)
        return self._finish(run, tokens_after, status, why, after)

    def _finish(
        self, run: _Run, tokens_after: int, status: Status, why: str, after: tuple[int, int]
    ) -> Result:
        """Report a run that changed the history, and set the session's per-turn counters to
        what it left (``counters_after_run``): no read of the store for them, on the turn or
        after it. They are a hint, as always: turns taken while the run went are not counted
        toward ``debounce_turns``, and a blocking run, which read the prompt's view (markers
        left out), may count an earlier run's newest marker as a message; every run plans
        again on what it reads."""
        run.stats["tokens_after"] = tokens_after
        run.stats["duration_s"] = round(time.monotonic() - run.started, 4)
        self.sessions.get(run.session_id).set_after_run(after)
        return result(status, why, run.stats)
