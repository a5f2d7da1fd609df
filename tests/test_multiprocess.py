"""Four host processes on one shared store (PostgreSQL, Redis, and SQLite as a bonus): shared
sessions, turns and ``session:compress`` requests from every process at once.

Each child is a fork of the warm ``forkserver`` of :mod:`procs` (litellm, the host, the plugin
and the test doubles already imported) and builds a real :class:`~host_stub.host.Host` on the
shared URL with the memory-summary plugin loaded from its entry point, a :class:`FakeLLM`
summarizer with a fixed latency answering valid JSON, and a small ``threshold`` /
``keep_recent`` so compressions are frequent. On the start line every child runs replayed turns
(``Host.run_turn(..., recorded=[reply])``) over all the sessions, interleaved, with a few
concurrent workers, and sends ``session:compress`` for a random session every few turns.

Instrumentation is test-side only: the memory service injected into the child's host is wrapped
(:class:`LoggedMemory`) and logs to a per-child JSONL file what the child appended (with the seq
the store returned), every lease hold (session, token, acquire / release times) and every
``commit_compression`` (the lease token held for its session in that process at the time, the
expected and new version, ``covered_up_to_seq`` of the record, won or lost). The
``session:compressing`` statuses are logged too.

While the children run, the parent checks every session with :class:`InvariantChecker` over and
over (no message lost, archive reasons never change, coverage and versions never go back, no
active message covered); on PostgreSQL it also watches the raw ``archived_at`` of every archived
row, which would change if a row were archived a second time. Afterwards, per session:

* seqs are gapless and each is either active or archived, and every seq the children were given
  by ``append`` is there, unchanged; nothing is there that no child appended;
* every archived message is archived ``summarized`` (this workload uses neither the ``window``
  strategy nor the ``trim`` fallback) with ``seq <= covered_up_to_seq`` of the final record, and
  no active message is covered by it;
* the winning commits have expected versions ``0, 1, ..., n-1`` (no two winners on one version),
  the final record is at version ``n``, ``covered_up_to_seq`` never goes back along them, and
  their wall order is their version order; no commit lost a race (the lease excludes every
  other compressor, and nothing else writes the record in this workload);
* lease holds of a session never overlap, across processes, and every release found its lease;
* every commit ran inside a lease hold of its session, by the same process and with that hold's
  token, and no hold produced more than one winning commit;
* each process's ``session:compressing`` reports (``stats.covered_up_to_seq``) name exactly the
  compressions it won.

Times. Every time is ``time.monotonic()``, i.e. ``CLOCK_MONOTONIC`` on Linux, which is one
system-wide clock: values from different processes on one machine compare directly (the server's
clock would do too, but Redis hands back no server time for a lease and the release time would
need an extra round trip). No tolerance is needed because the logged interval of a hold is an
*inner* bound of the real one: ``t_acquire`` is taken after ``acquire_lease`` returned (the
server granted it earlier) and ``t_release`` before ``release_lease`` is called (the server
drops it later). Two logged holds that overlap therefore overlapped on the server: the check
raises no false alarm; it can only miss an overlap shorter than a round trip (two compressions
that overlapped at all would still show as a commit that lost the version race).

The second test runs two processes on one session whose summarizer calls would outlive the lease:
the run must end (by the rules engine) before its lease does; see its docstring.

Size: ``MEMORY_SUMMARY_MP_PROCS`` (4), ``MEMORY_SUMMARY_MP_SESSIONS`` (50),
``MEMORY_SUMMARY_MP_TURNS`` (turns per process per session, 5), ``MEMORY_SUMMARY_MP_LLM_MS``
(summarizer latency, 20). The default size runs in well under a minute per backend (a bigger
run may need pytest's ``--timeout`` raised: every test has 300 s by default). Without a
PostgreSQL / Redis server the test skips, except when ``CI=true``, where it fails (the helpers of
``test_memory_contract`` decide, as for the contract tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import random
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from plugin_memory_summary.plugin import LEASE_BUSY

PROCS = int(os.environ.get("MEMORY_SUMMARY_MP_PROCS", "4"))
SESSIONS = int(os.environ.get("MEMORY_SUMMARY_MP_SESSIONS", "50"))
TURNS = int(os.environ.get("MEMORY_SUMMARY_MP_TURNS", "5"))
LLM_MS = float(os.environ.get("MEMORY_SUMMARY_MP_LLM_MS", "20"))
#: Concurrent turn loops inside one process.
WORKERS = 4
#: A ``session:compress`` for a random session after every this many turns of a process.
COMPRESS_EVERY = 3
#: The whole run (children started, workload, drain) must end within this many seconds.
RUN_TIMEOUT_S = 240.0 * max(1.0, PROCS * SESSIONS * TURNS / 1000)

LEASE_PREFIX = "memory-summary:"

#: Compressions happen every couple of turns; only the turn trigger and explicit requests start
#: them (no watermark); the lease outlives any hold many times over, so a hold never expires.
PLUGIN: dict[str, Any] = {
    "threshold": 8,
    "keep_recent": 4,
    "debounce_turns": 1,
    "auto_compress_threshold": 0,
    "hard_compress_threshold": 0,
    "lease_ttl_s": 60.0,
    "max_concurrent_summaries": 4,
    "summary_timeout_s": 60,
    "shutdown_grace_s": 60,
    "language": "en",
    "fallback": "rules",
}


def session_ids(n: int) -> list[str]:
    return [f"mp-{i:03d}" for i in range(n)]


# -- the child --------------------------------------------------------------------------------


@dataclass
class ChildSpec:
    url: str
    name: str
    sessions: list[str]
    turns: int
    seed: int
    log: str
    llm_delay: float
    events: Any = None
    go: Any = None
    workers: int = WORKERS
    compress_every: int = COMPRESS_EVERY
    plugin: dict[str, Any] = field(default_factory=lambda: dict(PLUGIN))
    #: After the turns: wait this long, then ``compress()`` the first session, again and again
    #: while another process holds its lease (at most 30 s).
    compress_after: float | None = None


class LoggedMemory:
    """The real backend, logging appends, lease holds and compression commits (test-side)."""

    def __init__(self, inner: Any, log: list[dict[str, Any]]) -> None:
        self._inner = inner
        self._log = log
        self._pid = os.getpid()
        #: session -> (token, t_acquire) of the lease this process holds for it.
        self._held: dict[str, tuple[str, float]] = {}
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, session_id: str, messages: Sequence[Any]) -> list[Any]:
        stored = await self._inner.append(session_id, messages)
        for m in stored:
            self._log.append(
                {
                    "ev": "append",
                    "session": session_id,
                    "seq": m.seq,
                    "epoch": m.epoch,
                    "role": m.role,
                    "kind": m.kind,
                    "content": m.content,
                }
            )
        return stored

    async def acquire_lease(self, name: str, ttl_s: float) -> Any:
        lease = await self._inner.acquire_lease(name, ttl_s)
        t_acquire = time.monotonic()  # after the grant: an inner bound (module docstring)
        if lease is None:
            self.refused += 1
            return None
        assert name.startswith(LEASE_PREFIX), name
        session = name[len(LEASE_PREFIX) :]
        if session in self._held:
            # Two holds of one session in one process at once: the store granted it twice.
            self._log.append({"ev": "double-hold", "session": session, "token": lease.token})
        self._held[session] = (lease.token, t_acquire)
        return lease

    async def release_lease(self, lease: Any) -> bool:
        t_release = time.monotonic()  # before the release: an inner bound
        session = lease.name[len(LEASE_PREFIX) :]
        held = self._held.get(session)
        if held is not None and held[0] == lease.token:
            del self._held[session]
        released = bool(await self._inner.release_lease(lease))
        self._log.append(
            {
                "ev": "hold",
                "pid": self._pid,
                "session": session,
                "token": lease.token,
                "t_acquire": held[1] if held is not None and held[0] == lease.token else None,
                "t_release": t_release,
                "released": released,
            }
        )
        return released

    async def commit_compression(
        self,
        session_id: str,
        record: dict[str, Any],
        expected_version: int,
        archive_through_seq: int,
        **kwargs: Any,
    ) -> bool:
        held = self._held.get(session_id)
        t0 = time.monotonic()
        won = bool(
            await self._inner.commit_compression(
                session_id, record, expected_version, archive_through_seq, **kwargs
            )
        )
        t1 = time.monotonic()
        self._log.append(
            {
                "ev": "commit",
                "pid": self._pid,
                "session": session_id,
                "token": held[0] if held is not None else None,
                "expected_version": expected_version,
                "version": expected_version + 1 if won else None,
                "covered": record.get("covered_up_to_seq"),
                "archive_through_seq": archive_through_seq,
                "epoch": kwargs.get("epoch"),
                "won": won,
                "t0": t0,
                "t1": t1,
            }
        )
        return won


async def _child(spec: ChildSpec) -> dict[str, Any]:
    from plugin_harness import json_summary

    from host_stub import signals
    from host_stub.config import HostConfig
    from host_stub.host import Host
    from host_stub.memory import open_memory
    from host_stub.messages import Message
    from host_stub.testing import FakeLLM, message_tokens

    log: list[dict[str, Any]] = []
    memory = LoggedMemory(open_memory(spec.url, message_tokens), log)
    llm = FakeLLM(default=json_summary, delay=spec.llm_delay)
    config = HostConfig.model_validate(
        {
            "host": {"model": "fake/chat", "reserve_for_reply": 0, "memory": spec.url},
            "plugins": {"allow": ["memory-summary"]},
            "plugin": {"memory-summary": spec.plugin},
        }
    )
    summary: dict[str, Any] = {"name": spec.name, "pid": os.getpid()}
    try:
        async with Host(config, memory=memory, llm=llm) as host:

            async def on_status(sender: Any, **payload: Any) -> None:
                if payload["status"] in ("done", "error", "skipped"):
                    stats = payload.get("stats") or {}
                    log.append(
                        {
                            "ev": "status",
                            "session": payload["session_id"],
                            "request_id": payload["request_id"],
                            "status": payload["status"],
                            "reason": payload["reason"],
                            "covered": stats.get("covered_up_to_seq"),
                        }
                    )

            host.bus.connect(signals.SESSION_COMPRESSING, on_status)
            await memory.get_epoch("warm-up")  # connect (and create the schema) before the start
            spec.events.put(("ready", spec.name, os.getpid()))
            loop = asyncio.get_running_loop()
            if not await loop.run_in_executor(None, spec.go.wait, 120):
                raise RuntimeError("no start signal within 120 s")

            rng = random.Random(spec.seed)
            items: list[tuple[str, int]] = []
            for t in range(spec.turns):
                order = list(spec.sessions)
                rng.shuffle(order)
                items += [(s, t) for s in order]
            work = iter(items)
            outcomes: Counter[str] = Counter()
            latencies: list[float] = []
            done = 0
            requests = 0

            async def worker() -> None:
                nonlocal done, requests
                for session, t in work:
                    text = f"{spec.name} {session} turn {t}"
                    start = time.perf_counter()
                    result = await host.run_turn(
                        session,
                        f"{text} user",
                        recorded=[Message(role="assistant", content=f"{text} reply")],
                    )
                    latencies.append(time.perf_counter() - start)
                    outcomes[result.outcome] += 1
                    done += 1
                    if done % spec.compress_every == 0:
                        await host.request_compression(rng.choice(spec.sessions))
                        requests += 1

            t0 = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(spec.workers)))
            t_turns = time.monotonic() - t0
            plugin = host.get_plugin("memory-summary")
            if spec.compress_after is not None:
                await asyncio.sleep(spec.compress_after)
                until = time.monotonic() + 30
                while True:
                    result = await plugin.compress(spec.sessions[0])
                    if result["reason"] != LEASE_BUSY or time.monotonic() > until:
                        break
                    await asyncio.sleep(0.05)
                summary["compress"] = {k: result[k] for k in ("status", "reason")}
            # Background compressions (the plugin holds them by strong reference; no public handle).
            while pending := plugin.scheduler.pending():
                await asyncio.gather(*pending, return_exceptions=True)
            summary.update(
                turns=done,
                outcomes=dict(outcomes),
                requests=requests,
                refused=memory.refused,
                turns_s=t_turns,
                drained_s=time.monotonic() - t0,
                latencies=latencies,
            )
    finally:
        with open(spec.log, "w", encoding="utf-8") as fh:
            for line in log:
                fh.write(json.dumps(line) + "\n")
    return summary


def child_main(spec: ChildSpec) -> None:
    """Entry point of a child process."""
    try:
        summary = asyncio.run(_child(spec))
    except BaseException:
        spec.events.put(("error", spec.name, traceback.format_exc()))
        raise
    spec.events.put(("done", spec.name, summary))


# -- the parent -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def storage(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh, empty store for the run (skips without a server, fails when CI=true)."""
    import test_memory_contract as contract

    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
    elif backend == "postgres":
        url = contract.pg_url()
        try:
            yield url
        finally:
            await contract.pg_drop(url)
    elif backend == "redis":
        url = contract.redis_url()
        try:
            yield url
        finally:
            await asyncio.to_thread(contract.redis_drop_now, url)
    else:  # pragma: no cover
        raise ValueError(backend)


