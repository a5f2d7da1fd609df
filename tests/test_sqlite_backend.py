"""The SQLite backend's own design (``host_stub/memory/sqlite/``), beyond the shared contract in
``test_memory_contract.py``: one thread hop per call, every statement of a call in one
transaction in the worker thread, cancellation that leaves a transaction whole or absent, closing
while calls are in flight, and the trace callback the crash tests rely on.

A thread hop is counted where it comes back: the worker hands its result to the event loop
through ``loop.call_soon_threadsafe``, once per hop, whatever library runs the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import host_stub.memory.sqlite.store as sqlite_backend
from host_stub.memory.sqlite import CHECKPOINT_INTERVAL_S, SQLiteMemory
from host_stub.messages import Message

SESSION = "s"


def user(text: str) -> Message:
    return Message(role="user", content=text)


def counter(message: Message) -> int:
    return 1


@pytest.fixture
async def memory(tmp_path: Path) -> AsyncIterator[SQLiteMemory]:
    store = SQLiteMemory(tmp_path / "store.db", counter)
    try:
        yield store
    finally:
        await store.close()


@contextlib.contextmanager
def counting_hops() -> Iterator[list[int]]:
    """Counts the running loop's ``call_soon_threadsafe`` calls: one per thread hop."""
    loop = asyncio.get_running_loop()
    count = [0]
    original = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return original(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign, assignment]
    try:
        yield count
    finally:
        del loop.call_soon_threadsafe  # back to the class's method


