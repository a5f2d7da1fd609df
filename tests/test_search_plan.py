"""The search's shared decisions (``host_stub.memory.search_plan``): which postings a search reads,
which candidates it scores in full, and the BM25 every backend ranks with. Pure functions; the
backends' use of them is in the memory contract suite."""

from __future__ import annotations

import math
import random

import pytest

from host_stub.memory import search_plan
from host_stub.memory.search_plan import (
    Plan,
    Read,
    choose,
    idf,
    index_terms,
    plan_search,
    query_terms,
    score,
    stored_counts,
)


def test_a_small_session_reads_every_list_whole() -> None:
    plan = plan_search(["a", "b", "c"], [5, 0, 900], n_docs=1000, total_len=10_000, budget=1000)
    assert plan.reads == [Read((0,), None), Read((2,), None)]  # rarest first; "b" is nowhere
    assert plan.probes == [] and plan.bounded == [] and plan.whole == [0, 2]
    assert plan.avg_len == 10.0


def test_a_large_session_reads_rare_lists_whole_then_common_terms_together() -> None:
    # "r" (40) and "s" (300) fit in 1,000 whole. "c" (0.5% of the messages) and "d" (8%) do
    # not: the messages holding both (about 400 if independent) fill the other 660.
    plan = plan_search(
        ["c", "r", "d", "x", "s"], [5000, 40, 80_000, 0, 300], 1_000_000, 2e7, budget=1000
    )
    assert plan.reads == [Read((1,), None), Read((4,), None), Read((0, 2), 660)]
    assert plan.whole == [1, 4]
    # The terms not read whole are probed among the candidates, rarest first, at most
    # max_probes of them; a term no message holds is never probed.
    assert plan.probes == [0, 2]
    assert plan_search(["c", "r", "d"], [5000, 40, 80_000], 10**6, 1e7, max_probes=1).probes == [0]


def test_conjunctions_go_most_selective_first_then_the_newest_of_the_rarest() -> None:
    # Three common terms: all three together (about 6 messages), then each pair by its
    # estimate, each up to twice its estimate plus 16; what is left (at most MAX_PARTIAL):
    # the newest of the rarest.
    plan = plan_search(["a", "b", "c"], [30_000, 10_000, 20_000], 10**6, 1e7, budget=1000)
    assert plan.reads == [
        Read((1, 2, 0), 28),
        Read((1, 2), 416),
        Read((1, 0), 556),
    ]
    plan = plan_search(["a", "b"], [7000, 3000], 10**6, 1e7, budget=1000)
    assert plan.reads == [Read((1, 0), 58), Read((1,), search_plan.MAX_PARTIAL)]
    assert plan.probes == [1, 0]
    # Only the rarest CONJOINED of them, MAX_CONJUNCTIONS combinations at most.
    plan = plan_search(list("abcdef"), [2000] * 6, 10**6, 1e7, budget=1000)
    assert all(set(r.terms) <= {0, 1, 2} for r in plan.reads)
    assert 0 < len([r for r in plan.reads if len(r.terms) > 1]) <= search_plan.MAX_CONJUNCTIONS


def test_equal_frequencies_go_in_query_order() -> None:
    plan = plan_search(["a", "b", "c"], [600, 600, 600], 10**6, 1e7, budget=1000)
    assert plan.reads[0] == Read((0,), None)
    assert plan.reads[1].terms == (1, 2)
    assert plan.reads[-1] == Read((1,), min(382, search_plan.MAX_PARTIAL))


def test_the_module_limits_are_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_plan, "MAX_POSTINGS", 10)
    monkeypatch.setattr(search_plan, "MAX_PARTIAL", 3)
    monkeypatch.setattr(search_plan, "MAX_PROBES", 0)
    plan = plan_search(["a", "b"], [4, 50], 100, 1000.0)
    assert plan.reads == [Read((0,), None), Read((1,), 3)] and plan.probes == []
    # A search asking for more results reads as many.
    assert plan_search(["a", "b"], [4, 50], 100, 1000.0, limit=20).reads[-1] == Read((1,), 16)
    monkeypatch.setattr(search_plan, "RESCORE", 1)
    assert choose(plan, {0: {1, 2, 3}}) == [3]  # a tie too large for one more: the newer
    assert choose(plan, {0: {1, 2, 3}}, limit=2) == [3, 2, 1]  # never fewer than asked for
    # A tie with the last one taken that fits in RESCORE more is taken whole.
    assert choose(plan, {0: {1, 2}}) == [2, 1]
    assert choose(plan, {0: {1, 2}, 1: {2}}) == [2]  # no tie


