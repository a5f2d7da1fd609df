"""Scheduling of compressions: single flight per session, the global cap, the cross-process
lease, the work that follows a commit, and every task the plugin starts (held by strong
reference, drained or cancelled at shutdown).

The scheduler knows nothing of how a compression is done: it runs the pipeline's
``compress_once`` under a session's lease and reports the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from host_stub.messages import Message
from host_stub.services import (
    LeaseLost,
    LeaseToken,
    MemoryService,
    MessageArchiveService,
    Snapshot,
)

from ..base import LOST_RACE, MemorySummaryConfig, Result, result
from .lease import KeptLease
from .slot import SummarizerSlot

__all__ = [
    "LEASE_BUSY",
    "LEASE_LOST",
    "Emit",
    "Scheduler",
    "Work",
]

log = logging.getLogger("plugin_memory_summary")

#: The ``skipped`` reason when another run holds the session's compression lease.
LEASE_BUSY = "another run (in this or another process) holds the session's lease"
#: The ``skipped`` reason when a newer holder took the lease during the run (its writes refused).
LEASE_LOST = "the session's lease was taken over during the run; its writes were refused"

Emit = Callable[[str, str, str, str, dict[str, Any]], Awaitable[None]]


class Work(Protocol):
    """One compression attempt (the pipeline's ``compress_once``); a committed run appends its
    event marker to ``markers``, written after the result."""

    def __call__(
        self,
        session_id: str,
        reason: str,
        deadline: float | None,
        snapshot: Snapshot | None,
        markers: list[Message],
        slot: SummarizerSlot | None,
        lease: LeaseToken | None,
    ) -> Awaitable[Result]: ...


class Scheduler:
    """Owns every task the plugin starts."""

    def __init__(
        self,
        config: MemorySummaryConfig,
        memory: MemoryService,
        archive: MessageArchiveService | None,
        work: Work,
        emit: Emit,
        name: str,
        warm: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.memory = memory
        self.archive = archive
        self._work = work
        self._emit = emit
        self._name = name
        self._semaphore = asyncio.Semaphore(config.max_concurrent_summaries)
        self._running: dict[str, asyncio.Task[Result]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        #: Sessions whose run waits for a slot under max_concurrent_summaries.
        self._queued: set[str] = set()
        #: Per session, the last run's marker write and lease release (see ``_after_run``).
        self._tails: dict[str, asyncio.Task[None]] = {}
        self._ids = itertools.count(1)
        self._warm_up = warm

    # -- what is going on ----------------------------------------------------------------------
    @property
    def running(self) -> frozenset[str]:
        """Sessions with a compression in progress (queued for a slot included)."""
        return frozenset(self._running)

    def pending(self) -> list[asyncio.Task[Any]]:
        """Background tasks not yet done."""
        return [t for t in self._background if not t.done()]

    def tail_pending(self, session_id: str) -> bool:
        """The last run of the session still writes its marker or releases its lease."""
        return session_id in self._tails

    async def _warm(self) -> None:
        if self._warm_up is not None:
            await self._warm_up()

    def request_id(self, session_id: str) -> str:
        return f"{self._name}:{session_id}:{next(self._ids)}"

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background, held until done (and drained at shutdown)."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no background task runs; ``False`` when ``timeout`` passed first."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while pending := self.pending():
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return False
            await asyncio.wait(pending, timeout=left)
        return True

    async def drain(self, grace_s: float) -> None:
        """Shutdown: give background work ``grace_s`` seconds, then cancel what is left."""
        pending = self.pending()
        if pending:
            _, still = await asyncio.wait(pending, timeout=grace_s)
            for task in still:
                task.cancel()
            if still:
                await asyncio.gather(*still, return_exceptions=True)

    async def cancel(self, session_id: str) -> bool:
        """Cancel the session's run (the ``memory_clear`` hook) and wait until it and its last
        writes are over; whether there was a run to cancel."""
        task = self._running.get(session_id)
        cancelled = False
        if task is not None and not task.done():
            task.cancel()
            cancelled = True
            await asyncio.wait({task})  # its last writes start as it ends (_after_run)
        await self.tail_done(session_id)  # a marker lands before the clear, not after
        return cancelled

    # -- requests ------------------------------------------------------------------------------
    async def report_skipped(
        self, session_id: str, reason: str, why: str, usage_ratio: float | None
    ) -> None:
        """Report a request that was planned and found useless before any run (its ``start``
        and its final ``skipped``)."""
        request_id = self.request_id(session_id)
        await self._emit(request_id, session_id, "start", reason, {"usage_ratio": usage_ratio})
        await self._emit(request_id, session_id, "skipped", why, {})

    async def request(
        self,
        session_id: str,
        reason: str,
        *,
        request_id: str | None = None,
        usage_ratio: float | None = None,
        deadline_s: float | None = None,
        look_again: Callable[[Result], bool] | None = None,
        snapshot: Snapshot | None = None,
    ) -> Result:
        """Compress a session (joining a compression already running for it) and report. Returns
        the final status; never raises for a failed compression. A blocking request that joined
        a run looks again afterwards (that run was planned on an older snapshot) unless
        ``look_again(result of the joined run)`` says no. ``snapshot``: a consistent read the
        caller already holds (the prompt's view); a run this request starts uses it instead of
        reading again (the commit's compare-and-set on version and epoch still catches anything
        written since, and a lost race reads afresh)."""
        request_id = request_id or self.request_id(session_id)
        final = result("error", "cancelled")
        await self._emit(request_id, session_id, "start", reason, {"usage_ratio": usage_ratio})
        try:
            deadline = None if deadline_s is None else time.monotonic() + deadline_s
            joined = session_id in self._running
            final = await self._join_or_run(session_id, reason, deadline, snapshot)
            if joined and reason == "hard" and (look_again is None or look_again(final)):
                # The run this request joined was built on an older snapshot: look again.
                again = await self._join_or_run(session_id, reason, deadline)
                if again.status == "done" or final.status != "done":
                    final = again
        except asyncio.CancelledError:
            final = result("error", "cancelled (host shutting down)")
            raise
        except Exception as exc:  # a bug must cost a compression, not a turn
            log.exception("compression of %s failed", session_id)
            final = result("error", f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(
                    self._emit(
                        request_id, session_id, final.status, final.reason, dict(final.stats)
                    )
                )
        return final

    async def _join_or_run(
        self,
        session_id: str,
        reason: str,
        deadline: float | None,
        snapshot: Snapshot | None = None,
    ) -> Result:
        task = self._running.get(session_id)
        joined = task is not None and not task.done()
        if joined and reason == "hard" and session_id in self._queued:
            # The running request still waits for a slot under max_concurrent_summaries; a
            # blocking request bypasses the cap instead of queueing behind it (the lease keeps
            # the two runs apart; the queued one then finds less or nothing to do).
            joined = False
        if task is None or not joined:
            task = asyncio.ensure_future(self._run(session_id, reason, deadline, snapshot))
            self._running[session_id] = task
            task.add_done_callback(functools.partial(_forget, self._running, session_id))
        try:
            if joined and deadline is not None:
                # A run started without our deadline may take a summarizer's full timeout: a
                # blocking request waits for it only until its own deadline (asyncio.wait never
                # cancels the run, and a TimeoutError of the run itself is not ours to rename).
                done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
                if not done:
                    return result(
                        "error", "deadline passed while another compression of this session ran"
                    )
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and not (current is not None and current.cancelling()):
                return result("skipped", "cancelled by a memory clear")
            raise

    async def _run(
        self,
        session_id: str,
        reason: str,
        deadline: float | None,
        snapshot: Snapshot | None = None,
    ) -> Result:
        if reason == "hard":  # blocking requests bypass the global cap
            return await self._run_leased(session_id, reason, deadline, snapshot, None)
        slot = SummarizerSlot(self._semaphore)
        self._queued.add(session_id)
        try:
            await slot.acquire()
        finally:
            self._queued.discard(session_id)
        try:
            return await self._run_leased(session_id, reason, deadline, snapshot, slot)
        finally:
            slot.release()

    async def _run_leased(
        self,
        session_id: str,
        reason: str,
        deadline: float | None,
        snapshot: Snapshot | None,
        slot: SummarizerSlot | None,
    ) -> Result:
        """One run under the session's cross-process lease; ``slot`` (none for a blocking run)
        is taken before the lease and given back once the summarizer is done."""
        await self.tail_done(session_id)  # this process's previous run gave its lease back
        await self._warm()  # slow first imports: before the lease, not under it
        # Renewed while the run lives (a crashed holder's lease runs out after lease_ttl_s);
        # released by the run's tail, after its marker.
        async with KeptLease(
            self.memory,
            f"{self._name}:{session_id}",
            self.config.lease_ttl_s,
            deadline=deadline,
            release=False,
        ) as kept:
            lease = kept.lease
            if lease is None:
                return result("skipped", LEASE_BUSY)
            markers: list[Message] = []
            try:
                for _ in range(3):
                    outcome = await self._work(
                        session_id, reason, deadline, snapshot, markers, slot, lease
                    )
                    if outcome.status != LOST_RACE:
                        return outcome
                    snapshot = None  # lost the race: read afresh
                return result("skipped", "lost the commit race three times")
            except LeaseLost:
                return result("skipped", LEASE_LOST)
            finally:
                # The marker and the lease's release follow the result: a blocking request
                # returns as soon as the commit is in; the others wait for them too.
                tail = self.spawn(self._after_run(session_id, lease, markers))
                self._tails[session_id] = tail
                tail.add_done_callback(functools.partial(_forget, self._tails, session_id))
                if reason != "hard":
                    with contextlib.suppress(Exception):
                        await asyncio.shield(tail)

    async def _after_run(self, session_id: str, lease: LeaseToken, markers: list[Message]) -> None:
        """A run's last writes, under its lease: its event marker, then the lease's release."""
        try:
            for marker in markers:  # only a run with an archive makes one
                try:
                    assert self.archive is not None
                    await self.archive.save_message(session_id, marker)
                except Exception:
                    log.exception("could not write the compression marker of %s", session_id)
        finally:
            with contextlib.suppress(Exception):
                await self.memory.release_lease(lease)

    async def tail_done(self, session_id: str) -> None:
        """Wait for the last run's marker and lease release in this process (never raises)."""
        tail = self._tails.get(session_id)
        if tail is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(tail)


def _forget(table: dict[str, Any], session_id: str, task: asyncio.Task[Any]) -> None:
    """Drop ``table[session_id]`` if it is still ``task`` (a newer one may have replaced it)."""
    if table.get(session_id) is task:
        del table[session_id]
