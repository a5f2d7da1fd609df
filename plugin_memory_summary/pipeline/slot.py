"""The summarizer slot of a run: one place under ``max_concurrent_summaries``. The scheduler
makes one per run from its semaphore and takes it before the lease; the pipeline gives it back
once the summarizer is done (and takes it again for an attempt after a lost race). Both use it,
so it lives below both."""

from __future__ import annotations

import asyncio

__all__ = ["SummarizerSlot"]


class SummarizerSlot:
    """One place under ``max_concurrent_summaries``, taken and given back at most once each
    time (``release`` without a held place does nothing)."""

    def __init__(self, semaphore: asyncio.Semaphore) -> None:
        self._semaphore = semaphore
        self.held = False

    async def acquire(self) -> None:
        if not self.held:
            await self._semaphore.acquire()
            self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._semaphore.release()
