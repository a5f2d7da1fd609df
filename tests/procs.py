"""Real host processes on one SQLite file, for the crash and race tests.

Children start from a ``forkserver`` whose process has already imported litellm (through
:func:`host_stub.llm.ensure_litellm`, ~3 s), the host, the plugin and the test doubles, so a child
is a fork of a warm interpreter and starts in milliseconds instead of seconds.

A child (:func:`child_main`) builds a real :class:`~host_stub.host.Host` on a SQLite file, with the
memory-summary plugin loaded from its entry point, a scripted LLM and the real SQLite backend, and
obeys a small command protocol (``turns``, ``compress``, ``clear``, ``drain``, ``stop``...) sent over
a pipe. Test-side instrumentation, no production hook:

* the LLM double (:class:`ProbeLLM`) reports ``llm`` when a summarizer call is in flight;
* the wrapped memory service (:class:`ProbeMemory`) reports ``before-commit`` when the summary is
  computed and ``commit_compression`` is about to run, and logs every lease hold
  ``(pid, name, t_acquire, t_release, released)``;
* a ``sqlite3`` trace callback on the backend's own connection (installed with
  ``SQLiteMemory.set_trace_callback``: it runs in the backend's worker thread, before each
  statement) reports ``in-commit`` inside ``commit_compression``'s transaction, after the summary
  record was written and before the archive ``UPDATE``, and ``marker`` inside the transaction
  that writes the compression's event marker, after its ``INSERT``.

At a point the child sends ``("at", point, info)`` to the parent (``info["pid"]`` is its pid). If
the point is the child's ``crash`` point it then blocks forever (the parent SIGKILLs it); if it is
one of its ``pauses`` it waits for the parent's event (once), then goes on.

:func:`run_cli` runs ``host-stub`` in a child the same way (fresh click state, litellm warm).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import queue
import signal
import sqlite3
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Set (only) in the environment the forkserver starts with: when it imports this module as a
#: preload, it pays for litellm once, for every child it will fork.
_PRELOAD_ENV = "PROCS_FORKSERVER_PRELOAD"

#: Imported once by the forkserver (which finds this module through ``PYTHONPATH``: Python 3.11's
#: forkserver ignores the ``sys_path`` it is handed).
PRELOAD = ["procs"]

SESSION_POINTS = ("llm", "before-commit", "in-commit", "marker")

#: Plugin settings of a child unless a test overrides them: compression only on request (the
#: threshold is out of reach), a short lease so a dead holder does not block for long, no
#: watermark triggers.
CHILD_PLUGIN: dict[str, Any] = {
    "threshold": 1000,
    "keep_recent": 4,
    "debounce_turns": 1,
    "auto_compress_threshold": 0,
    "hard_compress_threshold": 0,
    "lease_ttl_s": 1.0,
    "summary_timeout_s": 60,
    "shutdown_grace_s": 30,
}


# -- the forkserver ------------------------------------------------------------------------------

_ctx: Any = None
_ctx_lock = threading.Lock()


def context() -> Any:
    """The ``forkserver`` context, its server started with :data:`PRELOAD` imported."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            ctx = multiprocessing.get_context("forkserver")
            # A child re-runs the parent's main script as ``__mp_main__`` (pytest's console
            # script imports pytest): have the server import that once too.
            ctx.set_forkserver_preload(PRELOAD + [m for m in ("pytest",) if m in sys.modules])
            from multiprocessing import forkserver

            here = str(Path(__file__).resolve().parent)
            path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
            with _environ({_PRELOAD_ENV: "1", "PYTHONPATH": path}):
                forkserver.ensure_running()
            _ctx = ctx
    return _ctx


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- what a child is told -------------------------------------------------------------------------


