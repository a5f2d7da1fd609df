"""The pydantic-ai adapter: its message mapping both ways, the adapter contract with a sync and an
async agent (``Agent(..., capabilities=[MemoryCapability(...)])``), and the docs' quick start."""

from __future__ import annotations

import asyncio
import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from adapter_contract import (
    AGENT_MODEL,
    SYSTEM_PROMPT,
    AdapterContract,
    AgentDriver,
    ContractServer,
    lookup_value,
    tool_pairs_ok,
)
from fake_openai import FakeOpenAIServer, Reply
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from plugin_memory_summary.adapters import SOURCE_ID, AgentMemory, PromptItem
from plugin_memory_summary.adapters.pydantic_ai import (
    MemoryCapability,
    from_prompt,
    source_ids,
    to_memory,
)

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "adapters" / "pydantic-ai.md"
PLACEHOLDER = "[tool output pruned: call memory_expand to see it]"


@pytest.fixture(autouse=True)
def _close_run_sync_loop() -> Iterator[None]:
    """``Agent.run_sync`` leaves the thread's default event loop open on purpose (it reuses it
    at the next call): close it after each test, or it is collected, unclosed, in a later one."""
    yield
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return
    if not loop.is_closed() and not loop.is_running():
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    asyncio.set_event_loop(None)


def _conversation(run_id: str = "run-1") -> list[ModelMessage]:
    return [
        ModelRequest(
            parts=[SystemPromptPart(SYSTEM_PROMPT), UserPromptPart("please lookup alpha")],
            run_id=run_id,
        ),
        ModelResponse(
            parts=[ToolCallPart("lookup", {"key": "alpha"}, tool_call_id="call_1")],
            run_id=run_id,
        ),
        ModelRequest(
            parts=[ToolReturnPart("lookup", "value of alpha: ALPHA-42", tool_call_id="call_1")],
            run_id=run_id,
        ),
        ModelResponse(parts=[TextPart("done")], run_id=run_id),
    ]


def _items(messages: list[ModelMessage]) -> list[PromptItem]:
    """What the memory's prompt looks like for ``messages`` (summary block first)."""
    items = [
        PromptItem({"role": "system", "content": "Summary: the user likes trains."}, None, False)
    ]
    for m in to_memory(messages):
        items.append(PromptItem(m.to_openai(), str(m.metadata[SOURCE_ID]), False))
    return items


def _openai(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    """The chat-completions messages pydantic-ai's OpenAI model sends for ``messages``."""
    model = OpenAIChatModel(
        AGENT_MODEL, provider=OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key="test")
    )
    sent = asyncio.run(model._map_messages(messages, ModelRequestParameters()))
    return [dict(m) for m in sent]


# -- the mapping: pydantic-ai -> memory -----------------------------------------------------------
def test_to_memory_maps_parts_and_keeps_the_tool_pair() -> None:
    stored = to_memory(_conversation())
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[0].content == "please lookup alpha"  # the system prompt is not stored
    call = stored[1].tool_calls
    assert stored[1].content is None and call and call[0].id == "call_1"
    assert call[0].function.name == "lookup" and '"alpha"' in call[0].function.arguments
    assert stored[2].tool_call_id == "call_1" and stored[2].name == "lookup"
    assert stored[2].content == "value of alpha: ALPHA-42"
    assert stored[3].content == "done"


def test_ids_are_stable_new_turns_add_only_new_ids_and_runs_differ() -> None:
    history = _conversation()
    ids = source_ids(history)
    assert len(set(ids)) == 4 and all(i.startswith("pai-") for i in ids)
    # the same history after a JSON round trip (a history kept in a database)
    again = ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(history))
    assert source_ids(again) == ids
    # the next run passes the whole history back: the earlier ids do not change
    longer = [*history, ModelRequest(parts=[UserPromptPart("thanks")], run_id="run-2")]
    assert source_ids(longer)[:4] == ids and len(set(source_ids(longer))) == 5
    # the same words in another run (a thread started afresh) are another message
    assert source_ids(_conversation("run-9"))[0] != ids[0]
    # the same words later in the history are another message
    repeat = [*history, ModelRequest(parts=[UserPromptPart("please lookup alpha")], run_id="run-1")]
    assert source_ids(repeat)[4] != ids[0]