class ArchivedAtWatch:
    """PostgreSQL only: the raw ``(archived, archived_at)`` of every archived row, read again and
    again; a row archived a second time (even with the same reason) gets a new ``archived_at``."""

    def __init__(self, url: str) -> None:
        from urllib.parse import parse_qs, urlsplit

        [self.schema] = parse_qs(urlsplit(url).query)["schema"]
        self.seen: dict[tuple[str, int], tuple[str, float]] = {}
        self.reads = 0
        self._conn: Any = None

    async def check(self) -> None:
        import asyncpg
        import test_memory_contract as contract

        if self._conn is None:
            self._conn = await asyncpg.connect(contract.PG_URL, timeout=5)
        exists = await self._conn.fetchval("SELECT to_regclass($1)", f'"{self.schema}".messages')
        if exists is None:
            return
        rows = await self._conn.fetch(
            f'SELECT session_id, seq, archived, archived_at FROM "{self.schema}".messages'
            " WHERE archived IS NOT NULL"
        )
        self.reads += 1
        for r in rows:
            key = (r["session_id"], int(r["seq"]))
            now = (r["archived"], float(r["archived_at"]))
            before = self.seen.setdefault(key, now)
            assert before == now, f"{key}: archived again: {before} -> {now}"

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


async def _nothing() -> None:
    return None


