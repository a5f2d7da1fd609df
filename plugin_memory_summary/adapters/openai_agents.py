"""The memory as an OpenAI Agents SDK ``Session``: ``Runner.run(agent, text, session=...)``.

:class:`MemorySession` stores the items a run adds (user input, the model's messages, function
calls and their outputs, reasoning items) in the memory's store as chat messages, each keeping
the SDK's own items in its metadata, and gives the run back the memory's view of the session:
the summary block as a system item, old tool output as placeholders, the kept tail (the SDK's own
items where unchanged). Nothing is sent to OpenAI's servers for it: it works with any model the
SDK can call (the Responses API, chat completions, litellm). After a run's final reply is stored
the plugin may compress in the background, on the memory's own thread and event loop; the SDK's
loop never waits for it. :func:`memory_tools` gives the agent ``memory_search`` and
``memory_expand``.

Needs the ``openai-agents`` extra: ``pip install 'plugin-memory-summary[openai-agents]'``.
"""

from __future__ import annotations

import contextvars
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from agents.items import TResponseInputItem
from agents.memory.session_settings import SessionSettings, coerce_session_settings
from agents.models.fake_id import FAKE_RESPONSES_ID
from agents.tool import FunctionTool
from agents.tool_context import ToolContext

from host_stub.messages import Message, ToolCall, ToolCallFunction, text_of

from ._runtime import SOURCE_ID, AgentMemory, PromptItem

__all__ = [
    "ITEMS",
    "MemorySession",
    "item_key",
    "items_to_messages",
    "memory_tools",
    "prompt_to_items",
]

#: The metadata key a stored message keeps the SDK items it stands for under.
ITEMS = "openai_agents_items"
#: The session of the run in progress (set by :meth:`MemorySession.get_items`), for the tools.
_CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("memory_session_id")
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})

Item = dict[str, Any]


# -- items to messages -----------------------------------------------------------------------------
def item_key(item: Mapping[str, Any]) -> str | None:
    """The item's identity, as the SDK dedupes items: a call or its output by ``call_id``, any
    other item by its ``id`` (not the placeholder id chat-completions models give); ``None`` for
    an item without one (a user message, a chat-completions reply)."""
    kind = str(item.get("type") or "message")
    call_id = item.get("call_id")
    if isinstance(call_id, str) and call_id:
        return f"{kind}:{call_id}"
    item_id = item.get("id")
    if isinstance(item_id, str) and item_id and item_id != FAKE_RESPONSES_ID:
        return f"{kind}:{item_id}"
    return None


def _source_id(items: Sequence[Item]) -> str:
    # Unique, never reused: the store keeps the ids of cleared and deleted messages, so an id
    # derived from an item's position or content would collide after a pop or a clear.
    first = items[0]
    tag = item_key(first) or str(first.get("role") or first.get("type") or "item")
    return f"{tag}~{uuid.uuid4().hex[:16]}"


def _text_or_parts(content: Any) -> str | list[dict[str, Any]] | None:
    if content is None or isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else [content]:
        kind = str(part.get("type", "")) if isinstance(part, Mapping) else ""
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:  # a file, audio: its kind only (the item itself is kept whole in the metadata)
            parts.append({"type": kind or "unknown"})
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _output_text(output: Any) -> str:
    shown = _text_or_parts(output)
    return shown if isinstance(shown, str) else text_of(shown)


def _opaque_text(items: Sequence[Item]) -> str:
    texts = []
    for item in items:
        summary = [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, Mapping)]
        texts.append("\n".join(summary) if any(summary) else f"[{item.get('type', 'item')}]")
    return "\n".join(texts)


def _message(role: Any, items: list[Item], **fields: Any) -> Message:
    return Message(role=role, metadata={SOURCE_ID: _source_id(items), ITEMS: items}, **fields)