# -- the mapping: memory -> pydantic-ai -----------------------------------------------------------
def test_from_prompt_puts_the_system_prompt_first_and_keeps_order_and_objects() -> None:
    history = _conversation()
    out = from_prompt(_items(history), history)
    first = out[0]
    assert isinstance(first, ModelRequest)
    assert [type(p).__name__ for p in first.parts] == [
        "SystemPromptPart",
        "SystemPromptPart",
        "UserPromptPart",
    ]
    assert first.parts[0].content == SYSTEM_PROMPT
    assert "Summary" in str(first.parts[1].content)
    assert first.parts[2] is history[0].parts[1]  # the run's own part object
    assert out[1] is history[1] and out[3] is history[3]
    assert isinstance(out[2], ModelRequest) and out[2].parts[0] is history[2].parts[0]
    sent = _openai(out)
    assert [m["role"] for m in sent] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert tool_pairs_ok(sent) == []


def test_from_prompt_replaces_a_pruned_output_with_its_placeholder() -> None:
    history = _conversation()
    items = _items(history)
    tool = items[3]
    items[3] = PromptItem({**tool.message, "content": PLACEHOLDER}, tool.source_id, True)
    out = from_prompt(items, history)
    part = out[2].parts[0]
    assert isinstance(part, ToolReturnPart) and part is not history[2].parts[0]
    assert part.content == PLACEHOLDER and part.tool_call_id == "call_1"
    assert part.tool_name == "lookup"
    assert history[2].parts[0].content == "value of alpha: ALPHA-42"  # the run's own is intact
    assert tool_pairs_ok(_openai(out)) == []


