"""The contract every framework adapter passes (issue 34): one suite, run against each framework
with its real package, the memory's real store (an SQLite file) and a local OpenAI-compatible
fake server standing in for both the agent's model and the summarizer.

A framework's test module defines a driver (:class:`AgentDriver`) and binds the suite to it::

    from adapter_contract import AdapterContract

    class TestLangChainSync(AdapterContract):
        @staticmethod
        def make_driver() -> AgentDriver:
            return LangChainDriver(async_=False)

Each check runs the framework's own agent loop; the server records every request the agent's
model got (:attr:`ContractServer.agent_requests`), which is what the checks read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pytest
from fake_openai import FakeOpenAIServer, Reply

from host_stub.messages import Message
from plugin_memory_summary.adapters import SOURCE_ID, AgentMemory

__all__ = ["AdapterContract", "AgentDriver", "ContractServer", "lookup_value", "tool_pairs_ok"]

AGENT_MODEL = "fake-agent"
SUMMARY_MODEL = "openai/fake-summarizer"
SYSTEM_PROMPT = "You are a test agent."
#: The window the suite gives the agent's model: small, so a few dozen turns compress.
WINDOW = 1600
MEMORY_TOOLS = {"memory_search", "memory_expand"}
_LOOKUP = re.compile(r"\blookup (\w+)")


def lookup_value(key: str) -> str:
    """What the agent's own ``lookup`` tool returns (every driver's tool returns this)."""
    return f"value of {key}: {key.upper()}-42"


class AgentDriver(Protocol):
    """One framework's agent with the memory adapter (see the module docstring)."""

    name: str

    def open(self, memory: AgentMemory, base_url: str) -> None:
        """Build the agent over ``memory``: chat model ``fake-agent`` at ``base_url`` (api key
        ``test``), one tool of its own ``lookup(key: str) -> str`` returning
        :func:`lookup_value`, system prompt :data:`SYSTEM_PROMPT`."""
        ...

    def turn(self, thread: str, text: str) -> str:
        """One agent run with the user's ``text``; the final reply's text."""
        ...

    def framework_messages(self, thread: str) -> int | None:
        """Messages the framework's own state holds for the thread (``None``: it keeps none
        apart from the memory)."""
        ...

    def clear(self, thread: str) -> None:
        """Clear the thread's memory the framework's way (through the adapter)."""
        ...

    def close(self) -> None:
        """Close the agent (not the memory)."""
        ...


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _summary_reply(body: dict[str, Any]) -> str:
    """The fake summarizer: a short summary of what it digests, in its own words but grounded
    (the locker codes and cities the transcript names)."""
    text = " ".join(_text(m.get("content")) for m in body.get("messages", [])[1:])
    codes = list(dict.fromkeys(re.findall(r"locker code is (\d+)", text)))
    cities = list(dict.fromkeys(re.findall(r"city (?:number )?(\d+)", text)))
    parts = []
    if codes:
        parts.append(f"The user gave locker codes {', '.join(codes[:6])}.")
    if cities:
        parts.append(f"The user planned a trip to city {', '.join(cities[:6])}.")
    return " ".join(parts) or "The user and the agent talked."


class ContractServer(FakeOpenAIServer):
    """The fake server, scripted for the suite: the summarizer's requests (model
    ``fake-summarizer``) get a summary; an agent request whose last message is a user message
    saying ``lookup KEY`` gets a ``lookup`` tool call, one ending with a tool result a text
    reply, any other ``ok: ...``."""

    def __init__(self) -> None:
        super().__init__(default_reply=self._reply)
        self.agent_requests: list[dict[str, Any]] = []
        self.summarizer_requests = 0
        self._calls = 0

    def _reply(self, body: dict[str, Any]) -> Any:
        if str(body.get("model", "")).endswith("fake-summarizer"):
            self.summarizer_requests += 1
            return _summary_reply(body)
        self.agent_requests.append(body)
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            return f"done: {_text(last.get('content'))[:60]}"
        match = _LOOKUP.search(_text(last.get("content"))) if last.get("role") == "user" else None
        if match:
            self._calls += 1
            return Reply.tool_calls(
                [
                    {
                        "id": f"call_{self._calls}",
                        "type": "function",
                        "function": {
                            "name": "lookup",
                            "arguments": json.dumps({"key": match.group(1)}),
                        },
                    }
                ]
            )
        return f"ok: {_text(last.get('content'))[:40]}"


