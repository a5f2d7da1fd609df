"""The runtime every framework adapter shares (plugin_memory_summary.adapters.AgentMemory), and
the host's entry points for an agent loop it does not run (``record``, ``prepare_call``,
``end_turn``): checked with a plain agent loop written against the OpenAI client, through the
same contract suite the framework adapters pass."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from adapter_contract import SYSTEM_PROMPT, AdapterContract, AgentDriver, lookup_value

from host_stub.messages import Message, ToolCall, ToolCallFunction
from host_stub.testing.llm import FakeLLM
from plugin_memory_summary.adapters import SOURCE_ID, AgentMemory

LOOKUP_DEF = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a key up.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
    },
}


class PlainLoopDriver:
    """An agent loop with no framework: the OpenAI client, the memory's prompt, its tools."""

    name = "plain"

    def __init__(self) -> None:
        self.memory: AgentMemory | None = None
        self.client: openai.OpenAI | None = None
        self.own: dict[str, list[Message]] = {}
        self._ids = 0

    def open(self, memory: AgentMemory, base_url: str) -> None:
        self.memory = memory
        self.client = openai.OpenAI(base_url=base_url, api_key="test")

    def _message(self, **fields: Any) -> Message:
        self._ids += 1
        return Message(metadata={SOURCE_ID: f"plain-{id(self)}-{self._ids}"}, **fields)

    def turn(self, thread: str, text: str) -> str:
        assert self.memory is not None and self.client is not None
        own = self.own.setdefault(thread, [])
        own.append(self._message(role="user", content=text))
        tools = [
            LOOKUP_DEF,
            *(
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in self.memory.tools()
            ),
        ]
        for _ in range(4):
            items = self.memory.prompt(thread, own)
            sent = [{"role": "system", "content": SYSTEM_PROMPT}, *(i.message for i in items)]
            reply = (
                self.client.chat.completions.create(
                    model="fake-agent",
                    messages=sent,  # type: ignore[arg-type]
                    tools=tools,  # type: ignore[arg-type]
                )
                .choices[0]
                .message
            )
            calls = [
                ToolCall(
                    id=c.id,
                    function=ToolCallFunction(name=c.function.name, arguments=c.function.arguments),
                )
                for c in reply.tool_calls or []
                if c.type == "function"
            ]
            own.append(
                self._message(role="assistant", content=reply.content, tool_calls=calls or None)
            )
            if not calls:
                break
            for call in calls:
                args = json.loads(call.function.arguments)
                result = (
                    lookup_value(args["key"])
                    if call.function.name == "lookup"
                    else self.memory.call_tool(thread, call.function.name, args)
                )
                own.append(
                    self._message(
                        role="tool", tool_call_id=call.id, name=call.function.name, content=result
                    )
                )
        self.memory.end_turn(thread, own)
        return str(own[-1].content or "")

    def framework_messages(self, thread: str) -> int | None:
        return len(self.own.get(thread, []))

    def clear(self, thread: str) -> None:
        assert self.memory is not None
        self.memory.clear(thread)
        self.own.pop(thread, None)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class TestPlainLoop(AdapterContract):
    @staticmethod
    def make_driver() -> AgentDriver:
        return PlainLoopDriver()


def _user(i: int, text: str) -> Message:
    return Message(role="user", content=text, metadata={SOURCE_ID: f"u{i}"})


def test_prompt_stores_each_source_id_once() -> None:
    with AgentMemory("memory://", model="gpt-4o-mini", llm=FakeLLM()) as memory:
        first = [_user(1, "hello"), _user(2, "again")]
        memory.prompt("s", first)
        memory.prompt("s", [*first, _user(3, "third")])
        assert memory.add("s", first) == 0
        assert [m.content for m in memory.history("s")] == ["hello", "again", "third"]


def test_a_message_without_source_id_is_refused_and_nothing_stored() -> None:
    with AgentMemory("memory://", model="gpt-4o-mini", llm=FakeLLM()) as memory:
        with pytest.raises(ValueError, match="source_id"):
            memory.add("s", [_user(1, "kept?"), Message(role="user", content="no id")])
        assert memory.history("s") == []


def test_prompt_items_name_their_sources_and_the_summary_block() -> None:
    with AgentMemory(
        "memory://",
        model="gpt-4o-mini",
        context_window=2000,
        llm=FakeLLM(),
        config={"threshold": 8},
    ) as memory:
        messages: list[Message] = []
        for i in range(30):
            messages.append(_user(i, f"turn {i}: my locker code is {1000 + i}, topic {i}"))
            memory.prompt("s", messages)
            messages.append(
                Message(role="assistant", content=f"noted {i}", metadata={SOURCE_ID: f"a{i}"})
            )
            memory.end_turn("s", messages)
        memory.settle(10)
        items = memory.prompt("s", messages)
    assert items[0].source_id is None and items[0].message["role"] == "system"
    kept = [i for i in items if i.source_id is not None]
    assert kept and kept[-1].source_id == "a29"
    assert len(items) < len(messages)