@dataclass
class ChildSpec:
    db: str
    name: str = "child"
    #: Plugin config (``[plugin.memory-summary]``) on top of :data:`CHILD_PLUGIN`.
    plugin: dict[str, Any] = field(default_factory=dict)
    #: Report this point, then block until killed.
    crash: str | None = None
    #: Report these points, then wait for the event (once per point).
    pauses: dict[str, Any] = field(default_factory=dict)
    #: Seconds each summarizer call takes.
    llm_delay: float = 0.0
    #: A ``multiprocessing`` event ``compress``/``turns`` commands may wait for (``go=True``).
    go: Any = None
    #: JSONL files: lease holds, summarizer requests.
    lease_log: str | None = None
    llm_log: str | None = None


def _config(spec: ChildSpec) -> dict[str, Any]:
    return {
        "host": {"model": "fake/chat", "reserve_for_reply": 0, "memory": f"sqlite:///{spec.db}"},
        "plugins": {"allow": ["memory-summary"]},
        "plugin": {"memory-summary": {**CHILD_PLUGIN, **spec.plugin}},
    }


# -- instrumentation inside the child ---------------------------------------------------------------


class Probe:
    """Reports reached points to the parent and blocks or pauses there."""

    def __init__(self, spec: ChildSpec, events: Any) -> None:
        self.spec = spec
        self.events = events
        self.pauses = dict(spec.pauses)
        self.commit_armed = False
        self.marker_armed = False
        self.tx: list[str] = []

    def _report(self, point: str, info: dict[str, Any]) -> Any:
        self.events.put(("at", point, {"pid": os.getpid(), **info}))
        if point == self.spec.crash:
            # Stop here for good: the parent kills this process (or, should the parent itself
            # die first, this process leaves rather than hold the file's locks forever).
            parent = multiprocessing.parent_process()
            while True:
                time.sleep(0.5)
                if parent is not None and not parent.is_alive():
                    os._exit(3)
        return self.pauses.pop(point, None)

    def reach_sync(self, point: str, info: dict[str, Any]) -> None:
        gate = self._report(point, info)
        if gate is not None:
            gate.wait(120)

    async def reach(self, point: str, info: dict[str, Any]) -> None:
        gate = self._report(point, info)
        if gate is not None:
            await asyncio.get_running_loop().run_in_executor(None, gate.wait, 120)

    # sqlite3 trace callback: the backend's worker thread, before each statement runs.
    def trace(self, sql: str) -> None:
        head = sql.lstrip()[:40].upper()
        if head.startswith("BEGIN"):
            self.tx = []
        if (
            self.commit_armed
            and head.startswith("UPDATE MESSAGES SET ARCHIVED")
            and any(s.startswith("INSERT INTO metadata") and "'summary'" in s for s in self.tx)
        ):
            self.commit_armed = False
            self.reach_sync("in-commit", {"statements": list(self.tx), "next": sql})
        if (
            self.marker_armed
            and head.startswith("COMMIT")
            and any(s.startswith("INSERT INTO messages") and "'event-marker'" in s for s in self.tx)
        ):
            self.marker_armed = False
            self.reach_sync("marker", {"statements": list(self.tx), "next": sql})
        self.tx.append(sql)


