"""The prompt fitted to the window: when tier 1 and the full summary block would pass it, old
tool groups, the summary block and the newest results give way (in that order), the stored
messages stay whole; the block shrinks by whole items, identifiers last; the identifiers the
conversation acted on take a large share of the summary."""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace
from typing import Any

import pytest
from plugin_harness import plugin_host

from host_stub.hookspecs import PromptView
from host_stub.messages import Message, ToolCall, ToolCallFunction, text_of, tool_groups
from host_stub.prompt import apply_replacements
from host_stub.services import MetadataEntry
from host_stub.testing import FakeLLM, simple_count
from plugin_memory_summary.base.config import MemorySummaryConfig, PayloadCaps
from plugin_memory_summary.prompt import contribution
from plugin_memory_summary.prompt.prompt_fit import MESSAGE_OVERHEAD, Fit, fit_margin, fit_prompt
from plugin_memory_summary.prompt.state import SessionState
from plugin_memory_summary.prompt.tokens import FITTERS_KEPT, TokenBook
from plugin_memory_summary.record import fitting
from plugin_memory_summary.record.fitting import render_payload
from plugin_memory_summary.record.stored import SummaryRecord, build_record, dump_record
from plugin_memory_summary.record.summary_model import Excerpt, LedgerEntry, SummaryPayload
from plugin_memory_summary.summarizer.rules import rules_merge


def count(text: str) -> int:
    return simple_count(text)


def shown_total(messages: list[Message], replacements: dict[int, str]) -> int:
    return sum(
        count(replacements[m.seq]) + MESSAGE_OVERHEAD if m.seq in replacements else m.tokens or 0
        for m in messages
    )


def tool_chat(groups: int, results: int = 1, words: int = 200) -> list[Message]:
    """A user message, then ``groups`` tool-call groups of ``results`` results each."""
    out = [Message(role="user", content="look up my bookings", seq=1, tokens=6)]
    seq = 2
    for g in range(groups):
        calls = [
            ToolCall(
                id=f"c{g}-{r}",
                function=ToolCallFunction(
                    name="get_reservation", arguments=json.dumps({"reservation_id": f"R{g}{r}"})
                ),
            )
            for r in range(results)
        ]
        out.append(Message(role="assistant", tool_calls=calls, seq=seq, tokens=20))
        seq += 1
        for r in range(results):
            text = " ".join(f"g{g}r{r}w{i}" for i in range(words))
            out.append(
                Message(
                    role="tool",
                    tool_call_id=f"c{g}-{r}",
                    content=text,
                    seq=seq,
                    tokens=count(text) + MESSAGE_OVERHEAD,
                )
            )
            seq += 1
    return out


def fit(messages: list[Message], *, window: int, block: int, keep: int = 3) -> object:
    return fit_prompt(
        messages,
        window=window,
        fixed=100,
        block_tokens=block,
        keep_tool_groups=keep,
        max_result_tokens=None,
        count_tokens=count,
    )


def test_a_prompt_that_fits_keeps_tier_one_and_the_whole_summary_block() -> None:
    messages = tool_chat(4)
    out = fit(messages, window=100_000, block=500)
    assert out.block_budget is None  # type: ignore[attr-defined]
    results = [m.seq for m in messages if m.role == "tool"]
    assert sorted(out.replacements) == results[:1]  # type: ignore[attr-defined]


def test_old_tool_groups_give_way_before_the_summary_block() -> None:
    messages = tool_chat(4)
    whole = sum(m.tokens or 0 for m in messages)
    newest = sum(m.tokens or 0 for m in messages[-2:])
    # Room for the block and the newest group, not for three groups whole.
    window = 100 + 500 + newest + 300 + 16
    assert whole + 600 > window
    out = fit(messages, window=window, block=500)
    assert out.block_budget is None  # type: ignore[attr-defined]
    results = [m.seq for m in messages if m.role == "tool"]
    assert sorted(out.replacements) == results[:-1]  # type: ignore[attr-defined]
    assert 100 + 500 + shown_total(messages, out.replacements) <= window - fit_margin(window)  # type: ignore[attr-defined]


