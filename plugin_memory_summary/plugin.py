"""The plugin: hooks and signal receivers feeding one compression pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from host_stub import signals
from host_stub.hookspecs import Contribution, PromptView, hookimpl
from host_stub.messages import Message, text_of
from host_stub.services import (
    SUMMARY_NAMESPACE,
    HostProtocol,
    LeaseLost,
    LeaseToken,
    LLMService,
    MemoryService,
    MessageArchiveService,
    Snapshot,
)

from .config import MemorySummaryConfig
from .decisions import (
    CompressionPlan,
    after_compression,
    conversation_messages,
    counters_after_run,
    hard_triggered,
    plan_compression,
    soft_triggered,
    split_batches,
    summary_budget,
    turn_triggered,
)
from .hygiene import framing_overhead, wrap_summary_block
from .lease import KeptLease, warm_up
from .payload import SummaryPayload, render_payload
from .record import SummaryRecord, dump_record, read_record
from .redact import Redactor
from .render import cut_text, render_transcript

# The summarizer (``.summarize``, and through it ``.prompts`` and the rules engine) is imported by
# the compression path on first use: a host that only injects an existing summary never loads it.

__all__ = ["PLUGIN_NAME", "MemoryContext", "MemorySummaryPlugin"]

PLUGIN_NAME = "memory-summary"
log = logging.getLogger("plugin_memory_summary")

#: Sessions whose per-turn state one plugin instance keeps (least recently used forgotten first).
MAX_TRACKED_SESSIONS = 10_000

#: Texts whose token count ``_count`` remembers (summaries, blocks; a few per compression).
COUNT_MEMO_SIZE = 256

#: The ``skipped`` reason when another run holds the session's compression lease.
LEASE_BUSY = "another run (in this or another process) holds the session's lease"
#: The ``skipped`` reason when a newer holder took the lease during the run (its writes refused).
LEASE_LOST = "the session's lease was taken over during the run; its writes were refused"
_LOST_RACE = "lost-race"


class MemoryContext(BaseModel):
    """The parts of a session's memory, for callers that assemble their own prompt."""

    model_config = ConfigDict(defer_build=True)  # built on first use, not at import

    session_id: str
    summary: str | None
    payload: SummaryPayload | None
    recent_transcript: str
    covered_up_to_seq: int
    summary_version: int
    active_messages: int


class SummarizerSlot:
    """One place under ``max_concurrent_summaries``, taken and given back at most once each
    time (``release`` without a held place does nothing)."""

    def __init__(self, semaphore: asyncio.Semaphore) -> None:
        self._semaphore = semaphore
        self.held = False

    async def acquire(self) -> None:
        if not self.held:
            await self._semaphore.acquire()
            self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._semaphore.release()


@dataclass
class SessionState:
    """What the plugin remembers of a session between turns, so the per-turn check is O(1).
    It is a hint only: every compression decides again on a fresh snapshot."""

    active: int = 0
    last_seq: int = 0
    turns_since: int | None = None
    context_window: int | None = None
    breakdown: dict[str, int] = field(default_factory=dict)
    cooldown_until: float = 0.0
    #: Newest seq when a watermark compression was found unable to help (the cooldown's key).
    blocked_seq: int | None = None
    warned: bool = False
    #: The numbers above were read from the store at least once in this process.
    synced: bool = False
    syncing: bool = False


