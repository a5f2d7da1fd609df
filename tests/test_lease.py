"""The compression lease as a run holds it (``plugin_memory_summary.pipeline.lease``): renewed
while the run lives, fenced, and taken only once the slow imports are done (the summarizer's
``warm_up``).

Lease expiry is read from an injected clock (the in-memory store's ``clock``), and the renewal
loop's sleep is injected too where the test drives it: no test here depends on how fast the
machine is.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from plugin_harness import json_summary, plugin_host

from host_stub.memory.inmemory import InMemoryMemory
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message
from host_stub.services import LeaseToken
from host_stub.testing import FakeLLM, message_tokens
from plugin_memory_summary.pipeline.lease import KeptLease, renew_interval
from plugin_memory_summary.plugin import LEASE_LOST, PLUGIN_NAME
from plugin_memory_summary.summarizer.warm import warm_up

REPO_ROOT = Path(__file__).resolve().parents[1]


class VirtualTime:
    """A store clock, and a sleep that moves it instead of waiting."""

    def __init__(self, step: float | None = None) -> None:
        self.now = 1000.0
        #: Advance by this instead of the requested delay (a stalled process), if set.
        self.step = step

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.now += delay if self.step is None else self.step
        await asyncio.sleep(0)


async def spin(rounds: int = 50) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def test_renewal_comes_every_third_of_the_ttl() -> None:
    assert renew_interval(9.0) == 3.0
    assert renew_interval(0.3) == pytest.approx(0.1)


async def test_a_kept_lease_is_renewed_and_outlives_its_ttl() -> None:
    vt = VirtualTime()
    store = InMemoryMemory(message_tokens, clock=vt.clock)
    async with KeptLease(store, "L", 3.0, sleep=vt.sleep) as kept:
        assert kept.lease is not None and kept.fence == kept.lease.fence == 1
        await spin()
        assert vt.now > 1000.0 + 10 * 3.0  # many TTLs went by
        assert kept.renewals >= 10 and not kept.lost
        assert await store.acquire_lease("L", 3.0) is None  # still held
        assert kept.lease.expires_at > vt.now
    # Exit: no more renewals, and the lease was given back.
    renewals = kept.renewals
    taken = await store.acquire_lease("L", 3.0)
    assert taken is not None and taken.fence == 2
    await spin()
    assert kept.renewals == renewals


async def test_a_stalled_holder_loses_its_lease_and_leaves_the_new_holders_alone() -> None:
    vt = VirtualTime(step=5.0)  # each beat comes after more than the 3 s TTL
    store = InMemoryMemory(message_tokens, clock=vt.clock)
    async with KeptLease(store, "L", 3.0, sleep=vt.sleep) as kept:
        old = kept.lease
        assert old is not None
        await spin()
        assert kept.lost and kept.renewals == 0
        newer = await store.acquire_lease("L", 3.0)
        assert newer is not None and newer.fence > old.fence
    # The stalled holder's exit released nothing: the newer holder still holds the lease.
    assert await store.renew_lease(newer, 3.0) is not None
    assert await store.acquire_lease("L", 3.0) is None


async def test_release_false_hands_the_release_to_the_caller() -> None:
    vt = VirtualTime()
    store = InMemoryMemory(message_tokens, clock=vt.clock)
    async with KeptLease(store, "L", 3.0, sleep=vt.sleep, release=False) as kept:
        lease = kept.lease
        assert lease is not None
    assert await store.acquire_lease("L", 3.0) is None  # still held, no longer renewed
    assert await store.release_lease(lease) is True


async def test_a_busy_lease_is_tried_until_the_deadline() -> None:
    vt = VirtualTime()
    store = InMemoryMemory(message_tokens, clock=vt.clock)
    held = await store.acquire_lease("L", 3.0)
    assert held is not None
    tries = 0

    async def sleep(delay: float) -> None:
        nonlocal tries
        tries += 1
        if tries == 3:
            await store.release_lease(held)
        await asyncio.sleep(0)

    async with KeptLease(store, "L", 3.0, deadline=float("inf"), sleep=sleep) as kept:
        assert kept.lease is not None and kept.lease.fence == 2 and tries == 3
    async with KeptLease(store, "L", 3.0) as busy:  # no deadline: one try
        pass
    assert busy.lease is not None  # (the previous holder released it on exit)
    await store.acquire_lease("L", 3.0)  # now held by someone else
    async with KeptLease(store, "L", 3.0, deadline=0.0) as late:
        assert late.lease is None and late.fence is None


class FlakyRenewals(InMemoryMemory):
    """Renewal fails with a store error now and then."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renew_calls = 0

    async def renew_lease(self, lease: LeaseToken, ttl_s: float) -> LeaseToken | None:
        self.renew_calls += 1
        if self.renew_calls % 2:
            raise ConnectionError("store hiccup")
        return await super().renew_lease(lease, ttl_s)


