"""Prompt-cache friendliness: per model call, the tokens of the prompt that open it exactly as the
previous call's prompt opened (what a provider's prompt cache could reuse), measured by the host
and reported by the replay."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from host_stub import signals, tokenizer
from host_stub.config import HostConfig
from host_stub.hookspecs import Contribution, PromptView, hookimpl
from host_stub.host import Host
from host_stub.memory.inmemory import InMemoryMemory
from host_stub.messages import Message
from host_stub.prompt import PrefixReuse, assemble_prompt, prefix_reuse, reuse_shares
from host_stub.testing import FakeLLM
from plugin_memory_summary.extras.report import render_report, run_replay

MODEL = "gpt-4o-mini"


def count(message: Mapping[str, Any]) -> int:
    """The reference host's count of one message (litellm's formula, the model's encoding)."""
    counted = tokenizer.count_messages(MODEL, [message])
    assert counted is not None
    return counted


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


HEAD = system("You are a helpful assistant.")
SUMMARY = system(
    "<conversation-summary>\nLena flies LH 716 on 2025-04-03.\n</conversation-summary>"
)
CHAT = [user("Book the ryokan in Kyoto."), assistant("Booked: Ryokan Yachiyo, RY-20417.")]


# -- the pure function ------------------------------------------------------------------------------
def test_no_previous_prompt_reuses_nothing() -> None:
    prompt = [HEAD, *CHAT]
    assert prefix_reuse(None, prompt, count) == PrefixReuse(0, sum(map(count, prompt)))
    assert prefix_reuse([], prompt, count).reused == 0


def test_identical_and_appended_prompts() -> None:
    before = [HEAD, SUMMARY, *CHAT]
    total = sum(map(count, before))
    assert prefix_reuse(before, list(before), count) == PrefixReuse(total, total)
    after = [*before, user("And a table for two at 19:00?")]
    assert prefix_reuse(before, after, count) == PrefixReuse(total, sum(map(count, after)))


def test_a_changed_summary_keeps_the_head_and_the_shared_start_of_its_text() -> None:
    before = [HEAD, SUMMARY, *CHAT]
    new_summary = system(
        "<conversation-summary>\nLena flies LH 716 on 2025-04-03 and stays in Kyoto.\n"
        "</conversation-summary>"
    )
    after = [HEAD, new_summary, *CHAT]
    shared = "<conversation-summary>\nLena flies LH 716 on 2025-04-03"
    reuse = prefix_reuse(before, after, count)
    assert reuse.reused == count(HEAD) + count(system(shared))
    # Everything after the first change is sent again, however equal it is.
    assert reuse.tokens - reuse.reused > sum(map(count, CHAT))


def test_a_window_that_drops_the_oldest_message_reuses_only_the_head() -> None:
    before = [HEAD, *CHAT, user("Is it near the station?")]
    after = [HEAD, *CHAT[1:], user("Is it near the station?"), assistant("Ten minutes on foot.")]
    assert prefix_reuse(before, after, count).reused == count(HEAD)  # user -> assistant


def test_a_message_of_another_role_shares_nothing_inside_it() -> None:
    before = [HEAD, user("Kyoto first")]
    after = [HEAD, assistant("Kyoto first")]
    assert prefix_reuse(before, after, count).reused == count(HEAD)


def test_reuse_shares_pool_tokens_and_take_the_median_of_calls() -> None:
    calls = [PrefixReuse(90, 100), PrefixReuse(0, 300), PrefixReuse(50, 100)]
    pooled, median = reuse_shares(calls) or (0.0, 0.0)
    assert pooled == 140 / 500 and median == 0.5
    assert reuse_shares([]) is None and reuse_shares([PrefixReuse(0, 0)]) is None


