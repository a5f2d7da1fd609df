"""The memory as a pydantic-ai capability: ``Agent(model, capabilities=[MemoryCapability(m)])``.

Before each model request the capability mirrors the run's messages into the memory's store and
replaces what the model is sent with the memory's prompt: the agent's own system prompt, the
summary block, old tool output as placeholders, the kept tail. Only the request changes: the
run's message history (``result.all_messages()``) is never truncated or rewritten. At the end of
a run the final response is stored and the plugin may compress in the background. The tools
``memory_search`` and ``memory_expand`` are the capability's own toolset.

pydantic-ai messages carry no ids, so each stored message gets one derived from its place in the
run's full history, the id of the run it came from and its content (:func:`source_ids`): passing
``message_history=result.all_messages()`` to the next run stores only what is new.

The session is the ``session_id`` the capability was given (a string, or a function of the
``RunContext``), else the run's ``conversation_id`` (``agent.run(..., conversation_id=...)``, or
the one the passed history carries).

Needs the ``pydantic-ai`` extra: ``pip install 'plugin-memory-summary[pydantic-ai]'``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    RetryFeedbackPart,
    RetryPromptPart,
    SystemPromptPart,
    TextContent,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext, ModelRequestParameters
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import RunContext, Tool
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

from host_stub.messages import Message, ToolCall, ToolCallFunction, text_of

from ._runtime import SOURCE_ID, AgentMemory, MemoryTool, PromptItem

__all__ = ["MemoryCapability", "SessionId", "from_prompt", "source_ids", "to_memory"]

#: The session a run's messages go to: a fixed id, a function of the run's context, or ``None``
#: for the run's ``conversation_id``.
SessionId = str | Callable[[RunContext[Any]], str] | None

#: The prefix of every id the adapter derives.
ID_PREFIX = "pai-"

_NO_SESSION = (
    "MemoryCapability needs a session: give it session_id=..., or run the agent with "
    "conversation_id=..."
)

#: What a stored message stands for in the run's history: a request part or a whole response.
_Original = ModelRequestPart | ModelResponse


# -- pydantic-ai -> memory -------------------------------------------------------------------------
def _user_content(content: str | Sequence[Any]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for item in content:
        if isinstance(item, str | TextContent):
            parts.append({"type": "text", "text": item if isinstance(item, str) else item.content})
        elif isinstance(item, ImageUrl):
            parts.append({"type": "image_url", "image_url": {"url": item.url}})
        else:  # audio, documents, binary files, cache points: kept out of the memory's text
            parts.append({"type": str(getattr(item, "kind", "file"))})
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _request_part(part: ModelRequestPart) -> Message | None:
    """A request part as the memory stores it; ``None`` for what it does not: the agent's own
    system prompt (sent first with every request) and pydantic-ai's bookkeeping parts."""
    if isinstance(part, UserPromptPart):
        return Message(role="user", content=_user_content(part.content))
    if isinstance(part, ToolReturnPart):
        return Message(
            role="tool",
            content=part.model_response_str(),
            tool_call_id=part.tool_call_id,
            name=part.tool_name,
        )
    if isinstance(part, RetryFeedbackPart):
        return Message(role="user", content=part.model_response())
    if isinstance(part, RetryPromptPart):  # a legacy part, in a history built by hand
        if part.tool_name is None:
            return Message(role="user", content=part.model_response())
        return Message(
            role="tool",
            content=part.model_response(),
            tool_call_id=part.tool_call_id,
            name=part.tool_name,
        )
    return None


def _response(message: ModelResponse) -> Message | None:
    text = "\n\n".join(p.content for p in message.parts if isinstance(p, TextPart) and p.content)
    calls = [
        ToolCall(
            id=p.tool_call_id,
            function=ToolCallFunction(name=p.tool_name, arguments=p.args_as_json_str()),
        )
        for p in message.parts
        if isinstance(p, ToolCallPart)
    ]
    if not text and not calls:
        return None  # only thinking or provider-side parts: nothing a chat model is sent
    return Message(role="assistant", content=text or None, tool_calls=calls or None)


def _mirror(messages: Sequence[ModelMessage]) -> list[tuple[Message, _Original]]:
    """Each stored message of the history with its id set, and what it stands for."""
    out: list[tuple[Message, _Original]] = []
    for index, message in enumerate(messages):
        pairs: list[tuple[Message | None, _Original]]
        if isinstance(message, ModelRequest):
            pairs = [(_request_part(part), part) for part in message.parts]
        else:
            pairs = [(_response(message), message)]
        taken: dict[str, int] = {}
        for mapped, original in pairs:
            if mapped is None:
                continue
            key = json.dumps([message.run_id, mapped.to_openai()], sort_keys=True, default=str)
            digest = hashlib.sha256(key.encode()).hexdigest()[:16]
            seen = taken[digest] = taken.get(digest, 0) + 1
            source = f"{ID_PREFIX}{index}-{digest}" + (f"-{seen}" if seen > 1 else "")
            mapped.metadata[SOURCE_ID] = source
            out.append((mapped, original))
    return out