def tool_pairs_ok(messages: list[dict[str, Any]]) -> list[str]:
    """What is wrong with the tool pairs of one request's messages: a call without its result
    (before the next non-tool message), a result without its call."""
    problems = []
    open_calls: set[str] = set()
    for message in messages:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_calls:
                problems.append(f"result {call_id} without its call")
            open_calls.discard(call_id)
            continue
        if open_calls:
            problems.append(f"calls {sorted(open_calls)} without results")
            open_calls = set()
        for call in message.get("tool_calls") or []:
            open_calls.add(call["id"])
    if open_calls:
        problems.append(f"calls {sorted(open_calls)} without results")
    return problems


def _stored(memory: AgentMemory, thread: str) -> list[Message]:
    """Every message stored for ``thread``, archived or not (markers left out), once no
    compression runs (one committing between the two reads would hide what it archived)."""
    host = memory.host
    assert memory.settle(30), "a compression did not finish"

    async def read() -> list[Message]:
        stored = [
            *await host.memory.get_archived(thread),
            *await host.memory.get_history(thread),
        ]
        return [m for m in stored if not m.is_marker]

    return memory._run(read())


def _search(memory: AgentMemory, thread: str, query: str) -> dict[str, Any]:
    return json.loads(memory.call_tool(thread, "memory_search", {"query": query}))


