"""What a summary must be for a model to answer from it (the rules engine, folding a generated
conversation batch by batch), and the defaults that fill a window of any size."""

from __future__ import annotations

import random

import pytest
import regex
import rules_fold
from hypothesis import given, settings
from hypothesis import strategies as st

from host_stub.messages import Message, ToolCall, ToolCallFunction
from plugin_memory_summary.base.config import MemorySummaryConfig, PayloadCaps
from plugin_memory_summary.base.decisions import (
    plan_compression,
    summary_budget,
    summary_growth,
    tail_room_cap,
)
from plugin_memory_summary.record.fitting import render_payload
from plugin_memory_summary.record.summary_model import SummaryPayload
from plugin_memory_summary.safety.redact import Redactor
from plugin_memory_summary.summarizer.rules import _REFILL_MIN, rules_merge
from plugin_memory_summary.summarizer.summarize import summarize_batches

NAMES = ["Ava", "Bruno", "Chiara", "Dmitri", "Esme", "Farid", "Greta", "Hiro"]
PLACES = ["Lisbon", "Oaxaca", "Tromso", "Valparaiso", "Zanzibar", "Kyoto", "Bergen", "Cusco"]
THINGS = ["violin", "kayak", "telescope", "sourdough", "chessboard", "loom", "drone", "bonsai"]
MONTHS = ["March", "April", "May", "June", "July", "August", "September", "October"]


count = rules_fold.count


def conversation(seed: int, sessions: int = 12, turns: int = 10) -> list[Message]:
    """Two speakers over ``sessions`` dated sessions; each turn states a fact (a name, a place,
    a thing, a number) or makes small talk; the assistant states facts of its own."""
    rng = random.Random(seed)
    messages: list[Message] = []
    seq = 0
    for s in range(sessions):
        date = f"{rng.randint(1, 28)} {MONTHS[s % len(MONTHS)]}, 2023"
        for t in range(turns):
            seq += 1
            role = "user" if t % 2 == 0 else "assistant"
            speaker = "Nora" if role == "user" else "Milo"
            if rng.random() < 0.3:
                text = rng.choice(["That is lovely!", "Wow, really?", "Haha, yes indeed."])
            else:
                text = (
                    f"{rng.choice(NAMES)} took the {rng.choice(THINGS)} to "
                    f"{rng.choice(PLACES)} and paid {rng.randint(10, 999)} euros for it."
                )
            messages.append(
                Message(seq=seq, role=role, content=f"[10:00 am on {date}] {speaker}: {text}")
            )
    return messages


def fold(messages: list[Message], budget: int, batch: int = 20) -> SummaryPayload:
    return rules_fold.fold(messages, budget, batch)


def sentences_of(messages: list[Message]) -> set[str]:
    out = set()
    for m in messages:
        body = regex.sub(r"^\[[^\]]*\]\s*\w+:\s*", "", str(m.content))
        out.update(regex.split(r"(?<=[.!?])\s+", body))
    return out


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(300, 1500))
def test_the_record_holds_whole_source_sentences_never_twice(seed: int, budget: int) -> None:
    messages = conversation(seed, sessions=8)
    payload = fold(messages, budget)
    texts = [e.text for e in payload.excerpts]
    assert texts and len(texts) == len(set(texts))  # no item twice
    assert set(texts) <= sentences_of(messages)  # whole sentences, never a cut word
    rendered = render_payload(payload)
    assert count(rendered) <= budget
    assert not regex.search(r"\w…", rendered)  # no word cut in half anywhere
    # Small talk adds no fact: it is never kept while the budget has facts to spend on.
    assert not {"That is lovely!", "Wow, really?", "Haha, yes indeed."} & set(texts)