class MemorySummaryPlugin:
    """One instance per host (the entry point names :func:`create_plugin`)."""

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.config = MemorySummaryConfig()
        self.host: HostProtocol | None = None
        self.memory: MemoryService | None = None
        self.llm: LLMService | None = None
        self.archive: MessageArchiveService | None = None
        self.redactor = Redactor()
        self._state: OrderedDict[str, SessionState] = OrderedDict()
        self._running: dict[str, asyncio.Task[dict[str, Any]]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._semaphore: asyncio.Semaphore | None = None
        #: Sessions whose run waits for a slot under max_concurrent_summaries.
        self._queued: set[str] = set()
        #: Per session, the last run's marker write and lease release (see ``_after_run``).
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._blocks: dict[tuple[str, int, int], tuple[str, int]] = {}
        #: Token counts of recent texts, oldest first (see ``_count``).
        self._counted: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._receivers: list[tuple[str, Callable[..., Any]]] = []

    # -- hooks ---------------------------------------------------------------------------------
    @hookimpl
    def plugin_config_schema(self) -> type[BaseModel]:
        return MemorySummaryConfig

    @hookimpl
    def startup(
        self,
        host: HostProtocol,
        config: MemorySummaryConfig,
        memory: MemoryService,
        llm: LLMService,
        message_archive: MessageArchiveService | None,
    ) -> None:
        self.host, self.memory, self.llm, self.archive = host, memory, llm, message_archive
        self.config = config
        self._counted.clear()  # the summary model may have changed
        self.redactor = Redactor(config.redact_patterns)
        self._semaphore = asyncio.Semaphore(config.max_concurrent_summaries)
        for name, receiver in (
            (signals.AGENT_TURN_AFTER, self._on_turn_after),
            (signals.TOKEN_USAGE, self._on_token_usage),
            (signals.SESSION_COMPRESS, self._on_session_compress),
            (signals.MEMORY_CLEAR, self._on_memory_clear),
            (signals.MEMORY_MESSAGES_DELETED, self._on_messages_deleted),
        ):
            host.bus.connect(name, receiver)
            self._receivers.append((name, receiver))

    @hookimpl
    def agent_prompt(self, view: PromptView) -> Contribution | None:
        state = self._session(view.session_id)
        state.context_window = view.context_window
        if self.config.strategy != "summary" or view.summary is None:
            return None
        cached = self._blocks.get(
            (view.session_id, view.summary.version, self._budget(view.context_window))
        )
        if cached is None:
            record = read_record(view.summary, view.epoch)
            if record is None or record.stale or not record.text:
                return None
            cached = self._block(view.session_id, view.summary.version, record, view.context_window)
        return Contribution(id=PLUGIN_NAME, anchor="context", content=cached[0])

    @hookimpl
    async def before_model_call(self, view: PromptView) -> None:
        if self.config.strategy == "off":
            return
        state = self._session(view.session_id)
        state.context_window = view.context_window
        state.breakdown = dict(view.breakdown)
        if not hard_triggered(
            view.usage_ratio, self.config.hard_compress_threshold, dry_run=view.dry_run
        ):
            return
        newest = view.messages[-1].seq if view.messages else None
        if time.monotonic() < state.cooldown_until and state.blocked_seq == newest:
            return
        # The same pre-flight the run makes, on the prompt's own view: when it says no
        # compression could help, the call goes on without a store read or a lease.
        budget = self._budget(view.context_window)
        plan = self._plan(view.messages, "hard", state.breakdown, view.context_window, budget)
        if plan.skip is not None:
            if plan.blocked is not None:
                self._cool_down(view.session_id, state, plan.blocked, newest)
            request_id = self._request_id(view.session_id)
            await self._emit(
                request_id, view.session_id, "start", "hard", {"usage_ratio": view.usage_ratio}
            )
            await self._emit(request_id, view.session_id, "skipped", plan.skip, {})
            return

        def look_again(joined: dict[str, Any]) -> bool:
            covered = joined["stats"].get("covered_up_to_seq")
            if joined["status"] != "done" or covered is None:
                return True
            left, breakdown = after_compression(
                view.messages,
                state.breakdown,
                covered_up_to_seq=covered,
                summary_tokens=joined["stats"].get("block_tokens", budget),
            )
            ratio = sum(breakdown.values()) / view.context_window
            if not hard_triggered(ratio, self.config.hard_compress_threshold, dry_run=False):
                return False
            return self._plan(left, "hard", breakdown, view.context_window, budget).skip is None

        try:
            await self.request(
                view.session_id,
                "hard",
                usage_ratio=view.usage_ratio,
                deadline_s=self.config.hard_deadline_s,
                look_again=look_again,
                snapshot=Snapshot.model_construct(
                    session_id=view.session_id,
                    epoch=view.epoch,
                    messages=view.messages,
                    record=view.summary,
                ),
            )
        except Exception:  # never fail the turn
            log.exception("hard compression of %s failed", view.session_id)

    @hookimpl
    async def shutdown(self) -> None:
        for name, receiver in self._receivers:
            if self.host is not None:
                self.host.bus.disconnect(name, receiver)
        self._receivers.clear()
        pending = [t for t in self._background if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=self.config.shutdown_grace_s)
            for task in still:
                task.cancel()
            if still:
                await asyncio.gather(*still, return_exceptions=True)

    @hookimpl
    def register_commands(self, cli: Any, open_host: Any) -> None:
        from .commands import register

        register(cli, open_host)

    # -- receivers -----------------------------------------------------------------------------
    async def _on_turn_after(self, sender: Any, **payload: Any) -> None:
        if self.config.strategy == "off":
            return
        session_id: str = payload["session_id"]
        state = self._session(session_id)
        if not state.synced:
            if not state.syncing:
                state.syncing = True
                self._spawn(self._cold_turn_check(session_id, payload["outcome"]))
            return
        user, reply = payload.get("message"), payload.get("reply")
        if (
            user is not None
            and user.seq is not None
            and user.seq > state.last_seq
            and state.turns_since is not None
        ):
            state.turns_since += 1  # a turn the last snapshot did not already count
        last = max([m.seq for m in (user, reply) if m is not None and m.seq is not None], default=0)
        if last > state.last_seq:
            state.active += last - state.last_seq
            state.last_seq = last
        if (
            turn_triggered(
                payload["outcome"],
                state.active,
                self.config.threshold,
                state.turns_since,
                self.config.debounce_turns,
            )
            and session_id not in self._running
        ):
            self._spawn(self.request(session_id, "turn"))

    async def _cold_turn_check(self, session_id: str, outcome: str) -> None:
        """First turn seen of a session in this process: learn its numbers from the store."""
        assert self.memory is not None
        snap = await self.memory.snapshot(session_id)
        state = self._refresh_state(snap)
        if (
            turn_triggered(
                outcome,
                state.active,
                self.config.threshold,
                state.turns_since,
                self.config.debounce_turns,
            )
            and session_id not in self._running
        ):
            await self.request(session_id, "turn")

    async def _on_token_usage(self, sender: Any, **payload: Any) -> None:
        if self.config.strategy == "off":
            return
        session_id = payload["session_id"]
        state = self._session(session_id)
        state.context_window = payload["context_window"]
        state.breakdown = payload["breakdown"].model_dump()
        if not soft_triggered(
            payload["usage_ratio"],
            self.config.auto_compress_threshold,
            dry_run=payload["dry_run"],
            rebuilt=payload["rebuilt"],
        ):
            return
        if hard_triggered(
            payload["usage_ratio"], self.config.hard_compress_threshold, dry_run=payload["dry_run"]
        ):
            return  # the blocking compression in before_model_call, right after, does it
        cooling = time.monotonic() < state.cooldown_until and state.blocked_seq == state.last_seq
        if session_id in self._running or cooling:
            return
        assert self.host is not None
        await self.host.bus.send(
            signals.SESSION_COMPRESS,
            request_id=self._request_id(session_id),
            session_id=session_id,
            reason="auto",
            usage_ratio=payload["usage_ratio"],
        )

    async def _on_session_compress(self, sender: Any, **payload: Any) -> None:
        reason = payload["reason"]
        self._spawn(
            self.request(
                payload["session_id"],
                reason,
                request_id=payload["request_id"],
                usage_ratio=payload.get("usage_ratio"),
                deadline_s=self.config.hard_deadline_s if reason == "hard" else None,
            )
        )

    async def _on_memory_clear(self, sender: Any, **payload: Any) -> dict[str, Any] | None:
        types = payload.get("types")
        if types is not None and "summary" not in types:
            return None
        assert self.memory is not None
        if payload.get("scope") == "all" or payload.get("session_id") is None:
            sessions = [s.session_id for s in await self.memory.list_sessions()]
        else:
            sessions = [payload["session_id"]]
        cancelled = 0
        for session_id in sessions:
            task = self._running.get(session_id)
            if task is not None and not task.done():
                task.cancel()
                cancelled += 1
                await asyncio.wait({task})  # its last writes start as it ends (_after_run)
            await self._tail_done(session_id)  # a marker lands before the clear, not after
            await self.memory.clear(session_id, [SUMMARY_NAMESPACE])
            self._state.pop(session_id, None)
        self._blocks.clear()
        return {"summary": {"sessions": len(sessions), "cancelled": cancelled}}

    async def _on_messages_deleted(self, sender: Any, **payload: Any) -> None:
        assert self.memory is not None
        session_id, seqs = payload["session_id"], payload["seqs"]
        for _ in range(3):
            snap = await self.memory.snapshot(session_id)
            record = read_record(snap.record, snap.epoch)
            if record is None or not seqs or min(seqs) > record.covered_up_to_seq:
                return
            record = record.model_copy(update={"stale": True, "updated_at": time.time()})
            assert snap.record is not None
            if (
                await self.memory.save_metadata(
                    SUMMARY_NAMESPACE,
                    session_id,
                    dump_record(record),
                    expected_version=snap.record.version,
                )
                is not None
            ):
                self._spawn(self.rebuild(session_id))
                return

    # -- requests ------------------------------------------------------------------------------
    def _session(self, session_id: str) -> SessionState:
        """The session's per-turn state, most recently used last; past ``MAX_TRACKED_SESSIONS``
        the least recently used is forgotten (it is a hint: that session's next turn reads its
        numbers from the store again, as on its first turn in this process)."""
        state = self._state.get(session_id)
        if state is None:
            state = self._state[session_id] = SessionState()
            while len(self._state) > MAX_TRACKED_SESSIONS:
                self._state.popitem(last=False)
        else:
            self._state.move_to_end(session_id)
        return state

    def _request_id(self, session_id: str) -> str:
        return f"{PLUGIN_NAME}:{session_id}:{next(self._ids)}"

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _emit(
        self, request_id: str, session_id: str, status: str, reason: str, stats: dict[str, Any]
    ) -> None:
        if self.host is None:
            return
        await self.host.bus.send(
            signals.SESSION_COMPRESSING,
            request_id=request_id,
            session_id=session_id,
            status=status,
            reason=reason,
            stats=stats,
        )

    async def request(
        self,
        session_id: str,
        reason: str,
        *,
        request_id: str | None = None,
        usage_ratio: float | None = None,
        deadline_s: float | None = None,
        look_again: Callable[[dict[str, Any]], bool] | None = None,
        snapshot: Snapshot | None = None,
    ) -> dict[str, Any]:
        """Compress a session (joining a compression already running for it) and report. Returns
        the final status ``{"status", "reason", "stats"}``; never raises for a failed
        compression. A blocking request that joined a run looks again afterwards (that run was
        planned on an older snapshot) unless ``look_again(result of the joined run)`` says no.
        ``snapshot``: a consistent read the caller already holds (the prompt's view); a run this
        request starts uses it instead of reading again (the commit's compare-and-set on version
        and epoch still catches anything written since, and a lost race reads afresh)."""
        request_id = request_id or self._request_id(session_id)
        final: dict[str, Any] = {"status": "error", "reason": "cancelled", "stats": {}}
        await self._emit(request_id, session_id, "start", reason, {"usage_ratio": usage_ratio})
        try:
            deadline = None if deadline_s is None else time.monotonic() + deadline_s
            joined = session_id in self._running
            final = await self._join_or_run(session_id, reason, deadline, snapshot)
            if joined and reason == "hard" and (look_again is None or look_again(final)):
                # The run this request joined was built on an older snapshot: look again.
                again = await self._join_or_run(session_id, reason, deadline)
                if again["status"] == "done" or final["status"] != "done":
                    final = again
        except asyncio.CancelledError:
            final = {"status": "error", "reason": "cancelled (host shutting down)", "stats": {}}
            raise
        except Exception as exc:  # a bug must cost a compression, not a turn
            log.exception("compression of %s failed", session_id)
            final = {"status": "error", "reason": f"{type(exc).__name__}: {exc}", "stats": {}}
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(
                    self._emit(
                        request_id, session_id, final["status"], final["reason"], final["stats"]
                    )
                )
        return final

    async def _join_or_run(
        self,
        session_id: str,
        reason: str,
        deadline: float | None,
        snapshot: Snapshot | None = None,
    ) -> dict[str, Any]:
        task = self._running.get(session_id)
        joined = task is not None and not task.done()
        if joined and reason == "hard" and session_id in self._queued:
            # The running request still waits for a slot under max_concurrent_summaries; a
            # blocking request bypasses the cap instead of queueing behind it (the lease keeps
            # the two runs apart; the queued one then finds less or nothing to do).
            joined = False
        if not joined:
            task = asyncio.ensure_future(self._run(session_id, reason, deadline, snapshot))
            self._running[session_id] = task
            task.add_done_callback(lambda t, s=session_id: self._forget(self._running, s, t))
        try:
            if joined and deadline is not None:
                # A run started without our deadline may take a summarizer's full timeout: a
                # blocking request waits for it only until its own deadline (asyncio.wait never
                # cancels the run, and a TimeoutError of the run itself is not ours to rename).
                done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
                if not done:
                    return {
                        "status": "error",
                        "reason": "deadline passed while another compression of this session ran",
                        "stats": {},
                    }
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and not (current is not None and current.cancelling()):
                return {"status": "skipped", "reason": "cancelled by memory:clear", "stats": {}}
            raise

    @staticmethod
    def _forget(table: dict[str, Any], session_id: str, task: asyncio.Task[Any]) -> None:
        """Drop ``table[session_id]`` if it is still ``task`` (a newer one may have replaced it)."""
        if table.get(session_id) is task:
            del table[session_id]

    async def _run(
        self,
        session_id: str,
        reason: str,
        deadline: float | None,
        snapshot: Snapshot | None = None,
    ) -> dict[str, Any]:
        assert self._semaphore is not None
        if reason == "hard":  # blocking requests bypass the global cap
            return await self._run_leased(session_id, reason, deadline, snapshot, None)
        slot = SummarizerSlot(self._semaphore)
        self._queued.add(session_id)
        try:
            await slot.acquire()
        finally:
            self._queued.discard(session_id)
        try:
            return await self._run_leased(session_id, reason, deadline, snapshot, slot)
        finally:
            slot.release()

    async def _run_leased(
        self,
        session_id: str,
        reason: str,
        deadline: float | None,
        snapshot: Snapshot | None,
        slot: SummarizerSlot | None,
    ) -> dict[str, Any]:
        """One run under the session's cross-process lease; ``slot`` (none for a blocking run)
        is taken before the lease and given back once the summarizer is done."""
        assert self.memory is not None
        await self._tail_done(session_id)  # this process's previous run gave its lease back
        await warm_up(self.llm, self._summary_model())  # slow first imports: before the lease
        # Renewed while the run lives (a crashed holder's lease runs out after lease_ttl_s);
        # released by the run's tail, after its marker.
        async with KeptLease(
            self.memory,
            f"{PLUGIN_NAME}:{session_id}",
            self.config.lease_ttl_s,
            deadline=deadline,
            release=False,
        ) as kept:
            lease = kept.lease
            if lease is None:
                return {
                    "status": "skipped",
                    "reason": LEASE_BUSY,
                    "stats": {},
                }
            markers: list[Message] = []
            try:
                for _ in range(3):
                    result = await self._compress_once(
                        session_id, reason, deadline, snapshot, markers, slot, lease
                    )
                    if result["status"] != _LOST_RACE:
                        return result
                    snapshot = None  # lost the race: read afresh
                return {
                    "status": "skipped",
                    "reason": "lost the commit race three times",
                    "stats": {},
                }
            except LeaseLost:
                return {"status": "skipped", "reason": LEASE_LOST, "stats": {}}
            finally:
                # The marker and the lease's release follow the result: a blocking request
                # returns as soon as the commit is in; the others wait for them too.
                tail = self._spawn(self._after_run(session_id, lease, markers))
                self._tails[session_id] = tail
                tail.add_done_callback(lambda t, s=session_id: self._forget(self._tails, s, t))
                if reason != "hard":
                    with contextlib.suppress(Exception):
                        await asyncio.shield(tail)

    async def _after_run(self, session_id: str, lease: LeaseToken, markers: list[Message]) -> None:
        """A run's last writes, under its lease: its event marker, then the lease's release."""
        assert self.memory is not None
        try:
            for marker in markers:  # only a run with an archive makes one
                try:
                    assert self.archive is not None
                    await self.archive.save_message(session_id, marker)
                except Exception:
                    log.exception("could not write the compression marker of %s", session_id)
        finally:
            with contextlib.suppress(Exception):
                await self.memory.release_lease(lease)

    async def _tail_done(self, session_id: str) -> None:
        """Wait for the last run's marker and lease release in this process (never raises)."""
        tail = self._tails.get(session_id)
        if tail is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(tail)

    # -- the pipeline --------------------------------------------------------------------------
    def _count(self, text: str) -> int:
        """Tokens of ``text`` for the summary model. A compression counts the same strings more
        than once (the rendering ``fit_to_budget`` accepted is the summary text; the previous
        summary was counted when it was written), so recent answers are kept."""
        tokens = self._counted.get(text)
        if tokens is None:
            assert self.llm is not None
            tokens = self.llm.count_tokens(text, self._summary_model() or self.llm.default_model)
            if len(self._counted) >= COUNT_MEMO_SIZE:
                del self._counted[next(iter(self._counted))]  # the oldest entry
            self._counted[text] = tokens
        return tokens

    def _framing_tokens(self, lang: str) -> int:
        return self._count(framing_overhead(lang))  # remembered by _count

    def _summary_model(self) -> str | None:
        assert self.llm is not None
        return self.config.summary_model or self.llm.default_model

    def _budget(self, context_window: int) -> int:
        assert self.llm is not None
        model = self._summary_model()
        max_out = self.llm.max_output_tokens(model) if model else None
        return summary_budget(
            context_window, self.config.summary_token_ratio, self.config.summary_max_tokens, max_out
        )

    def _batch_tokens(self, budget: int) -> int:
        if self.config.batch_tokens:
            return self.config.batch_tokens
        assert self.llm is not None
        model = self._summary_model()
        window = self.llm.context_window(model) if model else 16_000
        # Room for the prompt, the previous summary and the answer.
        return max(1000, int(window * 0.6) - 2 * budget - 1000)

    def _context_window(self, session_id: str) -> int:
        state = self._state.get(session_id)
        if state is not None and state.context_window:
            return state.context_window
        assert self.host is not None
        return self.host.context_window()

    def _language(self, conv: list[Message]) -> str:
        """The configured language, or the one of the conversation's own words (tool payloads,
        often English JSON, left out)."""
        if self.config.language != "auto":
            return self.config.language
        from .prompts import detect_language

        return detect_language(
            text_of(m.content)
            for m in conv[-40:]
            if m.role in ("user", "assistant") and not m.tool_calls
        )

    def _refresh_state(self, snap: Snapshot) -> SessionState:
        state = self._session(snap.session_id)
        conv = conversation_messages(snap.messages)
        record = read_record(snap.record, snap.epoch)
        state.active = len(conv)
        state.last_seq = snap.last_seq or 0
        state.synced, state.syncing = True, False
        if record is None:
            state.turns_since = None
        else:
            state.turns_since = sum(
                1 for m in conv if m.role == "user" and (m.seq or 0) > record.compressed_at_seq
            )
        return state

    def _block(
        self, session_id: str, version: int, record: SummaryRecord, window: int
    ) -> tuple[str, int]:
        """The injected block for a record version, cut to the budget with the same counter that
        measures it; cached per version so the per-turn cost does not grow with anything."""
        budget = self._budget(window)
        key = (session_id, version, budget)
        cached = self._blocks.get(key)
        if cached is not None:
            return cached
        block = wrap_summary_block(record.text, record.lang)
        tokens = self._count(block)
        if tokens > budget:
            text = record.text
            lo, hi = 0, len(text)
            while lo < hi:  # longest prefix whose block fits
                mid = (lo + hi + 1) // 2
                if self._count(wrap_summary_block(cut_text(text, mid), record.lang)) <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            block = wrap_summary_block(cut_text(text, lo), record.lang)
            tokens = self._count(block)
        if len(self._blocks) > 4096:
            self._blocks.clear()
        self._blocks[key] = (block, tokens)
        return block, tokens

    def _plan(
        self,
        messages: list[Message],
        reason: str,
        breakdown: dict[str, int],
        window: int,
        budget: int,
    ) -> CompressionPlan:
        cfg = self.config
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
            min_gain=cfg.min_gain,
            breakdown=breakdown,
            summary_budget_tokens=budget,
            batch_tokens=self._batch_tokens(budget),
            max_batches=cfg.max_batches_per_run,
        )

    def _cool_down(
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

    async def _compress_once(
        self,
        session_id: str,
        reason: str,
        deadline: float | None,
        snapshot: Snapshot | None,
        markers: list[Message],
        slot: SummarizerSlot | None = None,
        lease: LeaseToken | None = None,
    ) -> dict[str, Any]:
        """One attempt; the event marker of a committed run goes to ``markers`` (written after
        the result, see ``_after_run``). ``slot`` is held while the summarizer works and given
        back before the commit, so the cap counts summarizer work, not store round trips (an
        attempt after a lost race takes it again)."""
        assert self.memory is not None and self.llm is not None
        cfg = self.config
        started = time.monotonic()
        snap = snapshot if snapshot is not None else await self.memory.snapshot(session_id)
        state = self._refresh_state(snap)
        record = read_record(snap.record, snap.epoch)
        conv = conversation_messages(snap.messages)
        window = self._context_window(session_id)
        budget = self._budget(window)
        plan = self._plan(snap.messages, reason, state.breakdown, window, budget)
        if plan.skip is not None:
            if plan.blocked is not None:
                self._cool_down(session_id, state, plan.blocked, conv[-1].seq)
            stats = {} if plan.gain is None else {"gain": plan.gain}
            return {"status": "skipped", "reason": plan.skip, "stats": stats}
        batches = plan.batches
        covered = batches[-1][-1].seq or 0
        archived_tokens = plan.archived_tokens
        # What these messages and the summary take in the context now.
        old_summary_tokens = self._count(record.text) if record else 0
        tokens_before = sum(m.tokens or 0 for m in conv) + old_summary_tokens
        stats: dict[str, Any] = {
            "trigger": reason,
            "messages_summarized": 0,
            "tokens_before": tokens_before,
            "model": None,
            "cost": 0.0,
            "fallback": None,
        }
        if cfg.strategy == "window":
            archived = await self.memory.trim_history(
                session_id, up_to_seq=covered, reason="window", lease=lease
            )
            stats.update(messages_archived=len(archived), fallback=None)
            return await self._finish(
                session_id,
                stats,
                started,
                tokens_before - archived_tokens,
                "done",
                "window",
                counters_after_run(snap.messages, covered, 0),
            )
        lang = self._language(conv)
        model = self._summary_model()
        from .summarize import summarize_batches

        if slot is not None:
            await slot.acquire()
        outcome = await summarize_batches(
            record.payload if record else None,
            batches,
            llm=self.llm,
            model=model,
            config=cfg,
            budget=budget,
            lang=lang,
            redactor=self.redactor,
            count_tokens=self._count,
            deadline=deadline,
            text_budget=budget - self._framing_tokens(lang),
        )
        if slot is not None:
            slot.release()
        stats.update(
            model=model,
            engine="llm" if model and not outcome.fallback else "rules",
            cost=outcome.cost,
            fallback=outcome.fallback,
            llm_calls=outcome.llm_calls,
        )
        status = "error" if outcome.errors else "done"
        why = "; ".join(outcome.errors + outcome.notes) or reason
        if outcome.batches_done == 0:
            archived = await self.memory.trim_history(
                session_id, up_to_seq=covered, reason="fallback-trim", lease=lease
            )
            stats.update(messages_archived=len(archived))
            return await self._finish(
                session_id,
                stats,
                started,
                tokens_before - archived_tokens,
                status,
                why,
                counters_after_run(snap.messages, covered, 0),
            )
        covered_now = batches[outcome.batches_done - 1][-1].seq or 0
        summarized = [m for b in batches[: outcome.batches_done] for m in b]
        now = time.time()
        text = render_payload(outcome.payload, lang)
        new = SummaryRecord(
            text=text,
            payload=outcome.payload,
            lang=lang,
            covered_up_to_seq=covered_now,
            epoch=snap.epoch,
            compressed_at_seq=snap.last_seq or 0,
            messages_summarized=(record.messages_summarized if record else 0) + len(summarized),
            compressions=(record.compressions if record else 0) + 1,
            model=model if outcome.llm_calls and not outcome.errors else None,
            cost=(record.cost if record else 0.0) + outcome.cost,
            fallback=outcome.fallback,
            created_at=record.created_at if record else now,
            updated_at=now,
        )
        won = await self.memory.commit_compression(
            session_id,
            dump_record(new),
            expected_version=snap.record.version if snap.record else 0,
            archive_through_seq=covered_now,
            epoch=snap.epoch,
            lease=lease,
        )
        if not won:
            if await self.memory.get_epoch(session_id) != snap.epoch:
                return {
                    "status": "skipped",
                    "reason": "session cleared during compression",
                    "stats": {},
                }
            return {"status": _LOST_RACE, "reason": "", "stats": {}}
        # The block the next prompt injects, built now (off the turn for a background run); the
        # record's version grows by one on every write, so the commit made it expected + 1.
        _, block_tokens = self._block(
            session_id, (snap.record.version if snap.record else 0) + 1, new, window
        )
        if covered_now < covered:  # trim fallback stopped early: the rest is only archived
            await self.memory.trim_history(
                session_id, up_to_seq=covered, reason="fallback-trim", lease=lease
            )
        summary_tokens = self._count(text)
        stats.update(
            messages_summarized=len(summarized),
            summary_tokens=summary_tokens,
            block_tokens=block_tokens,  # what the injected block takes, framing included
            covered_up_to_seq=covered_now,
        )
        if self.archive is not None:
            marker = Message(
                role="system",
                kind="event-marker",
                content=(
                    f"[memory-summary] {len(summarized)} messages summarized "
                    f"(through seq {covered_now})"
                ),
                metadata={
                    "plugin": PLUGIN_NAME,
                    "covered_up_to_seq": covered_now,
                    "trigger": reason,
                },
            )
            markers.append(marker)
        tokens_after = tokens_before - archived_tokens - old_summary_tokens + summary_tokens
        # Archived through ``covered``: summarized to ``covered_now``, trimmed past it if short.
        after = counters_after_run(snap.messages, covered, len(markers))
        return await self._finish(session_id, stats, started, tokens_after, status, why, after)

    async def _finish(
        self,
        session_id: str,
        stats: dict[str, Any],
        started: float,
        tokens_after: int,
        status: str,
        why: str,
        after: tuple[int, int],
    ) -> dict[str, Any]:
        """Report a run that changed the history, and set the session's per-turn counters to
        what it left (``counters_after_run``): no read of the store for them, on the turn or
        after it. They are a hint, as always: turns taken while the run went are not counted
        toward ``debounce_turns``, and a blocking run, which read the prompt's view (markers
        left out), may count an earlier run's newest marker as a message; every run plans
        again on what it reads."""
        stats["tokens_after"] = tokens_after
        stats["duration_s"] = round(time.monotonic() - started, 4)
        state = self._session(session_id)
        state.active, state.last_seq = after
        state.turns_since = 0
        state.synced, state.syncing = True, False
        return {"status": status, "reason": why, "stats": stats}

    # -- public API ----------------------------------------------------------------------------
    async def get_conversation_summary(self, session_id: str) -> str | None:
        """The current summary text of a session, or ``None``."""
        record = await self.show(session_id)
        return record.text if record and record.text else None

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no background compression of this process runs; return whether it is
        idle (``False`` when ``timeout`` passed first). For hosts that want to settle before
        reading the store, and for tests."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while pending := [t for t in self._background if not t.done()]:
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return False
            await asyncio.wait(pending, timeout=left)
        return True

    async def show(self, session_id: str) -> SummaryRecord | None:
        assert self.memory is not None
        entry = await self.memory.get_metadata(SUMMARY_NAMESPACE, session_id)
        return read_record(entry, await self.memory.get_epoch(session_id))

    async def compress(self, session_id: str, reason: str = "manual") -> dict[str, Any]:
        """Compress now (ignoring ``threshold``) and return the final status."""
        return await self.request(session_id, reason)

    async def memory_context(self, session_id: str, recent: int | None = None) -> MemoryContext:
        assert self.memory is not None
        snap = await self.memory.snapshot(session_id)
        record = read_record(snap.record, snap.epoch)
        conv = conversation_messages(snap.messages)
        if recent is not None:
            conv = conv[-recent:]
        return MemoryContext(
            session_id=session_id,
            summary=record.text if record else None,
            payload=record.payload if record else None,
            recent_transcript=render_transcript(
                conv,
                tool_truncate_chars=self.config.tool_truncate_chars,
                message_truncate_chars=self.config.message_truncate_chars,
                lang=record.lang if record else "en",
            ),
            covered_up_to_seq=record.covered_up_to_seq if record else 0,
            summary_version=snap.record.version if snap.record else 0,
            active_messages=len(conversation_messages(snap.messages)),
        )

    async def _update_record(
        self, session_id: str, change: Callable[[SummaryRecord], SummaryRecord]
    ) -> SummaryRecord:
        """Read-modify-write of the record with compare-and-set, retried on a concurrent write."""
        assert self.memory is not None
        for _ in range(10):
            snap = await self.memory.snapshot(session_id)
            record = read_record(snap.record, snap.epoch) or SummaryRecord(
                epoch=snap.epoch, created_at=time.time()
            )
            updated = change(record).model_copy(update={"updated_at": time.time()})
            version = await self.memory.save_metadata(
                SUMMARY_NAMESPACE,
                session_id,
                dump_record(updated),
                expected_version=snap.record.version if snap.record else 0,
            )
            if version is not None:
                return updated
        raise RuntimeError(f"summary of {session_id} kept changing; edit not saved")

    async def edit(self, session_id: str, text: str) -> SummaryRecord:
        """Replace the summary's prose; the structured fields and pinned facts stay."""

        def change(record: SummaryRecord) -> SummaryRecord:
            payload = record.payload.model_copy(update={"summary": text})
            return record.model_copy(
                update={"payload": payload, "text": render_payload(payload, record.lang)}
            )

        return await self._update_record(session_id, change)

    async def pin(self, session_id: str, fact: str) -> SummaryRecord:
        """Pin a fact: every later merge keeps it verbatim."""

        def change(record: SummaryRecord) -> SummaryRecord:
            pinned = list(dict.fromkeys([*record.payload.pinned_facts, fact]))
            payload = record.payload.model_copy(update={"pinned_facts": pinned})
            return record.model_copy(
                update={"payload": payload, "text": render_payload(payload, record.lang)}
            )

        return await self._update_record(session_id, change)

    async def unpin(self, session_id: str, fact: str) -> SummaryRecord | None:
        """Unpin a fact; ``None`` (and nothing written) when the session has no summary."""
        if await self.show(session_id) is None:
            return None

        def change(record: SummaryRecord) -> SummaryRecord:
            pinned = [f for f in record.payload.pinned_facts if f != fact]
            payload = record.payload.model_copy(update={"pinned_facts": pinned})
            return record.model_copy(
                update={"payload": payload, "text": render_payload(payload, record.lang)}
            )

        return await self._update_record(session_id, change)

    async def rebuild(self, session_id: str) -> dict[str, Any]:
        """Re-summarize from the archived (summarized) and active messages of the current epoch;
        pinned facts stay."""
        from .prompts import detect_language
        from .summarize import summarize_batches

        assert self.memory is not None and self.llm is not None
        snap = await self.memory.snapshot(session_id)
        record = read_record(snap.record, snap.epoch)
        archived = [
            m
            for m in await self.memory.get_archived(session_id, epoch=snap.epoch)
            if m.archived == "summarized"
        ]
        archived = conversation_messages(archived)
        if record is None and not archived:
            # Nothing summarized yet: there is no summary to rebuild, only history to compress.
            return await self.request(session_id, "manual")
        start = SummaryPayload(pinned_facts=record.payload.pinned_facts if record else [])
        window = self._context_window(session_id)
        budget = self._budget(window)
        lang = (
            record.lang if record else detect_language(text_of(m.content) for m in archived[-40:])
        )
        if archived:
            outcome = await summarize_batches(
                start,
                split_batches(archived, self._batch_tokens(budget)),
                llm=self.llm,
                model=self._summary_model(),
                config=self.config,
                budget=budget,
                lang=lang,
                redactor=self.redactor,
                count_tokens=self._count,
                text_budget=budget - self._framing_tokens(lang),
            )
            payload = outcome.payload
        else:
            payload = start
        now = time.time()
        covered = max([record.covered_up_to_seq if record else 0, *[m.seq or 0 for m in archived]])
        new = SummaryRecord(
            text=render_payload(payload, lang) if archived or payload.pinned_facts else "",
            payload=payload,
            lang=lang,
            covered_up_to_seq=covered,
            epoch=snap.epoch,
            compressed_at_seq=record.compressed_at_seq if record else 0,
            messages_summarized=len(archived),
            compressions=(record.compressions if record else 0),
            created_at=record.created_at if record else now,
            updated_at=now,
        )
        won = await self.memory.commit_compression(
            session_id,
            dump_record(new),
            expected_version=snap.record.version if snap.record else 0,
            archive_through_seq=covered,
            epoch=snap.epoch,
        )
        self._blocks.clear()
        if not won:
            return {"status": "skipped", "reason": "summary changed during rebuild", "stats": {}}
        result = await self.request(session_id, "manual")
        result.setdefault("stats", {})["rebuilt_from"] = len(archived)
        return result