async def _run_children(
    specs: list[ChildSpec], *, monitor: Any = _nothing
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]], float, float]:
    """Start the children (forks of the warm forkserver of :mod:`procs`), release them together,
    run ``monitor()`` until they are done; return their summaries, their logs (by child name),
    the seconds until all were ready and the wall time from the start line."""
    from procs import context

    ctx = context()
    events = ctx.Queue()
    go = ctx.Event()
    t_start = time.monotonic()
    for spec in specs:
        spec.events, spec.go = events, go
    processes = [
        ctx.Process(target=child_main, args=(spec,), name=f"mp-{spec.name}", daemon=True)
        for spec in specs
    ]
    summaries: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S

    def next_events() -> list[tuple[str, str, Any]]:
        out = []
        while True:
            try:
                out.append(events.get_nowait())
            except queue.Empty:
                return out

    def take(event: tuple[str, str, Any]) -> str:
        kind, name, value = event
        if kind == "error":
            pytest.fail(f"child {name} failed:\n{value}")
        if kind == "done":
            summaries[name] = value
        return kind

    try:
        for p in processes:
            p.start()
        ready = 0
        while ready < len(processes):
            if time.monotonic() > deadline:
                pytest.fail(f"only {ready} of {len(processes)} children got ready")
            try:
                event = await asyncio.to_thread(events.get, True, 0.5)
            except queue.Empty:
                dead = [p.name for p in processes if not p.is_alive()]
                assert not dead, f"children exited before the start: {dead}"
                continue
            ready += take(event) == "ready"
        t_go = time.monotonic()
        go.set()
        while len(summaries) < len(processes):
            for event in next_events():
                take(event)
            if len(summaries) == len(processes):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"children not done within {RUN_TIMEOUT_S} s: {sorted(summaries)}")
            dead = [p.name for p in processes if not p.is_alive() and p.exitcode != 0]
            if dead:
                await asyncio.sleep(0.5)  # let a dying child's error report arrive
                for event in next_events():
                    take(event)
                pytest.fail(f"children died without a report: {dead}")
            await monitor()
            await asyncio.sleep(0.05)
        wall = time.monotonic() - t_go
        for p in processes:
            await asyncio.to_thread(p.join, 30)
            assert p.exitcode == 0, f"{p.name}: exit code {p.exitcode}"
    finally:
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join(10)
        events.close()
        events.join_thread()
    logs = {spec.name: _read_jsonl(Path(spec.log)) for spec in specs}
    return [summaries[s.name] for s in specs], logs, t_go - t_start, wall


