"""The memory as a LangChain v1 middleware: ``create_agent(..., middleware=[MemoryMiddleware(m)])``.

Before each model call the middleware mirrors the agent's messages into the memory's store (by
each message's LangChain id) and replaces what the model sees with the memory's prompt: the
summary block, old tool output as placeholders, the kept tail. The agent's own state (its
checkpointer's thread) is never changed: nothing is removed from it and no state update is
returned. The thread id of the run (``config["configurable"]["thread_id"]``) is the memory's
session id. At the end of a run the final messages are stored and the plugin may compress in the
background. The tools ``memory_search`` and ``memory_expand`` are the middleware's own tools.

Needs the ``langchain`` extra: ``pip install 'plugin-memory-summary[langchain]'``.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, MutableMapping, Sequence
from typing import Any

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelCallResult,
    ModelRequest,
    ModelResponse,
)
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    ToolMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from langchain_core.messages.tool import default_tool_parser
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.config import get_config
from langgraph.runtime import Runtime

from host_stub.messages import Message, ToolCall, ToolCallFunction

from ._runtime import SOURCE_ID, AgentMemory, MemoryTool, PromptItem

__all__ = ["MemoryMiddleware", "from_prompt", "message_id", "to_memory"]

#: Threads whose handed-over message ids a middleware remembers (the oldest are forgotten: their
#: messages are then converted again and the memory finds them stored).
MAX_THREADS = 1024
#: Messages built for placeholders and summary blocks a middleware keeps for the next calls.
MAX_BUILT = 4096
#: The prefix of an id derived for a message that has none (see :func:`message_id`).
DERIVED_PREFIX = "lc-derived-"

_NO_THREAD = (
    "MemoryMiddleware needs a thread id: invoke the agent with "
    "config={'configurable': {'thread_id': '...'}}"
)


# -- mapping ---------------------------------------------------------------------------------------
def message_id(message: BaseMessage, anchor: str, ordinal: int) -> str:
    """The message's LangChain id; for a message without one, a stable id derived from the id
    of the nearest earlier message that has one (``anchor``), its place after that message, its
    type and its content. LangGraph's reducer gives every message of the agent's state an id:
    only a message added to the request lacks one (a result ``create_agent`` adds for a tool
    call with malformed arguments, which it also writes to the state; another middleware's)."""
    if message.id:
        return str(message.id)
    key = json.dumps(
        [anchor, ordinal, message.type, message.content, getattr(message, "tool_call_id", None)],
        sort_keys=True,
        default=str,
    )
    return DERIVED_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24]


def _ids(messages: Sequence[BaseMessage]) -> list[str]:
    ids, anchor, ordinal = [], "", 0
    for message in messages:
        if message.id:
            anchor, ordinal = str(message.id), 0
        else:
            ordinal += 1
        ids.append(message_id(message, anchor, ordinal))
    return ids


def _to_message(message: BaseMessage, source_id: str) -> Message:
    data = convert_to_openai_messages(message)
    assert isinstance(data, dict)
    calls = [
        ToolCall(
            id=str(c["id"]),
            function=ToolCallFunction(
                name=c["function"]["name"], arguments=c["function"].get("arguments") or ""
            ),
        )
        for c in data.get("tool_calls") or []
    ]
    if isinstance(message, AIMessage):  # a call with malformed arguments is a call all the same
        calls += [
            ToolCall(
                id=str(c["id"]),
                function=ToolCallFunction(
                    name=c.get("name") or "unknown", arguments=c["args"] or ""
                ),
            )
            for c in message.invalid_tool_calls
            if c.get("id")
        ]
    content = data.get("content")
    if calls and not content:
        content = None  # an assistant message that only calls tools
    return Message(
        role=data["role"],
        content=content,
        tool_calls=calls or None,
        tool_call_id=data.get("tool_call_id"),
        name=data.get("name"),
        metadata={SOURCE_ID: source_id},
    )


