"""The peers comparison's verdict (``bench/verdict.py``): which steps make the per-turn cost, and
when a peer counts as better on every column. Pure functions, loaded alone from ``bench/``."""

from __future__ import annotations

from typing import Any

import pytest
from bench_modules import load_bench

verdict = load_bench("verdict")


def numbers(**overrides: Any) -> dict[str, Any]:
    base = {
        "over": 0,
        "violations": 0,
        "turn_mean_us": 50.0,
        "turn_p99_us": 150.0,
        "mean_us": 80.0,
        "p99_us": 2000.0,
        "blocked": 20,
        "input_ratio": 2.0,
        "verbatim": 40.0,
        "mean": 2500.0,
    }
    return {**base, **overrides}


def test_the_per_turn_cost_leaves_out_the_steps_that_waited() -> None:
    turn, wait = verdict.split_steps([1.0, 9.0, 2.0, 8.0], [False, True, False, True])
    assert turn == [1.0, 2.0] and wait == [9.0, 8.0]
    with pytest.raises(ValueError, match="3 step times but 2 waiting flags"):
        verdict.split_steps([1.0, 2.0, 3.0], [False, True])


def test_per_turn_cost_needs_both_mean_and_p99() -> None:
    ours = numbers()
    assert verdict.verdict_checks(ours, numbers(turn_mean_us=60.0, turn_p99_us=200.0))["turn cost"]
    # Cheaper on average but with a worse tail is not at least as good.
    assert not verdict.verdict_checks(ours, numbers(turn_mean_us=60.0, turn_p99_us=100.0))[
        "turn cost"
    ]


def test_a_peer_dominates_only_when_at_least_as_good_on_every_column() -> None:
    ours = numbers()
    assert verdict.peer_dominates(ours, numbers())  # a tie on everything counts
    better_everywhere = numbers(turn_mean_us=10.0, p99_us=500.0, blocked=5, verbatim=50.0)
    assert verdict.peer_dominates(ours, better_everywhere)
    # One column where ours is better is enough to rule it out: budget adherence here.
    assert not verdict.peer_dominates(ours, {**better_everywhere, "over": 157})
    assert not verdict.peer_dominates(ours, {**better_everywhere, "verbatim": 30.0})
    checks = verdict.verdict_checks(ours, {**better_everywhere, "over": 157})
    assert checks["budget"] and not checks["p99"] and not checks["waiting"]
