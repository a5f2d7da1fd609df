"""Tier 1: old tool output is shown as a one-line placeholder before any summarizer runs; the
stored message stays whole, tool pairs stay, and the plan measures what the prompt shows."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from plugin_harness import json_summary, plugin_host

from host_stub.messages import Message, ToolCall, ToolCallFunction, text_of, tool_groups
from host_stub.prompt import apply_replacements
from host_stub.testing import FakeLLM, simple_count
from plugin_memory_summary.prompt.pruning import HELD_IDS, prune_replacements, pruned_costs


def count(text: str) -> int:
    return simple_count(text)


def group(seq: int, name: str, args: dict[str, object], result: str) -> list[Message]:
    call = ToolCall(id=f"c{seq}", function=ToolCallFunction(name=name, arguments=json.dumps(args)))
    return [
        Message(role="assistant", tool_calls=[call], seq=seq, tokens=20),
        Message(
            role="tool",
            tool_call_id=f"c{seq}",
            content=result,
            seq=seq + 1,
            tokens=count(result),
        ),
    ]


def chat(groups: int, result_words: int = 300) -> list[Message]:
    out = [Message(role="user", content="find my booking", seq=1, tokens=5)]
    for g in range(groups):
        seq = 2 + 3 * g
        result = " ".join(f"row{g}-{i}" for i in range(result_words))
        out += group(seq, "get_reservation", {"reservation_id": f"RES{g:03d}"}, result)
        out.append(Message(role="assistant", content=f"found RES{g:03d}", seq=seq + 2, tokens=4))
    return out


def test_old_tool_results_become_a_placeholder_naming_tool_arguments_size_and_seq() -> None:
    messages = chat(5)
    out = prune_replacements(
        messages, keep_tool_groups=2, max_result_tokens=None, count_tokens=count
    )
    results = [m for m in messages if m.role == "tool"]
    assert sorted(out) == [m.seq for m in results[:3]]  # the newest two groups stay whole
    line = out[results[0].seq]
    assert "\n" not in line
    assert f"#{results[0].seq}" in line
    assert "get_reservation(reservation_id=RES000)" in line
    assert f"{results[0].tokens:,} tokens" in line
    assert f"memory_expand({results[0].seq}, {results[0].seq})" in line


def test_a_placeholder_names_the_identifiers_its_result_held() -> None:
    """What an agent needs to act on is still in the prompt after its result is pruned: the
    ids the result held, under their keys (not those its call already names), at most a few."""
    record = {
        "reservation_id": "EUJUY6",
        "user_id": "mia_li_3668",
        "flights": [{"flight_number": "HAT136", "date": "2024-05-20", "origin": "JFK"}],
        "payment_history": [{"payment_id": "credit_card_4421486", "amount": 240}],
        "notes": " ".join(f"word{i}" for i in range(300)),
    }
    messages = [
        Message(role="user", content="check my trip", seq=1, tokens=4),
        *group(2, "get_reservation_details", {"reservation_id": "EUJUY6"}, json.dumps(record)),
        Message(role="assistant", content="found it", seq=4, tokens=3),
        *group(5, "get_user_details", {"user_id": "mia_li_3668"}, "profile " * 200),
    ]
    out = prune_replacements(
        messages, keep_tool_groups=1, max_result_tokens=None, count_tokens=count
    )
    line = out[3]
    assert "user_id mia_li_3668" in line and "flight_number HAT136" in line
    assert "payment_id credit_card_4421486" in line and "date 2024-05-20" in line
    assert line.count("EUJUY6") == 1  # in the call's arguments, not again among what it held
    many = {f"order_{i}": f"W{1000000 + i}" for i in range(10)}
    messages[2] = messages[2].model_copy(update={"content": json.dumps(many), "tokens": 400})
    line = prune_replacements(
        messages, keep_tool_groups=1, max_result_tokens=None, count_tokens=count
    )[3]
    assert sum(f"W{1000000 + i}" in line for i in range(10)) == HELD_IDS
    listing = {f"order_{i}": f"W{1000000 + i}" for i in range(40)}  # a search's many results
    messages[2] = messages[2].model_copy(update={"content": json.dumps(listing), "tokens": 400})
    line = prune_replacements(
        messages, keep_tool_groups=1, max_result_tokens=None, count_tokens=count
    )[3]
    assert "it held" not in line


def test_a_result_shorter_than_its_placeholder_is_left_as_it_is() -> None:
    messages = chat(4, result_words=2)
    assert (
        prune_replacements(messages, keep_tool_groups=1, max_result_tokens=None, count_tokens=count)
        == {}
    )


def test_a_kept_result_over_the_limit_is_cut_with_a_note_of_what_was_left_out() -> None:
    messages = chat(1, result_words=2000)
    result = messages[2]
    out = prune_replacements(
        messages, keep_tool_groups=3, max_result_tokens=200, count_tokens=count
    )
    shown = out[result.seq]
    assert text_of(result.content).startswith(shown.split("…")[0])
    assert f"of {result.tokens:,} tokens of tool result #{result.seq}" in shown
    assert count(shown) < 260


def test_without_recall_tools_the_placeholder_says_the_result_is_stored() -> None:
    out = prune_replacements(
        chat(3), keep_tool_groups=0, max_result_tokens=None, count_tokens=count, recall=False
    )
    assert out and all(
        "stored whole" in line and "memory_expand" not in line for line in out.values()
    )


@settings(max_examples=60, deadline=None)
@given(
    groups=st.integers(min_value=0, max_value=8),
    keep=st.integers(min_value=0, max_value=10),
    limit=st.one_of(st.none(), st.integers(min_value=64, max_value=2000)),
)
def test_replacements_keep_pairs_roles_and_never_grow_the_prompt(
    groups: int, keep: int, limit: int | None
) -> None:
    messages = chat(groups)
    out = prune_replacements(
        messages, keep_tool_groups=keep, max_result_tokens=limit, count_tokens=count
    )
    shown = apply_replacements(messages, out, lambda m: count(text_of(m.content)))
    assert [(m.role, m.tool_call_id, m.seq) for m in shown] == [
        (m.role, m.tool_call_id, m.seq) for m in messages
    ]
    assert all(complete for _, _, complete in tool_groups(shown))
    assert set(out) <= {m.seq for m in messages if m.role == "tool"}
    assert sum(m.tokens or 0 for m in shown) <= sum(m.tokens or 0 for m in messages)
    costs = pruned_costs(messages, out, count)
    assert [text_of(m.content) for m in costs] == [text_of(m.content) for m in messages]


async def tool_turns(h: object, n: int) -> None:
    for g in range(n):
        seq_args = {"reservation_id": f"RES{g:03d}"}
        call = Message(
            role="assistant",
            tool_calls=[
                ToolCall(
                    id=f"c{g}",
                    function=ToolCallFunction(
                        name="get_reservation", arguments=json.dumps(seq_args)
                    ),
                )
            ],
        )
        result = " ".join(f"row{g}-{i}" for i in range(150))
        await h.host.run_turn(  # type: ignore[attr-defined]
            "s",
            f"show reservation RES{g:03d}",
            recorded=[
                call,
                Message(role="tool", tool_call_id=f"c{g}", content=result),
                Message(role="assistant", content=f"Here is RES{g:03d}."),
            ],
        )


async def test_the_prompt_shows_placeholders_while_the_store_keeps_every_result_whole() -> None:
    async with plugin_host(
        {"prune_keep_tool_groups": 2, "auto_compress_threshold": 0, "hard_compress_threshold": 0},
        llm=FakeLLM(default=json_summary),
        host={"context_window": 100_000},
    ) as h:
        await tool_turns(h, 5)
        _, prompt, usage, _ = await h.host.build_prompt("s", dry_run=True)
        tools = [m for m in prompt if m["role"] == "tool"]
        assert len(tools) == 5
        assert all(m["content"].startswith("[tool result #") for m in tools[:3])
        assert all(m["content"].startswith("row") for m in tools[3:])
        stored = [m for m in await h.host.memory.get_history("s") if m.role == "tool"]
        assert all(text_of(m.content).startswith("row") for m in stored)
        assert usage.breakdown.tools < sum(m.tokens or 0 for m in stored)


async def test_pruning_saves_the_summarizer_calls_the_tool_output_would_have_cost() -> None:
    async def compressions(config: dict[str, object]) -> int:
        llm = FakeLLM(default=json_summary)
        async with plugin_host(
            {"auto_compress_threshold": 0.6, "hard_compress_threshold": 0.9, **config},
            llm=llm,
            host={"context_window": 3000},
        ) as h:
            await tool_turns(h, 12)
            await h.plugin.scheduler.wait_idle()
            return len(llm.calls)

    pruned = await compressions({})
    whole = await compressions({"prune_keep_tool_groups": None, "tool_result_max_share": 0})
    assert whole > 0
    assert pruned < whole


def test_a_cut_just_under_a_result_size_never_makes_it_longer() -> None:
    messages = chat(1)
    result = next(m for m in messages if m.role == "tool")
    assert result.tokens is not None
    for limit in range(result.tokens - 30, result.tokens):
        out = prune_replacements(
            messages, keep_tool_groups=1, max_result_tokens=limit, count_tokens=count
        )
        if result.seq in out:
            assert count(out[result.seq]) <= limit + 1