class ProbeMemory:
    """The SQLite backend, with points around ``commit_compression`` and marker appends, and a
    log of lease holds. Everything else is the backend's own."""

    def __init__(self, inner: Any, probe: Probe) -> None:
        self._inner = inner
        self._probe = probe
        self._held: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def install_trace(self) -> None:
        await self._inner.set_trace_callback(self._probe.trace)

    async def append(self, session_id: str, messages: Any) -> Any:
        if any(m.kind == "event-marker" for m in messages):
            self._probe.marker_armed = True
        try:
            return await self._inner.append(session_id, messages)
        finally:
            self._probe.marker_armed = False

    async def commit_compression(
        self,
        session_id: str,
        record: Any,
        expected_version: int,
        archive_through_seq: int,
        **kwargs: Any,
    ) -> bool:
        await self._probe.reach(
            "before-commit",
            {
                "session_id": session_id,
                "expected_version": expected_version,
                "archive_through_seq": archive_through_seq,
                "epoch": kwargs.get("epoch"),
                "text": record.get("text", ""),
            },
        )
        self._probe.commit_armed = True
        try:
            return bool(
                await self._inner.commit_compression(
                    session_id, record, expected_version, archive_through_seq, **kwargs
                )
            )
        finally:
            self._probe.commit_armed = False

    async def acquire_lease(self, name: str, ttl_s: float) -> Any:
        lease = await self._inner.acquire_lease(name, ttl_s)
        if lease is not None:
            self._held[lease.token] = time.monotonic()
        return lease

    async def release_lease(self, lease: Any) -> bool:
        t_release = time.monotonic()
        released = bool(await self._inner.release_lease(lease))
        t_acquire = self._held.pop(lease.token, None)
        if self._probe.spec.lease_log and t_acquire is not None:
            line = {
                "pid": os.getpid(),
                "name": lease.name,
                "t_acquire": t_acquire,
                "t_release": t_release,
                "released": released,
            }
            with open(self._probe.spec.lease_log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
        return released


class ProbeLLM:
    """The scripted LLM, with the ``llm`` point and a log of every summarizer request."""

    def __init__(self, inner: Any, probe: Probe) -> None:
        self._inner = inner
        self._probe = probe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def complete(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        sent = [m if isinstance(m, dict) else m.to_openai() for m in messages]
        spec = self._probe.spec
        if spec.llm_log:
            with open(spec.llm_log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "messages": sent}) + "\n")
        await self._probe.reach("llm", {"model": kwargs.get("model")})
        if spec.llm_delay:
            await asyncio.sleep(spec.llm_delay)
        return await self._inner.complete(messages, *args, **kwargs)


# -- the child --------------------------------------------------------------------------------------


def turn_texts(prefix: str, i: int) -> tuple[str, str]:
    """A turn's user and assistant text; unique, and never a substring of another turn's."""
    return f"{prefix} user <{i:05d}>", f"{prefix} reply <{i:05d}>"


class _Child:
    def __init__(self, spec: ChildSpec, events: Any) -> None:
        self.spec = spec
        self.events = events
        self.probe = Probe(spec, events)
        self.statuses: list[dict[str, Any]] = []
        self.host: Any = None

    async def start(self) -> None:
        from plugin_harness import json_summary

        from host_stub import signals
        from host_stub.config import HostConfig
        from host_stub.host import Host
        from host_stub.memory.sqlite import SQLiteMemory
        from host_stub.testing import FakeLLM, message_tokens

        memory = ProbeMemory(SQLiteMemory(self.spec.db, token_counter=message_tokens), self.probe)
        await memory.install_trace()
        llm = ProbeLLM(FakeLLM(default=json_summary), self.probe)
        self.host = Host(HostConfig.model_validate(_config(self.spec)), memory=memory, llm=llm)
        await self.host.start()

        async def on_status(sender: Any, **payload: Any) -> None:
            self.statuses.append(
                {k: payload[k] for k in ("request_id", "session_id", "status", "reason")}
            )

        self.host.bus.connect(signals.SESSION_COMPRESSING, on_status)

    @property
    def plugin(self) -> Any:
        return self.host.get_plugin("memory-summary")

    async def _go(self, wait: bool) -> None:
        if wait and self.spec.go is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.spec.go.wait, 60)

    async def op_turns(self, session: str, start: int, n: int, go: bool = False) -> list[Any]:
        from host_stub.messages import Message

        await self._go(go)
        out = []
        for i in range(start, start + n):
            user, reply = turn_texts(self.spec.name, i)
            result = await self.host.run_turn(
                session, user, recorded=[Message(role="assistant", content=reply)]
            )
            out.extend(
                {"seq": m.seq, "role": m.role, "content": m.content} for m in result.messages
            )
        return out

    async def op_compress(self, session: str, go: bool = False) -> dict[str, Any]:
        await self._go(go)
        result = await self.plugin.compress(session)
        return {"status": result["status"], "reason": result["reason"]}

    async def op_clear(self, session: str | None) -> Any:
        return json.loads(json.dumps(await self.host.clear(session), default=str))

    async def op_summary(self, session: str) -> str | None:
        return await self.plugin.get_conversation_summary(session)

    async def op_drain(self) -> list[dict[str, Any]]:
        """Wait until every compression request this process saw has its final status."""
        for _ in range(6000):
            started = {s["request_id"] for s in self.statuses if s["status"] == "start"}
            final = {s["request_id"] for s in self.statuses if s["status"] != "start"}
            if started <= final:
                break
            await asyncio.sleep(0.01)
        return list(self.statuses)

    async def serve(self, commands: Any) -> None:
        loop = asyncio.get_running_loop()
        self.events.put(("ready", os.getpid(), None))
        while True:
            op, args = await loop.run_in_executor(None, commands.recv)
            if op == "stop":
                break
            try:
                value = await getattr(self, f"op_{op}")(*args)
            except Exception:
                self.events.put(("error", op, traceback.format_exc()))
            else:
                self.events.put(("result", op, value))
        await self.host.stop()
        self.events.put(("stopped", os.getpid(), None))