def _plan(dfs: list[int], n_docs: int = 1000) -> Plan:
    return plan_search([f"t{i}" for i in range(len(dfs))], dfs, n_docs, n_docs * 10.0)


@pytest.fixture
def rescore_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """Candidates scored in full: exactly as many as results asked for."""
    monkeypatch.setattr(search_plan, "RESCORE", 0)


@pytest.mark.usefixtures("rescore_none")
def test_choose_takes_all_candidates_when_there_are_few() -> None:
    plan = _plan([10, 20])
    assert choose(plan, {0: {5, 9}, 1: {9, 12}}, limit=3) == [5, 9, 12]


@pytest.mark.usefixtures("rescore_none")
def test_choose_prefers_more_and_rarer_terms_and_then_the_newer() -> None:
    plan = _plan([10, 300, 300])
    holders = {0: {1, 2, 3}, 1: {2, 3, 4, 5, 6}, 2: {3, 7}}
    # 3 holds all three, 2 the rare one and one common one, 1 only the rare one; of those
    # holding one common term the newer come first.
    assert choose(plan, holders, limit=4) == [3, 2, 1, 7]
    assert choose(plan, holders, limit=5) == [3, 2, 1, 7, 6]


@pytest.mark.usefixtures("rescore_none")
def test_choose_equals_a_plain_ranking_of_the_summed_idf() -> None:
    rng = random.Random(3)
    for _ in range(200):
        dfs = [rng.randint(1, 400) for _ in range(rng.randint(1, 6))]
        plan = _plan(dfs)
        holders = {
            i: {rng.randint(1, 60) for _ in range(rng.randint(0, 40))} for i in range(len(dfs))
        }
        count = rng.randint(1, 30)
        summed: dict[int, float] = {}
        for i, seqs in holders.items():
            for seq in seqs:
                summed[seq] = summed.get(seq, 0.0) + plan.idfs[i]
        expected = sorted(summed, key=lambda s: (summed[s], s), reverse=True)[:count]
        got = choose(plan, holders, limit=count)
        assert sorted(got) == sorted(expected) or (
            # equal estimates summed in another order may differ in the last bit
            sorted(round(summed[s], 9) for s in got)
            == sorted(round(summed[s], 9) for s in expected)
        )


def test_idf_is_fts5s_and_a_term_in_over_half_the_messages_counts_next_to_nothing() -> None:
    assert idf(1000, 10) == pytest.approx(math.log(990.5 / 10.5))
    assert idf(10, 5) == idf(10, 9) == 1e-6


def test_score_is_bm25_with_the_lent_terms_at_half_weight() -> None:
    plan = plan_search(["kyoto", "ryokan"], [2, 10], n_docs=100, total_len=1000.0)
    # A message of 10 own terms holding "kyoto" twice, and 4 lent terms with "ryokan" once.
    tfs, length = stored_counts(
        {"kyoto": 0, "ryokan": 1},
        "kyoto a b c d e f kyoto g h",
        "ryokan x y z",
    )
    assert tfs == [2.0, 0.5] and length == 12.0
    got = score(plan, [(7, tfs, length)])
    norm = 1.2 * (0.25 + 0.75 * 12.0 / 10.0)
    expected = idf(100, 2) * 2 * 2.2 / (2 + norm) + idf(100, 10) * 0.5 * 2.2 / (0.5 + norm)
    assert got == {7: pytest.approx(expected)}
    # A candidate holding none of the terms is left out.
    assert score(plan, [(8, [0.0, 0.0], 5.0)]) == {}


def test_a_word_too_long_to_type_is_neither_indexed_nor_searched() -> None:
    long_word = "x" * (search_plan.MAX_TERM_BYTES + 1)
    assert index_terms(f"key {long_word} value") == ["key", "value"]
    assert query_terms(long_word) == []
    # A long identifier within the limit stays.
    assert index_terms("a" * 200) == ["a" * 200]
    # Multi-byte characters count in bytes.
    assert query_terms("é" * (search_plan.MAX_TERM_BYTES // 2 + 1)) == []


def test_the_readme_states_the_limits_the_code_has() -> None:
    from pathlib import Path

    text = " ".join((Path(__file__).parents[1] / "docs" / "usage.md").read_text().split())
    assert f"reads about {search_plan.MAX_POSTINGS:,} postings at most" in text
    assert f"the {search_plan.RESCORE} best by the rarity" in text
    assert f"a session of up to {search_plan.MAX_POSTINGS:,} messages every match" in text