async def test_a_failed_renewal_is_tried_again_at_the_next_beat() -> None:
    vt = VirtualTime()
    store = FlakyRenewals(message_tokens, clock=vt.clock)
    async with KeptLease(store, "L", 3.0, sleep=vt.sleep) as kept:
        await spin()
        assert store.renew_calls >= 10 and kept.renewals >= 5 and not kept.lost
        assert await store.acquire_lease("L", 3.0) is None


# -- the plugin's runs ------------------------------------------------------------------------


async def test_p1_a_run_whose_lease_was_taken_over_commits_nothing() -> None:
    """Issue 14 point 1 (fencing): a run that stalled past its lease while another process took
    the lease over must not commit; it reports the lost lease and the store is untouched."""
    vt = VirtualTime()
    store = InMemoryMemory(message_tokens, clock=vt.clock)
    in_llm = asyncio.Event()
    go_on = asyncio.Event()

    async def stalled_summary(sent: list[dict[str, Any]]) -> str:
        in_llm.set()
        await go_on.wait()
        return json_summary(sent)

    # A long TTL in real time: no renewal fires while the test runs; the store's clock jumps.
    async with plugin_host(
        {"keep_recent": 2, "threshold": 10_000, "lease_ttl_s": 60},
        llm=FakeLLM(default=stalled_summary),
        memory=store,
    ) as h:
        try:
            await h.turns("s", 6)
            run = asyncio.ensure_future(h.plugin.compress("s"))
            await in_llm.wait()
            vt.now += 61  # the holder stalled past its TTL ...
            newer = await store.acquire_lease(f"{PLUGIN_NAME}:s", 60)  # ... and was taken over
            assert newer is not None
            go_on.set()
            result = await run
            assert result["status"] == "skipped" and result["reason"] == LEASE_LOST
            assert await store.get_metadata("summary", "s") is None
            assert await store.get_archived("s") == []
            assert await store.acquire_lease(f"{PLUGIN_NAME}:s", 60) is None  # newer still holds
        finally:
            go_on.set()


class StepClockStore(InMemoryMemory):
    """Each renewal moves the store's clock on by the renewal interval first, as if that much
    time had passed: the lease's life is counted in renewals, not in the machine's speed."""

    def __init__(self, vt: VirtualTime) -> None:
        super().__init__(message_tokens, clock=vt.clock)
        self.vt = vt
        self.renewed = 0
        self.enough = asyncio.Event()

    async def renew_lease(self, lease: LeaseToken, ttl_s: float) -> LeaseToken | None:
        self.vt.now += renew_interval(ttl_s)
        renewed = await super().renew_lease(lease, ttl_s)
        self.renewed += 1
        if self.renewed >= 6:
            self.enough.set()
        return renewed


async def test_p1_a_live_run_keeps_its_lease_past_lease_ttl_s() -> None:
    """Issue 14 point 1 (heartbeat): a run that takes longer than ``lease_ttl_s`` renews its
    lease, so nobody takes it over, and it commits its LLM summary (the old code cut every run at
    80% of the TTL and never renewed)."""
    vt = VirtualTime()
    store = StepClockStore(vt)
    go_on = asyncio.Event()

    async def slow_summary(sent: list[dict[str, Any]]) -> str:
        await go_on.wait()
        return json_summary(sent)

    async with plugin_host(
        {"keep_recent": 2, "threshold": 10_000, "lease_ttl_s": 0.3},
        llm=FakeLLM(default=slow_summary),
        memory=store,
    ) as h:
        try:
            await h.turns("s", 6)
            started = vt.now
            run = asyncio.ensure_future(h.plugin.compress("s"))
            await asyncio.wait_for(store.enough.wait(), 120)  # a hang detector, not a time budget
            assert vt.now - started >= 2 * 0.3  # twice the TTL went by on the store's clock
            assert await store.acquire_lease(f"{PLUGIN_NAME}:s", 0.3) is None  # still held
            go_on.set()
            result = await run
            assert result["status"] == "done", result
            assert result["stats"]["engine"] == "llm" and not result["stats"]["fallback"]
            entry = await store.get_metadata("summary", "s")
            assert entry is not None and entry.version == 1
        finally:
            go_on.set()


# -- warm-up (point 2) ------------------------------------------------------------------------


