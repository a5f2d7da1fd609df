"""The reference host: plugin loading, config, the bus and the agent loop."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from host_stub import signals
from host_stub.bus import EventBus, UnknownSignalError
from host_stub.config import ConfigError, HostConfig, load_host_config
from host_stub.hookspecs import (
    ENTRY_POINT_GROUP,
    AgentTool,
    Contribution,
    PromptView,
    ToolContext,
    hookimpl,
)
from host_stub.host import Host
from host_stub.memory.inmemory import InMemoryMemory
from host_stub.messages import Message, ToolCall, ToolCallFunction
from host_stub.prompt import assemble_prompt, sanitize_tool_pairs
from host_stub.services import Completion
from host_stub.testing import FakeLLM, simple_count
from host_stub.tools import ToolRegistry

NO_ENTRY_POINTS = HostConfig.model_validate({"plugins": {"allow": []}})


class Recorder:
    """A third-party plugin: records every signal and hook call."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.views: list[PromptView] = []
        self.started_with: dict[str, Any] = {}

    @hookimpl
    def startup(self, host: Any, memory: Any, llm: Any) -> None:
        self.started_with = {"host": host, "memory": memory, "llm": llm}
        for name in signals.PAYLOADS:
            host.bus.connect(name, self._make(name))

    def _make(self, name: str) -> Any:
        async def receiver(sender: Any, **payload: Any) -> None:
            self.events.append((name, payload))

        return receiver

    @hookimpl
    def agent_prompt(self, view: PromptView) -> list[Contribution]:
        self.views.append(view)
        return [
            Contribution(id="kb", anchor="knowledge", content="KB"),
            Contribution(id="kb", anchor="knowledge", content="duplicate id"),
        ]

    def names(self) -> list[str]:
        return [n for n, _ in self.events]


def make_host(*plugins: tuple[str, Any], llm: FakeLLM | None = None, **host: Any) -> Host:
    config = HostConfig.model_validate(
        {"plugins": {"allow": []}, "host": {"model": "fake/chat", **host}}
    )
    return Host(
        config,
        memory=InMemoryMemory(token_counter=lambda m: simple_count(str(m.content))),
        llm=llm or FakeLLM(),
        plugins=list(plugins),
    )


def test_entry_point_lists_the_plugin() -> None:
    names = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert names["memory-summary"] == "plugin_memory_summary:create_plugin"
    assert names["memory-summary-extras"] == "plugin_memory_summary.extras:create_extension"


