"""Pure decisions: cut point, batches, budget, triggers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from host_stub.messages import Message, ToolCall, ToolCallFunction, tool_groups
from plugin_memory_summary.base.decisions import (
    conversation_messages,
    counters_after_run,
    cut_point,
    gain_estimate,
    hard_triggered,
    plan_compression,
    plan_watermark,
    soft_triggered,
    split_batches,
    summary_budget,
    turn_triggered,
)


def seq(messages: list[Message], tokens: int = 10) -> list[Message]:
    return [
        m.model_copy(update={"seq": i + 1, "tokens": m.tokens or tokens})
        for i, m in enumerate(messages)
    ]


def call(*ids: str) -> Message:
    return Message(
        role="assistant",
        tool_calls=[ToolCall(id=i, function=ToolCallFunction(name="f")) for i in ids],
    )


def result(cid: str) -> Message:
    return Message(role="tool", tool_call_id=cid, content="r")


def user(text: str = "u") -> Message:
    return Message(role="user", content=text)


def test_cut_keeps_newest_and_reports_seq() -> None:
    msgs = seq([user(str(i)) for i in range(10)])
    cut = cut_point(msgs, keep_recent=3)
    assert cut is not None
    assert cut.covered_up_to_seq == 7 and [m.seq for m in cut.kept] == [8, 9, 10]


def test_cut_moves_earlier_to_keep_parallel_tool_group_whole() -> None:
    msgs = seq([user(), user(), call("a", "b"), result("a"), result("b"), user(), user()])
    # keep_recent=3 would start the kept window at result("b"): the group moves to the kept side.
    cut = cut_point(msgs, keep_recent=3)
    assert cut is not None and cut.covered_up_to_seq == 2
    assert [m.role for m in cut.kept] == ["assistant", "tool", "tool", "user", "user"]


def test_cut_ignores_system_messages_and_markers() -> None:
    msgs = seq(
        [
            Message(role="system", content="policy"),
            user(),
            user(),
            Message(role="system", kind="event-marker", content="[m]"),
            user(),
            user(),
        ]
    )
    cut = cut_point(msgs, keep_recent=2)
    assert cut is not None
    assert [m.seq for m in cut.messages] == [2, 3] and [m.seq for m in cut.kept] == [5, 6]


def test_keep_recent_tokens_bounds_the_window_but_keeps_the_newest() -> None:
    msgs = seq([user(), user(), user().model_copy(update={"tokens": 5000}), user()])
    cut = cut_point(msgs, keep_recent=3, keep_recent_tokens=100)
    assert cut is not None and [m.seq for m in cut.kept] == [4]
    huge_last = seq([user(), user().model_copy(update={"tokens": 5000})])
    cut = cut_point(huge_last, keep_recent=3, keep_recent_tokens=100)
    assert cut is not None and [m.seq for m in cut.kept] == [2]


def test_nothing_to_cut() -> None:
    assert cut_point(seq([user(), user()]), keep_recent=5) is None
    assert cut_point(seq([call("a"), result("a")]), keep_recent=1) is None


messages_strategy = st.lists(
    st.sampled_from(["u", "a", "call1", "call2", "sys", "marker"]), min_size=0, max_size=40
)


def build(kinds: list[str]) -> list[Message]:
    out: list[Message] = []
    n = 0
    for k in kinds:
        if k == "u":
            out.append(user())
        elif k == "a":
            out.append(Message(role="assistant", content="a"))
        elif k == "sys":
            out.append(Message(role="system", content="s"))
        elif k == "marker":
            out.append(Message(role="system", kind="event-marker", content="m"))
        else:
            ids = [f"c{n}_{i}" for i in range(int(k[-1]))]
            n += 1
            out.append(call(*ids))
            out.extend(result(i) for i in ids)
    return seq(out, tokens=7)


@settings(max_examples=200, deadline=None)
@given(messages_strategy, st.integers(1, 12), st.one_of(st.none(), st.integers(1, 60)))
def test_cut_never_splits_a_tool_group(
    kinds: list[str], keep: int, keep_tokens: int | None
) -> None:
    msgs = build(kinds)
    cut = cut_point(msgs, keep, keep_tokens)
    if cut is None:
        return
    conv = conversation_messages(msgs)
    for start, end, _ in tool_groups(conv):
        seqs = [m.seq or 0 for m in conv[start:end]]
        assert all(s <= cut.covered_up_to_seq for s in seqs) or all(
            s > cut.covered_up_to_seq for s in seqs
        )
    assert cut.kept and cut.messages


@settings(max_examples=200, deadline=None)
@given(messages_strategy, st.integers(1, 40))
def test_batches_cover_in_order_and_never_end_inside_a_group(
    kinds: list[str], batch_tokens: int
) -> None:
    conv = conversation_messages(build(kinds))
    batches = split_batches(conv, batch_tokens)
    assert [m.seq for b in batches for m in b] == [m.seq for m in conv]
    for b in batches:
        assert b[0].role != "tool"
        groups = tool_groups(b)
        assert all(complete for _, _, complete in groups)


def test_summary_budget() -> None:
    assert summary_budget(128_000, 0.05, 2000, None) == 2000
    assert summary_budget(4000, 0.05, 2000, None) == 512  # floor of 512
    assert summary_budget(100_000, 0.05, 0, None) == 5000  # 0 = no cap
    assert summary_budget(100_000, 0.05, 0, 1024) == 1024  # summarizer's max output


def test_triggers() -> None:
    assert turn_triggered("replied", 30, 30, None, 3)
    assert not turn_triggered("aborted", 99, 30, None, 3)
    assert not turn_triggered("error", 99, 30, None, 3)
    assert not turn_triggered("replied", 29, 30, None, 3)
    assert not turn_triggered("replied", 40, 30, 2, 3)
    assert turn_triggered("silent", 40, 30, 3, 3)
    assert soft_triggered(0.7, 0.7, dry_run=False, rebuilt=False)
    assert not soft_triggered(0.99, 0.0, dry_run=False, rebuilt=False)  # 0 = off
    assert not soft_triggered(0.9, 0.7, dry_run=True, rebuilt=False)
    assert not soft_triggered(0.9, 0.7, dry_run=False, rebuilt=True)
    assert hard_triggered(0.95, 0.9, dry_run=False)
    assert not hard_triggered(0.99, 0.0, dry_run=False) and not hard_triggered(
        2.0, 1.0, dry_run=False
    )


def test_watermark_plan_aims_below_the_mark_or_reports_it_cannot() -> None:
    plan = plan_watermark(
        context_window=10_000,
        mark=0.9,
        min_gain=0.2,
        fixed_tokens=2000,
        summary_budget_tokens=512,
        newest_tokens=100,
    )
    assert plan.blocked is None and plan.keep_tokens == 7000 - 2000 - 512
    tight = plan_watermark(
        context_window=10_000,
        mark=0.9,
        min_gain=0.2,
        fixed_tokens=6400,
        summary_budget_tokens=512,
        newest_tokens=300,
    )
    assert tight.blocked is None and tight.keep_tokens == 300  # always the newest message
    blocked = plan_watermark(
        context_window=4000,
        mark=0.7,
        min_gain=0.2,
        fixed_tokens=2500,
        summary_budget_tokens=512,
        newest_tokens=100,
        summary_tokens_now=300,
    )
    assert blocked.keep_tokens is None and blocked.blocked is not None and "2500" in blocked.blocked
    # The floor counts the summary as it is now, not at its full budget: room left, compress.
    room = plan_watermark(
        context_window=4000,
        mark=0.7,
        min_gain=0.2,
        fixed_tokens=2500,
        summary_budget_tokens=512,
        newest_tokens=100,
        summary_tokens_now=0,
    )
    assert room.blocked is None and room.keep_tokens == 100
    assert (
        gain_estimate(
            archived_tokens=3000,
            summary_tokens_now=0,
            summary_budget_tokens=500,
            context_window=10_000,
        )
        == 0.25
    )
    # The summary grows by at most half of what a compression archives (a small one may add
    # 64 tokens): it frees the rest, however much room the budget has left.
    assert (
        gain_estimate(
            archived_tokens=100,
            summary_tokens_now=0,
            summary_budget_tokens=500,
            context_window=10_000,
        )
        == 0.0036
    )
    assert (
        gain_estimate(
            archived_tokens=1000,
            summary_tokens_now=0,
            summary_budget_tokens=5000,
            context_window=10_000,
        )
        == 0.05
    )


@settings(max_examples=300, deadline=None)
@given(
    messages_strategy,
    st.sampled_from(["turn", "auto", "hard", "manual"]),
    st.integers(1, 12),
    st.one_of(st.none(), st.integers(1, 60)),
    st.integers(40, 400),
    st.integers(1, 3),
    st.integers(0, 60),
)
def test_a_compression_plan_archives_whole_groups_oldest_first_and_never_the_newest(
    kinds: list[str],
    reason: str,
    keep: int,
    keep_tokens: int | None,
    window: int,
    max_batches: int,
    summary_now: int,
) -> None:
    msgs = build(kinds)
    conv = conversation_messages(msgs)
    plan = plan_compression(
        msgs,
        reason=reason,
        threshold=4,
        keep_recent=keep,
        keep_recent_tokens=keep_tokens,
        context_window=window,
        mark={"auto": 0.7, "hard": 0.9}.get(reason),
        min_gain=0.1,
        breakdown={"system": 5, "summary": summary_now},
        summary_budget_tokens=20,
        batch_tokens=25,
        max_batches=max_batches,
    )
    if plan.skip is not None:
        assert plan.cut is None and plan.batches == []
        assert plan.blocked is None or plan.skip == f"blocked: {plan.blocked}"
        return
    assert plan.cut is not None and plan.batches
    archived = [m for b in plan.batches for m in b]
    # Oldest first, a prefix of what the cut covers, at most max_batches, never the newest.
    assert archived == plan.cut.messages[: len(archived)] == conv[: len(archived)]
    assert len(plan.batches) <= max_batches and conv[-1] not in archived
    assert plan.archived_tokens == sum(m.tokens or 0 for m in archived)
    # A batch boundary (and the end of what is archived) never falls inside a tool group.
    covered = {m.seq for m in archived}
    for start, end, _ in tool_groups(conv):
        inside = [m.seq in covered for m in conv[start:end]]
        assert all(inside) or not any(inside)
        for b in plan.batches:
            ids = {m.seq for m in b}
            part = [m.seq in ids for m in conv[start:end]]
            assert all(part) or not any(part)


def test_counters_after_a_run_count_what_stays_and_count_its_markers_out() -> None:
    msgs = seq(
        [Message(role="system", content="core")]
        + [Message(role="user" if i % 2 else "assistant", content=str(i)) for i in range(8)]
        + [Message(role="system", kind="event-marker", content="m")]
    )
    # seqs: 1 core, 2-9 conversation, 10 an older marker; archived through 6 -> 7, 8, 9 stay.
    assert counters_after_run(msgs, 6, 0) == (3, 10)
    # The run's own marker comes after it (seq 11): the next turn's handler adds it back.
    assert counters_after_run(msgs, 6, 1) == (2, 10)
    assert counters_after_run([], 0, 0) == (0, 0)


def test_p21_the_newest_user_message_stays_in_the_kept_tail() -> None:
    """Issue 14, point 21: a small keep_recent must not leave a prompt of system, assistant and
    tool messages only (some providers refuse a prompt without a user message)."""
    msgs = seq(
        [
            Message(role="system", content="core"),
            user("hello"),
            Message(role="assistant", content="hi, how can I help?"),
            user("book it"),
            call("a"),
            result("a"),
            call("b"),
            result("b"),
            call("c"),
            result("c"),
        ]
    )
    cut = cut_point(msgs, keep_recent=2)
    assert cut is not None
    assert [m.role for m in cut.kept][0] == "user"
    assert cut.kept[0].content == "book it"
    # The newest user message is kept, and only what is older is summarized.
    assert [m.content for m in cut.messages] == ["hello", "hi, how can I help?"]