def test_a_large_newest_group_shrinks_the_block_then_is_cut_and_the_store_keeps_it_whole() -> None:
    messages = tool_chat(2, results=3, words=300)
    before = [m.model_copy(deep=True) for m in messages]
    window = 1600
    out = fit(messages, window=window, block=600)
    limit = window - fit_margin(window)
    budget = out.block_budget  # type: ignore[attr-defined]
    assert budget is not None and budget < 600
    assert 100 + budget + shown_total(messages, out.replacements) <= limit  # type: ignore[attr-defined]
    start, end, _ = tool_groups(messages[1:])[-1]
    newest = [m.seq for m in messages[1:][start + 1 : end]]
    for seq in newest:
        shown = out.replacements[seq]  # type: ignore[attr-defined]
        assert f"#{seq}" in shown and "memory_expand" in shown
        assert not shown.split("\n")[0].rstrip("…").endswith("w")  # no cut mid-word
    assert messages == before  # the replacements are the prompt's; the messages are unchanged
    # The tool pairs stay: every result keeps its call id and its place.
    shown_msgs = apply_replacements(messages, out.replacements, lambda m: 0)  # type: ignore[attr-defined]
    assert [m.tool_call_id for m in shown_msgs] == [m.tool_call_id for m in messages]


def test_the_block_is_left_out_when_nothing_else_could_make_room() -> None:
    messages = [Message(role="user", content="x " * 4000, seq=1, tokens=2000)]
    out = fit(messages, window=2100, block=500)
    assert out.block_budget == 0  # type: ignore[attr-defined]


def _record(payload: SummaryPayload) -> SummaryRecord:
    """A record of one compression of messages 1-90 holding ``payload``."""
    return build_record(
        None,
        payload,
        lang="en",
        covered_up_to_seq=90,
        epoch=0,
        compressed_at_seq=90,
        messages_summarized=90,
        compressions=1,
    )


