"""The peers comparison's decisions, as pure functions (``bench/peers.py`` runs the systems; this
decides what their numbers say). No imports from the rest of ``bench/``, so tests load it alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def split_steps(times: Sequence[float], waited: Sequence[bool]) -> tuple[list[float], list[float]]:
    """(steps that did not wait for a summarizer, steps that did). The first is the per-turn
    cost: on those steps every system does the same work (decide whether to compress, hand the
    prompt over)."""
    if len(times) != len(waited):
        raise ValueError(f"{len(times)} step times but {len(waited)} waiting flags")
    turn = [t for t, w in zip(times, waited, strict=True) if not w]
    wait = [t for t, w in zip(times, waited, strict=True) if w]
    return turn, wait


def verdict_checks(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, bool]:
    """Column by column: is ``ours`` at least as good as ``peer`` (both from ``aggregate``)?
    ``turn cost`` is the per-turn cost of the goal: mean and p99 of the steps that do not wait,
    both."""
    return {
        "budget": ours["over"] <= peer["over"],
        "tools": ours["violations"] <= peer["violations"],
        "turn cost": ours["turn_mean_us"] <= peer["turn_mean_us"]
        and ours["turn_p99_us"] <= peer["turn_p99_us"],
        "mean": ours["mean_us"] <= peer["mean_us"],
        "p99": ours["p99_us"] <= peer["p99_us"],
        "waiting": ours["blocked"] <= peer["blocked"],
        "input": ours["input_ratio"] <= peer["input_ratio"],
        "verbatim": ours["verbatim"] >= peer["verbatim"],
        "tokens": ours["mean"] <= peer["mean"],
    }


def peer_dominates(ours: dict[str, Any], peer: dict[str, Any]) -> bool:
    """The peer at least as good as ours on every column at once (what the goal rules out)."""
    return all(verdict_checks(peer, ours).values())