def items_to_messages(items: Iterable[Mapping[str, Any]]) -> list[Message]:
    """The chat messages the SDK ``items`` stand for, each with its items in
    ``metadata[ITEMS]`` and a new unique ``metadata["source_id"]``: a user, system or developer
    message (developer as system), an assistant message, consecutive ``function_call`` items as
    one assistant message with their tool calls, a ``function_call_output`` as a tool message.
    A reasoning item (or any other item chat has no place for: a hosted tool call) goes with the
    next message of the batch (with the calls when it falls between two), or the one before it;
    alone, it is an assistant message."""
    messages: list[Message] = []
    pending: list[Item] = []
    calls: Message | None = None
    for raw in items:
        item = dict(raw)
        kind = item.get("type")
        role = item.get("role")
        if kind == "function_call":
            call = ToolCall(
                id=str(item.get("call_id", "")),
                function=ToolCallFunction(
                    name=str(item.get("name", "")), arguments=str(item.get("arguments") or "")
                ),
            )
            if calls is not None:
                assert calls.tool_calls is not None
                calls.tool_calls.append(call)
                calls.metadata[ITEMS].append(item)
                continue
            calls = _message("assistant", [*pending, item], content=None, tool_calls=[call])
        elif kind == "function_call_output":
            calls = None
            messages.append(
                _message(
                    "tool",
                    [*pending, item],
                    content=_output_text(item.get("output")),
                    tool_call_id=str(item.get("call_id", "")),
                )
            )
            pending = []
            continue
        elif role in ("user", "system", "developer", "assistant") and kind in (None, "message"):
            calls = None
            messages.append(
                _message(
                    "system" if role == "developer" else role,
                    [*pending, item],
                    content=_text_or_parts(item.get("content")),
                )
            )
            pending = []
            continue
        elif calls is not None:  # reasoning between calls of one step: the calls stay one
            calls.metadata[ITEMS].append(item)
            continue
        else:  # reasoning, hosted tool calls, references: kept with their neighbour
            pending.append(item)
            continue
        messages.append(calls)
        pending = []
    if pending:
        if messages:
            messages[-1].metadata[ITEMS].extend(pending)
        else:
            messages.append(_message("assistant", pending, content=_opaque_text(pending)))
    return messages


def _stored_items(message: Message) -> list[Item]:
    items = message.metadata.get(ITEMS)
    if isinstance(items, list) and items:
        return [dict(i) for i in items]
    return _chat_to_items(message.to_openai())


# -- the memory's view to items --------------------------------------------------------------------
def _chat_to_items(message: Mapping[str, Any]) -> list[Item]:
    """Items for a chat message the session has no items of (stored by something else)."""
    role, content = message.get("role"), message.get("content")
    if role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": str(message.get("tool_call_id", "")),
                "output": text_of(content),
            }
        ]
    items: list[Item] = []
    if role != "assistant" or content:
        items.append({"role": role, "content": content if content is not None else ""})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": str(call.get("id", "")),
                "name": str(function.get("name", "")),
                "arguments": str(function.get("arguments") or ""),
            }
        )
    return items


def prompt_to_items(
    prompt: Sequence[PromptItem], stored: Mapping[str, Sequence[Mapping[str, Any]]]
) -> list[Item]:
    """The SDK items for the memory's prompt: the summary block (and anything else the plugin
    adds) as a system message; a stored message as the items it was made of (``stored``: by
    source id), copied; a pruned tool output as its ``function_call_output`` item with the
    placeholder as output; a message without items from its chat form."""
    out: list[Item] = []
    for entry in prompt:
        message = entry.message
        if entry.source_id is None:
            text = text_of(message.get("content"))
            if text:
                out.append({"role": "system", "content": text})
            continue
        items = stored.get(entry.source_id)
        if items is None:
            out.extend(_chat_to_items(message))
            continue
        copies = [json.loads(json.dumps(i)) for i in items]
        outputs = [i for i in copies if i.get("type") == "function_call_output"]
        if message.get("role") == "tool" and len(outputs) == 1:
            # Compared here, not only by ``changed``: the shown text is what counts.
            shown = text_of(message.get("content"))
            if shown != _output_text(outputs[0].get("output")):
                outputs[0]["output"] = shown
        elif entry.changed:
            out.extend(_chat_to_items(message))
            continue
        out.extend(copies)
    return out