def _check_session(
    session: str,
    *,
    active: list[Any],
    archived: list[Any],
    entry: Any,
    appended: dict[int, dict[str, Any]],
    commits: list[dict[str, Any]],
    holds: list[dict[str, Any]],
) -> dict[str, int]:
    """The after-the-run checks of one session (see the module docstring); returns counts."""
    where = f"session {session}"
    # -- every message accounted for, once ---------------------------------------------------
    active_seqs = [m.seq for m in active]
    archived_seqs = [m.seq for m in archived]
    assert len(set(archived_seqs)) == len(archived_seqs), f"{where}: a seq archived twice"
    assert not set(active_seqs) & set(archived_seqs), f"{where}: seqs both active and archived"
    stored = {m.seq: m for m in [*active, *archived]}
    top = max(stored, default=0)
    assert sorted(stored) == list(range(1, top + 1)), f"{where}: seqs not gapless"
    assert sorted(appended) == sorted(stored), (
        f"{where}: appended seqs {sorted(set(appended) ^ set(stored))[:10]} differ from the store"
    )
    for seq, want in appended.items():
        m = stored[seq]
        assert (m.role, m.kind, m.content, m.epoch) == (
            want["role"],
            want["kind"],
            want["content"],
            0,
        ), f"{where}: seq {seq} changed: {m!r} vs {want!r}"

    # -- archived only as summarized, covered, and nothing active covered ---------------------
    covered = int(entry.value["covered_up_to_seq"]) if entry is not None else 0
    for m in archived:
        assert m.archived == "summarized", f"{where}: seq {m.seq} archived {m.archived!r}"
        assert m.seq <= covered, f"{where}: seq {m.seq} summarized past coverage {covered}"
        assert not (m.role == "system" and m.kind == "message"), f"{where}: core archived"
    for m in active:
        if m.kind == "message" and m.role != "system":
            assert m.seq > covered, f"{where}: active seq {m.seq} covered by {covered}"

    # -- the winning commits: one per version, in order, coverage never back ------------------
    wins = sorted((c for c in commits if c["won"]), key=lambda c: c["expected_version"])
    lost = [c for c in commits if not c["won"]]
    assert [c["expected_version"] for c in wins] == list(range(len(wins))), (
        f"{where}: winning commits' expected versions "
        f"{[c['expected_version'] for c in wins]} (two winners on one version?)"
    )
    assert (entry.version if entry is not None else 0) == len(wins), (
        f"{where}: record at version {entry and entry.version}, {len(wins)} winning commits"
    )
    coverage = [c["covered"] for c in wins]
    assert coverage == sorted(coverage), f"{where}: covered_up_to_seq went back: {coverage}"
    if wins:
        assert coverage[-1] == covered, (
            f"{where}: final record covers {covered}, last win {coverage[-1]}"
        )
    by_time = sorted(wins, key=lambda c: c["t1"])
    assert by_time == wins, f"{where}: winning commits ran out of version order"
    assert not lost, (
        f"{where}: {len(lost)} commits lost a race although each ran under the lease: {lost[:3]}"
    )

    # -- lease holds never overlap; commits inside their own hold; <= 1 win per hold ----------
    assert all(h["t_acquire"] is not None for h in holds), f"{where}: release of an unknown hold"
    assert all(h["released"] for h in holds), f"{where}: a lease was gone at its release"
    ordered = sorted(holds, key=lambda h: h["t_acquire"])
    for prev, nxt in zip(ordered, ordered[1:], strict=False):
        assert prev["t_release"] <= nxt["t_acquire"], (
            f"{where}: lease holds overlap: pid {prev['pid']} "
            f"[{prev['t_acquire']:.6f}, {prev['t_release']:.6f}] and pid {nxt['pid']} "
            f"[{nxt['t_acquire']:.6f}, {nxt['t_release']:.6f}]"
        )
    by_token = {h["token"]: h for h in holds}
    assert len(by_token) == len(holds), f"{where}: a lease token handed out twice"
    wins_per_hold: Counter[str] = Counter()
    for c in commits:
        assert c["token"] is not None, f"{where}: commit without the session's lease held: {c}"
        hold = by_token.get(c["token"])
        assert hold is not None, f"{where}: commit under a token no hold has: {c}"
        assert hold["pid"] == c["pid"], (
            f"{where}: commit by pid {c['pid']} under pid {hold['pid']}'s lease"
        )
        assert hold["t_acquire"] <= c["t0"] and c["t1"] <= hold["t_release"], (
            f"{where}: commit [{c['t0']:.6f}, {c['t1']:.6f}] outside its hold "
            f"[{hold['t_acquire']:.6f}, {hold['t_release']:.6f}]"
        )
        if c["won"]:
            wins_per_hold[c["token"]] += 1
    more = {t: n for t, n in wins_per_hold.items() if n > 1}
    assert not more, f"{where}: holds with more than one winning commit: {more}"
    return {
        "messages": len(stored),
        "archived": len(archived),
        "compressions": len(wins),
        "holds": len(holds),
        "holders": len({h["pid"] for h in holds}),
    }


