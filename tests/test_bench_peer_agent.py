"""LangChain's agent in the peers comparison (``bench/peer_agent.py``, ``bench/peers.py``): how a
recorded conversation becomes the agent's turns, answers and tool results, and how our whole host
turn is set beside the agent's whole step. Pure parts, loaded without LangChain."""

from __future__ import annotations

import importlib
import json
from typing import Any

from bench_modules import load_bench

from host_stub.messages import Message, ToolCall, ToolCallFunction

peers = load_bench("peers")  # puts bench/ on the path and imports peer_agent from there
peer_agent = importlib.import_module("peer_agent")


def call(id_: str, name: str, arguments: str) -> ToolCall:
    return ToolCall(id=id_, function=ToolCallFunction(name=name, arguments=arguments))


def conversation() -> list[Message]:
    return [
        Message(role="system", content="policy"),
        Message(role="user", content="book it"),
        Message(
            role="assistant",
            content="",
            tool_calls=[
                call("c1", "find", '{"b": 2, "a": 1}'),
                call("c2", "find", '{"a": 1, "b": 2}'),
                call("c3", "book", "not json"),
            ],
        ),
        Message(role="tool", tool_call_id="c2", content="second"),
        Message(role="tool", tool_call_id="c1", content="first"),
        Message(role="tool", tool_call_id="c3", content="booked"),
        Message(role="assistant", content="done"),
        Message(role="user", content="thanks"),  # no reply: no model call
        Message(role="user", content="one more"),
        Message(role="assistant", content="sure"),
        Message(role="assistant", content="anything else?"),
    ]


def test_call_key_reads_the_arguments_as_the_tool_is_given_them() -> None:
    assert peer_agent.call_key("find", '{"b": 2, "a": 1}') == peer_agent.call_key(
        "find", '{"a":1,"b":2}'
    )
    assert peer_agent.call_key("find", None) == ("find", "{}")
    assert peer_agent.call_key("book", "not json") == ("book", json.dumps({"raw": "not json"}))


def test_turns_hold_the_users_messages_the_answers_and_the_results_in_call_order() -> None:
    turns = peer_agent.agent_turns(conversation())
    assert [[m.content for m in t.inputs] for t in turns] == [["book it"], ["thanks"], ["one more"]]
    first = turns[0]
    assert [m.content for m in first.answers] == ["", "done"]
    # two calls the tool cannot tell apart are answered in the order they were made
    assert first.results[peer_agent.call_key("find", '{"a": 1, "b": 2}')] == ["first", "second"]
    assert first.results[peer_agent.call_key("book", "not json")] == ["booked"]
    assert turns[1].answers == [] and turns[1].results == {}
    assert [m.content for m in turns[2].answers] == ["sure", "anything else?"]


def test_each_of_our_rows_is_set_beside_the_agent_on_the_same_kind_of_store() -> None:
    assert peers.agent_label("ours: default") == peers.agent_row("SQLite")
    assert peers.agent_label("ours: default, in-memory store") == peers.agent_row("in-memory")
    assert {peers.agent_row(c) for c in peers.CHECKPOINTERS} == {
        peers.agent_row("in-memory"),
        peers.agent_row("SQLite"),
    }
    # the verdict table names a peer by its label up to " (": the two agents stay apart
    assert len({peers.agent_row(c).split(" (")[0] for c in peers.CHECKPOINTERS}) == 2


def figures(p50: float, p99: float) -> dict[str, Any]:
    return {
        "turn_p50_us": p50,
        "turn_p99_us": p99,
        "blocked": 0,
        "wait_mean_us": None,
        "wait_max_us": None,
    }


def test_the_turn_row_compares_with_the_middleware_and_the_agent_apart() -> None:
    ours, middleware, agent = figures(700.0, 1500.0), figures(450.0, 900.0), figures(3000.0, 1400.0)
    row = peers.turn_row(ours, middleware, agent)
    assert row[2:4] == ["no", "no"]  # against the middleware's before_model
    assert row[-2:] == ["3,000 / 1,400", "yes / no"]  # against the agent's whole step
    assert peers.turn_row(ours, middleware)[-2:] == ["-", "-"]  # no agent in that regime