def _tail(items: list[Item], limit: int) -> list[Item]:
    """The newest ``limit`` items, less a tool output whose call fell before the cut."""
    window = items[-limit:] if limit > 0 else []
    calls = {i.get("call_id") for i in window if i.get("type") == "function_call"}
    return [
        i for i in window if i.get("type") != "function_call_output" or i.get("call_id") in calls
    ]


def _plain(item: Any) -> Item:
    """A JSON copy of an item (a dict, or an SDK/OpenAI model object)."""
    if hasattr(item, "model_dump"):
        item = item.model_dump(exclude_unset=True, mode="json")
    return cast(Item, json.loads(json.dumps(item, default=str)))


def _ends_turn(messages: Sequence[Message]) -> bool:
    last = messages[-1] if messages else None
    if last is None or last.role != "assistant" or last.tool_calls:
        return False
    return any(i.get("role") == "assistant" for i in last.metadata.get(ITEMS, []))


# -- the session -----------------------------------------------------------------------------------
def sent_besides(agent: Any) -> dict[str, Any]:
    """What the SDK sends with the session's items for ``agent`` (``None``: nothing known): its
    instructions when they are a string (a function's are known only in the run), and its
    function tools' definitions (the memory's own left out: the memory counts those)."""
    if agent is None:
        return {}
    instructions = getattr(agent, "instructions", None)
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.params_json_schema,
            },
        }
        for tool in getattr(agent, "tools", None) or []
        if isinstance(tool, FunctionTool) and tool.name not in _MEMORY_TOOLS
    ]
    return {"system": instructions if isinstance(instructions, str) else None, "tools": tools}


#: The memory's own tools (counted by the memory itself).
_MEMORY_TOOLS = frozenset({"memory_search", "memory_expand"})