def test_both_speakers_and_the_whole_conversation_are_in_the_record() -> None:
    messages = conversation(7)
    payload = fold(messages, budget=1200)
    assert {e.speaker for e in payload.excerpts} == {"Nora", "Milo"}
    dates = {str(m.content)[13:].split("]")[0] for m in messages}
    kept_dates = {e.when for e in payload.excerpts}
    # Every session is on the timeline (the budget has room for one sentence of each), the
    # first one as much as the last one.
    assert kept_dates == dates
    first, last = messages[0].seq, messages[-1].seq
    seqs = [e.seq for e in payload.excerpts]
    assert min(seqs) <= first + 10 and max(seqs) >= last - 10


def test_the_budget_is_used_and_names_numbers_places_outrank_small_talk() -> None:
    messages = conversation(11, sessions=20)
    payload = fold(messages, budget=1200)
    rendered = render_payload(payload)
    assert count(rendered) >= 0.85 * 1200  # a summary that leaves its budget empty keeps less
    facts = sum(1 for e in payload.excerpts if "euros" in e.text)
    assert facts == len(payload.excerpts)


@pytest.mark.parametrize("window", [4_000, 8_000, 32_000, 128_000])
@pytest.mark.parametrize("reserve", [0, 1024])
def test_defaults_fill_the_window_of_any_size(window: int, reserve: int) -> None:
    """With the shipped defaults, a soft-mark compression neither leaves the window mostly empty
    (the tail is whatever fits) nor gets skipped for gaining too little; the summary gets a
    real share of small windows and a bounded one of large ones."""
    config = MemorySummaryConfig()
    budget = min(
        summary_budget(
            window - reserve - 100, config.summary_token_ratio, config.summary_max_tokens, None
        ),
        tail_room_cap(window, config.fill_target, 100 + reserve),
    )
    # A dense summary keeps more facts per token than old verbatim turns: most of the room the
    # fill target leaves, never all of it, and a bounded amount of a large window.
    assert 512 <= budget <= 0.9 * (config.fill_target * window) and budget <= 8000
    messages = [
        Message(seq=i + 1, role="user" if i % 2 == 0 else "assistant", content="x", tokens=50)
        for i in range(int(config.auto_compress_threshold * window) // 50)
    ]
    breakdown = {"system": 100, "reserved_for_reply": reserve, "summary": budget // 2}
    plan = plan_compression(
        messages,
        reason="auto",
        threshold=config.threshold,
        keep_recent=config.keep_recent,
        keep_recent_tokens=config.keep_recent_tokens,
        context_window=window,
        mark=config.auto_compress_threshold,
        min_gain=config.min_gain,
        breakdown=breakdown,
        fill_target=config.fill_target,
        summary_budget_tokens=budget,
        batch_tokens=10**9,
        max_batches=config.max_batches_per_run,
    )
    assert plan.skip is None, plan.skip
    assert plan.cut is not None
    kept = sum(m.tokens or 0 for m in plan.cut.kept)
    after = 100 + reserve + budget + kept
    # Cut down to the fill target, not to a fixed message count: the kept tail is what fits.
    assert after <= config.fill_target * window + 50
    assert after >= config.fill_target * window - 100
    # The summary never takes the whole room the fill target leaves: the tail keeps a tenth.
    assert kept >= 0.1 * (config.fill_target * window - 100 - reserve) - 50


@pytest.mark.parametrize("cut", ["Messages #1-#598…", "Messages #1-#…", "Messages #…", "Messages…"])
def test_a_cut_overview_line_is_replaced_not_kept_beside_the_new_one(cut: str) -> None:
    # A cut may leave any part of the line, down to its first word.
    previous = SummaryPayload(summary=f"{cut}\nThe user flies on Fridays.")
    messages = [Message(role="user", content="Please book flight HAT123 on 2024-05-20.", seq=600)]
    payload = rules_merge(
        previous, messages, budget_tokens=400, count_tokens=count, caps=PayloadCaps(), lang="en"
    )
    lines = payload.summary.split("\n")
    assert [line for line in lines if line.startswith("Messages")] == [
        "Messages #1-#600 summarized."
    ]
    assert "The user flies on Fridays." in lines
    assert lines[0] == "The user flies on Fridays."


def call(call_id: str, name: str, arguments: str) -> Message:
    function = ToolCallFunction(name=name, arguments=arguments)
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, function=function)])