def test_installed_plugins_are_looked_up_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command builds a plugin manager up to four times; the installed distributions are
    scanned for plugins once."""
    import host_stub.plugins as plugins

    scans: list[str] = []

    def counting(**params: Any) -> Any:
        scans.append(params["group"])
        return entry_points(**params)

    monkeypatch.setattr(plugins, "entry_points", counting)
    monkeypatch.setattr(plugins, "_installed", None)
    for _ in range(3):
        _, loaded = plugins.get_plugin_manager(HostConfig())
        assert "memory-summary" in loaded
    assert scans == [ENTRY_POINT_GROUP]


def test_import_does_not_import_litellm() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "import host_stub, host_stub.host, plugin_memory_summary",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "litellm" not in out.stderr
    assert "plugin_memory_summary" in out.stderr


async def test_plugin_receives_every_signal_with_its_payload() -> None:
    recorder = Recorder()
    llm = FakeLLM(default="hello there")
    host = make_host(("recorder", recorder), llm=llm)
    async with host:
        assert recorder.started_with["memory"] is host.memory
        result = await host.run_turn("s1", "hi")
        assert result.outcome == "replied"
        await host.request_compression("s1")
        await host.clear("s1")
        await host.bus.send(signals.MEMORY_MESSAGES_DELETED, session_id="s1", seqs=[1])
        await host.bus.send(
            signals.SESSION_COMPRESSING, request_id="r", session_id="s1", status="done"
        )
    seen = dict(recorder.events)
    assert set(seen) == set(signals.PAYLOADS)
    for name, payload in recorder.events:
        signals.PAYLOADS[name].model_validate(payload)  # exactly the documented fields
    usage = seen[signals.TOKEN_USAGE]
    assert usage["used"] == sum(usage["breakdown"].model_dump().values())
    assert usage["breakdown"].system > 0 and usage["breakdown"].history > 0
    turn = seen[signals.AGENT_TURN_AFTER]
    assert (
        turn["outcome"] == "replied"
        and turn["reply"].content == "hello there"
        and turn["message"].seq == 1
    )
    # The knowledge contribution is placed once, after the static system prompt.
    sent = llm.calls[0]["messages"]
    assert [m["content"] for m in sent[:2]] == ["You are a helpful assistant.", "KB"]


async def test_misspelt_hookimpl_is_refused_at_start() -> None:
    class Typo:
        @hookimpl
        def agent_promt(self, view: Any) -> None:  # noqa: D401 - the typo is the point
            return None

    host = make_host(("typo", Typo()))
    with pytest.raises(ConfigError, match="agent_promt"):
        await host.start()


async def test_two_hosts_do_not_share_plugin_instances(tmp_path: Path) -> None:
    hosts = [
        Host(
            HostConfig(),
            memory=InMemoryMemory(token_counter=lambda m: 1),
            llm=FakeLLM(default_model=None),
        )
        for _ in range(2)
    ]
    async with hosts[0], hosts[1]:
        a, b = (h.get_plugin("memory-summary") for h in hosts)
        assert a is not b and a.memory is hosts[0].memory and b.memory is hosts[1].memory


async def test_bus_isolates_failing_receivers_and_refuses_unknown_names(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus()
    got: list[str] = []

    async def boom(sender: Any, **payload: Any) -> None:
        raise RuntimeError("receiver bug")

    def sync_receiver(sender: Any, **payload: Any) -> str:
        got.append(payload["session_id"])
        return "sync"

    bus.connect(signals.SESSION_COMPRESS, boom)
    bus.connect(signals.SESSION_COMPRESS, sync_receiver)
    with caplog.at_level(logging.ERROR):
        await bus.send(signals.SESSION_COMPRESS, request_id="r1", session_id="s", reason="manual")
    assert got == ["s"]
    assert "receiver bug" in caplog.text
    with pytest.raises(UnknownSignalError):
        await bus.send("session:compres", request_id="r", session_id="s")
    with pytest.raises(UnknownSignalError):
        bus.connect("nope", sync_receiver)
    with pytest.raises(ValueError):  # a payload that does not match the model
        await bus.send(signals.SESSION_COMPRESS, session_id="s")
    built = signals.SessionCompress(request_id="r3", session_id="u", reason="manual")
    await bus.send(signals.SESSION_COMPRESS, built)  # a payload the sender built: as it is
    assert got[-1] == "u"
    with pytest.raises(TypeError):  # a model of another signal
        await bus.send(
            signals.SESSION_COMPRESS, signals.MemoryMessagesDeleted(session_id="u", seqs=[1])
        )
    with pytest.raises(TypeError):  # a model and fields
        await bus.send(signals.SESSION_COMPRESS, built, session_id="v")
    bus.disconnect(signals.SESSION_COMPRESS, sync_receiver)
    await bus.send(signals.SESSION_COMPRESS, request_id="r2", session_id="t")
    assert got == ["s", "u"]


async def test_signal_receivers_return_values_are_dropped() -> None:
    """Signals are for observers: ``send`` hands the sender nothing of what receivers return."""
    bus = EventBus()
    heard: list[str] = []

    def sync_receiver(sender: Any, **payload: Any) -> dict[str, Any]:
        heard.append("sync")
        return {"summary": "an answer nobody may merge"}

    async def async_receiver(sender: Any, payload: signals.SessionCompress) -> str:
        heard.append("async")
        return "ignored"

    bus.connect(signals.SESSION_COMPRESS, sync_receiver)
    bus.connect(signals.SESSION_COMPRESS, async_receiver, typed=True)
    sent = await bus.send(signals.SESSION_COMPRESS, request_id="r", session_id="s")
    assert sent is None and sorted(heard) == ["async", "sync"]


class Clears:
    """A third-party plugin with a memory type of its own, cleared through the hook."""

    def __init__(self, answer: Any, *, fail: bool = False) -> None:
        self.answer = answer
        self.fail = fail
        self.calls: list[tuple[str, str | None, list[str] | None]] = []

    @hookimpl
    async def memory_clear(
        self, scope: str, session_id: str | None, types: list[str] | None
    ) -> Any:
        self.calls.append((scope, session_id, types))
        if self.fail:
            raise RuntimeError("clear bug")
        return self.answer


class ClearsSync:
    """Names only the arguments it wants, and answers without awaiting."""

    @hookimpl
    def memory_clear(self, types: list[str] | None) -> dict[str, Any]:
        return {"notes": {"types": types}}


async def test_memory_clear_is_a_hook_whose_answers_host_clear_merges(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert "memory:clear" not in signals.PAYLOADS
    kv, broken, silent = Clears({"kv": {"keys": 3}}), Clears(None, fail=True), Clears(None)
    host = make_host(("kv", kv), ("broken", broken), ("silent", silent), ("sync", ClearsSync()))
    async with host:
        await host.run_turn("s1", "hi")
        with pytest.raises(UnknownSignalError):  # a receiver of the old signal fails loudly
            host.bus.connect("memory:clear", lambda sender, **payload: {"kv": "lost"})
        with caplog.at_level(logging.ERROR):
            results = await host.clear("s1", ["history", "kv", "notes"])
        assert results == {
            "history": {"sessions": 1},
            "kv": {"keys": 3},
            "notes": {"types": ["history", "kv", "notes"]},
        }
        assert "clear bug" in caplog.text  # a failing plugin is logged, the others still clear
        assert await host.memory.get_history("s1") == []
        assert kv.calls == silent.calls == [("session", "s1", ["history", "kv", "notes"])]
        everything = await host.clear(None)
        assert everything["kv"] == {"keys": 3} and kv.calls[-1] == ("all", None, None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[host\nmodel=1", "invalid TOML"),
        ("[host]\nmodle = 'x'", "host.modle: unknown key"),
        (
            "[host]\nreserve_for_reply = 'many'",
            "host.reserve_for_reply: Input should be a valid integer",
        ),
        (
            "[host]\nreserve_for_reply = -1",
            "host.reserve_for_reply: Input should be greater than or equal to 0",
        ),
        ("[plugins]\nallow = ['nope']", "plugins.allow: not installed: nope"),
        ("[plugin.memory-summary]\nthresold = 10", "plugin.memory-summary.thresold: unknown key"),
        (
            "[plugin.memory-summary]\nthreshold = 'ten'",
            "plugin.memory-summary.threshold: Input should be a valid integer",
        ),
        (
            "[plugin.memory-summary]\nthreshold = 30\nkeep_recent = 40",
            "keep_recent (40) must be smaller than threshold (30)",
        ),
        (
            "[plugin.memory-summary]\nauto_compress_threshold = 1.5",
            "plugin.memory-summary.auto_compress_threshold: Input should be less than or equal to 1",
        ),
        ("[plugin.nope]\nx = 1", "plugin.nope: no such plugin loaded"),
    ],
)
async def test_bad_config_fails_at_start_with_file_and_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "host.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config = load_host_config(path)
        await Host(config, memory=InMemoryMemory(token_counter=lambda m: 1), llm=FakeLLM()).start()
    message = str(info.value)
    assert "\n" not in message and expected in message
    assert str(path) in message or "plugins.allow" in message


async def test_host_config_overrides_plugin_defaults(tmp_path: Path) -> None:
    path = tmp_path / "host.toml"
    path.write_text("[plugin.memory-summary]\nthreshold = 12\nkeep_recent = 4\n")
    async with Host(
        load_host_config(path), memory=InMemoryMemory(token_counter=lambda m: 1), llm=FakeLLM()
    ) as host:
        config = host.get_plugin("memory-summary").config
        assert (config.threshold, config.keep_recent, config.debounce_turns) == (12, 4, 3)


def test_assemble_prompt_places_anchors_and_merges_on_request() -> None:
    history = [
        Message(role="user", content="q1"),
        Message(role="assistant", content="a1"),
        Message(role="user", content="q2"),
        Message(role="system", kind="event-marker", content="[marker]"),
    ]
    contributions = [
        Contribution(id="hint", anchor="turn-hint", content="HINT"),
        Contribution(id="sum", anchor="context", content="SUMMARY"),
        Contribution(id="me", anchor="identity", content="ID"),
        Contribution(id="tc", anchor="turn-context", content="TC"),
    ]
    out = assemble_prompt("STATIC", contributions, history)
    assert [m["content"] for m in out] == [
        "ID",
        "STATIC",
        "SUMMARY",
        "q1",
        "a1",
        "TC",
        "q2",
        "HINT",
    ]
    merged = assemble_prompt("STATIC", contributions, history, merge_system_messages=True)
    assert merged[0] == {"role": "system", "content": "ID\n\nSTATIC\n\nSUMMARY"}
    assert [m["role"] for m in merged[1:3]] == ["user", "assistant"]


def _call(cid: str, name: str = "lookup") -> ToolCall:
    return ToolCall(id=cid, function=ToolCallFunction(name=name, arguments="{}"))


def test_sanitize_drops_orphans_and_pairs_positionally() -> None:
    msgs = [
        Message(role="tool", tool_call_id="c0", content="orphan result"),
        Message(role="assistant", tool_calls=[_call("c1")]),
        Message(role="tool", tool_call_id="c1", content="r1"),
        Message(role="assistant", content="partial", tool_calls=[_call("c2"), _call("c3")]),
        Message(role="tool", tool_call_id="c2", content="r2"),
        Message(role="user", content="u"),
        Message(
            role="assistant", tool_calls=[_call("c1")]
        ),  # id reused later: pairs with the next result
        Message(role="tool", tool_call_id="c1", content="r1b"),
    ]
    out, changed = sanitize_tool_pairs(msgs)
    assert [m.content for m in out] == [None, "r1", "partial", "u", None, "r1b"]
    assert out[2].tool_calls is None and changed == 3


async def test_tool_loop_emits_usage_before_every_model_call() -> None:
    recorder = Recorder()
    tools = ToolRegistry()
    tools.register(
        "add",
        lambda a, b: a + b,
        "add numbers",
        {"type": "object", "properties": {"a": {}, "b": {}}},
    )
    llm = FakeLLM()
    llm.enqueue(
        Completion(
            text="",
            tool_calls=[
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        ),
        "the sum is 5",
    )
    host = make_host(("recorder", recorder), llm=llm)
    host.tools = tools
    async with host:
        result = await host.run_turn("s", "add 2 and 3")
    assert (
        result.outcome == "replied"
        and result.reply is not None
        and result.reply.content == "the sum is 5"
    )
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    assert result.messages[2].content == "5"
    usage = [p for n, p in recorder.events if n == signals.TOKEN_USAGE]
    assert len(usage) == len(llm.calls) == 2
    assert usage[1]["breakdown"].tools > 0 and usage[0]["breakdown"].tool_defs > 0
    assert llm.calls[0]["tools"][0]["function"]["name"] == "add"


async def test_history_change_in_before_model_call_rebuilds_once() -> None:
    class Compressor:
        def __init__(self) -> None:
            self.memory: Any = None

        @hookimpl
        def startup(self, memory: Any) -> None:
            self.memory = memory

        @hookimpl
        async def before_model_call(self, view: PromptView) -> None:
            if len(view.messages) > 2:
                last = view.messages[-2].seq or 0
                await self.memory.commit_compression(
                    view.session_id,
                    {"text": "S"},
                    0 if view.summary is None else view.summary.version,
                    last,
                    epoch=view.epoch,
                )

    recorder = Recorder()
    llm = FakeLLM(default="fine")
    host = make_host(("recorder", recorder), ("compressor", Compressor()), llm=llm)
    async with host:
        await host.run_turn("s", "one")
        result = await host.run_turn("s", "two")
    rebuilt = [u.rebuilt for u in result.usage]
    assert rebuilt == [False, True]
    assert result.usage[1].used < result.usage[0].used
    assert [m["content"] for m in llm.calls[-1]["messages"] if m["role"] != "system"] == ["two"]


async def test_streaming_turn_emits_the_same_signals() -> None:
    recorder = Recorder()
    deltas: list[str] = []
    host = make_host(("recorder", recorder), llm=FakeLLM(default="streamed reply"))
    async with host:
        result = await host.run_turn("s", "hi", stream=True, on_delta=deltas.append)
    assert "".join(deltas) == "streamed reply" and result.reply is not None
    assert recorder.names().count(signals.TOKEN_USAGE) == 1
    assert recorder.names()[-1] == signals.AGENT_TURN_AFTER


async def test_model_error_is_a_failed_turn_not_an_exception() -> None:
    recorder = Recorder()
    llm = FakeLLM()
    llm.enqueue(RuntimeError("provider down"))
    host = make_host(("recorder", recorder), llm=llm)
    async with host:
        result = await host.run_turn("s", "hi")
    assert result.outcome == "error" and "provider down" in (result.error or "")
    assert dict(recorder.events)[signals.AGENT_TURN_AFTER]["outcome"] == "error"


async def test_replay_uses_recorded_replies_and_calls_no_model() -> None:
    llm = FakeLLM()
    recorder = Recorder()
    host = make_host(("recorder", recorder), llm=llm)
    recorded = [
        Message(role="assistant", tool_calls=[_call("c1", "search")]),
        Message(role="tool", tool_call_id="c1", content="found"),
        Message(role="assistant", content="here it is"),
    ]
    async with host:
        result = await host.run_turn("s", "find it", recorded=recorded)
        history = await host.memory.get_history("s")
    assert llm.calls == []
    assert [m.seq for m in history] == [1, 2, 3, 4]
    assert recorder.names().count(signals.TOKEN_USAGE) == 2  # before each recorded model reply
    assert result.reply is not None and result.reply.content == "here it is"


class ToolPlugin:
    """A third-party plugin that adds agent tools through the ``agent_tools`` hook."""

    def __init__(self, *names: str) -> None:
        self.names = names or ("lookup",)
        self.contexts: list[ToolContext] = []

    @hookimpl
    def agent_tools(self) -> list[AgentTool]:
        async def lookup(context: ToolContext, key: str) -> dict[str, Any]:
            self.contexts.append(context)
            if key == "boom":
                raise RuntimeError("the lookup table is on fire")
            return {"key": key, "value": key.upper()}

        return [
            AgentTool(
                name=name,
                description="look a key up",
                parameters={
                    "type": "object",
                    "properties": {"key": {"type": "string"}},
                    "required": ["key"],
                },
                handler=lookup,
            )
            for name in self.names
        ]


def _tool_call_reply(call_id: str, name: str, arguments: str) -> Completion:
    return Completion(
        text="",
        tool_calls=[
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    )


async def test_plugin_tools_are_listed_and_run_in_the_tool_loop_with_the_turns_session() -> None:
    plugin = ToolPlugin()
    llm = FakeLLM()
    llm.enqueue(
        _tool_call_reply("t1", "lookup", '{"key": "abc"}'),
        _tool_call_reply("t2", "lookup", '{"key": "boom"}'),
        _tool_call_reply("t3", "lookup", '{"wrong": 1}'),
        "done",
    )
    host = make_host(("tools", plugin), llm=llm)
    async with host:
        result = await host.run_turn("s1", "look up abc")
    assert result.outcome == "replied" and result.reply is not None
    assert result.reply.content == "done"
    assert [d["function"]["name"] for d in llm.calls[0]["tools"]] == ["lookup"]
    tools = [m for m in result.messages if m.role == "tool"]
    assert [(m.tool_call_id, m.name) for m in tools] == [
        ("t1", "lookup"),
        ("t2", "lookup"),
        ("t3", "lookup"),
    ]
    assert json.loads(tools[0].content) == {"key": "abc", "value": "ABC"}
    assert tools[0].metadata == {}
    # A handler's exception and arguments it does not take are tool errors, not a failed turn.
    assert tools[1].metadata == {"is_error": True} and "on fire" in tools[1].content
    assert tools[2].metadata == {"is_error": True} and "wrong" in tools[2].content
    assert [(c.session_id, c.call_id, c.model) for c in plugin.contexts] == [
        ("s1", "t1", "fake/chat"),
        ("s1", "t2", "fake/chat"),
    ]
    # The next call saw each result as an ordinary tool message after its call.
    roles = [m["role"] for m in llm.calls[-1]["messages"]]
    assert roles[-6:] == ["assistant", "tool", "assistant", "tool", "assistant", "tool"]


async def test_a_plugin_tool_name_taken_twice_stops_the_host_at_start() -> None:
    host = make_host(("one", ToolPlugin("lookup")), ("two", ToolPlugin("lookup")))
    with pytest.raises(ConfigError, match="agent tool 'lookup' is already registered"):
        await host.start()
    await host.stop()


async def test_a_typed_receiver_gets_the_signal_payload_model() -> None:
    from host_stub import signals
    from host_stub.bus import EventBus

    bus = EventBus()
    seen: list[object] = []
    kwargs_seen: list[dict[str, object]] = []

    async def typed(sender: object, event: signals.SessionCompress) -> None:
        seen.append(event)

    def plain(sender: object, **payload: object) -> None:
        kwargs_seen.append(payload)

    bus.connect(signals.SESSION_COMPRESS, typed, typed=True)
    bus.connect(signals.SESSION_COMPRESS, plain)
    await bus.send(signals.SESSION_COMPRESS, request_id="r1", session_id="s", reason="auto")
    assert len(seen) == 1 and isinstance(seen[0], signals.SessionCompress)
    assert (seen[0].session_id, seen[0].reason, seen[0].usage_ratio) == ("s", "auto", None)
    assert kwargs_seen == [
        {"request_id": "r1", "session_id": "s", "reason": "auto", "usage_ratio": None}
    ]
    bus.disconnect(signals.SESSION_COMPRESS, typed)
    await bus.send(signals.SESSION_COMPRESS, request_id="r2", session_id="s")
    assert len(seen) == 1 and len(kwargs_seen) == 2


async def test_typed_receivers_share_the_model_of_the_send_nested_sends_included() -> None:
    """Typed receivers get the one payload model of the send (the sender's own when it built
    it; not built again per receiver); a send made inside a receiver has its own, and the outer
    send's next receivers still get the outer one."""
    from host_stub import signals
    from host_stub.bus import EventBus

    bus = EventBus()
    seen: list[tuple[str, object]] = []

    async def first(sender: object, event: signals.TokenUsage) -> None:
        seen.append(("first", event))
        await bus.send(signals.SESSION_COMPRESS, request_id="r1", session_id="s")

    async def inner(sender: object, event: signals.SessionCompress) -> None:
        seen.append(("inner", event))

    def second(sender: object, event: signals.TokenUsage) -> None:
        seen.append(("second", event))

    bus.connect(signals.TOKEN_USAGE, first, typed=True)
    bus.connect(signals.TOKEN_USAGE, second, typed=True)
    bus.connect(signals.SESSION_COMPRESS, inner, typed=True)
    fields = {"model": "m", "context_window": 100, "used": 10, "usage_ratio": 0.1}
    usage = signals.TokenUsage(session_id="s", breakdown=signals.TokenBreakdown(), **fields)
    await bus.send(signals.TOKEN_USAGE, usage)
    assert [name for name, _ in seen] == ["first", "inner", "second"]
    assert seen[0][1] is usage and seen[2][1] is usage
    assert isinstance(seen[1][1], signals.SessionCompress)
    assert seen[1][1].request_id == "r1"  # type: ignore[attr-defined]
    seen.clear()
    await bus.send(signals.TOKEN_USAGE, session_id="t", breakdown={}, **fields)
    assert seen[0][1] is seen[2][1] and seen[0][1].session_id == "t"  # type: ignore[attr-defined]
