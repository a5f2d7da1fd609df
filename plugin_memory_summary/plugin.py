"""The plugin: hook implementations and signal receivers feeding one compression pipeline.

The work is done elsewhere: the ``pipeline`` package (``scheduler``: single flight, cap, lease,
every task; ``pipeline``: the compression as named steps) and the ``prompt`` package (``state``:
per-session numbers between turns; ``tokens``: budgets, token counts, the injected block). The
hooks that extend the host itself (CLI and chat commands, docs) are the ``extras`` package's,
loaded through their own entry point.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from host_stub import signals
from host_stub.hookspecs import Contribution, PromptView, hookimpl
from host_stub.services import (
    SUMMARY_NAMESPACE,
    HostProtocol,
    LLMService,
    MemoryService,
    MessageArchiveService,
)

from ._name import PLUGIN_NAME
from .base import (
    MemorySummaryConfig,
    Result,
    hard_triggered,
    result,
    soft_triggered,
    turn_triggered,
)
from .pipeline import (
    LEASE_BUSY,
    LEASE_LOST,
    NotStartedError,
    Parts,
    Pipeline,
    Scheduler,
    compress_before_call,
    mark_stale,
    rebuild,
    update_record,
)
from .prompt import (
    MAX_TRACKED_SESSIONS,
    MemoryContext,
    SessionTable,
    TokenBook,
    fitted_replacements,
    memory_context,
    summary_contribution,
)
from .record import SummaryRecord, read_record, with_pinned, with_text, without_pinned
from .safety import Redactor, neutralise
from .summarizer import warm_up

# The summarizer (``summarizer.summarize``, and through it ``summarizer.prompts`` and the rules
# engine) is imported by the compression path on first use: a host that only injects an existing
# summary never loads it.

__all__ = [
    "LEASE_BUSY",
    "LEASE_LOST",
    "MAX_TRACKED_SESSIONS",
    "PLUGIN_NAME",
    "MemoryContext",
    "MemorySummaryPlugin",
]

log = logging.getLogger("plugin_memory_summary")


class MemorySummaryPlugin:
    """One instance per host (the entry point names :func:`create_plugin`); the hooks that
    extend the host's CLI, chat and docs are in :class:`~.extras.HostExtensions`, a plugin of
    its own."""

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.config = MemorySummaryConfig()
        self.redactor = Redactor()
        #: Per-session numbers between turns (a hint; every run reads the store).
        self.sessions = SessionTable()
        self._parts: Parts | None = None
        self._receivers: list[tuple[str, Callable[..., Any]]] = []

    # -- the parts, set at start-up ------------------------------------------------------------
    @property
    def parts(self) -> Parts:
        """The services and workers ``startup`` set, in one bundle."""
        if self._parts is None:
            raise NotStartedError("the memory-summary plugin is not started (no startup hook yet)")
        return self._parts

    @property
    def host(self) -> HostProtocol:
        return self.parts.host

    @property
    def memory(self) -> MemoryService:
        return self.parts.memory

    @memory.setter
    def memory(self, memory: MemoryService) -> None:
        """Swap the plugin's handle on the store (to wrap it, e.g. for tracing); the host
        keeps its own."""
        self.pipeline.memory = self.scheduler.memory = memory
        self._parts = dataclasses.replace(self.parts, memory=memory)

    @property
    def tokens(self) -> TokenBook:
        """Budgets and token counts with the summary model's tokenizer."""
        return self.parts.tokens

    @property
    def pipeline(self) -> Pipeline:
        return self.parts.pipeline

    @property
    def scheduler(self) -> Scheduler:
        """Every compression and background task of this plugin instance."""
        return self.parts.scheduler

    # -- hooks ---------------------------------------------------------------------------------
    @hookimpl
    def plugin_config_schema(self) -> type[BaseModel]:
        return MemorySummaryConfig

    @hookimpl
    def plugin_models(self, config: MemorySummaryConfig, default_model: str | None) -> list[str]:
        model = config.summary_model or default_model
        return [model] if model else []

    @hookimpl
    def startup(
        self,
        host: HostProtocol,
        config: MemorySummaryConfig,
        memory: MemoryService,
        llm: LLMService,
        message_archive: MessageArchiveService | None,
    ) -> None:
        self.config = config
        self.redactor = Redactor(config.redact_patterns)
        tokens = TokenBook(config, llm)
        pipeline = Pipeline(
            config,
            host=host,
            memory=memory,
            llm=llm,
            archive=message_archive,
            tokens=tokens,
            sessions=self.sessions,
            redactor=self.redactor,
            name=PLUGIN_NAME,
        )
        scheduler = Scheduler(
            config,
            memory,
            message_archive,
            pipeline.compress_once,
            self._emit,
            PLUGIN_NAME,
            warm=lambda: warm_up(llm, tokens.summary_model()),
        )
        self._parts = Parts(host, memory, tokens, pipeline, scheduler)
        receivers: tuple[tuple[str, Callable[..., Any]], ...] = (
            (signals.AGENT_TURN_AFTER, self._on_turn_after),
            (signals.TOKEN_USAGE, self._on_token_usage),
            (signals.SESSION_COMPRESS, self._on_session_compress),
            (signals.MEMORY_MESSAGES_DELETED, self._on_messages_deleted),
        )
        for name, receiver in receivers:
            host.bus.connect(name, receiver, typed=True)
            self._receivers.append((name, receiver))

    @hookimpl
    def agent_prompt(self, view: PromptView) -> Contribution | None:
        state = self.sessions.get(view.session_id)
        state.context_window = view.context_window
        return summary_contribution(view, state, self.pipeline, PLUGIN_NAME)

    @hookimpl
    def prune_history(self, view: PromptView) -> dict[int, str] | None:
        state = self.sessions.get(view.session_id)
        return fitted_replacements(view, state, self.pipeline, PLUGIN_NAME) or None

    @hookimpl
    async def before_model_call(self, view: PromptView) -> None:
        if self.config.strategy == "off":
            return
        state = self.sessions.get(view.session_id)
        state.context_window = view.context_window
        state.breakdown = dict(view.breakdown)
        await compress_before_call(view, state, self.pipeline, self.scheduler)

    @hookimpl
    async def memory_clear(
        self, scope: str, session_id: str | None, types: list[str] | None
    ) -> dict[str, Any] | None:
        """Clear the summaries (type ``summary``) of one session or all, cancelling their runs."""
        if types is not None and "summary" not in types:
            return None
        if scope == "all" or session_id is None:
            sessions = [s.session_id for s in await self.memory.list_sessions()]
        else:
            sessions = [session_id]
        cancelled = 0
        for sid in sessions:
            cancelled += await self.scheduler.cancel(sid)
            await self.memory.clear(sid, [SUMMARY_NAMESPACE])
            self.sessions.forget(sid)
        self.tokens.forget_blocks()
        return {"summary": {"sessions": len(sessions), "cancelled": cancelled}}

    @hookimpl
    async def shutdown(self) -> None:
        for name, receiver in self._receivers:
            self.host.bus.disconnect(name, receiver)
        self._receivers.clear()
        if self._parts is not None:
            await self._parts.scheduler.drain(self.config.shutdown_grace_s)

    @hookimpl
    def agent_tools(self) -> list[Any]:
        from .recall import recall_tools  # memory_search and memory_expand

        return recall_tools(self.memory, self.tokens.llm, self.config.recall_tokens)

    # -- receivers -----------------------------------------------------------------------------
    async def _on_turn_after(self, sender: Any, event: signals.AgentTurnAfter) -> None:
        if self.config.strategy == "off":
            return
        session_id = event.session_id
        state = self.sessions.get(session_id)
        if not state.synced:
            if not state.syncing:
                state.syncing = True
                self.scheduler.spawn(self._cold_turn_check(session_id, event.outcome))
            return
        user, reply = event.message, event.reply
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
        if self._turn_triggers(session_id, event.outcome):
            self.scheduler.spawn(self.scheduler.request(session_id, "turn"))

    def _turn_triggers(self, session_id: str, outcome: str) -> bool:
        state = self.sessions.get(session_id)
        return (
            turn_triggered(
                outcome,
                state.active,
                self.config.threshold,
                state.turns_since,
                self.config.debounce_turns,
            )
            and session_id not in self.scheduler.running
        )

    async def _cold_turn_check(self, session_id: str, outcome: str) -> None:
        """First turn seen of a session in this process: learn its numbers from the store."""
        self.sessions.refresh(await self.memory.snapshot(session_id))
        if self._turn_triggers(session_id, outcome):
            await self.scheduler.request(session_id, "turn")

    async def _on_token_usage(self, sender: Any, event: signals.TokenUsage) -> None:
        if self.config.strategy == "off":
            return
        session_id = event.session_id
        state = self.sessions.get(session_id)
        state.context_window = event.context_window
        state.breakdown = event.breakdown.model_dump()
        if not soft_triggered(
            event.usage_ratio,
            self.config.auto_compress_threshold,
            dry_run=event.dry_run,
            rebuilt=event.rebuilt,
        ):
            return
        if hard_triggered(
            event.usage_ratio, self.config.hard_compress_threshold, dry_run=event.dry_run
        ):
            return  # the blocking compression in before_model_call, right after, does it
        cooling = time.monotonic() < state.cooldown_until and state.blocked_seq == state.last_seq
        if session_id in self.scheduler.running or cooling:
            return
        # The plugin's own request goes to its scheduler, not through a signal to itself; it
        # reports on ``session:compressing`` as every request does (``start``, reason ``auto``).
        self._request_in_background(session_id, "auto", usage_ratio=event.usage_ratio)

    async def _on_session_compress(self, sender: Any, event: signals.SessionCompress) -> None:
        """Another party (the host, a CLI, another plugin) asks for a compression."""
        self._request_in_background(
            event.session_id,
            event.reason,
            request_id=event.request_id,
            usage_ratio=event.usage_ratio,
        )

    def _request_in_background(
        self,
        session_id: str,
        reason: str,
        *,
        request_id: str | None = None,
        usage_ratio: float | None = None,
    ) -> None:
        self.scheduler.spawn(
            self.scheduler.request(
                session_id,
                reason,
                request_id=request_id,
                usage_ratio=usage_ratio,
                deadline_s=self.config.hard_deadline_s if reason == "hard" else None,
            )
        )

    async def _on_messages_deleted(self, sender: Any, event: signals.MemoryMessagesDeleted) -> None:
        session_id = event.session_id
        if await mark_stale(self.memory, session_id, event.seqs):
            self.scheduler.spawn(self.rebuild(session_id))

    async def _emit(
        self, request_id: str, session_id: str, status: str, reason: str, stats: dict[str, Any]
    ) -> None:
        if self._parts is None:
            return
        await self._parts.host.bus.send(
            signals.SESSION_COMPRESSING,
            request_id=request_id,
            session_id=session_id,
            status=status,
            reason=reason,
            stats=stats,
        )

    # -- public API ----------------------------------------------------------------------------
    async def get_conversation_summary(self, session_id: str) -> str | None:
        """The current summary text of a session, or ``None``. Chat-template tokens, role
        headers and the block's delimiters in it are made inert as in the injected block
        (:func:`.safety.neutralise`): a caller may well put it into a prompt. :meth:`show`
        gives the record as stored."""
        record = await self.show(session_id)
        return neutralise(record.text) if record and record.text else None

    async def request(
        self,
        session_id: str,
        reason: str,
        *,
        request_id: str | None = None,
        usage_ratio: float | None = None,
        deadline_s: float | None = None,
    ) -> Result:
        """Compress a session for ``reason`` (joining a running compression; ``hard`` with a
        ``deadline_s`` is what ``before_model_call`` does) and return the final status
        ``{"status", "reason", "stats"}``; never raises for a failed compression."""
        return await self.scheduler.request(
            session_id,
            reason,
            request_id=request_id,
            usage_ratio=usage_ratio,
            deadline_s=deadline_s,
        )

    async def compress(self, session_id: str, reason: str = "manual") -> Result:
        """Compress now (ignoring ``threshold``) and return the final status."""
        return await self.scheduler.request(session_id, reason)

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no background compression of this process runs; return whether it is
        idle (``False`` when ``timeout`` passed first). For hosts that want to settle before
        reading the store, and for tests."""
        return await self.scheduler.wait_idle(timeout)

    async def show(self, session_id: str) -> SummaryRecord | None:
        entry = await self.memory.get_metadata(SUMMARY_NAMESPACE, session_id)
        return read_record(entry, await self.memory.get_epoch(session_id))

    async def memory_context(self, session_id: str, recent: int | None = None) -> MemoryContext:
        """The summary, its payload and the recent transcript (``recent`` newest messages)."""
        return memory_context(await self.memory.snapshot(session_id), self.config, recent)

    async def edit(self, session_id: str, text: str) -> SummaryRecord:
        """Replace the summary's prose; the structured fields and pinned facts stay."""
        return await update_record(self.memory, session_id, lambda r: with_text(r, text))

    async def pin(self, session_id: str, fact: str) -> SummaryRecord:
        """Pin a fact: every later merge keeps it verbatim."""
        return await update_record(self.memory, session_id, lambda r: with_pinned(r, fact))

    async def unpin(self, session_id: str, fact: str) -> SummaryRecord | None:
        """Unpin a fact; ``None`` (and nothing written) when the session has no summary."""
        if await self.show(session_id) is None:
            return None
        return await update_record(self.memory, session_id, lambda r: without_pinned(r, fact))

    async def rebuild(self, session_id: str) -> Result:
        """Re-summarize from the archived (summarized) and active messages of the current epoch;
        pinned facts stay."""
        rebuilt = await rebuild(self.pipeline, session_id)
        if rebuilt.status == "lost":
            return result("skipped", "summary changed during rebuild")
        final = await self.scheduler.request(session_id, "manual")
        if rebuilt.status == "committed":
            final = result(
                final.status, final.reason, {**final.stats, "rebuilt_from": rebuilt.messages}
            )
        return final
