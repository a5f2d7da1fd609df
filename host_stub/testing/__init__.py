"""Test doubles at the host's edge, for a plugin's tests and benchmarks: one fake LLM service and a
started host to run turns against.

* :class:`FakeLLM`: an ``LLMService`` whose answers come from a queue, a per-model reply or a
  default (a text, a :class:`~host_stub.services.Completion`, an exception to raise, or a callable
  of the request), optionally after a fixed ``delay`` and through a seeded :class:`FaultPlan`
  (provider errors, timeouts, hangs, empty, garbage, wrongly typed, oversized and cut-off
  answers, slow replies). It records every call and keeps per-model :class:`CallStats`. Token
  counts are a cheap deterministic estimate unless a ``count`` function is given.
* :class:`HostHarness`: ``async with HostHarness(config) as h`` starts a host (a fake LLM and an
  in-memory store unless given others), records every ``session:compressing`` status and
  ``session:compress`` request, and stops the host on the way out.

A hanging call blocks on an :class:`asyncio.Future` until the call's own ``timeout`` passes (as a
real client would time out), until it is cancelled, or until the test fires it
(:meth:`FakeLLM.fire_hangs`); a slow reply completes after a tiny delay, or, with
``hold_slow=True``, when the test resolves it (:meth:`FakeLLM.resolve_slow`).

The fault kinds are listed in :mod:`host_stub.testing.faults`.
"""

from __future__ import annotations

from .faults import (
    CUT_MARK,
    FAULT_KINDS,
    LEAK_MARKERS,
    FaultPlan,
    FaultSampler,
    cut_answer,
    garbage_answer,
    oversized_answer,
    provider_error,
    wrong_types_answer,
)
from .harness import HostHarness
from .llm import CallStats, FakeLLM, Reply, count_simple, message_tokens, simple_count

__all__ = [
    "CUT_MARK",
    "FAULT_KINDS",
    "LEAK_MARKERS",
    "CallStats",
    "FakeLLM",
    "FaultPlan",
    "FaultSampler",
    "HostHarness",
    "Reply",
    "count_simple",
    "cut_answer",
    "garbage_answer",
    "message_tokens",
    "oversized_answer",
    "provider_error",
    "simple_count",
    "wrong_types_answer",
]