async def _final_state(url: str, sessions: list[str]) -> dict[str, tuple[Any, Any, Any]]:
    from host_stub.memory import open_memory
    from host_stub.services import SUMMARY_NAMESPACE
    from host_stub.testing import message_tokens

    store = open_memory(url, message_tokens)
    try:
        out = {}
        for s in sessions:
            assert await store.get_epoch(s) == 0, f"session {s}: epoch changed"
            out[s] = (
                await store.get_history(s),
                await store.get_archived(s),
                await store.get_metadata(SUMMARY_NAMESPACE, s),
            )
        return out
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["postgres", "redis", "sqlite"])
async def test_four_hosts_share_sessions_and_compress_at_once(backend: str, tmp_path: Path) -> None:
    from invariants import InvariantChecker

    from host_stub.memory import open_memory
    from host_stub.testing import message_tokens

    started = time.monotonic()
    sessions = session_ids(SESSIONS)
    async with storage(backend, tmp_path) as url:
        # -- online checks while the children run ----------------------------------------------
        watcher = open_memory(url, message_tokens)
        checkers = [InvariantChecker(watcher, s) for s in sessions]
        raw_watch = ArchivedAtWatch(url) if backend == "postgres" else None
        sweeps = 0
        next_sweep = 0.0

        async def monitor() -> None:
            nonlocal sweeps, next_sweep
            if time.monotonic() < next_sweep:
                return
            for checker in checkers:
                await checker.check()
            if raw_watch is not None:
                await raw_watch.check()
            sweeps += 1
            next_sweep = time.monotonic() + 1.0

        specs = [
            ChildSpec(
                url=url,
                name=f"p{n}",
                sessions=sessions,
                turns=TURNS,
                seed=1000 + n,
                log=str(tmp_path / f"p{n}.jsonl"),
                llm_delay=LLM_MS / 1000,
            )
            for n in range(PROCS)
        ]
        try:
            summaries, logs, ready_s, wall = await _run_children(specs, monitor=monitor)
            next_sweep = 0.0
            await monitor()  # once more, on the final state
        finally:
            await watcher.close()
            if raw_watch is not None:
                await raw_watch.close()

        # -- what each child did ---------------------------------------------------------------
        for s in summaries:
            assert s["turns"] == len(sessions) * TURNS, s["name"]
            assert s["outcomes"] == {"replied": s["turns"]}, (s["name"], s["outcomes"])
        appended: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        commits: dict[str, list[dict[str, Any]]] = defaultdict(list)
        holds: dict[str, list[dict[str, Any]]] = defaultdict(list)
        statuses: Counter[str] = Counter()
        for name, lines in logs.items():
            reported: set[tuple[str, int]] = set()
            won: set[tuple[str, int]] = set()
            for line in lines:
                ev, session = line["ev"], line["session"]
                assert ev != "double-hold", f"{name}: {line}"
                if ev == "append":
                    seq = line["seq"]
                    assert seq not in appended[session], (
                        f"session {session}: seq {seq} returned to two appends: "
                        f"{appended[session][seq]} and {line}"
                    )
                    appended[session][seq] = {**line, "child": name}
                elif ev == "commit":
                    commits[session].append(line)
                    if line["won"]:
                        won.add((session, line["covered"]))
                elif ev == "hold":
                    holds[session].append(line)
                elif ev == "status":
                    statuses[line["status"]] += 1
                    assert line["status"] != "error", f"{name}: {line}"
                    if line["covered"] is not None:
                        reported.add((session, line["covered"]))
            assert reported == won, (
                f"{name}: session:compressing reports {sorted(reported ^ won)[:5]} "
                "disagree with the commits it won"
            )

        # -- the final state, session by session -----------------------------------------------
        state = await _final_state(url, sessions)
        totals: Counter[str] = Counter()
        for s in sessions:
            active, archived, entry = state[s]
            totals.update(
                _check_session(
                    s,
                    active=active,
                    archived=archived,
                    entry=entry,
                    appended=appended[s],
                    commits=commits[s],
                    holds=holds[s],
                )
            )
        shared = sum(1 for s in sessions if len({h["pid"] for h in holds[s]}) >= 2)

    # The workload did what it is for: many compressions, leases changing hands between
    # processes, and contention (requests refused because another process held the lease).
    assert totals["compressions"] >= len(sessions), totals
    assert shared >= len(sessions) // 2, f"only {shared} sessions compressed by >= 2 processes"
    assert sum(s["refused"] for s in summaries) > 0, "no compression ever found the lease taken"
    assert sweeps >= 2, sweeps
    turns = sum(s["turns"] for s in summaries)
    sent = sum(s["requests"] for s in summaries)
    print(
        f"\n{backend}: {len(summaries)} processes, {len(sessions)} sessions, {turns} turns, "
        f"{totals['messages']} messages ({totals['archived']} archived), "
        f"{totals['compressions']} compressions in {totals['holds']} lease holds "
        f"({shared} sessions compressed by >= 2 processes), "
        f"{sum(s['refused'] for s in summaries)} lease refusals, "
        f"{sent} session:compress sent, statuses {dict(statuses)}; "
        f"{sweeps} invariant sweeps; children ready in {ready_s:.1f} s, turns done in "
        f"{max(s['turns_s'] for s in summaries):.1f} s, workload drained in {wall:.1f} s, "
        f"test {time.monotonic() - started:.1f} s"
    )