class SlowFirstCount(FakeLLM):
    """An LLM service whose first token count stands for a slow import (litellm): it records
    which thread ran it and when it ended, relative to the lease."""

    def __init__(self, store: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.watching = False
        self.first: dict[str, Any] | None = None

    def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
        if self.watching and self.first is None:
            self.first = {
                "thread": threading.current_thread(),
                "leases_before": list(self.store.acquired),
            }
        return super().count_tokens(messages_or_text, model)


class LeaseLog(InMemoryMemory):
    def __init__(self) -> None:
        super().__init__(message_tokens)
        self.acquired: list[str] = []

    async def acquire_lease(self, name: str, ttl_s: float) -> LeaseToken | None:
        lease = await super().acquire_lease(name, ttl_s)
        if lease is not None:
            self.acquired.append(name)
        return lease


async def test_p2_the_lease_is_taken_after_the_llm_service_is_warm() -> None:
    """Issue 14 point 2, in process: a run's first token count (where litellm gets imported)
    happens before the lease, in a worker thread, not on the event loop under the lease."""
    store = LeaseLog()
    llm = SlowFirstCount(store, default=json_summary)
    async with plugin_host({"keep_recent": 2, "threshold": 10_000}, llm=llm, memory=store) as h:
        await h.turns("s", 6)
        llm.watching = True  # the first count of the compression run
        result = await h.plugin.compress("s")
        assert result["status"] == "done"
        assert llm.first is not None
        assert llm.first["leases_before"] == []  # counted before any lease was taken
        assert llm.first["thread"] is not threading.main_thread()
        assert store.acquired == [f"{PLUGIN_NAME}:s"]


async def test_warm_up_runs_once_per_llm_service_and_never_raises() -> None:
    calls: list[str | None] = []

    class Counting:
        def count_tokens(self, text: str, model: str | None = None) -> int:
            calls.append(model)
            return 1

    class Broken:
        def count_tokens(self, text: str, model: str | None = None) -> int:
            calls.append("broken")
            raise RuntimeError("no tokenizer")

    llm, broken = Counting(), Broken()
    await warm_up(llm, "m")
    await warm_up(llm, "m")
    await warm_up(broken, "m")  # best effort: the run reports it later
    await warm_up(broken, "m")  # tried once: a failure is not tried again before every run
    await warm_up(None, None)
    assert calls == ["m", "broken"]


_CLI_PROBE = textwrap.dedent(
    """
    import json, sys, time

    import host_stub.llm as llm_module
    from host_stub.memory.sqlite import SQLiteMemory

    log = {"imports": [], "holds": []}
    real_ensure, real_acquire, real_release = (
        llm_module.ensure_litellm, SQLiteMemory.acquire_lease, SQLiteMemory.release_lease
    )

    def ensure_litellm():
        if "litellm" in sys.modules:
            return real_ensure()
        started = time.monotonic()
        try:
            return real_ensure()
        finally:
            log["imports"].append([started, time.monotonic()])

    async def acquire_lease(self, name, ttl_s):
        lease = await real_acquire(self, name, ttl_s)
        if lease is not None:
            log["holds"].append([time.monotonic(), None, "litellm" in sys.modules])
        return lease

    async def release_lease(self, lease):
        log["holds"][-1][1] = time.monotonic()
        return await real_release(self, lease)

    llm_module.ensure_litellm = ensure_litellm
    SQLiteMemory.acquire_lease, SQLiteMemory.release_lease = acquire_lease, release_lease
    from host_stub.cli import main

    code = main(["compress", "s", "--db", sys.argv[1], "--json"])
    print(json.dumps(log))
    sys.exit(code)
    """
)


@pytest.mark.slow
def test_p2_host_stub_compress_takes_the_lease_after_the_slow_import(tmp_path: Path) -> None:
    """Issue 14 point 2: ``host-stub compress`` in a fresh process (litellm not imported yet)
    imports litellm before it takes the lease, so the lease is held for the compression only.
    Checked by order of events, not by durations (they are printed)."""
    db = tmp_path / "m.db"

    async def fill() -> None:
        store = SQLiteMemory(db, message_tokens)
        try:
            await store.append(
                "s",
                [
                    Message(
                        role="user" if i % 2 == 0 else "assistant",
                        content=f"message number {i} about the order ORDER-{i}",
                    )
                    for i in range(40)
                ],
            )
        finally:
            await store.close()

    asyncio.run(fill())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _CLI_PROBE, str(db)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    status_line, log_line = proc.stdout.strip().splitlines()[-2:]
    assert json.loads(status_line)["status"] == "done", status_line
    log = json.loads(log_line)
    [(acquired, released, imported_at_acquire)] = log["holds"]
    if not log["imports"]:
        # Counting tokens no longer imports litellm at all (the rules engine calls no model):
        # nothing slow can happen under the lease.
        assert not imported_at_acquire and acquired <= released
        return
    [(import_start, import_end)] = log["imports"]
    print(f"import {import_end - import_start:.2f}s, lease held {released - acquired:.2f}s")
    assert imported_at_acquire, "the lease was taken before litellm was imported"
    assert import_end <= acquired <= released
