"""Which sentences the record keeps: a sentence that says who, what or when is worth more than
small talk of as many words."""

from __future__ import annotations

from host_stub.testing import simple_count
from plugin_memory_summary.record.summary_model import Excerpt
from plugin_memory_summary.summarizer.excerpts import select_excerpts

#: More words than the fact, none of them a name, a number or a date.
SMALL_TALK = (
    "Honestly, painting sunsets, hiking trails, baking bread and gardening keep me calm and "
    "grounded lately."
)
FACT = "Melanie ran the charity race on 20 May."


def test_a_fact_outranks_small_talk_of_as_many_words() -> None:
    pool = [
        Excerpt(seq=1, part=1, speaker="Caroline", text=SMALL_TALK),
        Excerpt(seq=2, part=1, speaker="Melanie", text=FACT),
    ]
    room = max(simple_count(e.text) + simple_count(e.speaker) + 2 for e in pool)
    [kept] = select_excerpts([], pool, budget_tokens=room, count_tokens=simple_count)
    assert kept.text == FACT
    # Alone, small talk is still kept: it is worth less, not nothing.
    [alone] = select_excerpts([], pool[:1], budget_tokens=room, count_tokens=simple_count)
    assert alone.text == SMALL_TALK


def test_small_talk_goes_first_in_the_order_the_budget_drops() -> None:
    pool = [
        Excerpt(seq=1, part=1, speaker="Melanie", text=FACT),
        Excerpt(seq=2, part=1, speaker="Caroline", text=SMALL_TALK),
    ]
    kept = select_excerpts([], pool, budget_tokens=10_000, count_tokens=simple_count)
    # Least important first: the small talk is the first the budget drops.
    assert [e.text for e in kept] == [SMALL_TALK, FACT]