# -- a compression that outlives its lease ------------------------------------------------------


class LeaseOverlap(AssertionError):
    """Two processes held one session's compression lease at once."""


def overlapping_holds(holds: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    ordered = sorted(holds, key=lambda h: h["t_acquire"])
    return [
        (a, b)
        for a, b in zip(ordered, ordered[1:], strict=False)
        if a["t_release"] > b["t_acquire"]
    ]


@pytest.mark.slow
async def test_a_compression_outliving_its_lease_stays_single_flight(tmp_path: Path) -> None:
    """Two processes, one session with a backlog of four batches. Every summarizer call takes
    0.9 s (far within ``summary_timeout_s``); the lease's TTL is 1 s. Process ``a`` compresses
    first; ``b`` asks again and again while ``a`` holds the lease. ``a``'s summarizer calls
    (4 x 0.9 s) outlive the TTL several times over; ``a`` renews its lease while it runs, so
    ``b`` gets the lease only after ``a`` is done: no overlap, no second pass, no lost commit."""
    from host_stub.memory import open_memory
    from host_stub.messages import Message
    from host_stub.testing import message_tokens

    url = f"sqlite:///{tmp_path / 'outlive.db'}"
    session = "outlive"
    store = open_memory(url, message_tokens)
    try:
        for i in range(4):  # 8 messages: 4 to summarize (one batch each), 4 kept
            await store.append(
                session,
                [Message(role="user", content=f"u{i}"), Message(role="assistant", content=f"r{i}")],
            )
    finally:
        await store.close()
    plugin = {
        **PLUGIN,
        "threshold": 1000,  # only the explicit requests compress
        "keep_recent": 4,
        "batch_tokens": 1,  # one message per batch: a run of 4 summarizer calls
        "max_batches_per_run": 4,
        "summary_timeout_s": 30.0,
        "lease_ttl_s": 1.0,
    }
    specs = [
        ChildSpec(
            url=url,
            name=name,
            sessions=[session],
            turns=0,
            seed=0,
            log=str(tmp_path / f"{name}.jsonl"),
            llm_delay=0.9,
            plugin=plugin,
            compress_after=after,
        )
        for name, after in (("a", 0.0), ("b", 0.5))
    ]
    summaries, logs, _, _ = await _run_children(specs)
    holds = [line for lines in logs.values() for line in lines if line["ev"] == "hold"]
    commits = [line for lines in logs.values() for line in lines if line["ev"] == "commit"]
    assert summaries[0]["compress"]["status"] == "done", summaries
    assert len(holds) == 2, holds
    overlaps = overlapping_holds(holds)
    if overlaps:
        lost = [c for c in commits if not c["won"]]
        raise LeaseOverlap(
            f"{len(overlaps)} overlapping lease holds of {session!r}: "
            + "; ".join(
                f"pid {a['pid']} [{a['t_acquire']:.3f}, {a['t_release']:.3f}] and pid {b['pid']} "
                f"[{b['t_acquire']:.3f}, {b['t_release']:.3f}]"
                for a, b in overlaps
            )
            + f"; {len(lost)} commits lost the race; compress results "
            + str([s["compress"] for s in summaries])
        )