messages = st.lists(
    st.builds(
        lambda role, text: {"role": role, "content": text},
        st.sampled_from(["system", "user", "assistant"]),
        st.text(max_size=40),
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(prompt=messages, more=messages)
def test_property_identical_prompts_reuse_all_and_appending_keeps_the_previous(
    prompt: list[dict[str, Any]], more: list[dict[str, Any]]
) -> None:
    total = sum(map(count, prompt))
    assert prefix_reuse(prompt, [dict(m) for m in prompt], count) == PrefixReuse(total, total)
    grown = [*prompt, *more]
    reuse = prefix_reuse(prompt, grown, count)
    assert reuse.tokens == total + sum(map(count, more))
    assert reuse.reused == (total if prompt else 0)


@settings(max_examples=200, deadline=None)
@given(before=messages, after=messages)
def test_property_reuse_is_bounded_by_the_equal_messages_and_the_first_change(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    reuse = prefix_reuse(before, after, count)
    same = 0
    while same < min(len(before), len(after)) and before[same] == after[same]:
        same += 1
    floor = sum(map(count, after[:same])) if before else 0
    ceiling = sum(map(count, after[: same + 1])) if before else 0
    assert floor <= reuse.reused <= min(ceiling, reuse.tokens)


# -- where the host puts the summary ----------------------------------------------------------------
def test_core_system_messages_come_before_the_summary() -> None:
    history = [
        Message(role="system", content="POLICY"),
        Message(role="user", content="q1"),
        Message(role="system", content="LATER NOTE"),
        Message(role="assistant", content="a1"),
    ]
    summary = [Contribution(id="sum", anchor="context", content="SUMMARY")]
    out = assemble_prompt("STATIC", summary, history)
    assert [m["content"] for m in out] == ["STATIC", "POLICY", "SUMMARY", "q1", "LATER NOTE", "a1"]
    merged = assemble_prompt("STATIC", summary, history, merge_system_messages=True)
    assert merged[0] == {"role": "system", "content": "STATIC\n\nPOLICY\n\nSUMMARY"}
    assert [m["content"] for m in merged[1:]] == ["q1", "LATER NOTE", "a1"]
    named = [Message(role="system", content="POLICY", name="ops"), *history[1:]]
    merged = assemble_prompt("STATIC", summary, named, merge_system_messages=True)
    assert merged[0]["content"] == "STATIC\n\nSUMMARY" and merged[1]["name"] == "ops"


# -- the host records it per model call -------------------------------------------------------------
class ChangingSummary:
    """A plugin whose context contribution changes at every model call."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def agent_prompt(self, view: PromptView) -> Contribution:
        self.calls += 1
        return Contribution(id="s", anchor="context", content=f"summary version {self.calls}")


async def test_the_host_reports_reuse_on_token_usage() -> None:
    config = HostConfig.model_validate({"host": {"model": "fake/chat"}, "plugins": {"allow": []}})
    llm = FakeLLM(default="ok")
    memory = InMemoryMemory(token_counter=lambda m: llm.count_tokens([m]))
    host = await Host(config, memory=memory, llm=llm).start()
    seen: list[dict[str, Any]] = []

    async def on_usage(sender: Any, **payload: Any) -> None:
        seen.append(payload)

    host.bus.connect(signals.TOKEN_USAGE, on_usage)
    try:
        first = await host.run_turn(
            "s", "hello", recorded=[Message(role="assistant", content="hi")]
        )
        second = await host.run_turn(
            "s", "again", recorded=[Message(role="assistant", content="x")]
        )
        await host.run_turn("other", "hello", recorded=[Message(role="assistant", content="hi")])
    finally:
        host.bus.disconnect(signals.TOKEN_USAGE, on_usage)
        await host.stop()
    (u1,), (u2,) = first.usage, second.usage
    assert u1.reused_tokens is None  # nothing sent before in this session
    assert u1.message_tokens == llm.count_tokens(first.sent[0])
    # The second prompt only appends to the first: all of the first is reused.
    assert u2.reused_tokens == u1.message_tokens < u2.message_tokens
    assert [p["reused_tokens"] for p in seen] == [None, u1.message_tokens, None]


async def test_a_contribution_that_changes_every_call_is_reused_only_up_to_it() -> None:
    config = HostConfig.model_validate(
        {"host": {"model": "fake/chat", "system_prompt": "STATIC"}, "plugins": {"allow": []}}
    )
    llm = FakeLLM(default="ok")
    memory = InMemoryMemory(token_counter=lambda m: llm.count_tokens([m]))
    host = Host(config, memory=memory, llm=llm, plugins=[("changing", ChangingSummary())])
    await host.start()
    try:
        await host.run_turn("s", "hello", recorded=[Message(role="assistant", content="hi")])
        second = await host.run_turn(
            "s", "again", recorded=[Message(role="assistant", content="x")]
        )
    finally:
        await host.stop()
    (usage,) = second.usage
    static = llm.count_tokens([{"role": "system", "content": "STATIC"}])
    shared = llm.count_tokens([{"role": "system", "content": "summary version "}])
    assert usage.reused_tokens == static + shared


# -- the replay report ------------------------------------------------------------------------------
POLICY = "You are the airline's agent. " + " ".join(
    f"Rule {i}: check the booking reference and the passenger's name before any change."
    for i in range(40)
)


def tool_chat(turns: int) -> list[Message]:
    out = [Message(role="system", content=POLICY)]
    for i in range(turns):
        out.append(Message(role="user", content=f"Question {i} about booking K7XQ{i:02d}. " * 8))
        out.append(
            Message(role="assistant", content=f"Answer {i}: booking K7XQ{i:02d} is set. " * 8)
        )
    return out


async def test_a_replay_with_the_plugin_reports_prefix_reuse() -> None:
    config = HostConfig.model_validate(
        {
            "host": {"memory": "memory://", "context_window": 4000, "reserve_for_reply": 0},
            "plugins": {"allow": ["memory-summary"]},
        }
    )
    report = await run_replay(config, tool_chat(60), "trip")
    series = report.with_plugin
    assert len(series.compressions) >= 2, "the replay never compressed"
    assert len(series.prefix) == report.turns - 1  # every call after the first
    pooled, median = series.prefix_reuse or (0.0, 0.0)
    assert 0 < pooled < 1 and 0 < median <= 1
    assert pooled == sum(r for r, _ in series.prefix) / sum(t for _, t in series.prefix)
    # A compression changes the summary, yet the system prompt and the policy (a core system
    # message, never archived) stay in the reused prefix.
    policy = tokenizer.count_messages(MODEL, [{"role": "system", "content": POLICY}]) or 0
    assert policy > 400
    assert min(r for r, _ in series.prefix) > policy
    line = next(li for li in render_report(report).splitlines() if "prompt prefix" in li)
    assert re.search(
        rf"{pooled:.0%} of prompt tokens reused from the previous call's prompt "
        rf"\(median per call {median:.0%}, {len(series.prefix)} calls\)",
        line,
    ), line
    assert tuple(report.to_dict()["with_plugin"]["prefix_reuse"]) == (pooled, median)


class CountingLLM(FakeLLM):
    """Counts the messages the host counts one by one (``count_tokens([message])``)."""

    def __init__(self) -> None:
        super().__init__(default="ok")
        self.counted: list[Any] = []

    def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
        if isinstance(messages_or_text, list) and len(messages_or_text) == 1:
            self.counted.append(messages_or_text[0])
        return super().count_tokens(messages_or_text, model)


async def test_a_message_is_counted_once_when_stored_not_again_in_the_prompt() -> None:
    config = HostConfig.model_validate({"host": {"model": "fake/chat"}, "plugins": {"allow": []}})
    llm = CountingLLM()
    memory = InMemoryMemory(token_counter=lambda m: llm.count_tokens([m]))
    host = await Host(config, memory=memory, llm=llm).start()
    try:
        for i in range(30):
            await host.run_turn("s", f"q{i}", recorded=[Message(role="assistant", content="a")])
        llm.counted.clear()
        result = await host.run_turn("s", "last", recorded=[Message(role="assistant", content="b")])
    finally:
        await host.stop()
    (usage,) = result.usage
    # The prompt holds the system prompt and 61 messages; two are new since the last call (the
    # reply to it and the new question): they carry the counts the store took at their appends.
    # This turn counted only what it stored: the question and the reply.
    assert len(result.sent[0]) == 62
    assert [m.content for m in llm.counted] == ["last", "b"]
    new = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "last"}]
    assert usage.message_tokens == sum(llm.count_tokens([m]) for m in result.sent[0])
    assert usage.reused_tokens == usage.message_tokens - sum(llm.count_tokens([m]) for m in new)


async def test_the_oldest_sessions_prompts_are_forgotten_past_the_character_budget(
    monkeypatch: Any,
) -> None:
    from host_stub import host as host_module

    monkeypatch.setattr(host_module, "LAST_PROMPTS_CHARS", 150)
    config = HostConfig.model_validate({"host": {"model": "fake/chat"}, "plugins": {"allow": []}})
    llm = FakeLLM(default="ok")
    memory = InMemoryMemory(token_counter=lambda m: llm.count_tokens([m]))
    host = await Host(config, memory=memory, llm=llm).start()
    reply = [Message(role="assistant", content="fine")]
    try:
        await host.run_turn("a", "x" * 60, recorded=reply)
        await host.run_turn("b", "y" * 60, recorded=reply)
        again_b = await host.run_turn("b", "more", recorded=reply)
        # a's prompt (about 90 characters with the system prompt) was dropped to keep b's two.
        again_a = await host.run_turn("a", "more", recorded=reply)
    finally:
        await host.stop()
    assert again_b.usage[0].reused_tokens is not None
    assert again_a.usage[0].reused_tokens is None