def to_memory(messages: Sequence[BaseMessage], skip: Collection[str] = ()) -> list[Message]:
    """The agent's messages as the memory stores them (OpenAI format, the LangChain id in
    ``metadata["source_id"]``), but those whose id is in ``skip`` (already stored). A message
    without an id gets its derived one (:func:`message_id`) set on it, so that, written to the
    state, it keeps that id."""
    ids = _ids(messages)
    for message, source_id in zip(messages, ids, strict=True):
        if not message.id:
            message.id = source_id
    return [_to_message(m, i) for m, i in zip(messages, ids, strict=True) if i not in skip]


def _from_dict(data: dict[str, Any]) -> BaseMessage:
    if data.get("role") == "assistant" and data.get("tool_calls"):
        calls, invalid = default_tool_parser(data["tool_calls"])
        return AIMessage(
            content=data.get("content") or "",
            tool_calls=calls,
            invalid_tool_calls=invalid,
            name=data.get("name"),
        )
    return convert_to_messages([data])[0]


def from_prompt(
    items: Sequence[PromptItem],
    messages: Sequence[BaseMessage],
    built: MutableMapping[str, BaseMessage] | None = None,
) -> list[AnyMessage]:
    """The memory's prompt as LangChain messages: an unchanged item is the agent's own message
    object (found by its id among ``messages``); a changed one (a tool output shown as a
    placeholder), an added one (the summary block) or a stored one the agent's state no longer
    holds (a thread resumed after a restart) is built from the OpenAI dict, keeping its id and,
    for a tool result, its ``tool_call_id`` and name. ``built``: the messages built before, by
    what they were built from (a placeholder or a summary block is sent again at every call
    until it changes: built once)."""
    originals = dict(zip(_ids(messages), messages, strict=True))
    out: list[AnyMessage] = []
    for item in items:
        original = originals.get(item.source_id) if item.source_id else None
        if original is not None and not item.changed:
            out.append(original)  # type: ignore[arg-type]
            continue
        key = json.dumps([item.source_id, item.message], sort_keys=True, default=str)
        message = built.get(key) if built is not None else None
        if message is None:
            message = _from_dict(item.message)
            if isinstance(original, ToolMessage) and isinstance(message, ToolMessage):
                message.name = original.name
            if item.source_id:
                message.id = item.source_id
            if built is not None:
                built[key] = message
        out.append(message)  # type: ignore[arg-type]
    return out


class _Built(OrderedDict[str, BaseMessage]):
    """A bounded map of built messages: the least recently used go first past :data:`MAX_BUILT`."""

    def get(self, key: str, default: Any = None) -> Any:
        found = super().get(key, default)
        if found is not default:
            self.move_to_end(key)
        return found

    def __setitem__(self, key: str, value: BaseMessage) -> None:
        super().__setitem__(key, value)
        while len(self) > MAX_BUILT:
            self.popitem(last=False)


# -- the thread id ---------------------------------------------------------------------------------
def _thread_from_config(config: Any) -> str:
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    if thread is None or str(thread) == "":
        raise ValueError(_NO_THREAD)
    return str(thread)


def _thread_id(runtime: Runtime[Any] | None) -> str:
    info = getattr(runtime, "execution_info", None)
    if info is not None and info.thread_id:
        return str(info.thread_id)
    try:
        config = get_config()
    except RuntimeError:
        config = None
    return _thread_from_config(config)