def test_a_smaller_block_drops_whole_items_and_keeps_every_action() -> None:
    ids = [f"BK{i:04d}X" for i in range(12)]
    payload = SummaryPayload(
        summary="Messages #1-#90 summarized.",
        excerpts=[
            Excerpt(seq=i, part=1, speaker="User", text=f"I would like sentence number {i} kept")
            for i in range(1, 40)
        ],
        ledger=[
            LedgerEntry(seq=100 + n, tool="cancel_booking", kind="booking", entity=i)
            for n, i in enumerate(ids)
        ],
    )
    record = _record(payload)
    book = TokenBook(MemorySummaryConfig(), FakeLLM())
    full, full_tokens = book.block("s", 1, record, 100_000)
    small, tokens = book.block("s", 1, record, full_tokens // 2)
    assert tokens <= full_tokens // 2
    assert all(f"booking {i}: cancelled #" in small for i in ids)
    assert "…" not in small
    assert "sentence number 39 kept" in small and "sentence number 1 kept" not in small


def _excerpts_record() -> SummaryRecord:
    """A record of 39 quoted sentences, whose block shrinks by whole excerpts."""
    return _record(
        SummaryPayload(
            summary="Messages #1-#90 summarized.",
            excerpts=[
                Excerpt(
                    seq=i, part=1, speaker="User", text=f"I would like sentence number {i} kept"
                )
                for i in range(1, 40)
            ],
        )
    )


def test_a_block_that_fits_a_smaller_budget_is_not_rendered_again() -> None:
    """A prompt that shrinks a little (a budget 32 tokens lower) gets the block made for the
    larger budget when that one fits: the same block a new rendering would give, without the
    renderings and counts (several milliseconds at a model call)."""
    record = _excerpts_record()
    counted: list[str] = []

    class Counting(FakeLLM):
        def count_tokens(self, messages_or_text: object, model: str | None = None) -> int:
            counted.append(str(messages_or_text))
            return super().count_tokens(messages_or_text, model)

    book = TokenBook(MemorySummaryConfig(), Counting())
    _, full_tokens = book.block("s", 1, record, 100_000)
    budget = full_tokens // 2 - (full_tokens // 2) % 32
    block, tokens = book.block("s", 1, record, budget)
    assert tokens < budget  # whole items: the block leaves some of its budget unused
    for lower in range(budget - 1, tokens - 1, -7):  # budgets the block made above still fits
        counted.clear()
        assert book.block("s", 1, record, lower) == (block, tokens)
        assert counted == []
        fresh = TokenBook(MemorySummaryConfig(), FakeLLM())
        assert fresh.block("s", 1, record, lower) == (block, tokens)  # what rendering gives
    counted.clear()
    smaller, fewer = book.block("s", 1, record, tokens - 1)  # no longer fits: made anew
    assert fewer <= tokens - 1 and smaller != block and counted


def test_a_block_made_before_the_commit_is_the_block_and_kept_only_when_told() -> None:
    """A compression makes the new record's block before its commit (``prepare_block``): the
    same block and count :meth:`block` gives, cached by nothing until ``keep_block`` (the
    commit won), then found for that version, its smaller renderings with it."""
    record = _excerpts_record()
    book = TokenBook(MemorySummaryConfig(), FakeLLM())
    _, full_tokens = book.block("other", 1, record, 100_000)
    budget = full_tokens // 2
    prepared = book.prepare_block(record, budget)
    fresh = TokenBook(MemorySummaryConfig(), FakeLLM())
    assert (prepared.block, prepared.tokens) == fresh.block("s", 7, record, budget)
    assert book.cached_block("s", 7, budget) is None  # not the session's before the commit
    assert prepared.fitter is not None  # the whole block did not fit: the fitter made it
    book.keep_block("s", 7, prepared)
    assert book.cached_block("s", 7, budget) == (prepared.block, prepared.tokens)
    assert book._fitter("s", 7, record) is prepared.fitter  # smaller budgets start from it


def test_blocks_for_ever_smaller_budgets_reuse_the_records_smaller_renderings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below what the last block fits, a new block is made, but from the renderings the record's
    earlier budgets made: a candidate or two rendered per budget, not a whole search (a tight
    window asked for a new budget at most calls, 2-5 ms each). The same blocks as a fresh book
    gives; the renderings are kept for the most recent records only, and dropped with the
    blocks."""
    record = _excerpts_record()
    rendered: list[SummaryPayload] = []
    render = fitting.render_payload

    def counting_render(p: SummaryPayload, lang: str = "en") -> str:
        rendered.append(p)
        return render(p, lang)

    book = TokenBook(MemorySummaryConfig(), FakeLLM())
    _, full_tokens = book.block("s", 1, record, 100_000)
    budget = full_tokens // 2
    book.block("s", 1, record, budget)
    per_budget = []
    while budget > full_tokens // 4:
        budget = book.block("s", 1, record, budget)[1] - 1  # just below the last block
        with monkeypatch.context() as m:
            m.setattr(fitting, "render_payload", counting_render)
            rendered.clear()
            made = book.block("s", 1, record, budget)
            per_budget.append(len(rendered))
        assert made == TokenBook(MemorySummaryConfig(), FakeLLM()).block("s", 1, record, budget)
    assert len(per_budget) >= 5
    assert sum(per_budget) <= 2.5 * len(per_budget), per_budget
    for version in range(2, FITTERS_KEPT + 10):
        book.block("s", version, record, budget)
    assert len(book._fitters) == FITTERS_KEPT
    assert ("s", 1) not in book._fitters
    book.forget_blocks()
    assert not book._fitters


def test_a_smaller_block_already_made_is_given_without_reading_the_record_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prompt near the window gets a smaller summary block at every call: once made for a
    budget, the block is given again without parsing the record (a large record's parse took
    a noticeable share of the call)."""
    record = _record(
        SummaryPayload(
            summary="Messages #1-#90 summarized.",
            excerpts=[
                Excerpt(seq=i, part=1, speaker="User", text=f"I would like sentence {i} kept")
                for i in range(1, 40)
            ],
        )
    )
    config = MemorySummaryConfig()
    book = TokenBook(config, FakeLLM())
    entry = MetadataEntry(namespace="summary", key="s", value=dump_record(record), version=1)
    view = PromptView(
        session_id="s", model="fake/chat", context_window=8000, messages=[], summary=entry
    )
    state = SessionState()
    pipeline: Any = SimpleNamespace(config=config, tokens=book, prune_memo={})
    reads: list[object] = []
    real = contribution.read_record
    monkeypatch.setattr(contribution, "read_record", lambda *a: reads.append(a) or real(*a))
    full = contribution.summary_contribution(view, state, pipeline, "memory-summary")
    assert full is not None
    full_tokens = book.count(full.content)
    key = (0, None, 1, 0, 8000)  # the view the fit below was computed for
    budget = full_tokens // 2 - (full_tokens // 2) % 32
    state.fit = (key, Fit({}, block_budget=budget + 5))
    first = contribution.summary_contribution(view, state, pipeline, "memory-summary")
    assert first is not None and book.count(first.content) <= budget and reads
    reads.clear()
    state.fit = (key, Fit({}, block_budget=budget + 9))  # the same budget once rounded
    again = contribution.summary_contribution(view, state, pipeline, "memory-summary")
    assert again == first and reads == []
    state.fit = (key, Fit({}, block_budget=40))  # below the framing: no block, as before
    assert contribution.summary_contribution(view, state, pipeline, "memory-summary") is None


def test_the_actions_the_conversation_took_take_the_summary_before_its_sentences() -> None:
    ids = [f"user_{i:03d}_{'x' * 6}" for i in range(30)]
    messages: list[Message] = []
    for n, i in enumerate(ids):
        messages.append(Message(role="user", content=f"Please close account {i} for me today."))
        call = ToolCall(
            id=f"c{n}",
            function=ToolCallFunction(
                name="close_account", arguments=json.dumps({"account_id": i})
            ),
        )
        messages.append(Message(role="assistant", tool_calls=[call]))
        messages.append(Message(role="tool", tool_call_id=f"c{n}", content='{"status": "closed"}'))
    for seq, message in enumerate(messages, start=1):
        message.seq = seq
    budget = 600
    payload = rules_merge(
        None, messages, budget_tokens=budget, count_tokens=count, caps=PayloadCaps(), lang="en"
    )
    text = render_payload(payload)
    assert all(f"account {i}: closed #" in text for i in ids)
    assert count(text) <= budget


async def _big_tool_turn(h: object, g: int, results: int, words: int) -> object:
    calls = [
        ToolCall(
            id=f"c{g}-{r}",
            function=ToolCallFunction(
                name="search_flights", arguments=json.dumps({"origin": "JFK", "n": r})
            ),
        )
        for r in range(results)
    ]
    recorded = [Message(role="assistant", tool_calls=calls)]
    recorded += [
        Message(
            role="tool",
            tool_call_id=f"c{g}-{r}",
            content=" ".join(f"HAT{g}{r}{i:03d} seats {i}" for i in range(words)),
        )
        for r in range(results)
    ]
    recorded.append(Message(role="assistant", content=f"Found flights for request {g}."))
    return await h.host.run_turn("s", f"search flights, request {g}", recorded=recorded)  # type: ignore[attr-defined]


async def test_no_prompt_goes_over_the_window_when_the_newest_tool_results_are_large() -> None:
    window = 2400
    async with plugin_host(
        {},
        llm=FakeLLM(default=lambda sent: json.dumps({"summary": "searched flights " * 40})),
        host={"context_window": window, "system_prompt": "Airline policy. " * 150},
    ) as h:
        over = []
        stored_sizes = []
        for g in range(8):
            result = await _big_tool_turn(h, g, results=3, words=130)
            await h.plugin.scheduler.wait_idle()
            usage = result.usage  # type: ignore[attr-defined]
            sent = [
                u for i, u in enumerate(usage) if not (i + 1 < len(usage) and usage[i + 1].rebuilt)
            ]
            over += [u.used for u in sent if u.used > window]
        stored = [m for m in await h.host.memory.get_history("s") if m.role == "tool"]
        stored += [m for m in await h.host.memory.get_archived("s") if m.role == "tool"]
        stored_sizes = [len(text_of(m.content)) for m in stored]
        record = await h.plugin.show("s")
    assert record is not None  # a summary block was in play
    assert over == []
    assert min(stored_sizes) > 500  # the store keeps every result whole


def test_a_turn_of_many_tool_calls_gets_placeholders_of_a_few_words() -> None:
    messages = tool_chat(30, words=60)
    calls = sum(m.tokens or 0 for m in messages if m.role != "tool")
    line = fit(messages, window=100_000, block=0, keep=1)
    one_line_each = 100 + shown_total(messages, line.replacements)  # type: ignore[attr-defined]
    window = (calls + one_line_each) // 2 + 400
    assert one_line_each > window  # one line per old result is already too much
    out = fit(messages, window=window, block=200, keep=3)
    replacements = out.replacements  # type: ignore[attr-defined]
    old = [m.seq for m in messages if m.role == "tool"][:-1]
    assert all(replacements[seq].startswith(f"[result #{seq} pruned") for seq in old)
    assert 100 + (out.block_budget or 0) + shown_total(messages, replacements) <= window  # type: ignore[attr-defined]


def test_past_the_soft_mark_old_tool_groups_give_way_when_that_alone_brings_it_under() -> None:
    messages = tool_chat(4)
    window = 10_000  # fits whatever happens
    configured = fit(messages, window=window, block=500)
    newest_only = fit(messages, window=window, block=500, keep=1)
    shown = 100 + 500 + shown_total(messages, configured.replacements)  # type: ignore[attr-defined]
    deeper_prompt = 100 + 500 + shown_total(messages, newest_only.replacements)  # type: ignore[attr-defined]
    assert deeper_prompt < shown
    under = functools.partial(
        fit_prompt,
        messages,
        window=window,
        fixed=100,
        block_tokens=500,
        keep_tool_groups=3,
        max_result_tokens=None,
        count_tokens=count,
    )
    out = under(prune_to=deeper_prompt)
    results = [m.seq for m in messages if m.role == "tool"]
    assert sorted(out.replacements) == results[:-1]
    assert out.block_budget is None
    # When even the newest group alone would not get under the mark, tier 1 stays as set and
    # the compression decides.
    out = under(prune_to=600)
    assert out.replacements == configured.replacements  # type: ignore[attr-defined]
