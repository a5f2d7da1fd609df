"""What runs beside the worker thread: the snapshot reads it caches, the checkpointer, and the
busy errors it retries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from .rows import _Row, _SnapshotRows
from .statements import _scalar, _snapshot_rows

log = logging.getLogger("host_stub.memory.sqlite")

#: Checkpoints after archives start at most this often (seconds); the archives that follow one
#: within this time share one checkpoint at its end (see the module's docstring).
CHECKPOINT_INTERVAL_S = 0.25


class _ActiveReads:
    """What the last snapshot of each recent session read (its active rows, the record's row,
    the epoch), with the connection's ``PRAGMA data_version`` when it read them. That version
    changes when another connection commits; this connection's own writes do not change it, so
    every write of its own but an append drops what is kept (``clear``), and an append adds its
    rows (``appended``). While the version is unchanged a snapshot needs no ``SELECT``. Used by
    whoever holds ``_in_use``, inside the transaction; a transaction that fails drops all."""

    def __init__(self, sessions: int = 256) -> None:
        self._limit = sessions
        self._by_session: OrderedDict[str, dict[str, tuple[int, list[_Row], _Row | None, int]]]
        self._by_session = OrderedDict()

    def read(
        self, db: sqlite3.Connection, session_id: str, namespace: str, epoch: int | None = None
    ) -> _SnapshotRows:
        """A snapshot's rows: kept ones when no other connection committed since; else read
        (the version first, so what is kept is never older than its version says)."""
        version = int(_scalar(db, "PRAGMA data_version"))
        kept = self._by_session.get(session_id, {}).get(namespace)
        if kept is not None and kept[0] == version:
            self._by_session.move_to_end(session_id)
            return list(kept[1]), kept[2], kept[3]
        rows, record, epoch = _snapshot_rows(db, session_id, namespace, epoch)
        self._by_session.setdefault(session_id, {})[namespace] = (version, rows, record, epoch)
        self._by_session.move_to_end(session_id)
        while len(self._by_session) > self._limit:
            self._by_session.popitem(last=False)
        return list(rows), record, epoch

    def appended(self, session_id: str, epoch: int, rows: list[_Row]) -> None:
        """Rows this connection just added to the session (newest seqs, active)."""
        reads = self._by_session.get(session_id, {})
        for namespace, (_, kept, _, kept_epoch) in list(reads.items()):
            if kept_epoch == epoch:
                kept.extend(rows)
            else:  # another epoch than the one this transaction read: read again
                del reads[namespace]

    def clear(self) -> None:
        self._by_session.clear()


class _Checkpointer:
    """Checkpoints of a database's WAL on a connection and a thread of their own (see the
    module's docstring): ``PASSIVE``, so they wait for no reader or writer, and the store's
    connection goes on with its transactions meanwhile. At most one starts every
    :data:`CHECKPOINT_INTERVAL_S`; one asked for sooner is put off to the interval's end (one
    at a time: the archives in between share it)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None  # used by the checkpoint thread only
        self._running: Future[None] | None = None
        self._started = -CHECKPOINT_INTERVAL_S  # monotonic time of the last start
        #: A checkpoint put off: the loop its timer is on and the timer.
        self._deferred: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None

    def soon(self) -> None:
        """Checkpoint after an archive: now, or at the end of the current interval when a
        checkpoint started less than :data:`CHECKPOINT_INTERVAL_S` ago or still runs (on the
        running event loop; nothing more when one is put off already on that loop)."""
        loop = asyncio.get_running_loop()
        if self._deferred is not None:
            if self._deferred[0] is loop:
                return
            self._deferred[1].cancel()  # put off on a loop that has ended: start again here
            self._deferred = None
        wait = self._started + CHECKPOINT_INTERVAL_S - time.monotonic()
        running = self._running is not None and not self._running.done()
        if wait <= 0 and not running:
            self._start()
            return
        delay = max(wait, CHECKPOINT_INTERVAL_S if running else 0.0)
        self._deferred = (loop, loop.call_later(delay, self._put_off_done))

    def _put_off_done(self) -> None:
        self._deferred = None
        self.soon()

    def _start(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="sqlite-checkpoint"
            )
        self._started = time.monotonic()
        self._running = self._executor.submit(self._checkpoint)

    def _checkpoint(self) -> None:
        try:
            if self._db is None:
                self._db = sqlite3.connect(
                    self._path, isolation_level=None, timeout=0, check_same_thread=False
                )
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # the automatic checkpoint still runs: nothing is lost
            log.debug("checkpoint of %s failed: %s", self._path, exc)
            self._close_connection()

    def _close_connection(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()

    async def close(self) -> None:
        """Cancel a checkpoint put off; wait for a running one, then close the connection and
        end the thread."""
        if self._deferred is not None:
            self._deferred[1].cancel()
            self._deferred = None
        executor, self._executor = self._executor, None
        if executor is not None:
            closing = executor.submit(self._close_connection)
            executor.shutdown(wait=False)
            await asyncio.shield(asyncio.wrap_future(closing))


class _Busy(Exception):
    """A transaction run at once met another connection's lock; it was rolled back."""


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds what the statement needs."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)