class MemorySession:
    """The SDK ``Session`` over :class:`AgentMemory`: ``Runner.run(agent, text,
    session=MemorySession("user-42", memory, agent=agent))``. ``session_id`` is the memory's
    session id; ``session_settings`` the SDK's (its ``limit`` caps the items :meth:`get_items`
    returns). ``agent``: the agent the session serves, whose instructions (when a string) and
    function tools the SDK sends with the items, so the memory's budget counts them (a session
    is not told which agent reads it)."""

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        memory: AgentMemory,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
        agent: Any = None,
    ) -> None:
        self.session_id = session_id
        self.memory = memory
        self.agent = agent
        self.session_settings = (
            coerce_session_settings(dict(session_settings))
            if isinstance(session_settings, Mapping)
            else session_settings or SessionSettings()
        )
        #: The items of the stored messages the session knows, by source id.
        self._items: dict[str, list[Item]] = {}
        #: The identities (:func:`item_key`) of the items stored, for re-adds; read once.
        self._keys: set[str] | None = None

    def __repr__(self) -> str:
        return f"MemorySession({self.session_id!r})"

    async def _load(self) -> set[str]:
        """Read the session's active messages: their items and the items' identities."""
        keys = self._keys if self._keys is not None else set()
        for message in await self.memory.ahistory(self.session_id):
            source = message.metadata.get(SOURCE_ID)
            if message.is_marker or not source:
                continue
            items = _stored_items(message)
            self._items[str(source)] = items
            keys.update(k for k in map(item_key, items) if k)
        self._keys = keys
        return keys

    # -- the Session protocol --------------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """What the model is to see of the session: the summary block as a system item, then
        the kept items (old tool output as placeholders). It is built by the memory as for a
        model call, so the plugin's work before a call runs first (a compression when the hard
        watermark is passed; one running in the background is not waited for). ``limit``: only
        the newest ``limit`` items of it, less a tool output whose call falls before the cut."""
        _CURRENT.set(self.session_id)
        if limit is not None and limit <= 0:
            return []
        prompt = await self.memory.aprompt(self.session_id, [], **sent_besides(self.agent))
        sources = {p.source_id for p in prompt if p.source_id}
        if not sources <= self._items.keys():
            await self._load()
        self._items = {s: i for s, i in self._items.items() if s in sources}
        items = prompt_to_items(prompt, self._items)
        if limit is not None:
            items = _tail(items, limit)
        return cast(list[TResponseInputItem], items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store the items as chat messages (:func:`items_to_messages`). An item already stored
        (the same ``call_id`` or ``id``) is not stored again. When the last is the run's final
        reply, the turn ends: the plugin may start a compression in the background."""
        keys = self._keys if self._keys is not None else await self._load()
        fresh: list[Item] = []
        new_keys: set[str] = set()
        for item in map(_plain, items):
            key = item_key(item)
            if key is not None:
                if key in keys or key in new_keys:
                    continue
                new_keys.add(key)
            fresh.append(item)
        messages = items_to_messages(fresh)
        if not messages:
            return
        if _ends_turn(messages):
            await self.memory.aend_turn(self.session_id, messages)
        else:
            await self.memory.aadd(self.session_id, messages)
        keys.update(new_keys)
        for message in messages:
            self._items[message.metadata[SOURCE_ID]] = message.metadata[ITEMS]

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest stored item and return it (``None`` when no active message is left:
        what a summary covers is not popped). Its message is marked deleted in the store; the
        other items of that message (calls of the same step) are stored again without it."""
        history = await self.memory.ahistory(self.session_id)
        last = next((m for m in reversed(history) if not m.is_marker), None)
        if last is None or last.seq is None:
            return None
        items = _stored_items(last)
        memory = self.memory
        await memory.adelete(self.session_id, [last.seq])
        self._items.pop(str(last.metadata.get(SOURCE_ID)), None)
        popped, rest = items[-1], items[:-1]
        key = item_key(popped)
        if self._keys is not None and key is not None:
            self._keys.discard(key)
        if rest:
            messages = items_to_messages(rest)
            await memory.aadd(self.session_id, messages)
            for message in messages:
                self._items[message.metadata[SOURCE_ID]] = message.metadata[ITEMS]
        return cast(TResponseInputItem, popped)

    async def clear_session(self) -> None:
        """Forget the session: its messages, its summary, its archive."""
        await self.memory.aclear(self.session_id)
        self._items = {}
        self._keys = set()

    def tools(self) -> list[FunctionTool]:
        """:func:`memory_tools` of this session."""
        return memory_tools(self.memory, self.session_id)


# -- the memory's tools ----------------------------------------------------------------------------
def memory_tools(
    memory: AgentMemory,
    session_id: str | Callable[[ToolContext[Any]], str] | None = None,
) -> list[FunctionTool]:
    """``memory_search`` and ``memory_expand`` as SDK function tools (the memory must be
    started). ``session_id``: the session they search, a function of the tool's context that
    names it, or ``None``: the session of the run that calls them (the :class:`MemorySession`
    the run was given)."""

    def session_of(context: ToolContext[Any]) -> str:
        if callable(session_id):
            return session_id(context)
        if session_id is not None:
            return session_id
        current = _CURRENT.get(None)
        if current is None:
            raise RuntimeError("no MemorySession in this run: pass memory_tools a session_id")
        return current

    def tool(name: str, description: str, parameters: dict[str, Any]) -> FunctionTool:
        async def invoke(context: ToolContext[Any], arguments: str) -> str:
            return await memory.acall_tool(session_of(context), name, arguments or "{}")

        # Not strict: the plugin's schemas have optional arguments (strict makes all required).
        return FunctionTool(
            name=name,
            description=description,
            params_json_schema=parameters,
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )

    return [tool(t.name, t.description, t.parameters) for t in memory.tools()]