def test_a_task_in_progress_does_not_repeat_the_goal_or_the_open_questions() -> None:
    request = "I want to move my flight HAT123 to Friday and add a checked bag."
    question = "Is there a fee for the second bag?"
    messages = [
        Message(role="user", content=request, seq=1),
        call("c1", "hold_reservation", '{"reservation_id": "K7XQ2M"}'),
        Message(role="tool", tool_call_id="c1", content='{"status": "ok"}', seq=3),
        Message(role="user", content=question, seq=4),
    ]
    payload = rules_merge(
        None, messages, budget_tokens=600, count_tokens=count, caps=PayloadCaps(), lang="en"
    )
    # The task is there, and what its tool did is in the ledger, ...
    assert payload.in_progress_tasks and payload.in_progress_tasks[0].todo == [question]
    text = render_payload(payload)
    assert "reservation K7XQ2M: held #0: status=ok" in text
    # ... but its goal is the conversation's goal and its to-do the open question: each is
    # said once.
    assert text.count(request) == 1
    assert text.count(question) == 1


def long_turns(seed: int, sessions: int = 10, turns: int = 8) -> list[Message]:
    """Like ``conversation``, but each turn states three facts: a speaker's sentences run on."""
    rng = random.Random(seed)
    messages: list[Message] = []
    for s in range(sessions):
        date = f"{rng.randint(1, 28)} {MONTHS[s % len(MONTHS)]}, 2023"
        for t in range(turns):
            role = "user" if t % 2 == 0 else "assistant"
            speaker = "Nora" if role == "user" else "Milo"
            facts = " ".join(
                f"{rng.choice(NAMES)} took the {rng.choice(THINGS)} to {rng.choice(PLACES)} "
                f"on day {rng.randint(1, 999)}."
                for _ in range(3)
            )
            messages.append(
                Message(
                    seq=len(messages) + 1,
                    role=role,
                    content=f"[10:00 am on {date}] {speaker}: {facts}",
                )
            )
    return messages


@pytest.mark.parametrize("seed", [3, 17, 29])
def test_a_record_asked_to_fill_takes_the_room_its_estimate_left(seed: int) -> None:
    # The per-sentence estimate names the speaker on every sentence; the rendering names them
    # once per run of sentences. Asked to fill, the record spends that room on more facts.
    messages = long_turns(seed)
    budget = 600  # the conversation's sentences need more: the record has to choose

    def merged(fill: bool) -> SummaryPayload:
        return rules_merge(
            None, messages, budget_tokens=budget, count_tokens=count, caps=PayloadCaps(), fill=fill
        )

    filled, estimated = merged(True), merged(False)
    assert budget - _REFILL_MIN <= count(render_payload(filled)) <= budget
    assert count(render_payload(estimated)) < count(render_payload(filled))
    assert len(filled.excerpts) > len(estimated.excerpts)


async def test_a_growing_summary_takes_the_growth_the_plan_allows_it() -> None:
    # Without a model the rules engine folds the batch; the summary, far below its budget, may
    # grow by a share of the batch (decisions.summary_growth) and takes all of that share.
    messages = long_turns(5, sessions=3)
    budget = 4000
    outcome = await summarize_batches(
        None,
        [messages],
        llm=None,  # type: ignore[arg-type]
        model=None,
        config=MemorySummaryConfig(),
        budget=budget,
        lang="en",
        redactor=Redactor(),
        count_tokens=count,
    )
    allowed = summary_growth(sum(count(str(m.content)) for m in messages), 0, budget)
    assert allowed < budget
    assert allowed - _REFILL_MIN <= count(render_payload(outcome.payload)) <= allowed