class AdapterContract:
    """The checks. A subclass sets :meth:`make_driver`."""

    #: Plugin config for the suite: compress early and often, summarizer on the fake server.
    CONFIG: ClassVar[dict[str, Any]] = {"summary_model": SUMMARY_MODEL, "threshold": 16}

    @staticmethod
    def make_driver() -> AgentDriver:
        raise NotImplementedError

    # -- fixtures --------------------------------------------------------------------------------
    @pytest.fixture
    def server(self) -> Iterator[ContractServer]:
        with ContractServer() as server:
            yield server

    @pytest.fixture
    def store(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'memory.db'}"

    def _memory(self, server: ContractServer, store: str) -> AgentMemory:
        return AgentMemory(
            store,
            model=f"openai/{AGENT_MODEL}",
            api_base=server.base_url,
            api_key="test",
            context_window=WINDOW,
            reserve_for_reply=200,
            config=self.CONFIG,
        ).start()

    @pytest.fixture
    def agent(
        self, server: ContractServer, store: str
    ) -> Iterator[tuple[AgentDriver, AgentMemory]]:
        memory = self._memory(server, store)
        driver = self.make_driver()
        try:
            driver.open(memory, server.base_url)
            yield driver, memory
        finally:
            driver.close()
            memory.close()

    # -- the checks ------------------------------------------------------------------------------
    def test_every_message_stored_once(self, agent: tuple[AgentDriver, AgentMemory]) -> None:
        driver, memory = agent
        driver.turn("t-once", "hello there, my city is Lima")
        driver.turn("t-once", "please lookup alpha")
        driver.turn("t-once", "thanks, and lookup beta")
        driver.turn("t-once", "bye for now")
        memory.settle(10)
        stored = _stored(memory, "t-once")
        ids = [m.metadata.get(SOURCE_ID) for m in stored]
        assert all(ids) and len(ids) == len(set(ids)), ids
        # 4 user messages, 4 final replies, 2 assistant tool calls and their 2 results
        roles = [m.role for m in stored]
        assert roles.count("user") == 4 and roles.count("tool") == 2, roles
        assert roles.count("assistant") == 6, roles
        own = driver.framework_messages("t-once")
        if own is not None:
            assert own == len(stored), (own, len(stored))

    def test_long_conversation_compresses_and_model_sees_summary(
        self, agent: tuple[AgentDriver, AgentMemory], server: ContractServer
    ) -> None:
        driver, memory = agent
        for i in range(28):
            extra = f" lookup key{i}" if i % 5 == 2 else ""
            driver.turn(
                "t-long",
                f"turn {i}: my locker code is {4000 + i}; I keep planning the trip to city "
                f"number {i} with museums, trains and small hotels near the river.{extra}",
            )
        memory.settle(20)
        driver.turn("t-long", "what do you remember?")
        stored = _stored(memory, "t-long")
        assert any(m.archived for m in stored), "nothing was archived"
        last = server.agent_requests[-1]["messages"]
        summaries = [
            m
            for m in last
            if m.get("role") == "system" and _text(m.get("content")) != SYSTEM_PROMPT
        ]
        assert summaries, [m.get("role") for m in last]
        assert len(last) < len(stored), (len(last), len(stored))
        own = driver.framework_messages("t-long")
        if own is not None:  # the framework's own state is never truncated
            assert own == len(stored), (own, len(stored))

    def test_no_request_splits_a_tool_pair(
        self, agent: tuple[AgentDriver, AgentMemory], server: ContractServer
    ) -> None:
        driver, memory = agent
        for i in range(24):
            driver.turn("t-pairs", f"step {i} of the plan: lookup item{i} and tell me its value")
        memory.settle(20)
        driver.turn("t-pairs", "lookup final")
        assert server.agent_requests
        for n, body in enumerate(server.agent_requests):
            assert tool_pairs_ok(body["messages"]) == [], (n, body["messages"])
        assert any(m.archived for m in _stored(memory, "t-pairs"))

    def test_memory_search_finds_an_archived_line(
        self, agent: tuple[AgentDriver, AgentMemory], server: ContractServer
    ) -> None:
        driver, memory = agent
        driver.turn("t-search", "remember this: the boathouse locker code is 8814")
        for i in range(26):
            driver.turn("t-search", f"turn {i}: more planning about trains, hotels and city {i}")
        memory.settle(20)
        hits = _search(memory, "t-search", "boathouse locker code")["results"]
        assert any("8814" in h["snippet"] and h["status"] == "archived" for h in hits), hits
        tools = {t["function"]["name"] for t in server.agent_requests[-1].get("tools") or []}
        assert MEMORY_TOOLS <= tools, tools

    def test_restart_on_the_same_store_resumes_the_thread(
        self, server: ContractServer, store: str
    ) -> None:
        memory = self._memory(server, store)
        driver = self.make_driver()
        try:
            driver.open(memory, server.base_url)
            for i in range(20):
                driver.turn("t-restart", f"turn {i}: my locker code is {5000 + i} in city {i}")
            memory.settle(20)
            before = len(_stored(memory, "t-restart"))
        finally:
            driver.close()
            memory.close()
        memory = self._memory(server, store)
        driver = self.make_driver()
        try:
            driver.open(memory, server.base_url)
            seen = len(server.agent_requests)
            driver.turn("t-restart", "I am back: what was my last locker code?")
            first = server.agent_requests[seen]["messages"]
            earlier = " ".join(_text(m.get("content")) for m in first)
            assert "5019" in earlier or "locker code" in earlier, first
            stored = _stored(memory, "t-restart")
            ids = [m.metadata.get(SOURCE_ID) for m in stored]
            assert len(ids) == len(set(ids)), "a message was stored twice after the restart"
            assert len(stored) == before + 2, (before, len(stored))
        finally:
            driver.close()
            memory.close()

    def test_clear_forgets_the_thread(self, agent: tuple[AgentDriver, AgentMemory]) -> None:
        driver, memory = agent
        driver.turn("t-clear", "my locker code is 3141")
        driver.turn("t-clear", "lookup gamma")
        driver.turn("t-other", "my locker code is 2718")
        driver.clear("t-clear")
        assert memory.history("t-clear") == []
        assert _search(memory, "t-clear", "locker code")["results"] == []
        assert memory.history("t-other"), "clearing one thread cleared another"