async def test_async_callers_share_the_runtime_loop() -> None:
    async with AgentMemory("memory://", model="gpt-4o-mini", llm=FakeLLM()) as memory:
        await asyncio.gather(*(memory.aadd(f"s{i}", [_user(i, f"hello {i}")]) for i in range(5)))
        assert [len(await memory.ahistory(f"s{i}")) for i in range(5)] == [1] * 5
        # the same message again, concurrently: stored once
        await asyncio.gather(*(memory.aadd("s0", [_user(0, "hello 0")]) for _ in range(5)))
        assert len(await memory.ahistory("s0")) == 1


def test_a_config_error_raises_at_start() -> None:
    memory = AgentMemory("memory://", model="gpt-4o-mini", llm=FakeLLM(), config={"nope": 1})
    with pytest.raises(Exception, match="nope"):
        memory.start()
    assert memory._thread is None


async def test_prepare_call_counts_what_the_outside_loop_sends_besides_the_prompt() -> None:
    """An agent framework sends its own system prompt and tool definitions with the memory's
    prompt: the usage that decides compressions counts them (issue 34)."""
    async with AgentMemory(
        "memory://", model="gpt-4o-mini", context_window=4000, llm=FakeLLM()
    ) as memory:
        host = memory.host
        seen: list[Any] = []

        async def on_usage(sender: Any, **payload: Any) -> None:
            seen.append(payload)

        host.bus.connect("token:usage", on_usage)
        await memory.aprompt("s", [_user(1, "hello")])
        system = "You are a careful travel agent. " * 20
        tools = [LOOKUP_DEF] * 5
        await memory.aprompt("s", [_user(2, "again")], system=system, tools=tools)
        bare, counted = seen[0]["breakdown"], seen[1]["breakdown"]
        assert counted.system == bare.system + host.count_text(system)
        assert counted.tool_defs == bare.tool_defs + host.count_text(
            json.dumps(tools, sort_keys=True)
        )
        assert seen[1]["used"] > seen[0]["used"] + host.count_text(system)


async def test_prepare_call_names_the_stored_message_behind_each_sent_one() -> None:
    async with AgentMemory("memory://", model="gpt-4o-mini", llm=FakeLLM()) as memory:
        host = memory.host
        await host.record("s", [_user(1, "first"), _user(2, "second")])
        prepared = await host.prepare_call("s")
        assert [m["content"] for m in prepared.prompt] == ["first", "second"]
        assert [s.metadata[SOURCE_ID] for s in prepared.sources if s] == ["u1", "u2"]
        assert prepared.usage.session_id == "s"


def test_a_pruned_tool_output_is_marked_changed_and_names_its_stored_message() -> None:
    """Old tool output is sent as a placeholder: the prompt item says it changed, so an adapter
    sends the placeholder, not the framework's own (whole) message."""
    big = "flight record " * 400
    with AgentMemory(
        "memory://", model="gpt-4o-mini", context_window=16_000, llm=FakeLLM()
    ) as memory:
        messages: list[Message] = []
        for i in range(8):
            call = ToolCall(
                id=f"c{i}", function=ToolCallFunction(name="get_flight", arguments="{}")
            )
            messages += [
                _user(i, f"check flight {i}"),
                Message(role="assistant", tool_calls=[call], metadata={SOURCE_ID: f"a{i}"}),
                Message(
                    role="tool",
                    tool_call_id=f"c{i}",
                    name="get_flight",
                    content=big,
                    metadata={SOURCE_ID: f"t{i}"},
                ),
                Message(role="assistant", content=f"done {i}", metadata={SOURCE_ID: f"r{i}"}),
            ]
        items = memory.prompt("s", messages)
    tools = [i for i in items if i.message["role"] == "tool"]
    pruned = [i for i in tools if i.message["content"] != big]
    assert pruned, "no old tool output was pruned"
    assert all(i.changed and i.source_id and i.source_id.startswith("t") for i in pruned)
    assert not any(i.changed for i in tools if i.message["content"] == big)


def test_a_cleared_or_deleted_message_handed_over_again_is_stored_again() -> None:
    """A framework thread still holding messages after a clear (its checkpointer) or a deleted
    message sent again: stored again, not skipped as already stored."""
    with AgentMemory("memory://", model="gpt-4o-mini", llm=FakeLLM()) as memory:
        first = [_user(1, "hello"), _user(2, "again")]
        memory.add("s", first)
        memory.clear("s")
        assert memory.add("s", first) == 2
        seq = memory.history("s")[-1].seq
        assert seq is not None and memory.delete("s", [seq]) == [seq]
        assert [m.content for m in memory.history("s")] == ["hello"]
        assert memory.add("s", first) == 1
        assert [m.content for m in memory.history("s")] == ["hello", "again"]
