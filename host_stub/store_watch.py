"""How the reference host watches its store: the writes made through it (to tell whether a
prompt must be built again, and to learn of an archive), whether it can store and read in one
call, and what identifies the history a prompt was built from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .services import Snapshot

__all__ = ["WriteCounter", "reads_with_append", "snapshot_key"]

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
