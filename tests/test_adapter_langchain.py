"""The LangChain v1 adapter: its message mapping, the adapter contract with a sync and an async
agent (``create_agent`` with :class:`MemoryMiddleware`), and the docs' quick start."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine
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
    tool_pairs_ok,
)
from fake_openai import FakeOpenAIServer, Reply
from langchain.agents import create_agent
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

from plugin_memory_summary.adapters import SOURCE_ID, AgentMemory, PromptItem
from plugin_memory_summary.adapters.langchain import (
    DERIVED_PREFIX,
    MemoryMiddleware,
    from_prompt,
    to_memory,
)

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "adapters" / "langchain.md"
_T = TypeVar("_T")


def _conversation() -> list[BaseMessage]:
    return [
        HumanMessage("please lookup alpha", id="h1"),
        AIMessage(
            "",
            id="a1",
            tool_calls=[{"name": "lookup", "args": {"key": "alpha"}, "id": "call_1"}],
        ),
        ToolMessage("value of alpha: ALPHA-42", tool_call_id="call_1", name="lookup", id="t1"),
        AIMessage("done", id="a2"),
    ]


# -- the mapping -----------------------------------------------------------------------------------
def test_to_memory_keeps_ids_and_the_tool_pair() -> None:
    stored = to_memory(_conversation())
    assert [m.metadata[SOURCE_ID] for m in stored] == ["h1", "a1", "t1", "a2"]
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    call = stored[1]
    assert call.content is None and call.tool_calls is not None
    assert call.tool_calls[0].id == "call_1"
    assert call.tool_calls[0].function.name == "lookup"
    assert call.tool_calls[0].function.arguments == '{"key": "alpha"}'
    assert stored[2].tool_call_id == "call_1" and stored[2].name == "lookup"


def test_a_message_without_an_id_gets_a_stable_derived_one() -> None:
    first = [HumanMessage("hi", id="h1"), SystemMessage("note"), SystemMessage("note")]
    again = [HumanMessage("hi", id="h1"), SystemMessage("note"), SystemMessage("note")]
    ids = [m.metadata[SOURCE_ID] for m in to_memory(first)]
    assert ids == [m.metadata[SOURCE_ID] for m in to_memory(again)]
    assert ids[1].startswith(DERIVED_PREFIX) and ids[1] != ids[2]
    assert [m.id for m in first] == ids  # set on the message, so the state keeps it


def test_a_call_with_malformed_arguments_keeps_its_pair() -> None:
    call = AIMessage(
        "",
        id="a1",
        invalid_tool_calls=[
            {
                "name": "lookup",
                "args": "{bad",
                "id": "call_9",
                "error": None,
                "type": "invalid_tool_call",
            }
        ],
    )
    stored = to_memory([call])[0]
    assert stored.tool_calls is not None and stored.tool_calls[0].id == "call_9"
    assert stored.tool_calls[0].function.arguments == "{bad"
    rebuilt = from_prompt([PromptItem(stored.to_openai(), "a-restarted", False)], [])[0]
    assert isinstance(rebuilt, AIMessage) and rebuilt.invalid_tool_calls[0]["id"] == "call_9"


def test_from_prompt_sends_originals_and_replaces_a_placeholder() -> None:
    messages = _conversation()
    stored = to_memory(messages)
    summary = {"role": "system", "content": "Summary: the user asked about alpha."}
    placeholder = {**stored[2].to_openai(), "content": "[lookup output, 24 chars: expand 3]"}
    items = [
        PromptItem(summary, None, False),
        PromptItem(stored[0].to_openai(), "h1", False),
        PromptItem(stored[1].to_openai(), "a1", False),
        PromptItem(placeholder, "t1", True),
        PromptItem(stored[3].to_openai(), "a2", False),
    ]
    out = from_prompt(items, messages)
    assert isinstance(out[0], SystemMessage) and out[0].content == summary["content"]
    assert out[1] is messages[0] and out[2] is messages[1] and out[4] is messages[3]
    tool = out[3]
    assert isinstance(tool, ToolMessage) and tool is not messages[2]
    assert tool.content == placeholder["content"]
    assert (tool.tool_call_id, tool.name, tool.id) == ("call_1", "lookup", "t1")
    assert messages[2].content == "value of alpha: ALPHA-42"  # the state's message is untouched


def test_from_prompt_builds_a_placeholder_or_summary_once_while_it_stays_the_same() -> None:
    """The messages built for what the memory sends in place of the agent's own are reused at
    the next calls (a LangChain message costs to build), and built again once they change."""
    messages = _conversation()
    stored = to_memory(messages)
    summary = {"role": "system", "content": "Summary: the user asked about alpha."}
    placeholder = {**stored[2].to_openai(), "content": "[lookup output, 24 chars: expand 3]"}
    items = [
        PromptItem(summary, None, False),
        PromptItem(stored[0].to_openai(), "h1", False),
        PromptItem(stored[1].to_openai(), "a1", False),
        PromptItem(placeholder, "t1", True),
    ]
    built: dict[str, Any] = {}
    first = from_prompt(items, messages, built)
    again = from_prompt(items, messages, built)
    assert again[0] is first[0] and again[3] is first[3]
    changed = [PromptItem({**summary, "content": "Summary: alpha, then beta."}, None, False)]
    assert from_prompt(changed + items[1:], messages, built)[0] is not first[0]


def test_from_prompt_rebuilds_stored_messages_the_state_lacks() -> None:
    """A thread resumed after a restart: the state holds only the new message."""
    stored = to_memory(_conversation())
    items = [PromptItem(m.to_openai(), str(m.metadata[SOURCE_ID]), False) for m in stored]
    new = HumanMessage("I am back", id="h2")
    items.append(PromptItem({"role": "user", "content": "I am back"}, "h2", False))
    out = from_prompt(items, [new])
    assert [m.id for m in out] == ["h1", "a1", "t1", "a2", "h2"]
    assert out[-1] is new
    call = out[1]
    assert isinstance(call, AIMessage) and call.tool_calls[0]["id"] == "call_1"
    assert call.tool_calls[0]["args"] == {"key": "alpha"}
    result = out[2]
    assert isinstance(result, ToolMessage) and result.tool_call_id == "call_1"


# -- the drivers -----------------------------------------------------------------------------------
@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return lookup_value(key)


class LangChainDriver:
    """``create_agent`` with :class:`MemoryMiddleware`, run with ``invoke`` or ``ainvoke``."""

    def __init__(self, *, async_: bool) -> None:
        self.name = "langchain-async" if async_ else "langchain"
        self.async_ = async_
        self.loop = asyncio.new_event_loop() if async_ else None

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        assert self.loop is not None
        return self.loop.run_until_complete(coro)

    @staticmethod
    def _config(thread: str) -> Any:
        return {"configurable": {"thread_id": thread}}

    def open(self, memory: AgentMemory, base_url: str) -> None:
        self.middleware = MemoryMiddleware(memory)
        self.checkpointer = InMemorySaver()
        self.agent = create_agent(
            ChatOpenAI(model=AGENT_MODEL, base_url=base_url, api_key="test"),
            tools=[lookup],
            system_prompt=SYSTEM_PROMPT,
            middleware=[self.middleware],
            checkpointer=self.checkpointer,
        )

    def turn(self, thread: str, text: str) -> str:
        state = {"messages": [{"role": "user", "content": text}]}
        if self.async_:
            result = self._run(self.agent.ainvoke(state, self._config(thread)))
        else:
            result = self.agent.invoke(state, self._config(thread))
        return str(result["messages"][-1].text)

    def framework_messages(self, thread: str) -> int | None:
        return len(self.agent.get_state(self._config(thread)).values.get("messages", []))

    def clear(self, thread: str) -> None:
        if self.async_:
            self._run(self.middleware.aclear(thread, self.checkpointer))
        else:
            self.middleware.clear(thread, self.checkpointer)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            self.loop = None


class TestLangChainSync(AdapterContract):
    @staticmethod
    def make_driver() -> AgentDriver:
        return LangChainDriver(async_=False)


class TestLangChainAsync(AdapterContract):
    @staticmethod
    def make_driver() -> AgentDriver:
        return LangChainDriver(async_=True)


# -- the adapter's own behaviour -------------------------------------------------------------------
def test_a_run_without_a_thread_id_names_the_fix(tmp_path: Path) -> None:
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
        agent = create_agent(
            ChatOpenAI(model=AGENT_MODEL, base_url=server.base_url, api_key="test"),
            tools=[lookup],
            middleware=[MemoryMiddleware(memory)],
        )
        with pytest.raises(ValueError, match=r"thread id: invoke the agent with config="):
            agent.invoke({"messages": [{"role": "user", "content": "hi"}]})
        assert server.agent_requests == []


def test_the_memory_tools_use_the_runs_thread(tmp_path: Path) -> None:
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
        middleware = MemoryMiddleware(memory)
        agent = create_agent(
            ChatOpenAI(model=AGENT_MODEL, base_url=server.base_url, api_key="test"),
            middleware=[middleware],
            checkpointer=InMemorySaver(),
        )
        agent.invoke(
            {"messages": [{"role": "user", "content": "the canoe is green"}]},
            {"configurable": {"thread_id": "a"}},
        )
        search = {t.name: t for t in middleware.tools}["memory_search"]
        found = search.invoke({"query": "canoe green"}, {"configurable": {"thread_id": "a"}})
        other = search.invoke({"query": "canoe green"}, {"configurable": {"thread_id": "b"}})
        assert "canoe is green" in found and "canoe is green" not in other
        assert {t.name for t in middleware.tools} == {"memory_search", "memory_expand"}
        assert middleware.tools[0].args_schema == memory.tools()[0].parameters


def test_the_result_langchain_adds_for_a_malformed_call_is_stored_once(tmp_path: Path) -> None:
    """``create_agent`` answers a tool call with malformed arguments with a result of its own
    (without an id) in the request and in the state: stored once, under the id it was given."""
    with (
        FakeOpenAIServer() as server,
        AgentMemory(
            f"sqlite:///{tmp_path / 'm.db'}",
            model=f"openai/{AGENT_MODEL}",
            api_base=server.base_url,
            api_key="test",
            context_window=4000,
        ) as memory,
    ):
        bad = {
            "id": "call_9",
            "type": "function",
            "function": {"name": "lookup", "arguments": "{bad"},
        }
        server.enqueue(Reply.tool_calls([bad]), "first", "second", "third")
        agent = create_agent(
            ChatOpenAI(model=AGENT_MODEL, base_url=server.base_url, api_key="test"),
            tools=[lookup],
            middleware=[MemoryMiddleware(memory)],
            checkpointer=InMemorySaver(),
        )
        config: Any = {"configurable": {"thread_id": "m"}}
        for text in ("lookup ???", "and now?", "again?"):
            agent.invoke({"messages": [{"role": "user", "content": text}]}, config)
        state = agent.get_state(config).values["messages"]
        stored = memory.history("m")
        assert [m.id for m in state] == [m.metadata[SOURCE_ID] for m in stored]
        assert [m.role for m in stored].count("tool") == 1
        for body in server.requests:
            assert tool_pairs_ok(body["messages"]) == [], body["messages"]


# -- the docs --------------------------------------------------------------------------------------
def test_the_docs_quick_start_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = DOC.read_text(encoding="utf-8")
    assert "pip install 'plugin-memory-summary[langchain]'" in text
    source = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    with ContractServer() as server:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        exec(compile(source, str(DOC), "exec"), {"__name__": "quick_start"})
        assert server.agent_requests, "the quick start did not call the agent's model"
        first = server.agent_requests[0]
        assert {"memory_search", "memory_expand"} <= {t["function"]["name"] for t in first["tools"]}
    assert "ALPHA-42" in capsys.readouterr().out
    assert (tmp_path / "agent-memory.db").exists()


def test_the_budget_counts_the_agents_system_prompt_and_tools() -> None:
    """What create_agent sends besides the memory's prompt (its system prompt, its own tools'
    schemas) is counted in the usage that decides a compression."""

    from adapter_contract import ContractServer
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from plugin_memory_summary.adapters import AgentMemory
    from plugin_memory_summary.adapters.langchain import MemoryMiddleware

    @tool
    def lookup(key: str) -> str:
        """Look a key up in the very large reference catalogue of keys and their values."""
        return key

    seen: list[Any] = []
    long_prompt = "You are a test agent with many careful rules. " * 40
    with ContractServer() as server:
        memory = AgentMemory(
            "memory://",
            model="openai/fake-agent",
            api_base=server.base_url,
            api_key="test",
            context_window=100_000,
        ).start()
        try:

            async def on_usage(sender: Any, **payload: Any) -> None:
                seen.append(payload["breakdown"])

            memory.host.bus.connect("token:usage", on_usage)
            model = ChatOpenAI(model="fake-agent", base_url=server.base_url, api_key="test")
            for n, (prompt, tools) in enumerate(
                [("short", [lookup]), (long_prompt, [lookup]), ("short", [])]
            ):
                agent = create_agent(
                    model, tools, system_prompt=prompt, middleware=[MemoryMiddleware(memory)]
                )
                agent.invoke(
                    {"messages": [("user", "hello")]}, {"configurable": {"thread_id": f"t-{n}"}}
                )
        finally:
            memory.close()
    short, long, bare = seen
    assert long.system - short.system >= memory_count(long_prompt) - 5
    assert long.tool_defs == short.tool_defs > bare.tool_defs > 0  # the memory's own two


def memory_count(text: str) -> int:
    """Roughly the tokens of ``text`` (litellm's default counter is near four characters each)."""
    return len(text) // 6