# -- the middleware --------------------------------------------------------------------------------
class MemoryMiddleware(AgentMiddleware):
    """The plugin's memory for a LangChain v1 agent (see the module docstring).

    ``memory`` is a started :class:`AgentMemory` (its tools are read here). ``memory_tools``:
    give the agent ``memory_search`` and ``memory_expand`` (default ``True``)."""

    def __init__(self, memory: AgentMemory, *, memory_tools: bool = True) -> None:
        super().__init__()
        self.memory = memory
        self.tools: Sequence[BaseTool] = (
            [self._tool(t) for t in memory.tools()] if memory_tools else []
        )
        self._own_tools = {t.name for t in memory.tools()}
        #: Per thread, the ids of the messages already handed to the memory (converted once;
        #: the memory itself stores each id once whatever it is handed).
        self._handed: OrderedDict[str, set[str]] = OrderedDict()
        #: Messages built for what the memory sends in place of the agent's own (see
        #: :func:`from_prompt`), the least recently used forgotten first.
        self._built: _Built = _Built()
        #: The agent's own tools' definitions, by the identity of the tools they were made of.
        self._defs: tuple[tuple[int, ...], list[dict[str, Any]]] = ((), [])

    def _new(self, thread: str, messages: Sequence[BaseMessage]) -> list[Message]:
        """The messages of ``thread`` not handed to the memory yet (by a model call that
        succeeded: see :meth:`_handed_over`), converted."""
        handed = self._handed.get(thread)
        if handed is not None:
            self._handed.move_to_end(thread)
        return to_memory(messages, handed or ())

    def _handed_over(self, thread: str, messages: Sequence[Message]) -> None:
        handed = self._handed.get(thread)
        if handed is None:
            handed = self._handed[thread] = set()
            while len(self._handed) > MAX_THREADS:
                self._handed.popitem(last=False)
        handed.update(str(m.metadata[SOURCE_ID]) for m in messages)

    def _sent_besides(self, request: ModelRequest[Any]) -> dict[str, Any]:
        """What the call sends besides the memory's prompt, for its budget: the agent's system
        prompt and its own tools' definitions (the memory's tools are counted by the memory)."""
        system = request.system_message.text if request.system_message is not None else None
        key = tuple(id(t) for t in request.tools)
        if key != self._defs[0]:
            defs = []
            for tool in request.tools:
                try:
                    definition = convert_to_openai_tool(tool)
                except Exception:  # a provider's built-in tool, as a dict it cannot convert
                    definition = tool if isinstance(tool, dict) else {"name": str(tool)}
                if definition.get("function", {}).get("name") not in self._own_tools:
                    defs.append(definition)
            self._defs = (key, defs)
        return {"system": system, "tools": self._defs[1]}

    def _tool(self, spec: MemoryTool) -> BaseTool:
        memory, name = self.memory, spec.name

        def run(**arguments: Any) -> str:
            return memory.call_tool(_thread_id(None), name, arguments)

        async def arun(**arguments: Any) -> str:
            return await memory.acall_tool(_thread_id(None), name, arguments)

        return StructuredTool.from_function(
            func=run,
            coroutine=arun,
            name=name,
            description=spec.description,
            args_schema=spec.parameters,
        )

    # -- model calls -----------------------------------------------------------------------------
    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult[Any]:
        thread = _thread_id(request.runtime)
        new = self._new(thread, request.messages)
        items = self.memory.prompt(thread, new, **self._sent_besides(request))
        self._handed_over(thread, new)
        return handler(request.override(messages=from_prompt(items, request.messages, self._built)))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult[Any]:
        thread = _thread_id(request.runtime)
        new = self._new(thread, request.messages)
        items = await self.memory.aprompt(thread, new, **self._sent_besides(request))
        self._handed_over(thread, new)
        return await handler(
            request.override(messages=from_prompt(items, request.messages, self._built))
        )

    # -- the end of a run ------------------------------------------------------------------------
    def after_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        thread = _thread_id(runtime)
        self.memory.end_turn(thread, self._new(thread, state["messages"]))
        return None

    async def aafter_agent(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        thread = _thread_id(runtime)
        await self.memory.aend_turn(thread, self._new(thread, state["messages"]))
        return None

    # -- user actions ----------------------------------------------------------------------------
    def clear(self, thread_id: str, checkpointer: Any = None) -> None:
        """Forget the thread: its stored history, summary and archive, and the checkpointer's
        thread when one is given (``agent.checkpointer``); a thread left in the checkpointer is
        mirrored into the memory again at its next run."""
        if checkpointer is not None:
            checkpointer.delete_thread(thread_id)
        self.memory.clear(thread_id)
        self._handed.pop(thread_id, None)

    async def aclear(self, thread_id: str, checkpointer: Any = None) -> None:
        """:meth:`clear` for an async caller."""
        if checkpointer is not None:
            await checkpointer.adelete_thread(thread_id)
        await self.memory.aclear(thread_id)
        self._handed.pop(thread_id, None)