def test_from_prompt_rebuilds_what_the_run_does_not_hold() -> None:
    """A thread resumed without its history: the stored messages come back as built parts, the
    tool call still before its result, the new request last."""
    old = _conversation("run-old")
    new = [ModelRequest(parts=[SystemPromptPart(SYSTEM_PROMPT), UserPromptPart("back")])]
    items = _items(old)
    items += [PromptItem(m.to_openai(), str(m.metadata[SOURCE_ID]), False) for m in to_memory(new)]
    # the stored tool result has no name: it is taken from its call
    items[3] = PromptItem({k: v for k, v in items[3].message.items() if k != "name"}, "x", False)
    out = from_prompt(items, new)
    assert isinstance(out[1], ModelResponse) and out[1] is not old[1]
    call = out[1].parts[0]
    assert isinstance(call, ToolCallPart) and call.tool_call_id == "call_1"
    assert call.args_as_dict() == {"key": "alpha"}
    result = out[2].parts[0]
    assert isinstance(result, ToolReturnPart) and result.tool_name == "lookup"
    assert isinstance(out[-1], ModelRequest) and out[-1].parts[-1] is new[0].parts[1]
    sent = _openai(out)
    assert sent[0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert sent[-1] == {"role": "user", "content": "back"}
    assert tool_pairs_ok(sent) == []


# -- the contract ----------------------------------------------------------------------------------
class PydanticAIDriver:
    """A pydantic-ai agent with :class:`MemoryCapability`; the thread is the run's
    ``conversation_id``; the driver keeps each thread's ``all_messages()`` and passes it back
    as ``message_history``."""

    def __init__(self, *, async_: bool) -> None:
        self.name = "pydantic-ai-async" if async_ else "pydantic-ai"
        self.async_ = async_
        self.agent: Agent[None, str] | None = None
        self.capability: MemoryCapability | None = None
        self.histories: dict[str, list[ModelMessage]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def open(self, memory: AgentMemory, base_url: str) -> None:
        self.capability = MemoryCapability(memory)
        model = OpenAIChatModel(
            AGENT_MODEL, provider=OpenAIProvider(base_url=base_url, api_key="test")
        )
        agent = Agent(model, system_prompt=SYSTEM_PROMPT, capabilities=[self.capability])

        @agent.tool_plain
        def lookup(key: str) -> str:
            """Look a key up."""
            return lookup_value(key)

        self.agent = agent
        if self.async_:
            self.loop = asyncio.new_event_loop()

    def turn(self, thread: str, text: str) -> str:
        assert self.agent is not None
        history = self.histories.get(thread, [])
        if self.loop is not None:
            result = self.loop.run_until_complete(
                self.agent.run(text, message_history=history, conversation_id=thread)
            )
        else:
            result = self.agent.run_sync(text, message_history=history, conversation_id=thread)
        self.histories[thread] = result.all_messages()
        return result.output

    def framework_messages(self, thread: str) -> int | None:
        return len(self.histories.get(thread, []))

    def clear(self, thread: str) -> None:
        assert self.capability is not None
        if self.loop is not None:
            self.loop.run_until_complete(self.capability.aclear(thread))
        else:
            self.capability.clear(thread)
        self.histories.pop(thread, None)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()
            self.loop = None


class TestPydanticAISync(AdapterContract):
    @staticmethod
    def make_driver() -> AgentDriver:
        return PydanticAIDriver(async_=False)


class TestPydanticAIAsync(AdapterContract):
    @staticmethod
    def make_driver() -> AgentDriver:
        return PydanticAIDriver(async_=True)


def test_the_run_history_is_never_truncated_and_the_session_can_be_fixed(tmp_path: Path) -> None:
    with ContractServer() as server:
        memory = AgentMemory(
            f"sqlite:///{tmp_path / 'm.db'}",
            model=f"openai/{AGENT_MODEL}",
            api_base=server.base_url,
            api_key="test",
            context_window=1600,
            reserve_for_reply=200,
            config=AdapterContract.CONFIG,
        )
        with memory:
            capability = MemoryCapability(memory, session_id="user-42")
            model = OpenAIChatModel(
                AGENT_MODEL, provider=OpenAIProvider(base_url=server.base_url, api_key="test")
            )
            agent = Agent(model, system_prompt=SYSTEM_PROMPT, capabilities=[capability])
            history: list[ModelMessage] = []
            for i in range(24):
                text = f"turn {i}: my locker code is {4000 + i} for the trip to city {i}"
                history = agent.run_sync(text, message_history=history).all_messages()
            memory.settle(20)
            history = agent.run_sync("and now?", message_history=history).all_messages()
            # the session is the fixed id, whatever the runs' conversation id
            assert memory.history("user-42")
            assert len(history) == 50  # 25 turns, each a request and a response: all kept
            sent = server.agent_requests[-1]["messages"]
            assert sent[0] == {"role": "system", "content": SYSTEM_PROMPT}
            assert len(sent) < len(history)
            capability.clear()
            assert memory.history("user-42") == []


async def test_streamed_and_iterated_runs_end_the_turn() -> None:
    with ContractServer() as server:
        async with AgentMemory(
            "memory://",
            model=f"openai/{AGENT_MODEL}",
            api_base=server.base_url,
            api_key="test",
            context_window=4000,
            config=AdapterContract.CONFIG,
        ) as memory:
            model = OpenAIChatModel(
                AGENT_MODEL, provider=OpenAIProvider(base_url=server.base_url, api_key="test")
            )
            agent = Agent(
                model, system_prompt=SYSTEM_PROMPT, capabilities=[MemoryCapability(memory)]
            )
            async with agent.run_stream("hello stream", conversation_id="s1") as streamed:
                assert await streamed.get_output() == "ok: hello stream"
            async with agent.iter("hello iter", conversation_id="s2") as run:
                async for _node in run:
                    pass
            for session, text in (("s1", "hello stream"), ("s2", "hello iter")):
                stored = await memory.ahistory(session)
                assert [(m.role, m.content) for m in stored] == [
                    ("user", text),
                    ("assistant", f"ok: {text}"),
                ]


def test_the_agent_calls_the_memory_tools_in_its_session() -> None:
    def reply(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return f"found: {last['content']}"
        if "search" in str(last.get("content")):
            return Reply.tool_calls(
                [
                    {
                        "id": "call_m",
                        "type": "function",
                        "function": {
                            "name": "memory_search",
                            "arguments": json.dumps({"query": "boathouse locker"}),
                        },
                    }
                ]
            )
        return "noted"

    with FakeOpenAIServer(default_reply=reply) as server:
        with AgentMemory(
            "memory://",
            model=f"openai/{AGENT_MODEL}",
            api_base=server.base_url,
            api_key="test",
            context_window=4000,
        ) as memory:
            model = OpenAIChatModel(
                AGENT_MODEL, provider=OpenAIProvider(base_url=server.base_url, api_key="test")
            )
            capability = MemoryCapability(memory, session_id=lambda ctx: f"user-{ctx.deps}")
            agent = Agent(model, deps_type=int, capabilities=[capability])
            first = agent.run_sync("the boathouse locker code is 8814", deps=7)
            result = agent.run_sync("search for it", deps=7, message_history=first.all_messages())
            assert result.output.startswith("found: ") and "8814" in result.output
            assert len(memory.history("user-7")) == 6
            assert memory.history("user-8") == []


def test_the_budget_counts_the_system_prompt_instructions_and_own_tools() -> None:
    seen: list[dict[str, Any]] = []
    with ContractServer() as server:
        with AgentMemory(
            "memory://",
            model=f"openai/{AGENT_MODEL}",
            api_base=server.base_url,
            api_key="test",
            context_window=4000,
        ) as memory:
            aprompt = memory.aprompt

            async def recording(session: str, messages: Any, **kwargs: Any) -> Any:
                seen.append(kwargs)
                return await aprompt(session, messages, **kwargs)

            memory.aprompt = recording  # type: ignore[method-assign]
            model = OpenAIChatModel(
                AGENT_MODEL, provider=OpenAIProvider(base_url=server.base_url, api_key="test")
            )
            agent = Agent(
                model,
                system_prompt=SYSTEM_PROMPT,
                instructions="Answer briefly.",
                capabilities=[MemoryCapability(memory, session_id="s")],
            )

            @agent.tool_plain
            def lookup(key: str) -> str:
                """Look a key up."""
                return lookup_value(key)

            agent.run_sync("please lookup alpha")
    assert len(seen) == 2  # the user's request, then the tool result's
    for kwargs in seen:
        assert SYSTEM_PROMPT in kwargs["system"] and "Answer briefly." in kwargs["system"]
        assert [t["function"]["name"] for t in kwargs["tools"]] == ["lookup"]


# -- the docs' quick start ------------------------------------------------------------------------
def test_the_quick_start_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    match = re.search(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert match, "no python block in the quick start"

    def reply(body: dict[str, Any]) -> str:
        last = body["messages"][-1]
        return f"echo: {last.get('content')}"

    with FakeOpenAIServer(default_reply=reply) as server:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        exec(compile(match.group(1), str(DOC), "exec"), {"__name__": "__main__"})
        bodies = list(server.requests)
    assert "echo:" in capsys.readouterr().out
    assert (tmp_path / "agent-memory.db").exists()
    agent_bodies = [b for b in bodies if b.get("tools")]
    assert agent_bodies and {"memory_search", "memory_expand"} <= {
        t["function"]["name"] for t in agent_bodies[-1]["tools"]
    }
    # the second run's request carries the first turn (from the history the memory kept)
    assert "4417" in str(agent_bodies[-1]["messages"])
