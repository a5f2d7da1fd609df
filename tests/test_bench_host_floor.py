"""The host's floor (``bench/host_floor.py``): the figures of each system's steps that wait for
no summarizer, and its row against the middleware's. Pure parts, loaded without LangChain."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from bench_modules import load_bench

host_floor = load_bench("host_floor")  # puts bench/ on the path
replay = importlib.import_module("replay")


def run(times_us: list[float], waited: list[bool], verbatim: list[int]) -> Any:
    r = replay.SystemRun("x")
    r.step_times = [t / 1e6 for t in times_us]
    r.waited = waited
    r.steps = [replay.Step(tokens=100, verbatim=v) for v in verbatim]
    return r


def test_figures_leave_out_the_steps_that_waited_for_a_summarizer() -> None:
    runs = [
        run([100, 9_000, 300], [False, True, False], [2, 4, 6]),
        run([200], [False], [8]),
    ]
    f = host_floor.turn_figures(runs)
    assert f["steps"] == 3  # the 9 ms step waited: not counted
    assert f["p50_us"] == pytest.approx(200)
    assert f["p99_us"] == pytest.approx(300)
    assert f["messages"] == pytest.approx(5.0)  # every step's prompt


def test_row_against_the_middleware() -> None:
    ours = {"steps": 10, "p50_us": 800.0, "p99_us": 1_000.0, "messages": 9.84}
    peer = {"steps": 12, "p50_us": 400.0, "p99_us": 2_000.0, "messages": 14.0}
    assert host_floor.floor_row(ours, peer) == [10, 9.8, "800 / 1,000", "2.00x / 0.50x", "no / yes"]
    assert host_floor.floor_row(peer, peer)[-2:] == ["1.00x / 1.00x", "yes / yes"]
