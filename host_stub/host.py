"""The reference host: plugins, services, the bus and the agent loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pluggy

from . import signals
from .bus import EventBus, await_me_maybe
from .calibration import Calibration, applied_ratio, calibrated_window
from .checks import check_message, cut_to_limit
from .config import ConfigError, HostConfig
from .counting import PromptCounts
from .hookspecs import AgentTool, Contribution, PromptView, ToolContext
from .messages import Message, ToolCall, ToolCallFunction
from .plugins import LoadedPlugin, check_services, get_plugin_manager, plugin_config
from .prompt import (
    apply_replacements,
    assemble_prompt,
    history_breakdown,
    known_counts,
    prefix_reuse,
    sanitize_tool_pairs,
    shared_messages,
)
from .services import LLMService, MemoryService, OpensAtStart, Snapshot
from .session_ids import check_session_id
from .store_watch import TurnWaits, WriteCounter, reads_with_append, snapshot_key
from .tools import ToolRegistry

__all__ = ["WARMING_UP", "Host", "MemoryMessageArchive", "TurnResult", "open_host"]

log = logging.getLogger("host_stub.host")

_T = TypeVar("_T")

#: True in the task that builds a session's next prompt in the background after an archive
#: (see ``Host._archived``): work done there is not part of any turn.
WARMING_UP: ContextVar[bool] = ContextVar("warming_up", default=False)


class NoModelConfigured(RuntimeError):
    """A turn that needs a model, on a host that has none (its own LLM service, no model set)."""


#: Used to size the window and count tokens when the host has no chat model (replay only).
REPLAY_MODEL = "gpt-4o-mini"

#: Characters of the last prompts sent that the host keeps, to measure each session's next
#: prompt's prefix reuse (the least recently used sessions go first).
LAST_PROMPTS_CHARS = 16_000_000


@dataclass
class SentPrompt:
    """The last prompt sent in a session, each message's tokens, and its characters."""

    messages: list[dict[str, Any]]
    tokens: list[int]
    chars: int


class MemoryMessageArchive:
    """The reference ``message-archive``: event markers go into the session's own store, where
    the agent loop leaves them out of prompts and plugins leave them out of counts."""

    def __init__(self, memory: MemoryService) -> None:
        self._memory = memory

    async def save_message(self, session_id: str, message: Message) -> None:
        await self._memory.append(session_id, [message])


@dataclass
class PreparedCall:
    """A prompt :meth:`Host.prepare_call` built: the messages to send, for each of them the
    stored history message it stands for (``None`` for what the host or a plugin added: the
    system prompt, a summary block), and the measured usage."""

    prompt: list[dict[str, Any]]
    sources: list[Message | None]
    usage: signals.TokenUsage


@dataclass
class TurnResult:
    session_id: str
    outcome: str
    reply: Message | None = None
    messages: list[Message] = field(default_factory=list)
    usage: list[signals.TokenUsage] = field(default_factory=list)
    sent: list[list[dict[str, Any]]] = field(default_factory=list)
    error: str | None = None