def child_main(spec: ChildSpec, commands: Any, events: Any) -> None:
    """Entry point of a child process."""

    async def run() -> None:
        child = _Child(spec, events)
        try:
            await child.start()
        except Exception:
            events.put(("error", "start", traceback.format_exc()))
            return
        await child.serve(commands)

    asyncio.run(run())


# -- the parent's handle -----------------------------------------------------------------------------


class ChildError(AssertionError):
    pass


class Child:
    """A started child process; use as a context manager (it is killed on the way out unless
    it stopped)."""

    def __init__(self, spec: ChildSpec) -> None:
        ctx = context()
        self.spec = spec
        self.events = ctx.Queue()
        # One-way pipe: the parent writes commands, the child reads them.
        self._reader, self._writer = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=child_main,
            args=(spec, self._reader, self.events),
            name=f"host-{spec.name}",
            daemon=True,
        )
        self.reached: list[tuple[str, dict[str, Any]]] = []
        self._results: list[tuple[str, Any]] = []
        self.pid: int | None = None
        #: Seconds from ``start()`` to the child's ``ready`` (host started).
        self.started_s = 0.0

    def start(self, timeout: float = 60) -> Child:
        t0 = time.monotonic()
        self.process.start()
        self._reader.close()
        _, pid, _ = self._next(timeout, ("ready",))
        self.pid = pid
        self.started_s = time.monotonic() - t0
        return self

    def __enter__(self) -> Child:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        if self.process.is_alive():
            self.kill()
        self.events.close()
        self.events.join_thread()
        with contextlib.suppress(Exception):
            self._writer.close()

    def _next(self, timeout: float, wanted: tuple[str, ...]) -> tuple[str, Any, Any]:
        """The next event of a wanted kind; ``at`` events are collected on the way, errors
        raise."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChildError(
                    f"{self.spec.name}: no {wanted} event within {timeout}s "
                    f"(alive={self.process.is_alive()}, reached={[p for p, _ in self.reached]}, "
                    f"results={self._results})"
                )
            try:
                kind, a, b = self.events.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                if not self.process.is_alive() and self.events.empty():
                    raise ChildError(
                        f"{self.spec.name}: exited ({self.process.exitcode}) while waiting for "
                        f"{wanted}"
                    ) from None
                continue
            if kind == "error":
                raise ChildError(f"{self.spec.name}: {a} failed in the child:\n{b}")
            if kind == "at":
                self.reached.append((a, b))
                if "at" in wanted:
                    return kind, a, b
                continue
            if kind in wanted:
                return kind, a, b
            if kind == "result":
                self._results.append((a, b))

    def send(self, op: str, *args: Any) -> None:
        self._writer.send((op, args))

    def result(self, op: str, timeout: float = 60) -> Any:
        if self._results:
            got, value = self._results.pop(0)
        else:
            _, got, value = self._next(timeout, ("result",))
        assert got == op, f"{self.spec.name}: expected the result of {op}, got {got}"
        return value

    def call(self, op: str, *args: Any, timeout: float = 60) -> Any:
        self.send(op, *args)
        return self.result(op, timeout)

    def wait_at(self, point: str, timeout: float = 60) -> dict[str, Any]:
        """Wait until the child reports ``point`` (already reported counts); return its info."""
        for p, info in self.reached:
            if p == point:
                return info
        while True:
            _, p, info = self._next(timeout, ("at",))
            if p == point:
                return info

    def kill(self) -> int:
        """SIGKILL, reap, and return the exit code (``-SIGKILL``)."""
        assert self.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.process.join(30)
        assert not self.process.is_alive(), f"{self.spec.name}: still alive after SIGKILL"
        return int(self.process.exitcode or 0)

    def stop(self, timeout: float = 60) -> None:
        self.send("stop")
        self._next(timeout, ("stopped",))
        self.process.join(timeout)
        if self.process.is_alive():
            self.kill()
            raise ChildError(f"{self.spec.name}: did not exit after stop")
        assert self.process.exitcode == 0, f"{self.spec.name}: exit code {self.process.exitcode}"


@contextlib.contextmanager
def children(*specs: ChildSpec) -> Iterator[list[Child]]:
    """Start several children at once (the forks run in parallel)."""
    started: list[Child] = []
    try:
        for spec in specs:
            started.append(Child(spec).start())
        yield started
    finally:
        for child in started:
            child.__exit__(None, None, None)


# -- the command line in a child ------------------------------------------------------------------------


def _cli_child(argv: list[str], out: Any) -> None:
    import io

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            from host_stub.cli import main

            code: Any = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # what a user would see: a traceback, exit status 1
            traceback.print_exc()
            code = 1
    out.put((code, stdout.getvalue(), stderr.getvalue()))


def run_cli(argv: list[str], timeout: float = 120) -> tuple[int, str, str]:
    """``host-stub ARGV`` in a child (litellm already imported, click's state fresh): exit code,
    stdout and stderr. An exception escaping ``main`` counts as exit status 1, traceback on
    stderr, as it would for a user."""
    ctx = context()
    out = ctx.Queue()
    process = ctx.Process(target=_cli_child, args=(list(argv), out), daemon=True)
    process.start()
    try:
        code, stdout, stderr = out.get(timeout=timeout)
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
        out.close()
        out.join_thread()
    return int(code or 0), stdout, stderr


# -- reading the file the way an operator would ---------------------------------------------------------


def raw(db: str | Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of a read-only query on the file (no backend code involved)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return list(con.execute(sql, params))
    finally:
        con.close()


def summary_row(db: str | Path, session: str) -> tuple[Any, ...] | None:
    """``(value, version, deleted)`` of the session's summary record, or ``None``."""
    rows = raw(
        db,
        "SELECT value, version, deleted FROM metadata WHERE namespace = 'summary' AND key = ?",
        (session,),
    )
    return rows[0] if rows else None


def archived_counts(db: str | Path, session: str) -> dict[str | None, int]:
    rows = raw(
        db,
        "SELECT archived, COUNT(*) FROM messages WHERE session_id = ? GROUP BY archived",
        (session,),
    )
    return {reason: n for reason, n in rows}


def dump(db: str | Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the store's tables (leases aside: they come and go), for before/after
    comparisons; empty when the file does not exist."""
    if not Path(db).exists():
        return {}
    return {
        table: sorted(raw(db, f"SELECT * FROM {table}"), key=repr)
        for table in ("sessions", "messages", "metadata")
    }


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line]


# Preload side effect: only in the forkserver (see :func:`context`).
if os.environ.get(_PRELOAD_ENV) == "1":
    from host_stub.llm import ensure_litellm

    ensure_litellm()
    import plugin_harness  # noqa: F401

    import host_stub.cli  # noqa: F401
    import host_stub.host  # noqa: F401
    import host_stub.memory.sqlite  # noqa: F401
    import host_stub.testing  # noqa: F401
    import plugin_memory_summary  # noqa: F401