def source_ids(messages: Sequence[ModelMessage]) -> list[str]:
    """The ids the adapter gives the stored messages of a run's history, in order: the index of
    the pydantic-ai message in the history, a hash of its run id and of the mapped content (a
    request's parts are stored one by one, each with its own hash), and a counter when one
    request holds the same part twice. The same history gives the same ids in every process."""
    return [str(m.metadata[SOURCE_ID]) for m, _ in _mirror(messages)]


def to_memory(messages: Sequence[ModelMessage]) -> list[Message]:
    """The run's messages as the memory stores them (OpenAI chat format, the derived id in
    ``metadata["source_id"]``): a user prompt, a tool return or a retry is one message; a
    response one assistant message (its text and tool calls); system prompt parts are not
    stored (the agent sends its own with every request)."""
    return [m for m, _ in _mirror(messages)]


# -- memory -> pydantic-ai -------------------------------------------------------------------------
def _built_response(message: dict[str, Any]) -> ModelResponse:
    parts: list[ModelResponsePart] = []
    if text := text_of(message.get("content")):
        parts.append(TextPart(content=text))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        parts.append(
            ToolCallPart(
                tool_name=str(function.get("name", "")),
                args=function.get("arguments") or "{}",
                tool_call_id=str(call["id"]),
            )
        )
    return ModelResponse(parts=parts)


def _built_part(message: dict[str, Any], tool_names: dict[str, str]) -> ModelRequestPart:
    role, text = message.get("role"), text_of(message.get("content"))
    if role == "tool":
        call_id = str(message.get("tool_call_id", ""))
        name = message.get("name") or tool_names.get(call_id, "")
        return ToolReturnPart(tool_name=str(name), content=text, tool_call_id=call_id)
    if role == "system":
        return SystemPromptPart(content=text)
    return UserPromptPart(content=text)


def _system_parts(
    messages: Sequence[ModelMessage],
) -> tuple[list[SystemPromptPart], list[SystemPromptPart]]:
    """The agent's own system prompt parts the request carries: those of the whole history
    (sent first), and the request-scoped ones of the current request (sent with it)."""
    system = [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, SystemPromptPart) and p.scope != "request"
    ]
    last = messages[-1] if messages else None
    scoped = [
        p
        for p in (last.parts if isinstance(last, ModelRequest) else ())
        if isinstance(p, SystemPromptPart) and p.scope == "request"
    ]
    return system, scoped


def from_prompt(
    items: Sequence[PromptItem], messages: Sequence[ModelMessage]
) -> list[ModelMessage]:
    """The memory's prompt as pydantic-ai messages for one request: first a request with the
    agent's own system prompt parts and the summary block, then the prompt's messages in order.

    An unchanged item is the run's own part or response object (found by its id among
    ``messages``); a changed one (a tool output shown as a placeholder: a ``ToolReturnPart``
    with the placeholder and the same ``tool_call_id``), an added one (the summary block: a
    ``SystemPromptPart``) or one the run's history does not hold (a thread resumed without its
    history) is built from the OpenAI dict. Consecutive user, tool and system items share one
    ``ModelRequest``; each assistant item is a ``ModelResponse``. A request-scoped system prompt
    of the current request stays with it."""
    return _from_items(items, messages, _mirror(messages))


def _from_items(
    items: Sequence[PromptItem],
    messages: Sequence[ModelMessage],
    mirrored: Sequence[tuple[Message, _Original]],
) -> list[ModelMessage]:
    originals = {str(m.metadata[SOURCE_ID]): original for m, original in mirrored}
    system, scoped = _system_parts(messages)
    tool_names = {
        str(call["id"]): str((call.get("function") or {}).get("name", ""))
        for item in items
        for call in item.message.get("tool_calls") or []
    }
    out: list[ModelMessage] = []
    pending: list[ModelRequestPart] = list(system)
    for item in items:
        original = originals.get(item.source_id) if item.source_id and not item.changed else None
        if item.message.get("role") == "assistant":
            if pending:
                out.append(ModelRequest(parts=pending))
                pending = []
            if isinstance(original, ModelResponse):
                out.append(original)
            else:
                out.append(_built_response(item.message))
        elif original is not None and not isinstance(original, ModelResponse):
            pending.append(original)
        else:
            pending.append(_built_part(item.message, tool_names))
    pending.extend(scoped)
    if pending:
        out.append(ModelRequest(parts=pending))
    last = messages[-1] if messages else None
    if isinstance(last, ModelRequest) and not isinstance(out[-1] if out else None, ModelRequest):
        # the current request holds nothing the memory stores: it is sent as it is
        out.append(ModelRequest(parts=[p for p in last.parts if p not in system]))
    return out


