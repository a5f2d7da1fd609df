"""How the reference host watches its store: the writes made through it (to tell whether a
prompt must be built again, and to learn of an archive), the turns waiting on it now (for
background work to let them go first), whether it can store and read in one call, and what
identifies the history a prompt was built from."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .services import Snapshot

__all__ = ["TurnWaits", "WriteCounter", "reads_with_append", "snapshot_key"]

_T = TypeVar("_T")

#: The store methods that change what a session's snapshot holds.
_WRITES = (
    "append",
    "append_snapshot",
    "trim_history",
    "commit_compression",
    "clear",
    "delete_messages",
    "forget",
)
#: The writes that archive messages (they return what they archived, or whether they won).
_ARCHIVES = ("trim_history", "commit_compression")


class TurnWaits:
    """How many of a host's turns wait on its store at this moment. A store call that leaves
    the event loop (SQLite's worker thread, a database round trip) lets any ready task run; a
    background compression that starts its CPU work then holds the turn's next step until that
    work is done. Background work waits here first (:meth:`none_waiting`)."""

    def __init__(self) -> None:
        self._waiting = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    @property
    def waiting(self) -> int:
        return self._waiting

    async def around(self, call: Awaitable[_T]) -> _T:
        """``await call``, counted as a turn waiting on the store."""
        self._waiting += 1
        self._quiet.clear()
        try:
            return await call
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._quiet.set()

    async def none_waiting(self, max_wait_s: float) -> bool:
        """Return ``True`` once no turn waits on the store (at once when none does), ``False``
        after ``max_wait_s`` seconds of turns waiting (a busy host's background work is
        delayed, never stopped)."""
        if not self._waiting:
            return True
        loop = asyncio.get_running_loop()
        end = loop.time() + max_wait_s
        while self._waiting:  # another turn may have started waiting before this task ran
            left = end - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._quiet.wait(), left)
            except TimeoutError:
                return False
        return True


class WriteCounter:
    """Counts, per session, the writes made through one store object (its write methods are
    wrapped on the instance: the object, its class and its identity stay what they were).

    The host compares the count before and after ``before_model_call`` to tell whether the
    prompt must be built again, instead of reading a second snapshot after every hook.
    ``archived(session_id)`` is called after each write that archived messages of a session
    (a compression's commit or a trim that took effect)."""

    def __init__(self, store: Any, archived: Callable[[str], None] | None = None) -> None:
        self.counts: dict[str, int] = {}
        for name in _WRITES:
            method = getattr(store, name, None)
            if method is not None:
                setattr(store, name, self._wrap(method, archived if name in _ARCHIVES else None))

    def _wrap(
        self, method: Callable[..., Any], archived: Callable[[str], None] | None
    ) -> Callable[..., Any]:
        counts = self.counts

        async def write(session_id: str, *args: Any, **kwargs: Any) -> Any:
            try:
                done = await method(session_id, *args, **kwargs)
            finally:
                counts[session_id] = counts.get(session_id, 0) + 1
            if done and archived is not None:
                archived(session_id)
            return done

        write.__name__ = getattr(method, "__name__", "write")
        write.__doc__ = getattr(method, "__doc__", None)
        return write

    def of(self, session_id: str) -> int:
        return self.counts.get(session_id, 0)


def reads_with_append(store: Any) -> bool:
    """Whether the host may store and read in one call (``append_snapshot``, see
    :class:`~host_stub.services.SnapshotOnAppend`): the store's class defines it at least as
    far down its hierarchy as ``append``. A subclass or a wrapper that changes ``append`` (to
    log, to filter) without it keeps every append going through its own ``append``."""
    mro = type(store).__mro__

    def definer(name: str) -> type | None:
        return next((k for k in mro if name in vars(k)), None)

    fused, plain = definer("append_snapshot"), definer("append")
    return fused is not None and plain is not None and issubclass(fused, plain)


def snapshot_key(snap: Snapshot) -> tuple[Any, ...]:
    """What identifies the history a prompt was built from: a clear changes the epoch, a
    compression the record's version, a trim the number of active messages (the first seq alone
    misses it: core system messages are never archived, so one may head the history for good),
    an append the last seq."""
    record_version = snap.record.version if snap.record else 0
    return (snap.epoch, record_version, snap.first_seq, snap.last_seq, len(snap.messages))
