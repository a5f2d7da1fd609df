"""The memory for an agent loop someone else runs: the one runtime every framework adapter uses.

An adapter maps its framework's messages to the host's :class:`~host_stub.messages.Message` (each
with the framework's own id in ``metadata["source_id"]``) and back; everything else happens here,
through the reference host's own turn path (:meth:`~host_stub.host.Host.record`,
:meth:`~host_stub.host.Host.prepare_call`, :meth:`~host_stub.host.Host.end_turn`), so the plugin
runs exactly as it does in the host: the same triggers, the same blocking compression at the hard
watermark, the same prompt.

The host and its store live on an event loop of their own, in a daemon thread the runtime starts:
a sync agent calls the blocking methods, an async one the ``a``-prefixed ones, and both reach the
same loop (a store's connections belong to one loop; a compression in the background never runs
on the framework's loop or holds its streams).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from host_stub.config import HostConfig
from host_stub.hookspecs import ToolContext
from host_stub.host import Host
from host_stub.messages import Message
from host_stub.services import LLMService, MemoryService

from .._name import PLUGIN_NAME

__all__ = ["AgentMemory", "MemoryTool", "PromptItem", "SOURCE_ID"]

_T = TypeVar("_T")

log = logging.getLogger("plugin_memory_summary.adapters")

#: The metadata key a mirrored message keeps its framework's own id under.
SOURCE_ID = "source_id"
#: Why a message is archived when it no longer counts as stored: a framework that hands it over
#: again (a thread still in its checkpointer after a clear) has it stored again.
_GONE = frozenset({"cleared", "deleted"})
#: Sessions whose mirrored ids are kept in memory at most (the oldest are read again when needed).
MAX_SESSIONS = 1024


@dataclass(frozen=True)
class PromptItem:
    """One message of the prompt the memory built: the OpenAI-format ``message`` to send, and the
    framework id of the message it stands for (``None`` for the summary block and other messages
    the plugin added). ``changed``: the content differs from what was stored (old tool output
    shown as a placeholder), so the framework's own object must not be sent as it is."""

    message: dict[str, Any]
    source_id: str | None
    changed: bool


@dataclass(frozen=True)
class MemoryTool:
    """A tool the memory gives the agent (``memory_search``, ``memory_expand``): its name,
    description and JSON-schema parameters, as an agent framework declares a tool."""

    name: str
    description: str
    parameters: dict[str, Any]