# -- the capability --------------------------------------------------------------------------------
class MemoryCapability(AbstractCapability[Any]):
    """The plugin's memory for a pydantic-ai agent (see the module docstring).

    ``memory`` is a started :class:`AgentMemory` (its tools are read when the agent is built).
    ``session_id``: the memory session of every run (a string), a function returning it from the
    run's ``RunContext`` (e.g. from ``ctx.deps``), or ``None`` (the default) for the run's
    ``conversation_id``. ``memory_tools``: give the agent ``memory_search`` and
    ``memory_expand`` (default ``True``)."""

    def __init__(
        self, memory: AgentMemory, *, session_id: SessionId = None, memory_tools: bool = True
    ) -> None:
        self.memory = memory
        self.session_id = session_id
        tools = memory.tools()
        self._memory_tools = {t.name for t in tools}
        self._toolset: FunctionToolset[Any] | None = (
            FunctionToolset([self._tool(t) for t in tools]) if memory_tools else None
        )

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a live memory: not built from an agent spec

    def session(self, ctx: RunContext[Any]) -> str:
        """The memory session of the run ``ctx`` belongs to."""
        session: str | None
        if callable(self.session_id):
            session = self.session_id(ctx)
        else:
            session = self.session_id or ctx.conversation_id
        if not session:
            raise ValueError(_NO_SESSION)
        return str(session)

    # -- the memory's tools ----------------------------------------------------------------------
    def _tool(self, spec: MemoryTool) -> Tool[Any]:
        memory, name = self.memory, spec.name

        async def run(ctx: RunContext[Any], **arguments: Any) -> str:
            return await memory.acall_tool(self.session(ctx), name, arguments)

        return Tool.from_schema(
            run,
            name=name,
            description=spec.description,
            json_schema=spec.parameters,
            takes_ctx=True,
        )

    def get_toolset(self) -> AbstractToolset[Any] | None:
        return self._toolset

    # -- model requests --------------------------------------------------------------------------
    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        history = list(ctx.messages)  # the run's whole history, which stays as it is
        mirrored = _mirror(history)
        items = await self.memory.aprompt(
            self.session(ctx),
            [m for m, _ in mirrored],
            **self._sent_besides(history, request_context.model_request_parameters),
        )
        request_context.messages = _from_items(items, history, mirrored)
        return request_context

    def _sent_besides(
        self, history: Sequence[ModelMessage], parameters: ModelRequestParameters
    ) -> dict[str, Any]:
        """What the request sends besides the memory's prompt, for its budget: the agent's system
        prompt parts and instructions, and its own tools' definitions (function and output
        tools; the memory's tools are counted by the memory)."""
        system, scoped = _system_parts(history)
        texts = [p.content for p in (*system, *scoped)]
        texts += [p.content for p in parameters.instruction_parts or ()]
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": t.parameters_json_schema,
                },
            }
            for t in (*parameters.function_tools, *parameters.output_tools)
            if t.name not in self._memory_tools
        ]
        return {"system": "\n\n".join(texts), "tools": tools}

    # -- the end of a run ------------------------------------------------------------------------
    async def after_run(
        self, ctx: RunContext[Any], *, result: AgentRunResult[Any]
    ) -> AgentRunResult[Any]:
        await self.memory.aend_turn(self.session(ctx), to_memory(result.all_messages()))
        return result

    # -- user actions ----------------------------------------------------------------------------
    def clear(self, session_id: str | None = None) -> None:
        """Forget a session (the fixed ``session_id`` when none is given): its stored history,
        summary and archive. Start its next run with a fresh ``message_history``: messages
        passed again are mirrored into the memory again."""
        self.memory.clear(self._cleared(session_id))

    async def aclear(self, session_id: str | None = None) -> None:
        """:meth:`clear` for an async caller."""
        await self.memory.aclear(self._cleared(session_id))

    def _cleared(self, session_id: str | None) -> str:
        session = session_id or (self.session_id if isinstance(self.session_id, str) else None)
        if not session:
            raise ValueError("MemoryCapability.clear needs the session id to clear")
        return session