async def hops(call: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    with counting_hops() as count:
        result = await call()
    return count[0], result


class Trace:
    """A trace callback that records ``(sql, thread)`` and can hold the worker thread at the
    first statement starting with ``hold`` until :meth:`release`."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, threading.Thread]] = []
        self.hold: str | None = None
        self.held = threading.Event()
        self._release = threading.Event()

    def __call__(self, sql: str) -> None:
        self.statements.append((sql, threading.current_thread()))
        if self.hold is not None and sql.lstrip().upper().startswith(self.hold.upper()):
            self.hold = None
            self.held.set()
            self._release.wait(30)

    def arm(self, prefix: str) -> None:
        self.held.clear()
        self._release.clear()
        self.hold = prefix

    async def wait_held(self) -> None:
        for _ in range(3000):
            if self.held.is_set():
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"the worker never reached {self.hold!r}")

    def release(self) -> None:
        self._release.set()

    def sql(self) -> list[str]:
        """The statements the backend ran; the ones SQLite runs inside them for the FTS5 search
        index (traced as ``-- ...``, some at ``COMMIT``) left out."""
        return [sql for sql, _ in self.statements if not sql.startswith("-- ")]

    def clear(self) -> None:
        self.statements.clear()


@pytest.fixture
async def traced(memory: SQLiteMemory) -> AsyncIterator[tuple[SQLiteMemory, Trace]]:
    trace = Trace()
    await memory.set_trace_callback(trace)
    try:
        yield memory, trace
    finally:
        trace.release()  # never leave the worker held, whatever the test did


def raw(path: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows read through a connection of its own (no backend code)."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
        return list(con.execute(sql, params))


def stored(path: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The session's messages ``(seq, archived)`` and summary rows ``(value, version)``."""
    return (
        raw(
            path, "SELECT seq, archived FROM messages WHERE session_id = ? ORDER BY seq", (SESSION,)
        ),
        raw(path, "SELECT value, version FROM metadata WHERE key = ?", (SESSION,)),
    )


# -- one hop per call ------------------------------------------------------------------------------


async def test_every_call_is_one_thread_hop_or_none(memory: SQLiteMemory) -> None:
    """Each call is one transaction and at most one hop to the worker thread; a turn's short
    calls (append, snapshot, the two together) run on the event loop's thread, no hop, once the
    connection is open and free."""
    # The first call opens the file and creates the schema in the same hop.
    assert (await hops(lambda: memory.get_epoch("warm-up")))[0] == 1

    n, out = await hops(lambda: memory.append(SESSION, [user(f"m{i}") for i in range(100)]))
    assert n == 0 and [m.seq for m in out] == list(range(1, 101))
    n, snap = await hops(lambda: memory.snapshot(SESSION))
    assert n == 0 and len(snap.messages) == 100 and snap.record is None
    n, (out, snap) = await hops(lambda: memory.append_snapshot(SESSION, [user("m101")]))
    assert n == 0 and out[0].seq == 101 and snap.last_seq == 101
    n, won = await hops(lambda: memory.commit_compression(SESSION, {"text": "S"}, 0, 40, epoch=0))
    assert n == 1 and won is True
    n, won = await hops(lambda: memory.commit_compression(SESSION, {"text": "S"}, 0, 50, epoch=0))
    assert n == 1 and won is False  # a lost compare-and-set is one hop too
    n, snap = await hops(lambda: memory.snapshot(SESSION))
    assert n == 0 and snap.first_seq == 41 and snap.record is not None
    n, lease = await hops(lambda: memory.acquire_lease("compress:s", 5.0))
    assert n == 1 and lease is not None
    n, refused = await hops(lambda: memory.acquire_lease("compress:s", 5.0))
    assert n == 1 and refused is None
    n, released = await hops(lambda: memory.release_lease(lease))
    assert n == 1 and released is True

    others: list[Callable[[], Awaitable[Any]]] = [
        lambda: memory.get_history(SESSION, limit=5),
        lambda: memory.get_archived(SESSION, epoch=0),
        lambda: memory.trim_history(SESSION, keep_recent=10),
        lambda: memory.save_metadata("ns", SESSION, {"v": 1}),
        lambda: memory.save_metadata("ns", SESSION, {"v": 2}, expected_version=1),
        lambda: memory.get_metadata("ns", SESSION),
        lambda: memory.list_metadata("ns"),
        lambda: memory.delete_metadata("ns", SESSION, expected_version=2),
        lambda: memory.delete_messages(SESSION, [95, 96]),
        lambda: memory.list_sessions(),
        lambda: memory.clear(SESSION),
        lambda: memory.forget("warm-up"),
    ]
    for call in others:
        assert (await hops(call))[0] == 1


async def test_a_short_call_never_waits_on_the_event_loop_for_another_connection(
    memory: SQLiteMemory, tmp_path: Path
) -> None:
    """While another connection (another process) holds the write lock, an append does not
    wait on the event loop's thread: it goes to the worker, which waits there, and the loop
    runs on; it lands once the lock is free, nothing written twice."""
    await memory.append(SESSION, [user("first")])  # opens the file
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with counting_hops() as count:
            task = asyncio.create_task(memory.append(SESSION, [user("second")]))
            ticks = 0
            for _ in range(10):
                await asyncio.sleep(0.01)
                ticks += 1
            assert not task.done() and ticks == 10  # the loop ran on
            other.execute("COMMIT")
            out = await asyncio.wait_for(task, 10)
        assert count[0] == 1 and [m.seq for m in out] == [2]
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
    snap = await memory.snapshot(SESSION)
    assert [m.content for m in snap.messages] == ["first", "second"]


async def test_the_worker_waits_for_another_connection_after_short_calls(
    memory: SQLiteMemory, tmp_path: Path
) -> None:
    """The loop's short calls leave the busy timeout at 0 (not set again around each one); the
    worker's next job waits for another connection's lock as before, up to the busy timeout."""

    def busy_timeout() -> int:
        assert memory._db is not None  # noqa: SLF001
        return int(memory._db.execute("PRAGMA busy_timeout").fetchone()[0])  # noqa: SLF001

    await memory.append(SESSION, [user("first")])  # opens the file (in the worker)
    for i in range(3):
        await memory.append_snapshot(SESSION, [user(f"m{i}")])
        assert busy_timeout() == 0
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        saved = asyncio.create_task(memory.save_metadata("ns", SESSION, {"v": 1}))
        await asyncio.sleep(0.3)  # longer than no wait at all; the job is still waiting
        assert not saved.done()
        other.execute("COMMIT")
        assert await asyncio.wait_for(saved, 10) == 1
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
    assert busy_timeout() == 10_000
    out, snap = await memory.append_snapshot(SESSION, [user("last")])
    assert busy_timeout() == 0 and out[0].seq == 5 and snap.last_seq == 5


async def test_a_short_call_waits_for_the_worker_when_it_holds_the_connection(
    memory: SQLiteMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short call made while the worker is inside a transaction never runs beside it on the
    same connection: it queues behind it, in the worker, and sees what that one committed."""
    await memory.append(SESSION, [user(f"m{i}") for i in range(6)])
    inside, release = threading.Event(), threading.Event()
    catch_up = sqlite_backend._catch_up  # noqa: SLF001

    def held(db: sqlite3.Connection, session_id: str) -> None:
        inside.set()
        release.wait(10)
        catch_up(db, session_id)

    monkeypatch.setattr(sqlite_backend, "_catch_up", held)
    task = asyncio.create_task(memory.commit_compression(SESSION, {"text": "S"}, 0, 4, epoch=0))
    await asyncio.to_thread(inside.wait, 10)
    with counting_hops() as count:
        append = asyncio.create_task(memory.append(SESSION, [user("late")]))
        await asyncio.sleep(0.05)
        assert not append.done()  # waiting for the connection, not running beside the commit
        release.set()
        assert await task is True
        [late] = await append
    assert late.seq == 7 and count[0] >= 1
    snap = await memory.snapshot(SESSION)
    assert snap.first_seq == 5 and snap.record is not None


async def test_an_archive_checkpoints_the_wal_beside_the_store(tmp_path: Path) -> None:
    """After an archive the WAL is checkpointed on a connection and a thread of their own (a
    turn's append, on the event loop's thread, no longer runs SQLite's automatic checkpoint
    every thousand pages: several milliseconds each); the store's own calls go on meanwhile,
    and closing the store ends that thread."""
    path = tmp_path / "wal.db"
    memory = SQLiteMemory(path, counter)
    try:
        text = "the flight was moved to gate B12 because of the storm " * 20
        await memory.append(SESSION, [user(f"{i} {text}") for i in range(200)])
        before = path.stat().st_size  # the messages are in the WAL only
        assert Path(f"{path}-wal").stat().st_size > before
        assert await memory.commit_compression(SESSION, {"text": "S"}, 0, 150, epoch=0)
        checkpoints = memory._checkpoints  # noqa: SLF001
        assert checkpoints is not None and checkpoints._running is not None
        await asyncio.wrap_future(checkpoints._running)
        assert path.stat().st_size > before + 200 * len(text) // 2  # copied into the file
        assert (await memory.snapshot(SESSION)).first_seq == 151
        assert checkpoints._executor is not None
        threads = list(checkpoints._executor._threads)  # this store's checkpoint thread
        assert threads
    finally:
        await memory.close()
    for thread in threads:
        await asyncio.to_thread(thread.join, 5)
        assert not thread.is_alive()


def count_checkpoints(memory: SQLiteMemory) -> list[float]:
    """The monotonic times at which ``memory``'s checkpoints start from now on."""
    checkpoints = memory._checkpoints  # noqa: SLF001
    assert checkpoints is not None
    run = checkpoints._checkpoint
    started: list[float] = []

    def counted() -> None:
        started.append(time.monotonic())
        run()

    checkpoints._checkpoint = counted  # type: ignore[method-assign]
    return started


async def test_archives_close_together_share_one_checkpoint(tmp_path: Path) -> None:
    """A host that archives at every turn (a trim after each reply) got a checkpoint at every
    turn, each competing with the next turn for the CPU (the whole turn 1.32-1.38 ms at the
    median, 1.04-1.10 without, in ``bench/overhead.py --flatness`` on SQLite). Checkpoints now
    start at most every ``CHECKPOINT_INTERVAL_S``: the first archive's at once, the archives
    that follow within the interval share one at its end, so the last archive's pages are still
    checkpointed."""
    path = tmp_path / "wal.db"
    memory = SQLiteMemory(path, counter)
    started = count_checkpoints(memory)
    checkpoints = memory._checkpoints  # noqa: SLF001
    assert checkpoints is not None
    try:
        text = "the flight was moved to gate B12 because of the storm " * 20
        await memory.append(SESSION, [user(f"{i} {text}") for i in range(40)])
        first = time.monotonic()
        for keep in range(30, 10, -1):  # twenty archives, one right after the other
            assert await memory.trim_history(SESSION, keep_recent=keep)
        assert time.monotonic() - first < CHECKPOINT_INTERVAL_S  # all within one interval
        await asyncio.sleep(0.05)
        assert len(started) == 1  # the first archive's, at once
        await asyncio.sleep(CHECKPOINT_INTERVAL_S + 0.1)
        assert len(started) == 2  # one more for the nineteen that followed, at the end
        assert started[1] - started[0] >= CHECKPOINT_INTERVAL_S * 0.9
        assert checkpoints._running is not None
        await asyncio.wrap_future(checkpoints._running)
        wal = sqlite3.connect(path)
        try:  # nothing left to copy: the last archive's pages are in the file
            busy, log_frames, done = wal.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            wal.close()
        assert busy == 0 and done == log_frames
        await asyncio.sleep(CHECKPOINT_INTERVAL_S + 0.1)
        assert len(started) == 2  # nothing archived since: no more checkpoints
        assert await memory.trim_history(SESSION, keep_recent=5)
        await asyncio.sleep(0.05)
        assert len(started) == 3  # an archive after a quiet interval: at once again
    finally:
        await memory.close()


async def test_closing_the_store_cancels_a_checkpoint_it_put_off(tmp_path: Path) -> None:
    memory = SQLiteMemory(tmp_path / "wal.db", counter)
    await memory.append(SESSION, [user(f"m{i}") for i in range(10)])
    assert await memory.trim_history(SESSION, keep_recent=8)
    assert await memory.trim_history(SESSION, keep_recent=6)  # put off to the interval's end
    checkpoints = memory._checkpoints  # noqa: SLF001
    assert checkpoints is not None and checkpoints._deferred is not None
    await memory.close()
    assert checkpoints._deferred is None and checkpoints._executor is None


async def test_with_a_trace_callback_every_call_runs_in_the_worker(
    traced: tuple[SQLiteMemory, Trace],
) -> None:
    memory, trace = traced
    await memory.append_snapshot(SESSION, [user("a")])
    await memory.snapshot(SESSION)
    threads = {thread for _, thread in trace.statements}
    assert trace.statements and threading.current_thread() not in threads


async def test_a_call_runs_its_statements_in_one_transaction_in_the_worker_thread(
    traced: tuple[SQLiteMemory, Trace],
) -> None:
    memory, trace = traced
    await memory.append(SESSION, [user(f"m{i}") for i in range(6)])

    for call, begin in [
        (lambda: memory.snapshot(SESSION), "BEGIN"),
        (
            lambda: memory.commit_compression(SESSION, {"text": "S"}, 0, 3, epoch=0),
            "BEGIN IMMEDIATE",
        ),
        (lambda: memory.append(SESSION, [user("a"), user("b")]), "BEGIN IMMEDIATE"),
        (lambda: memory.acquire_lease("L", 5.0), "BEGIN IMMEDIATE"),
    ]:
        trace.clear()
        await call()
        sql = trace.sql()
        assert sql[0] == begin and sql[-1] == "COMMIT", sql
        assert len(sql) >= 4  # several statements, one hop
        assert not any(s in ("BEGIN", "BEGIN IMMEDIATE", "COMMIT") for s in sql[1:-1]), sql
        threads = {thread for _, thread in trace.statements}
        assert len(threads) == 1 and threading.current_thread() not in threads

    # Statement order the crash points of tests/procs.py rely on.
    trace.clear()
    await memory.commit_compression(SESSION, {"text": "T"}, 1, 5, epoch=0)
    sql = trace.sql()
    metadata = next(i for i, s in enumerate(sql) if s.startswith("INSERT INTO metadata"))
    archive = next(i for i, s in enumerate(sql) if s.startswith("UPDATE messages SET archived"))
    assert "'summary'" in sql[metadata] and metadata < archive
    trace.clear()
    await memory.append(SESSION, [Message(role="assistant", content="[m]", kind="event-marker")])
    sql = trace.sql()
    insert = next(i for i, s in enumerate(sql) if s.startswith("INSERT INTO messages"))
    assert "'event-marker'" in sql[insert] and insert < len(sql) - 1 and sql[-1] == "COMMIT"


async def test_removing_the_trace_callback(traced: tuple[SQLiteMemory, Trace]) -> None:
    memory, trace = traced
    await memory.get_epoch(SESSION)
    assert trace.statements
    await memory.set_trace_callback(None)
    trace.clear()
    await memory.get_epoch(SESSION)
    assert trace.statements == []


# -- cancellation ----------------------------------------------------------------------------------


async def test_cancelled_while_running_commit_compression_commits_whole(
    traced: tuple[SQLiteMemory, Trace],
) -> None:
    memory, trace = traced
    await memory.append(SESSION, [user(f"m{i}") for i in range(6)])
    before = stored(memory.path)

    # Hold the worker inside the transaction: the summary is written, the archive is not yet.
    trace.arm("UPDATE messages SET archived")
    task = asyncio.create_task(memory.commit_compression(SESSION, {"text": "S"}, 0, 4, epoch=0))
    await trace.wait_held()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stored(memory.path) == before  # other connections see nothing of it yet
    later = asyncio.create_task(memory.get_history(SESSION))  # queued behind the held job
    await asyncio.sleep(0.05)
    assert not later.done()

    trace.release()
    # The job went on by itself and committed everything; the next call ran after it.
    assert [m.seq for m in await later] == [5, 6]
    messages, records = stored(memory.path)
    assert messages == [
        (1, "summarized"),
        (2, "summarized"),
        (3, "summarized"),
        (4, "summarized"),
        (5, None),
        (6, None),
    ]
    assert records == [('{"text":"S"}', 1)]
    # And the backend is usable.
    assert await memory.commit_compression(SESSION, {"text": "T"}, 1, 6, epoch=0) is True
    assert await memory.get_history(SESSION) == []


async def test_cancelled_while_queued_commit_compression_never_runs(
    traced: tuple[SQLiteMemory, Trace],
) -> None:
    memory, trace = traced
    await memory.append(SESSION, [user(f"m{i}") for i in range(6)])
    before = stored(memory.path)

    trace.arm("SELECT epoch FROM sessions")  # an earlier call holds the worker
    blocker = asyncio.create_task(memory.get_epoch(SESSION))
    await trace.wait_held()
    task = asyncio.create_task(memory.commit_compression(SESSION, {"text": "S"}, 0, 4, epoch=0))
    await asyncio.sleep(0.01)  # submitted, waiting behind the blocker
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    trace.release()
    assert await blocker == 0

    assert stored(memory.path) == before
    assert not any("INSERT INTO metadata" in s for s in trace.sql())
    snap = await memory.snapshot(SESSION)
    assert snap.record is None and len(snap.messages) == 6
    assert await memory.commit_compression(SESSION, {"text": "S"}, 0, 4, epoch=0) is True


@pytest.mark.parametrize("delay", [None, 0.0, 0.0002, 0.0005, 0.001, 0.002, 0.005])
async def test_cancelling_commit_compression_at_any_moment_is_all_or_nothing(
    memory: SQLiteMemory, delay: float | None
) -> None:
    for round_ in range(8):
        session = f"{SESSION}{round_}"
        await memory.append(session, [user(f"m{i}") for i in range(10)])
        task = asyncio.create_task(memory.commit_compression(session, {"text": "S"}, 0, 7, epoch=0))
        if delay is not None:
            await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        snap = await memory.snapshot(session)
        if snap.record is None:
            assert [m.seq for m in snap.messages] == list(range(1, 11))
            assert await memory.get_archived(session) == []
        else:
            assert (snap.record.value, snap.record.version) == ({"text": "S"}, 1)
            assert [m.seq for m in snap.messages] == [8, 9, 10]
            assert len(await memory.get_archived(session)) == 7


async def test_an_error_inside_the_transaction_rolls_it_back(
    memory: SQLiteMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    await memory.append(SESSION, [user(f"m{i}") for i in range(6)])
    before = stored(memory.path)

    def broken(*args: Any) -> None:  # after the summary record was written
        raise sqlite3.OperationalError("disk I/O error (simulated)")

    monkeypatch.setattr(sqlite_backend, "_archive", broken)
    with pytest.raises(sqlite3.OperationalError, match="simulated"):
        await memory.commit_compression(SESSION, {"text": "S"}, 0, 4, epoch=0)
    assert stored(memory.path) == before
    monkeypatch.undo()

    assert await memory.commit_compression(SESSION, {"text": "S"}, 0, 4, epoch=0) is True
    assert [m.seq for m in await memory.get_history(SESSION)] == [5, 6]


# -- opening and closing ---------------------------------------------------------------------------


async def test_nothing_is_opened_before_the_first_call(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "lazy.db"
    store = SQLiteMemory(path, counter)
    assert not path.exists()
    await store.close()
    await store.close()
    assert not path.exists()
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.get_epoch(SESSION),
        lambda: store.set_trace_callback(None),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="closed"):
            await call()


async def test_private_memory_database(tmp_path: Path) -> None:
    one, two = SQLiteMemory(":memory:", counter), SQLiteMemory(":memory:", counter)
    try:
        await one.append(SESSION, [user("only in one")])
        assert [m.content for m in (await one.snapshot(SESSION)).messages] == ["only in one"]
        assert await two.get_history(SESSION) == []
    finally:
        await one.close()
        await two.close()
    assert not list(tmp_path.iterdir())


async def test_close_lets_calls_already_made_finish(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    store = SQLiteMemory(path, counter)
    trace = Trace()
    await store.set_trace_callback(trace)
    await store.get_epoch("warm-up")
    worker = trace.statements[0][1]
    assert worker is not threading.current_thread() and worker.is_alive()

    tasks = [asyncio.create_task(store.append(SESSION, [user(f"m{i}")])) for i in range(5)]
    await asyncio.sleep(0)  # every append is submitted
    await store.close()
    assert sorted(m.seq or 0 for t in tasks for m in t.result()) == [1, 2, 3, 4, 5]
    assert stored(path)[0] == [(i, None) for i in range(1, 6)]
    with pytest.raises(RuntimeError, match="closed"):
        await store.append(SESSION, [user("late")])
    with pytest.raises(RuntimeError, match="closed"):
        await store.snapshot(SESSION)
    await store.close()
    worker.join(10)
    assert not worker.is_alive()


async def test_close_waits_for_a_running_transaction_even_when_cancelled(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "store.db")
    store = SQLiteMemory(path, counter)
    trace = Trace()
    await store.set_trace_callback(trace)
    try:
        await store.append(SESSION, [user(f"m{i}") for i in range(4)])
        worker = trace.statements[0][1]
        trace.arm("UPDATE messages SET archived")
        commit = asyncio.create_task(
            store.commit_compression(SESSION, {"text": "S"}, 0, 2, epoch=0)
        )
        await trace.wait_held()
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0.05)
        assert not closing.done()  # the transaction is still running
        with pytest.raises(RuntimeError, match="closed"):
            await store.get_epoch(SESSION)  # closed already for new calls
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
    finally:
        trace.release()
    assert await commit is True
    await store.close()  # waits for the closing the cancelled call started
    worker.join(10)
    assert not worker.is_alive()
    messages, records = stored(path)
    assert messages == [(1, "summarized"), (2, "summarized"), (3, None), (4, None)]
    assert records == [('{"text":"S"}', 1)]


# -- snapshots while no other connection writes ------------------------------------------------------


def reads_messages(sql: list[str]) -> bool:
    return any(s.startswith("SELECT") and "FROM messages" in s for s in sql)


async def test_a_snapshot_reads_no_rows_while_only_this_store_appended(
    traced: tuple[SQLiteMemory, Trace],
) -> None:
    """The rows the last snapshot read, and those this store appended since, are the session
    while no other connection committed (``PRAGMA data_version``): no ``SELECT`` of them."""
    memory, trace = traced
    await memory.append(SESSION, [user(f"m{i}") for i in range(5)])
    await memory.save_metadata("summary", SESSION, {"text": "S"})
    first = await memory.snapshot(SESSION)  # reads (a write of its own came before)
    trace.clear()
    again = await memory.snapshot(SESSION)
    assert not reads_messages(trace.sql()) and "PRAGMA data_version" in trace.sql()
    assert again == first
    trace.clear()
    [added], fused = await memory.append_snapshot(SESSION, [user("m5")])
    assert not reads_messages(trace.sql())
    assert [m.content for m in fused.messages] == [f"m{i}" for i in range(6)]
    assert fused.record is not None and fused.record.value == {"text": "S"}
    await memory.append(SESSION, [user("m6")])
    trace.clear()
    snap = await memory.snapshot(SESSION)
    assert not reads_messages(trace.sql()) and snap.last_seq == 7 and added.seq == 6
    assert [(m.seq, m.content) for m in snap.messages] == [
        (m.seq, m.content) for m in await memory.get_history(SESSION)
    ]


@pytest.mark.parametrize(
    "write",
    [
        lambda m: m.commit_compression(SESSION, {"text": "T"}, 1, 3, epoch=0),
        lambda m: m.trim_history(SESSION, keep_recent=2),
        lambda m: m.clear(SESSION),
        lambda m: m.delete_messages(SESSION, [4]),
        lambda m: m.save_metadata("summary", SESSION, {"text": "U"}),
        lambda m: m.delete_metadata("summary", SESSION),
        lambda m: m.forget(SESSION),
    ],
)
async def test_a_snapshot_after_any_other_write_reads_again(
    write: Callable[[SQLiteMemory], Awaitable[Any]], tmp_path: Path
) -> None:
    """Whichever store on the file writes (this one or another), the next snapshot is what a
    fresh store reads."""
    for writer_is_other in (False, True):
        path = tmp_path / f"{writer_is_other}.db"
        memory, other = SQLiteMemory(path, counter), SQLiteMemory(path, counter)
        try:
            await memory.append(SESSION, [user(f"m{i}") for i in range(5)])
            await memory.save_metadata("summary", SESSION, {"text": "S"})
            await memory.snapshot(SESSION)
            await memory.snapshot(SESSION)  # kept
            await write(other if writer_is_other else memory)
            seen = await memory.snapshot(SESSION)
            fresh = SQLiteMemory(path, counter)
            try:
                assert seen == await fresh.snapshot(SESSION)
            finally:
                await fresh.close()
            _, fused = await memory.append_snapshot(SESSION, [user("late")])
            assert fused.messages[-1].content == "late"
            assert [m.seq for m in fused.messages] == [
                m.seq for m in await memory.get_history(SESSION)
            ]
        finally:
            await memory.close()
            await other.close()


async def test_a_failed_append_leaves_no_row_in_what_snapshots_keep(
    memory: SQLiteMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that fails after its rows were added to the kept reads (its rollback
    removes them from the file) drops what is kept: no snapshot shows a row never committed."""
    await memory.append(SESSION, [user("kept")])
    await memory.snapshot(SESSION)
    real = sqlite_backend._ActiveReads.read  # noqa: SLF001

    def failing(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(sqlite_backend._ActiveReads, "read", failing)  # noqa: SLF001
    with pytest.raises(sqlite3.OperationalError):
        await memory.append_snapshot(SESSION, [user("rolled back")])
    monkeypatch.setattr(sqlite_backend._ActiveReads, "read", real)  # noqa: SLF001
    snap = await memory.snapshot(SESSION)
    assert [m.content for m in snap.messages] == ["kept"]
    [late] = await memory.append(SESSION, [user("late")])
    assert late.seq == 2
    assert [m.content for m in (await memory.snapshot(SESSION)).messages] == ["kept", "late"]


async def test_a_new_connection_reads_again(memory: SQLiteMemory, tmp_path: Path) -> None:
    """``data_version`` counts per connection: after the store opens a new one (the old one
    was dropped), nothing kept from the old one is trusted."""
    await memory.append(SESSION, [user("a")])
    await memory.snapshot(SESSION)
    await memory.snapshot(SESSION)

    def drop() -> None:
        memory._close_connection()  # noqa: SLF001

    await memory._in_worker(drop)  # noqa: SLF001
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    other.execute("UPDATE messages SET body = ? WHERE seq = 1", ('{"content":"b"}',))
    other.close()
    assert [m.content for m in (await memory.snapshot(SESSION)).messages] == ["b"]


# -- opened at the host's start ----------------------------------------------------------------------


async def test_the_host_opens_the_file_at_start_so_a_first_turn_makes_no_hop(
    tmp_path: Path,
) -> None:
    """The first turn does not open the file (the worker, WAL, the schema): the host opened it
    at start, and the turn's store calls run on the event loop."""
    from host_stub.config import HostConfig
    from host_stub.host import Host
    from host_stub.testing import FakeLLM

    config = HostConfig.model_validate(
        {
            "host": {"model": "fake/chat", "memory": f"sqlite:///{tmp_path / 'h.db'}"},
            "plugins": {"allow": []},
        }
    )
    async with Host(config, llm=FakeLLM(default="ok")) as host:
        assert host.memory._db is not None  # noqa: SLF001
        n, result = await hops(lambda: host.run_turn("s", "hello"))
        assert n == 0 and result.outcome == "replied"
        assert [m.content for m in await host.memory.get_history("s")] == ["hello", "ok"]


async def test_a_file_that_cannot_be_opened_fails_the_start_and_is_closed(tmp_path: Path) -> None:
    from host_stub.config import HostConfig
    from host_stub.host import Host
    from host_stub.testing import FakeLLM

    path = tmp_path / "not-a-db.db"
    path.write_text("plain text, not SQLite\n" * 100)
    config = HostConfig.model_validate(
        {"host": {"model": "fake/chat", "memory": f"sqlite:///{path}"}, "plugins": {"allow": []}}
    )
    host = Host(config, llm=FakeLLM(default="ok"))
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ConnectionError, match="not a SQLite database"):
        await host.start()
    await asyncio.sleep(0.05)
    assert not {t.name for t in threading.enumerate()} - before  # no worker left behind
    assert path.read_text().startswith("plain text")


def test_a_checkpoint_put_off_on_an_ended_loop_does_not_stop_later_ones(tmp_path: Path) -> None:
    """A store used from one ``asyncio.run`` after another: a checkpoint put off on a loop that
    ended never ran; the next archive, on the new loop, still gets one."""
    memory = SQLiteMemory(tmp_path / "wal.db", counter)
    started = count_checkpoints(memory)
    checkpoints = memory._checkpoints  # noqa: SLF001
    assert checkpoints is not None

    async def two_archives() -> None:
        await memory.append(SESSION, [user(f"m{i}") for i in range(10)])
        assert await memory.trim_history(SESSION, keep_recent=8)
        assert await memory.trim_history(SESSION, keep_recent=6)  # put off

    asyncio.run(two_archives())
    assert checkpoints._deferred is not None and len(started) == 1

    async def later() -> None:
        await asyncio.sleep(CHECKPOINT_INTERVAL_S)
        assert await memory.trim_history(SESSION, keep_recent=4)
        await asyncio.sleep(0.05)
        await memory.close()

    asyncio.run(later())
    assert len(started) == 2
