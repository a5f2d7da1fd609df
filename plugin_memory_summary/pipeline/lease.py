"""The compression lease as a run holds it: taken when the work is ready, renewed while the run
lives, fenced.

A run takes the session's lease with :class:`KeptLease` (an async context manager). While the
context is open a task it owns renews the lease every third of its TTL, so the lease never runs
out under a live run, however long the summarizer takes, while a crashed process's lease runs
out one TTL after its last renewal and another process takes over. Every acquisition carries a
fencing token (``LeaseToken.fence``); the run passes its lease to the writes it makes
(``commit_compression(..., lease=...)``, ``trim_history(..., lease=...)``), and the store
refuses them with ``LeaseLost`` once a newer holder took the lease, e.g. after this process
stalled past the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from host_stub.services import LeaseToken, MemoryService

__all__ = ["KeptLease", "renew_interval"]

log = logging.getLogger(__name__)

#: How often a failed acquisition is tried again until the caller's deadline.
ACQUIRE_POLL_S = 0.05

Sleep = Callable[[float], Awaitable[Any]]


def renew_interval(ttl_s: float) -> float:
    """Seconds between renewals: a third of the TTL, so two renewals in a row may fail (or come
    late) before the lease runs out."""
    return ttl_s / 3


class KeptLease:
    """``async with KeptLease(memory, name, ttl_s) as kept:`` takes the lease (trying again until
    ``deadline``, a ``time.monotonic()`` value; ``None`` = one try) and renews it until the
    context exits. ``kept.lease`` is the held token, or ``None`` if the lease was busy; its
    ``fence`` is what the run's writes pass on. On exit the renewal stops and, with
    ``release=True``, the lease is given back; with ``release=False`` the caller releases it
    itself (e.g. after the run's last writes). ``sleep`` and ``monotonic`` are for tests."""

    def __init__(
        self,
        memory: MemoryService,
        name: str,
        ttl_s: float,
        *,
        deadline: float | None = None,
        release: bool = True,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.memory = memory
        self.name = name
        self.ttl_s = ttl_s
        self.deadline = deadline
        self.release = release
        self._sleep = sleep
        self._monotonic = monotonic
        #: The held lease with its latest expiry; ``None`` when it was busy.
        self.lease: LeaseToken | None = None
        #: Set once a renewal found the lease gone (expired and taken, or released).
        self.lost = False
        #: Renewals that succeeded (for tests and logs).
        self.renewals = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def fence(self) -> int | None:
        return None if self.lease is None else self.lease.fence

    async def __aenter__(self) -> KeptLease:
        lease = await self.memory.acquire_lease(self.name, self.ttl_s)
        while lease is None and self.deadline is not None and self._monotonic() < self.deadline:
            await self._sleep(ACQUIRE_POLL_S)
            lease = await self.memory.acquire_lease(self.name, self.ttl_s)
        self.lease = lease
        if lease is not None:
            self._task = asyncio.ensure_future(self._renew())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.release and self.lease is not None and not self.lost:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.memory.release_lease(self.lease))

    async def _renew(self) -> None:
        """The heartbeat: renew every third of the TTL until the lease is found gone."""
        while True:
            await self._sleep(renew_interval(self.ttl_s))
            assert self.lease is not None
            try:
                renewed = await self.memory.renew_lease(self.lease, self.ttl_s)
            except Exception:  # a store hiccup: the next beat tries again
                log.warning("could not renew lease %s", self.name, exc_info=True)
                continue
            if renewed is None:
                # Expired and maybe taken over (the run's fenced writes will be refused and say
                # so), or released by the caller's own tail (``release=False``): no alarm here.
                log.debug("lease %s is gone (expired, taken over or released)", self.name)
                self.lost = True
                return
            self.lease = renewed
            self.renewals += 1