class AgentMemory:
    """The plugin's memory for an agent framework's loop.

    ``memory`` is a store URL as in the host's config (``sqlite:///agent-memory.db``,
    ``postgresql://...``, ``redis://...``, ``:memory:``) or a store object. ``model`` is the
    chat model the agent calls (its context window sets the budget; ``context_window`` overrides
    it), ``api_base``/``api_key`` reach an OpenAI-compatible server for the summarizer, and
    ``config`` is the plugin's ``[plugin.memory-summary]`` table (``summary_model`` among it).
    ``llm`` replaces the LLM service (tests). Use it as a context manager (``with`` or
    ``async with``), or call :meth:`start` and :meth:`close`."""

    def __init__(
        self,
        memory: str | MemoryService = "sqlite:///agent-memory.db",
        *,
        model: str,
        context_window: int | None = None,
        api_base: str | None = None,
        api_key: str | None = None,
        config: Mapping[str, Any] | None = None,
        reserve_for_reply: int = 1024,
        llm: LLMService | None = None,
    ) -> None:
        host: dict[str, Any] = {
            "model": model,
            "system_prompt": "",
            "reserve_for_reply": reserve_for_reply,
        }
        if isinstance(memory, str):
            host["memory"] = memory
        for key, value in (
            ("context_window", context_window),
            ("api_base", api_base),
            ("api_key", api_key),
        ):
            if value is not None:
                host[key] = value
        self.config = HostConfig.model_validate(
            {
                "host": host,
                "plugins": {"allow": [PLUGIN_NAME]},
                "plugin": {PLUGIN_NAME: dict(config or {})},
            }
        )
        self._memory = None if isinstance(memory, str) else memory
        self._llm = llm
        self._host: Host | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: Per session, the framework ids already stored (read from the store once per process).
        self._seen: OrderedDict[str, set[str]] = OrderedDict()
        self._session_locks: dict[str, asyncio.Lock] = {}
        self._calls = itertools.count(1)
        #: The ends of turns being stored (see :meth:`end_turn`).
        self._ending: set[concurrent.futures.Future[int]] = set()
        self._ending_lock = threading.Lock()
        #: The last system prompt and tool definitions counted, with their tokens.
        self._outside_counts: dict[str, tuple[str, int]] = {}

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def host(self) -> Host:
        """The started host (for inspection: its store, the plugin, the usage it measured)."""
        if self._host is None:
            raise RuntimeError("AgentMemory is not started: use it as a context manager")
        return self._host

    def start(self) -> AgentMemory:
        """Start the runtime's loop thread and the host on it (every config error raises here)."""
        with self._lock:
            if self._host is not None:
                return self
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="agent-memory", daemon=True)
            thread.start()
            host = Host(self.config, memory=self._memory, llm=self._llm)
            try:
                asyncio.run_coroutine_threadsafe(host.start(), loop).result()
            except BaseException:
                asyncio.run_coroutine_threadsafe(_stop(None), loop).result()
                loop.call_soon_threadsafe(loop.stop)
                thread.join()
                loop.close()
                raise
            self._loop, self._thread, self._host = loop, thread, host
        return self

    def close(self) -> None:
        """Store the ends of turns not stored yet, stop the host (background compressions get
        the plugin's shutdown grace) and the loop."""
        self._wait_ended(None)
        with self._lock:
            host, loop, thread = self._host, self._loop, self._thread
            self._host = self._loop = self._thread = None
        if host is None or loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(_stop(host), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def __enter__(self) -> AgentMemory:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> AgentMemory:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    def _submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("AgentMemory is not started: use it as a context manager")
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the runtime's loop and wait (from a sync caller)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking AgentMemory call from its own loop; use the a-methods")
        return self._submit(coro).result()

    async def _arun(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the runtime's loop and await it (from an async caller's loop)."""
        return await asyncio.wrap_future(self._submit(coro))

    # -- the agent loop --------------------------------------------------------------------------
    def prompt(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> list[PromptItem]:
        """Store what of ``messages`` is new (by ``metadata["source_id"]``), then build the
        prompt for the model call that follows: see :meth:`aprompt`."""
        return self._run(self._prompt(session_id, messages, system, tools))

    async def aprompt(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> list[PromptItem]:
        """Store what of ``messages`` (the framework's whole conversation, or its new tail) is
        new, then build the prompt for the model call that follows, with the plugin's work before
        a call done (a compression when the hard watermark is passed).

        The framework's own system prompt is not in it: the adapter sends its own first, and
        passes its text as ``system`` and its own tools' definitions (OpenAI format, the memory's
        tools left out) as ``tools``, so the budget counts what the call really sends."""
        return await self._arun(self._prompt(session_id, messages, system, tools))

    def add(self, session_id: str, messages: Sequence[Message]) -> int:
        """Store what of ``messages`` is new; return how many were stored."""
        return self._run(self._add(session_id, messages, call_follows=False))

    async def aadd(self, session_id: str, messages: Sequence[Message]) -> int:
        """:meth:`add` for an async caller."""
        return await self._arun(self._add(session_id, messages, call_follows=False))

    def end_turn(self, session_id: str, messages: Sequence[Message] = ()) -> None:
        """The agent's turn ended: store what of ``messages`` is new (the final reply), and let
        the plugin decide on a compression in the background. Returns at once: the store write
        and the plugin's decision run on the runtime's loop, before any later call of the
        session (its lock is first-come, first-served); :meth:`settle` and :meth:`close` wait
        for them. A failure is logged (``plugin_memory_summary.adapters``)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking AgentMemory call from its own loop; use the a-methods")
        future = self._submit(self._end_turn(session_id, messages))
        with self._ending_lock:
            self._ending.add(future)
        future.add_done_callback(self._ended)

    async def aend_turn(self, session_id: str, messages: Sequence[Message] = ()) -> None:
        """:meth:`end_turn` for an async caller (it returns at once as well)."""
        self.end_turn(session_id, messages)

    def _ended(self, future: concurrent.futures.Future[int]) -> None:
        with self._ending_lock:
            self._ending.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("storing the end of a turn failed", exc_info=future.exception())

    def _wait_ended(self, timeout: float | None) -> bool:
        with self._ending_lock:
            pending = list(self._ending)
        done, not_done = concurrent.futures.wait(pending, timeout=timeout)
        return not not_done

    def history(self, session_id: str) -> list[Message]:
        """The session's active (not archived) stored messages, oldest first."""
        return self._run(self.host.memory.get_history(session_id))

    async def ahistory(self, session_id: str) -> list[Message]:
        """:meth:`history` for an async caller."""
        return await self._arun(self.host.memory.get_history(session_id))

    def delete(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        """Delete stored messages (by seq) as the host's ``delete_messages`` does (plugins hear
        of it; a summary covering them is marked stale); the seqs deleted. Their framework ids
        count as not stored from then on."""
        return self._run(self._delete(session_id, seqs))

    async def adelete(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        """:meth:`delete` for an async caller."""
        return await self._arun(self._delete(session_id, seqs))

    def clear(self, session_id: str) -> dict[str, Any]:
        """Forget the session: its history, its summary, its archive."""
        return self._run(self._clear(session_id))

    async def aclear(self, session_id: str) -> dict[str, Any]:
        """:meth:`clear` for an async caller."""
        return await self._arun(self._clear(session_id))

    def settle(self, timeout: float = 30.0) -> bool:
        """Wait until the ends of turns are stored and no compression runs (``False`` when
        ``timeout`` passes first)."""
        if not self._wait_ended(timeout):
            return False
        return self._run(self.host.settle(timeout))

    async def asettle(self, timeout: float = 30.0) -> bool:
        """:meth:`settle` for an async caller."""
        return await asyncio.to_thread(self.settle, timeout)

    # -- the memory's tools ----------------------------------------------------------------------
    def tools(self) -> list[MemoryTool]:
        """The tools the plugin gives the agent (``memory_search``, ``memory_expand``)."""
        host = self.host
        return [
            MemoryTool(
                name=d["function"]["name"],
                description=d["function"].get("description", ""),
                parameters=d["function"].get("parameters") or {"type": "object"},
            )
            for d in host.tools.definitions()
            if d["function"]["name"] in host.plugin_tools
        ]

    def call_tool(self, session_id: str, name: str, arguments: str | Mapping[str, Any]) -> str:
        """Run one of :meth:`tools` in ``session_id``; its text (an error is text too)."""
        return self._run(self._call_tool(session_id, name, arguments))

    async def acall_tool(
        self, session_id: str, name: str, arguments: str | Mapping[str, Any]
    ) -> str:
        """:meth:`call_tool` for an async caller."""
        return await self._arun(self._call_tool(session_id, name, arguments))

    # -- on the runtime's loop -------------------------------------------------------------------
    def _session_lock(self, session_id: str) -> asyncio.Lock:
        lock = self._session_locks.get(session_id)
        if lock is None:
            lock = self._session_locks[session_id] = asyncio.Lock()
        return lock

    async def _seen_ids(self, session_id: str) -> set[str]:
        seen = self._seen.get(session_id)
        if seen is not None:
            self._seen.move_to_end(session_id)
            return seen
        memory = self.host.memory
        stored = [
            *await memory.get_archived(session_id),
            *await memory.get_history(session_id),
        ]
        seen = {
            str(m.metadata[SOURCE_ID])
            for m in stored
            if m.metadata.get(SOURCE_ID) and m.archived not in _GONE
        }
        self._seen[session_id] = seen
        while len(self._seen) > MAX_SESSIONS:
            self._seen.popitem(last=False)
        return seen

    async def _add(
        self, session_id: str, messages: Sequence[Message], *, call_follows: bool
    ) -> int:
        async with self._session_lock(session_id):
            seen = await self._seen_ids(session_id)
            new, ids = [], set()
            for message in messages:
                source = message.metadata.get(SOURCE_ID)
                if not source:
                    raise ValueError(
                        f"a message without metadata[{SOURCE_ID!r}] cannot be mirrored once"
                    )
                source = str(source)
                if source in seen or source in ids:
                    continue
                ids.add(source)
                new.append(message)
            await self.host.record(session_id, new, call_follows=call_follows)
            seen.update(ids)
            return len(new)

    def _count_outside(self, key: str, text: str) -> int:
        """Tokens of a text the framework sends besides the prompt, counted once per text."""
        cached = self._outside_counts.get(key)
        if cached is not None and cached[0] == text:
            return cached[1]
        tokens = self.host.count_text(text) if text else 0
        self._outside_counts[key] = (text, tokens)
        return tokens

    async def _prompt(
        self,
        session_id: str,
        messages: Sequence[Message],
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> list[PromptItem]:
        await self._add(session_id, messages, call_follows=True)
        prepared = await self.host.prepare_call(
            session_id,
            system_tokens=self._count_outside("system", system or ""),
            tool_def_tokens=self._count_outside(
                "tools", json.dumps(list(tools), sort_keys=True, default=str) if tools else ""
            ),
        )
        items = []
        for sent, source in zip(prepared.prompt, prepared.sources, strict=True):
            source_id = source.metadata.get(SOURCE_ID) if source is not None else None
            changed = source is not None and sent.get("content") != source.content
            items.append(PromptItem(sent, str(source_id) if source_id else None, changed))
        return items

    async def _end_turn(self, session_id: str, messages: Sequence[Message]) -> int:
        added = await self._add(session_id, messages, call_follows=False)
        history = await self.host.memory.get_history(session_id, limit=64)
        user = next((m for m in reversed(history) if m.role == "user"), None)
        reply = next((m for m in reversed(history) if m.role == "assistant"), None)
        await self.host.end_turn(session_id, user=user, reply=reply)
        return added

    async def _delete(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        async with self._session_lock(session_id):
            deleted = await self.host.delete_messages(session_id, list(seqs))
            self._seen.pop(session_id, None)  # read again: the deleted ids are gone
            return deleted

    async def _clear(self, session_id: str) -> dict[str, Any]:
        async with self._session_lock(session_id):
            result = await self.host.clear(session_id)
            self._seen.pop(session_id, None)
            return result

    async def _call_tool(
        self, session_id: str, name: str, arguments: str | Mapping[str, Any]
    ) -> str:
        if name not in self.host.plugin_tools:
            return f"unknown memory tool {name!r}"
        text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
        context = ToolContext(
            session_id=session_id, call_id=f"memory-{next(self._calls)}", model=self.host.model
        )
        result, _is_error = await self.host.tools.run(name, text, context)
        return result


async def _stop(host: Host | None) -> None:
    """Stop ``host``, then end what else runs on the runtime's loop (a library's background
    worker, such as litellm's logging queue), as :func:`asyncio.run` does on its way out."""
    try:
        if host is not None:
            await host.stop()
    finally:
        me = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not me]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await asyncio.get_running_loop().shutdown_asyncgens()