class Host:
    """Start with :meth:`start`, stop with :meth:`stop` (or use :func:`open_host`)."""

    def __init__(
        self,
        config: HostConfig | None = None,
        *,
        memory: MemoryService | None = None,
        llm: LLMService | None = None,
        plugins: Sequence[tuple[str, Any]] = (),
        tools: ToolRegistry | None = None,
    ) -> None:
        self.config = config or HostConfig()
        self.bus = EventBus(sender=self)
        self._memory = memory
        self._llm = llm
        self._extra_plugins = list(plugins)
        self.tools = tools or ToolRegistry()
        #: Provider prompt tokens per host-counted token, per chat model, from the agent loop's
        #: own calls (see :meth:`token_ratio`).
        self.calibration = Calibration()
        self._writes = WriteCounter(None)
        self.pm: pluggy.PluginManager | None = None
        self.plugins: dict[str, LoadedPlugin] = {}
        self.message_archive: MemoryMessageArchive | None = None
        self._system_tokens: int | None = None
        #: The prompt's token counts, with the chat model's counter.
        self.counts = PromptCounts(lambda value: self.llm.count_tokens(value, self.model))
        #: Per session, the prompt build that follows an archive in the background (see
        #: ``_archived``), and the sessions whose model call is being prepared.
        self._warming: dict[str, asyncio.Task[None]] = {}
        #: The turns waiting on the store now (see :meth:`after_turns`).
        self._turn_waits = TurnWaits()
        self._preparing: set[str] = set()
        self._tool_def_tokens: int | None = None
        #: Per session, the tokens an outside agent loop sends besides the history (its own
        #: system prompt, its own tools' definitions): see :meth:`prepare_call`.
        self._outside: dict[str, tuple[int, int]] = {}
        #: Names of the tools plugins added through ``agent_tools``.
        self.plugin_tools: set[str] = set()
        #: Per session, the last prompt the agent loop sent (see ``TokenUsage.reused_tokens``).
        self._last_sent: OrderedDict[str, SentPrompt] = OrderedDict()
        self._last_sent_chars = 0
        #: Per session, the snapshot an append before a model call read with it (a store with
        #: ``append_snapshot``), and the session's write count then: the prompt build takes it
        #: when nothing wrote to the session since.
        self._fresh: dict[str, tuple[int, Snapshot]] = {}
        #: Whether the store reads a snapshot with an append (``reads_with_append``).
        self._fuses: bool | None = None
        self._started = False

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def memory(self) -> MemoryService:
        assert self._memory is not None, "host not started"
        return self._memory

    @property
    def llm(self) -> LLMService:
        assert self._llm is not None, "host not started"
        return self._llm

    @property
    def model(self) -> str:
        return self.config.host.model or REPLAY_MODEL

    def get_plugin(self, name: str) -> Any:
        return self.plugins[name].plugin

    async def __aenter__(self) -> Host:
        """``async with Host(config) as host``: started on entry, stopped on the way out."""
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> Host:
        """Load and validate plugins (every config error surfaces here), open services, start
        plugins."""
        pm, loaded = get_plugin_manager(self.config, self._extra_plugins)
        configs = {name: plugin_config(pm, item, self.config) for name, item in loaded.items()}
        #: The host made its own LLM service (none was passed): a turn needs a configured model.
        self._own_llm = self._llm is None
        if self._llm is None:
            from .llm import LiteLLMService

            h = self.config.host
            self._llm = LiteLLMService(
                default_model=h.model,
                api_base=h.api_base,
                api_key=h.api_key,
                num_retries=h.llm_retries,
                timeout=h.llm_timeout_s,
                model_overrides={k: v.model_dump() for k, v in h.models.items()},
                max_reply_chars=h.llm_max_reply_chars,
            )
        created = self._memory is None
        if self._memory is None:
            from .memory import open_memory

            try:
                self._memory = open_memory(self.config.host.memory, self.counts.message)
            except (ValueError, ModuleNotFoundError) as exc:
                raise ConfigError(f"{self.config.source}: host.memory: {exc}") from None
        if isinstance(self._memory, OpensAtStart):
            try:
                await self._memory.open()  # now, not at the first turn
            except BaseException:
                if created:  # the host's own store: nothing else would close it
                    store, self._memory = self._memory, None
                    with contextlib.suppress(Exception):
                        await store.close()
                raise
        await self._resolve_window()
        service = getattr(self._llm, "calibration", None)
        if isinstance(service, Calibration):  # one warning per model for both, not one each
            self.calibration.warned = service.warned
        self._writes = WriteCounter(self.memory, self._archived)
        self.message_archive = MemoryMessageArchive(self.memory)
        self.pm = pm
        self.plugins = loaded
        services = {"memory": self.memory, "llm": self.llm, "message-archive": self.message_archive}
        for name, item in loaded.items():
            check_services(item, set(services))
            item.config = configs[name]
        for name, item in loaded.items():
            caller = pm.subset_hook_caller(
                "startup", remove_plugins=[p.plugin for n, p in loaded.items() if n != name]
            )
            for result in caller(
                host=self,
                config=item.config,
                memory=self.memory,
                llm=self.llm,
                message_archive=self.message_archive,
            ):
                await await_me_maybe(result)
        self._started = True
        await self._register_plugin_tools()
        return self

    async def _register_plugin_tools(self) -> None:
        """Put the tools plugins return from ``agent_tools`` into the tool loop. A name the host
        or another plugin already uses is a start-up error."""
        assert self.pm is not None
        for impl in self.pm.hook.agent_tools.get_hookimpls():
            value = await await_me_maybe(impl.function())
            items = value if isinstance(value, list) else ([] if value is None else [value])
            for item in items:
                tool = AgentTool.model_validate(item)
                if tool.name in self.tools:
                    raise ConfigError(
                        f"plugin {impl.plugin_name!r}: agent tool {tool.name!r} is already "
                        "registered"
                    )
                self.tools.register(
                    tool.name,
                    tool.handler,
                    tool.description,
                    tool.parameters,
                    takes_context=True,
                )
                self.plugin_tools.add(tool.name)
        self._tool_def_tokens = None

    async def _resolve_window(self) -> None:
        """For a configured chat model without ``context_window``: ask the ``api_base`` server for
        its window when nothing else knows it, then look the window up once, so a model nobody
        knows gets its one warning line (naming the setting to add) now, not mid-conversation."""
        h = self.config.host
        if not h.model or h.context_window:
            return
        knows = getattr(self.llm, "knows_window", None)
        probe = getattr(self.llm, "probe_server_window", None)
        if h.api_base and knows is not None and probe is not None and not knows(h.model):
            await probe(h.model)
        self.llm.context_window(h.model)

    async def stop(self) -> None:
        if self.pm is not None and self._started:
            for result in self.pm.hook.shutdown():
                try:
                    await await_me_maybe(result)
                except Exception:
                    log.exception("plugin shutdown failed")
        self._started = False
        warming = list(self._warming.values())
        for task in warming:
            task.cancel()
        await asyncio.gather(*warming, return_exceptions=True)
        if self._memory is not None:
            await self._memory.close()

    async def settle(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, for the background work of this host and its
        plugins: the host's prompt warm-ups and each plugin's own work (a plugin that runs some
        in the background says when it is over with ``async wait_idle(timeout) -> bool``, as the
        memory plugin does for its compressions). Never for other asyncio tasks: a library may
        start one that lives as long as the event loop (litellm's logging worker does at its
        first call). Returns whether everything was over in time."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        warming = [t for t in self._warming.values() if not t.done()]
        if warming:
            await asyncio.wait(warming, timeout=max(0.0, end - loop.time()))
        idle = all(t.done() for t in warming)
        for item in self.plugins.values():
            wait_idle = getattr(item.plugin, "wait_idle", None)
            if callable(wait_idle):
                idle = bool(await wait_idle(max(0.0, end - loop.time()))) and idle
        return idle

    # -- counting ----------------------------------------------------------------------------
    def count_text(self, text: str) -> int:
        return self.counts.text(text)

    def context_window(self) -> int:
        """The chat model's window, in the provider's tokens."""
        return self.config.host.context_window or self.llm.context_window(self.model)

    def host_tool_def_tokens(self) -> int:
        """Tokens of the host's own tool definitions, without those plugins added (what a prompt
        would carry with the plugins off)."""
        defs = [
            d for d in self.tools.definitions() if d["function"]["name"] not in self.plugin_tools
        ]
        return self.count_text(json.dumps(defs)) if defs else 0

    def token_ratio(self) -> float:
        """Provider tokens per host-counted token for the chat model, as the window and the
        reply reserve are divided by it (1.0 with ``calibrate_tokens = false``): from the agent
        loop's own calls once one reported its usage, before that from any call the LLM service
        made to the model (a summarizer's), else 1.0. Never under 1
        (:func:`~host_stub.calibration.applied_ratio`): a provider that reports fewer tokens
        than the host counts never makes a prompt pass the window by the host's own count."""
        if not self.config.host.calibrate_tokens:
            return 1.0
        own = self.calibration.get(self.model)
        if own is not None:
            return applied_ratio(own.ratio)
        service = getattr(self.llm, "calibration", None)
        measured = service.ratio(self.model) if isinstance(service, Calibration) else 1.0
        return applied_ratio(measured)

    def calibration_report(self) -> dict[str, Any]:
        """What calibrated the watermark: the ratio in use for the chat model, the agent loop's
        calls and the LLM service's calls (summarizers included), per model."""
        service = getattr(self.llm, "calibration", None)
        return {
            "model": self.model,
            "ratio": round(self.token_ratio(), 4),
            "enabled": self.config.host.calibrate_tokens,
            "agent_calls": self.calibration.snapshot(),
            "service_calls": service.snapshot() if isinstance(service, Calibration) else {},
        }

    def _observe_usage(self, usage: signals.TokenUsage, completion: Any) -> None:
        """Feed the chat model's calibration with one call: the host's count of the prompt it
        sent (``used`` without the reply reserve) against the provider's ``prompt_tokens``."""
        reported = getattr(completion, "usage", None)
        if reported is None or getattr(reported, "estimated", False):
            return
        counted = usage.used - usage.breakdown.reserved_for_reply
        self.calibration.observe(usage.model, counted, int(reported.prompt_tokens or 0))

    # -- hooks -------------------------------------------------------------------------------
    async def _collect_contributions(self, view: PromptView) -> list[Contribution]:
        assert self.pm is not None
        out: list[Contribution] = []
        for result in self.pm.hook.agent_prompt(view=view):
            try:
                value = await await_me_maybe(result)
            except Exception:
                log.exception("agent_prompt failed")
                continue
            if value is None:
                continue
            items = value if isinstance(value, list) else [value]
            out.extend(Contribution.model_validate(i) for i in items)
        return out

    async def _pruned(self, view: PromptView, history: list[Message]) -> list[Message]:
        """``history`` as the prompt shows it: each message a plugin's ``prune_history`` replaced
        carries the replacement text and its token count (the first plugin's answer wins)."""
        assert self.pm is not None
        replacements: dict[int, str] = {}
        for result in self.pm.hook.prune_history(view=view):
            try:
                value = await await_me_maybe(result)
            except Exception:
                log.exception("prune_history failed")
                continue
            for seq, text in (value or {}).items():
                replacements.setdefault(int(seq), str(text))
        if not replacements:
            return history

        def count(message: Message) -> int:
            return self.counts.shown(view.session_id, message)

        return apply_replacements(history, replacements, count)

    async def _before_model_call(self, view: PromptView) -> None:
        assert self.pm is not None
        try:
            results = self.pm.hook.before_model_call(view=view)
        except Exception:
            log.exception("before_model_call failed")
            return
        for result in results:
            try:
                await await_me_maybe(result)
            except Exception:
                log.exception("before_model_call failed")

    # -- prompt --------------------------------------------------------------------------------
    async def build_prompt(
        self, session_id: str, *, dry_run: bool = False
    ) -> tuple[Snapshot, list[dict[str, Any]], signals.TokenUsage, PromptView]:
        """One consistent snapshot -> contributions -> messages and their measured usage."""
        snap, prompt, usage, view, _ = await self._build(session_id, dry_run=dry_run)
        return snap, prompt, usage, view

    async def _build(
        self,
        session_id: str,
        *,
        dry_run: bool = False,
        take_fresh: bool = True,
        sources: dict[int, Message] | None = None,
    ) -> tuple[Snapshot, list[dict[str, Any]], signals.TokenUsage, PromptView, dict[int, int]]:
        """:meth:`build_prompt`, and the token counts the history's messages carry, by the id of
        the message sent (see :func:`~host_stub.prompt.assemble_prompt`). ``take_fresh``: the
        snapshot an append read for the coming model call may be used (and is then used up).
        ``sources``: filled with the history message each sent history message stands for."""
        fresh = self._fresh.pop(session_id, None) if take_fresh else None
        if fresh is not None and fresh[0] == self._writes.of(session_id):
            snap = fresh[1]
        else:
            snap = await self._store(self.memory.snapshot(session_id))
        history, repaired = sanitize_tool_pairs([m for m in snap.messages if not m.is_marker])
        if repaired:
            log.warning(
                "session %s: %d unpaired tool messages left out of the prompt", session_id, repaired
            )
        ratio = self.token_ratio()
        window = calibrated_window(self.context_window(), ratio)
        base = PromptView(
            session_id=session_id,
            model=self.model,
            context_window=window,
            messages=history,
            summary=snap.record,
            epoch=snap.epoch,
            dry_run=dry_run,
        )
        shown = await self._pruned(base, history)
        contributions = await self._collect_contributions(base)
        outside = self._outside.get(session_id, (0, 0))
        if self._system_tokens is None:
            self._system_tokens = self.count_text(self.config.host.system_prompt)
        if self._tool_def_tokens is None:
            defs = self.tools.definitions()
            self._tool_def_tokens = self.count_text(json.dumps(defs)) if defs else 0
        breakdown = history_breakdown(
            shown,
            contributions,
            system_tokens=self._system_tokens + outside[0],
            tool_def_tokens=self._tool_def_tokens + outside[1],
            reserved_for_reply=round(self.config.host.reserve_for_reply / ratio),
            count_text=self.counts.contribution,
        )
        used = sum(breakdown.model_dump().values())
        usage = signals.TokenUsage(
            session_id=session_id,
            model=self.model,
            context_window=window,
            used=used,
            usage_ratio=used / window,
            breakdown=breakdown,
            summary_version=snap.record.version if snap.record else 0,
            dry_run=dry_run,
            calibration=round(ratio, 4),
        )
        view = base.model_copy(
            update={"usage_ratio": usage.usage_ratio, "breakdown": breakdown.model_dump()}
        )
        stored: dict[int, int] = {}
        prompt = assemble_prompt(
            self.config.host.system_prompt,
            contributions,
            shown,
            merge_system_messages=self.config.host.merge_system_messages,
            stored_counts=stored,
            sources=sources,
        )
        if sources:  # the stored message, not its pruned copy (a placeholder for old output)
            stored_by_seq = {m.seq: m for m in history}
            for key, shown_message in sources.items():
                sources[key] = stored_by_seq.get(shown_message.seq, shown_message)
        return snap, prompt, usage, view, stored

    async def _prepare_call(
        self,
        session_id: str,
        result: TurnResult,
        sources: dict[int, Message] | None = None,
    ) -> list[dict[str, Any]]:
        """Measure, let plugins act before the call, rebuild once if the history changed: if
        anything wrote to the session through this host's store while the hook ran (a blocking
        compression), the snapshot is read again and compared."""
        self._preparing.add(session_id)
        try:
            return await self._prepare(session_id, result, sources)
        finally:
            self._preparing.discard(session_id)

    async def _prepare(
        self, session_id: str, result: TurnResult, sources: dict[int, Message] | None = None
    ) -> list[dict[str, Any]]:
        writes = self._writes.of(session_id)
        snap, prompt, usage, view, stored = await self._build(session_id, sources=sources)
        usage, tokens = self._with_reuse(session_id, prompt, usage, stored)
        await self.bus.send(signals.TOKEN_USAGE, usage)
        result.usage.append(usage)
        await self._before_model_call(view)
        if self._writes.of(session_id) != writes:
            again = await self._store(self.memory.snapshot(session_id))
            if snapshot_key(again) != snapshot_key(snap):
                if sources is not None:
                    sources.clear()
                snap, prompt, usage, view, stored = await self._build(session_id, sources=sources)
                usage, tokens = self._with_reuse(session_id, prompt, usage, stored, rebuilt=True)
                await self.bus.send(signals.TOKEN_USAGE, usage)
                result.usage.append(usage)
        result.sent.append(prompt)
        self._remember_sent(session_id, prompt, tokens)
        return prompt

    # -- after a compression -------------------------------------------------------------------
    def _archived(self, session_id: str) -> None:
        """Something archived part of a session's history through this host's store (a
        compression's commit, a trim): its next prompt changed (a new summary block, fewer
        messages). Build that prompt now, in the background, while the agent waits on its model
        call, so the turn finds the new texts counted (the summary block, the system message it
        is merged into, the history's new placeholders) instead of counting them before its
        call. Only for a session whose turns this host runs (it sent a prompt of it: a command
        that compresses and stops builds none); not while the session's call is being prepared
        (a blocking compression: that turn builds the prompt again at once), nor twice at a
        time."""
        if (
            not self._started
            or session_id not in self._last_sent
            or session_id in self._preparing
            or session_id in self._warming
        ):
            return
        task = asyncio.get_running_loop().create_task(
            self._warm_prompt(session_id), name=f"warm prompt {session_id}"
        )
        self._warming[session_id] = task
        task.add_done_callback(lambda _t: self._warming.pop(session_id, None))

    async def _warm_prompt(self, session_id: str) -> None:
        """Build the session's next prompt as a dry run (plugins see ``dry_run``; nothing is
        sent, signalled or remembered as sent) and count its messages that carry no count."""
        WARMING_UP.set(True)  # this task's own context
        try:
            _, prompt, _, _, stored = await self._build(session_id, dry_run=True, take_fresh=False)
            for message in prompt:
                if id(message) not in stored:
                    self.counts.wire_remembered(message)
        except Exception:  # only a warm-up: the turn builds and counts the prompt anyway
            log.debug("warming the next prompt of %s failed", session_id, exc_info=True)

    def _with_reuse(
        self,
        session_id: str,
        prompt: list[dict[str, Any]],
        usage: signals.TokenUsage,
        stored: Mapping[int, int],
        *,
        rebuilt: bool = False,
    ) -> tuple[signals.TokenUsage, list[int]]:
        """``usage`` with the prompt's message tokens and the prefix it shares with the last
        prompt sent in the session, and each message's tokens. Only the messages after the
        shared ones are looked at: the others' counts are the last prompt's; of those, a history
        message has the count it carries (``stored``, by the id of the message sent), and only
        the others (a changed summary block) are counted."""
        last = self._last_sent.get(session_id)
        if last is None:
            tokens = [stored.get(id(m)) or self.counts.wire_remembered(m) for m in prompt]
            reused = None
        else:
            same = shared_messages(last.messages, prompt)
            known = known_counts(last.messages[same:], last.tokens[same:])
            tokens = [
                *last.tokens[:same],
                *(stored.get(id(m)) or self.counts.known_or_count(m, known) for m in prompt[same:]),
            ]
            reused = prefix_reuse(last.messages, prompt, self.counts.wire, tokens=tokens).reused
        update = {"message_tokens": sum(tokens), "reused_tokens": reused, "rebuilt": rebuilt}
        return usage.model_copy(update=update), tokens

    def _remember_sent(
        self, session_id: str, prompt: list[dict[str, Any]], tokens: list[int]
    ) -> None:
        chars = sum(len(m["content"]) for m in prompt if isinstance(m.get("content"), str))
        old = self._last_sent.pop(session_id, None)
        self._last_sent_chars -= old.chars if old is not None else 0
        self._last_sent[session_id] = SentPrompt(prompt, tokens, chars)
        self._last_sent_chars += chars
        while self._last_sent_chars > LAST_PROMPTS_CHARS and len(self._last_sent) > 1:
            gone, evicted = self._last_sent.popitem(last=False)
            self._outside.pop(gone, None)  # its next prepare_call says it again
            self._last_sent_chars -= evicted.chars

    async def _store(self, call: Awaitable[_T]) -> _T:
        """``await call`` (a store call of a turn or of a prompt build), counted as waiting on
        the store unless it is the background warm-up's."""
        if WARMING_UP.get():
            return await call
        return await self._turn_waits.around(call)

    async def after_turns(self, max_wait_s: float) -> bool:
        """For background work about to use the CPU (a compression between its steps): return
        once no turn of this host waits on the store, so that work does not hold the turn's
        next step (``True``; at once when none waits), or after ``max_wait_s`` seconds of turns
        waiting (``False``). See :class:`~host_stub.services.YieldsToTurns`."""
        return await self._turn_waits.none_waiting(max_wait_s)

    async def _append(
        self, session_id: str, messages: Sequence[Message], *, call_follows: bool
    ) -> list[Message]:
        """Store ``messages``; when a model call follows and the store can, read the snapshot
        the call's prompt needs in the same transaction (one round trip instead of two; see
        :class:`~host_stub.services.SnapshotOnAppend`)."""
        if self._fuses is None:
            self._fuses = reads_with_append(self.memory)
        if not (call_follows and self._fuses):
            return await self._store(self.memory.append(session_id, messages))
        writes = self._writes.of(session_id)
        fused = self.memory.append_snapshot(session_id, messages)  # type: ignore[attr-defined]
        stored, snap = await self._store(fused)
        if self._writes.of(session_id) == writes + 1:  # nothing else wrote meanwhile
            self._fresh[session_id] = (writes + 1, snap)
        return stored

    # -- turns -------------------------------------------------------------------------------
    async def run_turn(
        self,
        session_id: str,
        user: str | Message | Sequence[Message],
        *,
        recorded: Sequence[Message] | None = None,
        stream: bool = False,
        on_delta: Callable[[str], Any] | None = None,
    ) -> TurnResult:
        """One turn. With ``recorded`` (replay), the recorded assistant and tool messages stand in
        for the model's replies and the tools' results; no model is called.

        An invalid session id (:class:`~host_stub.session_ids.InvalidSessionId`) or a message
        without content or over ``max_message_chars`` (:class:`~host_stub.checks.MessageRejected`)
        raises before anything is stored. ``user`` may be empty (no message) when a replay
        resumes in the middle of a turn."""
        inputs = (
            [Message(role="user", content=user)]
            if isinstance(user, str)
            else ([user] if isinstance(user, Message) else list(user))
        )
        check_session_id(session_id)
        limit = self.config.host.max_message_chars
        for message in [*inputs, *(recorded or [])]:
            check_message(message, limit)
        result = TurnResult(session_id=session_id, outcome="silent")
        call_follows = recorded is None or (bool(recorded) and recorded[0].role == "assistant")
        stored = await self._append(session_id, inputs, call_follows=call_follows)
        result.messages.extend(stored)
        user_message = next((m for m in reversed(stored) if m.role == "user"), None)
        try:
            if recorded is not None:
                await self._replay_turn(session_id, list(recorded), result)
            else:
                await self._model_turn(session_id, result, stream=stream, on_delta=on_delta)
        except asyncio.CancelledError:
            result.outcome = "aborted"
            await self._turn_after(session_id, user_message, result)
            raise
        except Exception as exc:
            log.warning("turn failed in session %s: %s", session_id, exc)
            result.outcome = "error"
            result.error = f"{type(exc).__name__}: {exc}"
        await self._turn_after(session_id, user_message, result)
        return result

    async def _turn_after(
        self, session_id: str, user_message: Message | None, result: TurnResult
    ) -> None:
        self._fresh.pop(session_id, None)  # read for a call the turn did not make
        await self.bus.send(
            signals.AGENT_TURN_AFTER,
            session_id=session_id,
            model=self.model,
            outcome=result.outcome,
            message=user_message,
            reply=result.reply,
            metadata={"error": result.error} if result.error else {},
        )

    async def _replay_turn(
        self, session_id: str, recorded: list[Message], result: TurnResult
    ) -> None:
        i = 0
        while i < len(recorded):
            if recorded[i].role == "assistant":
                await self._prepare_call(session_id, result)
                reply = recorded[i]
                batch = [reply]
                i += 1
                while i < len(recorded) and recorded[i].role == "tool":
                    batch.append(recorded[i])
                    i += 1
            else:
                batch = [recorded[i]]
                i += 1
            call_follows = i < len(recorded) and recorded[i].role == "assistant"
            stored = await self._append(session_id, batch, call_follows=call_follows)
            result.messages.extend(stored)
            if stored[0].role == "assistant":
                result.reply = stored[0]
                result.outcome = "replied"

    async def _model_turn(
        self,
        session_id: str,
        result: TurnResult,
        *,
        stream: bool,
        on_delta: Callable[[str], Any] | None,
    ) -> None:
        if self._own_llm and not self.config.host.model:
            raise NoModelConfigured(
                "no model configured: set one under [host] model in the host config (or pass "
                "--model), with api_base for an OpenAI-compatible server"
            )
        defs = self.tools.definitions() or None
        iterations = self.config.host.max_tool_iterations
        for iteration in range(iterations):
            prompt = await self._prepare_call(session_id, result)
            completion = await self._call_model(prompt, defs, stream=stream, on_delta=on_delta)
            self._observe_usage(result.usage[-1], completion)
            calls = [
                ToolCall(
                    id=c["id"],
                    function=ToolCallFunction(
                        name=c["function"]["name"], arguments=c["function"].get("arguments") or ""
                    ),
                )
                for c in completion.tool_calls or []
            ]
            reply = Message(
                role="assistant", content=completion.text or None, tool_calls=calls or None
            )
            if not completion.text and not calls:
                return
            stored = await self._store(self.memory.append(session_id, [reply]))
            result.messages.extend(stored)
            result.reply = stored[0]
            result.outcome = "replied"
            if not calls:
                return
            outputs = []
            for call in calls:
                context = ToolContext(session_id=session_id, call_id=call.id, model=self.model)
                text, is_error = await self.tools.run(
                    call.function.name, call.function.arguments, context
                )
                outputs.append(
                    Message(
                        role="tool",
                        tool_call_id=call.id,
                        name=call.function.name,
                        content=cut_to_limit(text, self.config.host.max_message_chars),
                        metadata={"is_error": True} if is_error else {},
                    )
                )
            call_follows = iteration + 1 < iterations
            result.messages.extend(
                await self._append(session_id, outputs, call_follows=call_follows)
            )

    async def _call_model(
        self,
        prompt: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        stream: bool,
        on_delta: Callable[[str], Any] | None,
    ) -> Any:
        max_tokens = self.config.host.reserve_for_reply or None
        if not stream:
            return await self.llm.complete(
                prompt, model=self.model, max_tokens=max_tokens, tools=tools
            )
        final = None
        # The host's own LLM service streams; the plugin-facing Protocol needs only complete().
        stream_call = self.llm.stream  # type: ignore[attr-defined]
        async for item in stream_call(prompt, model=self.model, max_tokens=max_tokens, tools=tools):
            if isinstance(item, str):
                if on_delta is not None:
                    await await_me_maybe(on_delta(item))
            else:
                final = item
        assert final is not None
        return final

    # -- an agent loop this host does not run ------------------------------------------------
    async def record(
        self, session_id: str, messages: Sequence[Message], *, call_follows: bool = True
    ) -> list[Message]:
        """Store messages of an agent loop run elsewhere (an agent framework's own loop), as a
        turn of :meth:`run_turn` stores its own: checked first (nothing is stored when one is
        rejected), then appended in one write. ``call_follows``: a model call of the session
        comes next (:meth:`prepare_call`), so a store that can reads its snapshot with the
        append."""
        check_session_id(session_id)
        limit = self.config.host.max_message_chars
        for message in messages:
            check_message(message, limit)
        if not messages:
            return []
        return await self._append(session_id, messages, call_follows=call_follows)

    async def prepare_call(
        self, session_id: str, *, system_tokens: int = 0, tool_def_tokens: int = 0
    ) -> PreparedCall:
        """The prompt for a model call an outside agent loop is about to make: built from the
        stored history, measured, and with the plugins' ``before_model_call`` done (a blocking
        compression among them), exactly as a turn of :meth:`run_turn` prepares its calls.
        ``system_tokens`` and ``tool_def_tokens``: what the loop sends besides this prompt (its
        own system prompt and tool definitions), counted in the session's usage from now on
        (the prompts built for it in the background too)."""
        check_session_id(session_id)
        if system_tokens or tool_def_tokens:
            self._outside[session_id] = (system_tokens, tool_def_tokens)
        else:
            self._outside.pop(session_id, None)
        result = TurnResult(session_id=session_id, outcome="silent")
        by_id: dict[int, Message] = {}
        prompt = await self._prepare_call(session_id, result, by_id)
        return PreparedCall(
            prompt=prompt,
            sources=[by_id.get(id(m)) for m in prompt],
            usage=result.usage[-1],
        )

    async def end_turn(
        self,
        session_id: str,
        *,
        user: Message | None = None,
        reply: Message | None = None,
        outcome: str = "replied",
    ) -> None:
        """An outside agent loop's turn ended: plugins hear ``agent:turn-after`` as after a
        turn of :meth:`run_turn` (the stored user message and reply, when known)."""
        result = TurnResult(session_id=session_id, outcome=outcome, reply=reply)
        await self._turn_after(session_id, user, result)

    # -- user actions ------------------------------------------------------------------------
    async def clear(self, session_id: str | None, types: list[str] | None = None) -> dict[str, Any]:
        """Clear memory (``session_id`` None = every session): the host clears the history, then
        each plugin's ``memory_clear`` hook clears its own types; returns the merged results. A
        plugin whose hook raises is logged and the others still clear."""
        scope = "session" if session_id else "all"
        sessions = (
            [session_id]
            if session_id
            else [s.session_id for s in await self.memory.list_sessions()]
        )
        results: dict[str, Any] = {}
        if types is None or "history" in types:
            for sid in sessions:
                await self.memory.clear(sid, ["history"])
            results["history"] = {"sessions": len(sessions)}
        kwargs = {"scope": scope, "session_id": session_id, "types": types}
        for impl in self.pm.hook.memory_clear.get_hookimpls() if self.pm is not None else ():
            try:
                value = await await_me_maybe(impl.function(**{k: kwargs[k] for k in impl.argnames}))
            except Exception:
                log.exception("memory_clear of plugin %r failed", impl.plugin_name)
                continue
            if isinstance(value, dict):
                results.update(value)
        return results

    async def delete_messages(self, session_id: str, seqs: list[int]) -> list[int]:
        """Roll back or edit: mark messages deleted, then tell plugins
        (``memory:messages-deleted``)."""
        deleted = await self.memory.delete_messages(session_id, seqs)
        if deleted:
            await self.bus.send(
                signals.MEMORY_MESSAGES_DELETED, session_id=session_id, seqs=deleted
            )
        return deleted

    async def request_compression(self, session_id: str, reason: str = "manual") -> str:
        """Send ``session:compress`` and return its request id."""
        request_id = f"{session_id}:{time.time_ns()}"
        await self.bus.send(
            signals.SESSION_COMPRESS, request_id=request_id, session_id=session_id, reason=reason
        )
        return request_id


@contextlib.asynccontextmanager
async def open_host(config: HostConfig | None = None, **kwargs: Any) -> AsyncIterator[Host]:
    host = Host(config, **kwargs)
    await host.start()
    try:
        yield host
    finally:
        await host.stop()
