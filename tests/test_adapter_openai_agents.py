"""The OpenAI Agents SDK adapter: its item mapping both ways, the session's protocol methods, the
memory tools, the adapter contract with a sync (``Runner.run_sync``) and an async
(``Runner.run``) agent over :class:`MemorySession`, and the docs' quick start."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import warnings
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from adapter_contract import (
    AGENT_MODEL,
    SYSTEM_PROMPT,
    AdapterContract,
    AgentDriver,
    ContractServer,
    lookup_value,
)
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.memory import Session
from fake_openai import Reply
from openai import AsyncOpenAI

from host_stub.testing.llm import FakeLLM
from plugin_memory_summary.adapters import SOURCE_ID, AgentMemory, PromptItem
from plugin_memory_summary.adapters.openai_agents import (
    ITEMS,
    MemorySession,
    item_key,
    items_to_messages,
    memory_tools,
    prompt_to_items,
)

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "adapters" / "openai-agents.md"
_T = TypeVar("_T")

# ``Runner.run_sync`` reuses the thread's event loop and shuts its async generators down after
# each run, so the next run's HTTP client warns (the SDK's own behaviour, ignored by default).
pytestmark = pytest.mark.filterwarnings(
    "ignore:asynchronous generator .* was scheduled after loop.shutdown_asyncgens:ResourceWarning"
)


def _thread_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop ``Runner.run_sync`` uses (the thread's default one), if there is one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:
            return None


@pytest.fixture(autouse=True)
def _sdk() -> Iterator[None]:
    set_tracing_disabled(True)  # nothing may try the network
    yield
    # ``Runner.run_sync`` leaves the thread's default loop open on purpose: close it here.
    loop = _thread_loop()
    if loop is not None and not loop.is_closed() and not loop.is_running():
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    asyncio.set_event_loop(None)


def _close_sync_client(client: AsyncOpenAI) -> None:
    loop = _thread_loop()
    if loop is not None and not loop.is_closed():
        loop.run_until_complete(client.close())


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    return asyncio.run(coro)


def _memory(**config: Any) -> AgentMemory:
    return AgentMemory(
        "memory://",
        model="gpt-4o-mini",
        context_window=config.pop("context_window", 8000),
        reserve_for_reply=config.pop("reserve_for_reply", 1024),
        llm=FakeLLM(),
        config={"threshold": 10, **config},
    )


# Items as the SDK hands them to a session (chat-completions replies carry the placeholder id).
USER = {"content": "please lookup alpha and beta", "role": "user"}
CALL_A = {
    "arguments": '{"key": "alpha"}',
    "call_id": "call_a",
    "name": "lookup",
    "type": "function_call",
    "id": "__fake_id__",
    "provider_data": {"model": "fake-agent", "response_id": "chatcmpl-1"},
}
CALL_B = {**CALL_A, "arguments": '{"key": "beta"}', "call_id": "call_b"}
OUT_A = {"call_id": "call_a", "output": lookup_value("alpha"), "type": "function_call_output"}
OUT_B = {"call_id": "call_b", "output": lookup_value("beta"), "type": "function_call_output"}
REPLY = {
    "id": "__fake_id__",
    "content": [{"annotations": [], "text": "both found", "type": "output_text", "logprobs": []}],
    "role": "assistant",
    "status": "completed",
    "type": "message",
}
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]}
STEP = [USER, CALL_A, CALL_B, OUT_A, OUT_B, REPLY]


# -- items to messages -----------------------------------------------------------------------------
def test_a_step_with_two_calls_maps_to_one_assistant_message_and_two_results() -> None:
    messages = items_to_messages(STEP)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    calls = messages[1]
    assert calls.content is None and calls.tool_calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in calls.tool_calls] == [
        ("call_a", "lookup", '{"key": "alpha"}'),
        ("call_b", "lookup", '{"key": "beta"}'),
    ]
    assert calls.metadata[ITEMS] == [CALL_A, CALL_B]
    assert [m.tool_call_id for m in messages[2:4]] == ["call_a", "call_b"]
    assert messages[2].content == lookup_value("alpha")
    assert messages[0].content == USER["content"] and messages[4].content == "both found"
    ids = [m.metadata[SOURCE_ID] for m in messages]
    assert len(set(ids)) == len(ids)
    assert ids[1].startswith("function_call:call_a~") and ids[0].startswith("user~")
    # every item is kept, in order, with the message it belongs to
    assert [i for m in messages for i in m.metadata[ITEMS]] == STEP


def test_content_parts_roles_and_reasoning_items() -> None:
    items = [
        {"role": "developer", "content": "be brief"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "see"},
                {"type": "input_text", "text": "this"},
            ],
        },
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]},
        REASONING,
        {**REPLY, "id": "msg_1"},
        REASONING | {"id": "rs_2"},
    ]
    messages = items_to_messages(items)
    assert [m.role for m in messages] == ["system", "user", "user", "assistant"]
    assert messages[1].content == "see\nthis"
    assert messages[2].content == [{"type": "image_url", "image_url": {"url": "data:x"}}]
    # a reasoning item goes with the message after it; a trailing one with the one before
    assert messages[3].metadata[ITEMS] == [
        REASONING,
        {**REPLY, "id": "msg_1"},
        REASONING | {"id": "rs_2"},
    ]
    # one between two calls of a step leaves them one assistant message
    step = items_to_messages([REASONING, CALL_A, REASONING | {"id": "rs_2"}, CALL_B, OUT_A, OUT_B])
    assert [m.role for m in step] == ["assistant", "tool", "tool"]
    assert [c.id for c in step[0].tool_calls or []] == ["call_a", "call_b"]
    assert step[0].metadata[ITEMS] == [REASONING, CALL_A, REASONING | {"id": "rs_2"}, CALL_B]
    alone = items_to_messages([REASONING])
    assert [(m.role, m.content) for m in alone] == [("assistant", "hm")]
    assert alone[0].metadata[ITEMS] == [REASONING]


def test_item_keys_are_the_sdks_dedupe_keys() -> None:
    assert item_key(CALL_A) == "function_call:call_a"
    assert item_key(OUT_A) == "function_call_output:call_a"
    assert item_key(REPLY) is None  # the chat-completions placeholder id is no identity
    assert item_key({**REPLY, "id": "msg_9"}) == "message:msg_9"
    assert item_key(USER) is None and item_key(REASONING) == "reasoning:rs_1"


# -- the memory's prompt to items ------------------------------------------------------------------
def test_prompt_to_items_summary_placeholders_and_exact_items() -> None:
    messages = items_to_messages(STEP)
    stored = {m.metadata[SOURCE_ID]: m.metadata[ITEMS] for m in messages}
    prompt = [PromptItem({"role": "system", "content": "SUMMARY"}, None, False)]
    for m in messages:
        sent = m.to_openai()
        changed = m.tool_call_id == "call_a"
        if changed:
            sent["content"] = "[tool result pruned]"
        prompt.append(PromptItem(sent, m.metadata[SOURCE_ID], changed))
    items = prompt_to_items(prompt, stored)
    assert items[0] == {"role": "system", "content": "SUMMARY"}
    assert items[1:] == [
        USER,
        CALL_A,
        CALL_B,
        OUT_A | {"output": "[tool result pruned]"},
        OUT_B,
        REPLY,
    ]
    assert OUT_A["output"] == lookup_value("alpha")  # the stored items are not changed
    items[1]["content"] = "mutated"
    assert stored[messages[0].metadata[SOURCE_ID]][0] == USER  # copies are given out
    # a message the session holds no items of (stored by something else): from its chat form
    unknown = [
        PromptItem(
            {
                "role": "assistant",
                "content": "hi",
                "tool_calls": [
                    {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            "other-1",
            False,
        ),
        PromptItem({"role": "tool", "tool_call_id": "c9", "content": "r"}, "other-2", False),
    ]
    assert prompt_to_items(unknown, {}) == [
        {"role": "assistant", "content": "hi"},
        {"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c9", "output": "r"},
    ]


# -- the session -----------------------------------------------------------------------------------
def test_the_session_is_an_sdk_session_and_round_trips_exactly() -> None:
    async def scenario() -> None:
        async with _memory() as memory:
            session = MemorySession("s1", memory)
            assert isinstance(session, Session)
            await session.add_items(copy.deepcopy(STEP))
            assert await session.get_items() == STEP
            # a fresh session object (a restart) reads the items back from the store
            assert await MemorySession("s1", memory).get_items() == STEP
            stored = await memory.ahistory("s1")
            assert [m.role for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]

    _run(scenario())


def test_the_budget_counts_the_agents_instructions_and_tools() -> None:
    """With the agent given, what the SDK sends besides the items (its instructions, its own
    function tools' schemas) is counted in the usage that decides a compression."""
    from agents import Agent, function_tool

    @function_tool
    def find(key: str) -> str:
        """Look a key up in the very large reference catalogue of keys and their values."""
        return key

    seen: list[Any] = []
    long = "You are a careful agent with many rules about refunds and rebooking. " * 30

    async def scenario() -> None:
        async with _memory() as memory:

            async def on_usage(sender: Any, **payload: Any) -> None:
                seen.append(payload["breakdown"])

            memory.host.bus.connect("token:usage", on_usage)
            for n, agent in enumerate(
                [None, Agent(name="a", instructions=long, tools=[find, *memory_tools(memory)])]
            ):
                session = MemorySession(f"b{n}", memory, agent=agent)
                await session.add_items([USER])
                await session.get_items()

    _run(scenario())
    bare, counted = seen
    assert counted.system - bare.system >= len(long) // 6
    assert counted.tool_defs > bare.tool_defs  # its own tool; the memory's two counted once


def test_adding_an_item_again_is_a_no_op() -> None:
    async def scenario() -> None:
        async with _memory() as memory:
            session = MemorySession("s2", memory)
            await session.add_items([USER, CALL_A, OUT_A])
            await session.add_items([CALL_A, OUT_A, {**REPLY, "id": "msg_1"}])
            await MemorySession("s2", memory).add_items([CALL_A, {**REPLY, "id": "msg_1"}])
            assert await session.get_items() == [USER, CALL_A, OUT_A, {**REPLY, "id": "msg_1"}]
            assert len(await memory.ahistory("s2")) == 4

    _run(scenario())


def test_pop_item_removes_the_newest_item() -> None:
    async def scenario() -> None:
        async with _memory() as memory:
            session = MemorySession("s3", memory)
            assert await session.pop_item() is None
            await session.add_items([USER, CALL_A, CALL_B])
            assert await session.pop_item() == CALL_B
            # the other call of the step stays, as an assistant message of its own (the
            # prompt leaves a call without its result out)
            assert await session.get_items() == [USER]
            history = await memory.ahistory("s3")
            assert [m.role for m in history] == ["user", "assistant"]
            assert [c.id for c in history[1].tool_calls or []] == ["call_a"]
            assert await session.pop_item() == CALL_A
            await session.add_items([CALL_A, OUT_A])  # popped, then added again: stored
            assert await session.get_items() == [USER, CALL_A, OUT_A]
            assert await session.pop_item() == OUT_A
            assert await session.pop_item() == CALL_A
            assert await session.pop_item() == USER
            assert await session.get_items() == [] and await session.pop_item() is None

    _run(scenario())


def test_get_items_limit_keeps_tool_pairs_whole() -> None:
    async def scenario() -> None:
        async with _memory() as memory:
            session = MemorySession("s4", memory, session_settings={"limit": 2})
            assert session.session_settings is not None and session.session_settings.limit == 2
            await session.add_items(copy.deepcopy(STEP))
            assert await session.get_items(limit=2) == [REPLY]
            assert await session.get_items(limit=3) == [REPLY]
            assert await session.get_items(limit=4) == [CALL_B, OUT_B, REPLY]
            assert await session.get_items(limit=5) == [CALL_A, CALL_B, OUT_A, OUT_B, REPLY]
            assert await session.get_items(limit=100) == STEP
            assert await session.get_items(limit=0) == []

    _run(scenario())


def test_clear_session_forgets_everything() -> None:
    async def scenario() -> None:
        async with _memory() as memory:
            session = MemorySession("s5", memory)
            await session.add_items(copy.deepcopy(STEP))
            await session.clear_session()
            assert await session.get_items() == [] and await memory.ahistory("s5") == []
            await session.add_items([CALL_A, OUT_A])  # the same call ids: a new conversation
            assert await session.get_items() == [CALL_A, OUT_A]

    _run(scenario())


async def _tool_turns(
    session: MemorySession, memory: AgentMemory, turns: int, size: int = 150
) -> None:
    for i in range(turns):
        await session.add_items([{"role": "user", "content": f"question {i} on city {i}"}])
        call = {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
        output = {"type": "function_call_output", "call_id": f"c{i}", "output": "x " * size}
        await session.add_items([call, output])
        reply = {"type": "message", "role": "assistant", "id": f"msg_{i}", "content": []}
        reply["content"] = [{"type": "output_text", "text": f"answer {i}"}]
        await session.add_items([reply])
        await memory.asettle(10)


def test_a_compressed_session_gives_the_summary_first() -> None:
    async def scenario() -> None:
        async with _memory(context_window=3000) as memory:
            session = MemorySession("s6", memory)
            await _tool_turns(session, memory, 24)
            items = await session.get_items()
            assert items[0]["role"] == "system" and "summar" in items[0]["content"]
            assert all(i.get("role") != "system" for i in items[1:])
            outputs = [i for i in items if i.get("type") == "function_call_output"]
            calls = {i["call_id"] for i in items if i.get("type") == "function_call"}
            assert outputs and calls == {o["call_id"] for o in outputs}
            assert items[-1]["id"] == "msg_23" and len(items) < 24 * 4
            stored = await memory.ahistory("s6")
            assert len(stored) < 24 * 4  # the rest is archived, not lost
            found = await memory.acall_tool("s6", "memory_search", {"query": "question 1"})
            assert json.loads(found)["results"]

    _run(scenario())


def test_old_tool_output_comes_back_as_a_placeholder_output() -> None:
    async def scenario() -> None:
        async with _memory(
            context_window=1400, reserve_for_reply=100, threshold=60, prune_keep_tool_groups=1
        ) as memory:
            session = MemorySession("s7", memory)
            await _tool_turns(session, memory, 3, size=600)
            items = await session.get_items()
            outputs = [i for i in items if i.get("type") == "function_call_output"]
            assert [o["call_id"] for o in outputs] == ["c0", "c1", "c2"]
            assert outputs[2]["output"] == "x " * 600
            assert all("pruned" in o["output"] for o in outputs[:2]), outputs
            assert len(items) == 12 and items[0] == {
                "role": "user",
                "content": "question 0 on city 0",
            }

    _run(scenario())


# -- the memory's tools ----------------------------------------------------------------------------
@function_tool
def lookup(key: str) -> str:
    """Look a key up in the inventory."""
    return lookup_value(key)


def _agent(client: AsyncOpenAI, memory: AgentMemory, session_id: str | None = None) -> Agent[Any]:
    return Agent(
        name="test-agent",
        instructions=SYSTEM_PROMPT,
        model=OpenAIChatCompletionsModel(AGENT_MODEL, client),
        tools=[lookup, *memory_tools(memory, session_id)],
    )


def test_the_memory_tools_search_the_runs_session(tmp_path: Path) -> None:
    with (
        ContractServer() as server,
        AgentMemory(
            f"sqlite:///{tmp_path / 'm.db'}",
            model=f"openai/{AGENT_MODEL}",
            api_base=server.base_url,
            api_key="test",
            context_window=4000,
        ) as memory,
    ):
        tools = memory_tools(memory)
        assert {t.name for t in tools} == {"memory_search", "memory_expand"}
        assert tools[0].params_json_schema == memory.tools()[0].parameters
        client = AsyncOpenAI(base_url=server.base_url, api_key="test")
        agent = _agent(client, memory)
        Runner.run_sync(agent, "the canoe is green", session=MemorySession("a", memory))
        search = Reply.tool_calls([{"name": "memory_search", "arguments": {"query": "canoe"}}])
        for thread in ("a", "b"):
            server.enqueue(search)
            Runner.run_sync(
                agent, "what colour is the canoe?", session=MemorySession(thread, memory)
            )
        results = [
            m["content"]
            for b in server.agent_requests
            for m in b["messages"]
            if m["role"] == "tool"
        ]
        assert len(results) == 2
        assert "canoe is green" in results[0] and "canoe is green" not in results[1]
        # a fixed session id
        server.enqueue(search)
        Runner.run_sync(_agent(client, memory, "a"), "again?", session=MemorySession("c", memory))
        assert "canoe is green" in server.agent_requests[-1]["messages"][-1]["content"]
        _close_sync_client(client)


# -- the contract ----------------------------------------------------------------------------------
class OpenAIAgentsDriver:
    """An SDK agent with :class:`MemorySession`: ``Runner.run_sync``, or ``Runner.run`` on an
    event loop of the driver's own."""

    def __init__(self, *, async_: bool) -> None:
        self.name = "openai-agents-async" if async_ else "openai-agents-sync"
        self.async_ = async_
        self.loop: asyncio.AbstractEventLoop | None = None

    def open(self, memory: AgentMemory, base_url: str) -> None:
        self.memory = memory
        self.client = AsyncOpenAI(base_url=base_url, api_key="test")
        self.agent = _agent(self.client, memory)
        self.sessions: dict[str, MemorySession] = {}
        if self.async_:
            self.loop = asyncio.new_event_loop()

    def _session(self, thread: str) -> MemorySession:
        if thread not in self.sessions:
            self.sessions[thread] = MemorySession(thread, self.memory)
        return self.sessions[thread]

    def turn(self, thread: str, text: str) -> str:
        session = self._session(thread)
        if self.loop is not None:
            result = self.loop.run_until_complete(Runner.run(self.agent, text, session=session))
        else:
            result = Runner.run_sync(self.agent, text, session=session)
        return str(result.final_output)

    def framework_messages(self, thread: str) -> int | None:
        return None  # the SDK keeps no state apart from the session

    def clear(self, thread: str) -> None:
        # On the loop the runs use: ``asyncio.run`` would unset ``run_sync``'s default loop.
        loop = self.loop or _thread_loop()
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
        loop.run_until_complete(self._session(thread).clear_session())

    def close(self) -> None:
        if self.loop is None:
            _close_sync_client(self.client)
            return
        self.loop.run_until_complete(self.client.close())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        self.loop = None


class TestOpenAIAgentsSync(AdapterContract):
    @staticmethod
    def make_driver() -> AgentDriver:
        return OpenAIAgentsDriver(async_=False)


class TestOpenAIAgentsAsync(AdapterContract):
    @staticmethod
    def make_driver() -> AgentDriver:
        return OpenAIAgentsDriver(async_=True)


def test_a_run_stores_each_item_once_and_sends_the_sdks_items(tmp_path: Path) -> None:
    with (
        ContractServer() as server,
        AgentMemory(
            f"sqlite:///{tmp_path / 'm.db'}",
            model=f"openai/{AGENT_MODEL}",
            api_base=server.base_url,
            api_key="test",
            context_window=4000,
        ) as memory,
    ):
        driver = OpenAIAgentsDriver(async_=True)
        driver.open(memory, server.base_url)
        try:
            assert driver.turn("t", "please lookup alpha") == f"done: {lookup_value('alpha')}"
            assert driver.turn("t", "thanks") == "ok: thanks"
        finally:
            driver.close()
        stored = memory.history("t")
        assert [m.role for m in stored] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
        ]
        second = server.agent_requests[-1]["messages"]
        assert second[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert [m["role"] for m in second[1:]] == ["user", "assistant", "tool", "assistant", "user"]
        assert all(ITEMS in m.metadata for m in stored)


# -- the docs --------------------------------------------------------------------------------------
def test_the_docs_quick_start_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = DOC.read_text()
    assert "pip install 'plugin-memory-summary[openai-agents]'" in text
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    source = blocks[0]
    with ContractServer() as server:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        exec(compile(source, str(DOC), "exec"), {"__name__": "quick_start"})
        assert server.agent_requests, "the quick start did not call the agent's model"
        tools = {t["function"]["name"] for t in server.agent_requests[0]["tools"]}
        assert tools == {"lookup", "memory_search", "memory_expand"}
        assert server.agent_requests[-1]["messages"][-1]["role"] == "tool"
    assert (tmp_path / "agent-memory.db").exists()
