"""Throughput with several host processes on one store: turns per second and compressions per
second with 1, 2 and 4 processes, per backend (SQLite, PostgreSQL, Redis).

A fixed workload: ``--sessions`` shared sessions of ``--turns`` turns each. With ``P``
processes, process ``p`` runs the turns ``t`` with ``t % P == p`` of every session, so every
session is worked on by every process; inside a process ``--workers`` loops run turns
concurrently (sessions shuffled per round). A turn is replayed by default (``run_turn`` with the
recorded assistant reply: no chat model, so a turn costs what the host, the plugin and the store
cost); ``--chat-latency-ms`` makes turns call a fake chat model instead. The summarizer is a fake
of fixed latency (``--latency-ms``, default 200 ms) answering valid JSON. Compressions start
from the turn trigger only (small ``threshold`` / ``keep_recent``, no watermarks), at most
``max_concurrent_summaries`` (4) at once per process; across processes a session's compression
lease decides who compresses (a process that finds it taken skips, the next turn tries again).

Each process is a fork of a ``forkserver`` that has imported the host, the plugin, the backends
and the fake LLM, and connects to the store before the common start line; process start-up is
not measured. Measured from the start line: the turn phase (until the last process ran its
last turn) and the drain (until the last background compression of the last process ended).
``turns/s`` = turns / turn phase; ``compressions/s`` = winning compressions / drain; turn
latency percentiles over every turn of every process. Times from different processes are
``time.monotonic()`` (one system-wide clock on Linux). After every run the store is checked:
every session holds exactly the messages appended (two per turn plus one event marker per
compression), gapless.

PostgreSQL (``$MEMORY_SUMMARY_PG_URL``, default the local ``test`` database) runs in a fresh
schema and Redis (``$MEMORY_SUMMARY_REDIS_URL``, default ``redis://127.0.0.1:6379/0``) under a
fresh key prefix, both removed afterwards; a server that cannot be reached is left out with a
note. SQLite uses a file in a temporary directory.

    python bench/multiprocess.py [--sessions 50] [--turns 40] [--latency-ms 200]
        [--processes 1,2,4] [--backends sqlite,postgres,redis] [--workers 4]
        [--chat-latency-ms 0] [--repeat 1] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import queue
import random
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    Table,
    TokenCounter,
    out_dir,
    percentile,
    print_versions,
    progress,
    versions,
    write_results,
)
from fakes import CHAT_MODEL, SUMMARIZER_MODEL, bench_llm, summarizer_stats  # noqa: E402

NAME = "multiprocess"
PG_URL = os.environ.get("MEMORY_SUMMARY_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("MEMORY_SUMMARY_REDIS_URL", "redis://127.0.0.1:6379/0")
BACKENDS = ("sqlite", "postgres", "redis")

#: The plugin in every process: compressions from the turn trigger only, every few turns of a
#: session; a lease far longer than any run.
PLUGIN: dict[str, Any] = {
    "summary_model": SUMMARIZER_MODEL,
    "threshold": 12,
    "keep_recent": 6,
    "debounce_turns": 1,
    "auto_compress_threshold": 0,
    "hard_compress_threshold": 0,
    "max_concurrent_summaries": 4,
    "lease_ttl_s": 120.0,
    "shutdown_grace_s": 120.0,
    "language": "en",
}

_WORDS = (
    "please check my booking for next week and tell me whether the seat upgrade to row 12 "
    "is still possible, my customer number is 4471-XK and I travel with two children"
).split()


def user_text(session: str, turn: int) -> str:
    k = sum(map(ord, session))
    n = 20 + (k * 31 + turn * 17) % 25
    return f"[{session} t{turn}] " + " ".join(
        _WORDS[(k + turn * 3 + i) % len(_WORDS)] for i in range(n)
    )


def reply_text(session: str, turn: int) -> str:
    k = sum(map(ord, session))
    return f"[{session} t{turn} reply] " + " ".join(
        _WORDS[(k * 7 + turn + i * 5) % len(_WORDS)] for i in range(40)
    )


# -- the child ------------------------------------------------------------------------------------


@dataclass
class Spec:
    url: str
    name: str
    items: list[tuple[str, int]]
    workers: int
    latency: float
    chat_latency: float
    plugin: dict[str, Any] = field(default_factory=lambda: dict(PLUGIN))


class TimedLLM:
    """:func:`fakes.bench_llm` with one latency for the summarizer and another for the chat
    model."""

    def __init__(self, latency: float, chat_latency: float) -> None:
        self.inner = bench_llm(counter=TokenCounter(), latency=0.0, default_model=SUMMARIZER_MODEL)
        self.latency = latency
        self.chat_latency = chat_latency
        self.default_model = SUMMARIZER_MODEL

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, messages: Any, model: str | None = None, **kwargs: Any) -> Any:
        wait = (
            self.latency if (model or SUMMARIZER_MODEL) == SUMMARIZER_MODEL else self.chat_latency
        )
        if wait:
            await asyncio.sleep(wait)
        return await self.inner.complete(messages, model=model, **kwargs)


class CountingMemory:
    """The backend, counting winning compression commits (nothing else changes)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.won = 0
        self.lost = 0
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def commit_compression(self, *args: Any, **kwargs: Any) -> bool:
        won = bool(await self._inner.commit_compression(*args, **kwargs))
        self.won += won
        self.lost += not won
        return won

    async def acquire_lease(self, name: str, ttl_s: float) -> Any:
        lease = await self._inner.acquire_lease(name, ttl_s)
        self.refused += lease is None
        return lease


async def _child(spec: Spec, events: Any, go: Any) -> dict[str, Any]:
    from host_stub.config import HostConfig
    from host_stub.host import Host
    from host_stub.memory import open_memory
    from host_stub.messages import Message

    llm = TimedLLM(spec.latency, spec.chat_latency)
    model = CHAT_MODEL if spec.chat_latency else None
    config = HostConfig.model_validate(
        {
            "host": {"memory": spec.url, "model": model, "reserve_for_reply": 0},
            "plugins": {"allow": ["memory-summary"]},
            "plugin": {"memory-summary": spec.plugin},
        }
    )

    def count(message: Message) -> int:
        return llm.count_tokens([message])

    memory = CountingMemory(open_memory(spec.url, count))
    host = Host(config, memory=memory, llm=llm)
    await host.start()
    try:
        await memory.get_epoch("warm-up")  # connect (and create the schema) before the start
        for session, t in spec.items[:1]:
            user_text(session, t)  # warm the token counter's encoder
            llm.count_tokens("warm-up")
        events.put(("ready", spec.name, None))
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, go.wait, 300):
            raise RuntimeError("no start signal within 300 s")
        work = iter(spec.items)
        latencies: list[float] = []
        errors = 0

        async def worker() -> None:
            nonlocal errors
            for session, t in work:
                recorded = (
                    None
                    if spec.chat_latency
                    else [Message(role="assistant", content=reply_text(session, t))]
                )
                start = time.perf_counter()
                result = await host.run_turn(session, user_text(session, t), recorded=recorded)
                latencies.append(time.perf_counter() - start)
                errors += result.outcome != "replied"

        await asyncio.gather(*(worker() for _ in range(spec.workers)))
        t_turns = time.monotonic()
        plugin = host.get_plugin("memory-summary")
        # The plugin's background compressions (held by strong reference; no public handle).
        while pending := plugin.scheduler.pending():
            await asyncio.gather(*pending, return_exceptions=True)
        t_drained = time.monotonic()
    finally:
        await host.stop()
    return {
        "name": spec.name,
        "turns": len(latencies),
        "errors": errors,
        "latencies": latencies,
        "t_turns": t_turns,
        "t_drained": t_drained,
        "compressions": memory.won,
        "lost": memory.lost,
        "refused": memory.refused,
        "summarizer_calls": summarizer_stats(llm.inner).calls,
    }


def child_main(spec: Spec, events: Any, go: Any) -> None:
    try:
        result = asyncio.run(_child(spec, events, go))
    except BaseException:
        events.put(("error", spec.name, traceback.format_exc()))
        raise
    events.put(("done", spec.name, result))


# -- storage ---------------------------------------------------------------------------------------


def _probe(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or ``None``."""

    async def pg() -> None:
        import asyncpg

        conn = await asyncpg.connect(PG_URL, timeout=3)
        await conn.close()

    async def rds() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
        try:
            await client.ping()
        finally:
            await client.aclose()

    if backend == "sqlite":
        return None
    try:
        asyncio.run(pg() if backend == "postgres" else rds())
    except Exception as exc:  # missing driver or unreachable server
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
    return None


async def _server_version(backend: str) -> str | None:
    if backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(PG_URL, timeout=5)
        try:
            return "PostgreSQL " + str(await conn.fetchval("SHOW server_version"))
        finally:
            await conn.close()
    if backend == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            return "Redis " + str((await client.info("server"))["redis_version"])
        finally:
            await client.aclose()
    import sqlite3

    return "SQLite " + sqlite3.sqlite_version


@contextlib.asynccontextmanager
async def storage(backend: str) -> AsyncIterator[str]:
    """A fresh, empty store; removed afterwards."""
    tag = uuid.uuid4().hex[:12]
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="bench-mp-") as tmp:
            yield f"sqlite:///{Path(tmp) / 'bench.db'}"
    elif backend == "postgres":
        import asyncpg

        schema = f"bench_mp_{tag}"
        try:
            yield f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"
        finally:
            conn = await asyncpg.connect(PG_URL, timeout=5)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()
    else:
        import redis.asyncio as aioredis

        prefix = f"bench-mp-{tag}:"
        try:
            yield f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"
        finally:
            client = aioredis.Redis.from_url(REDIS_URL)
            try:
                keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
                for i in range(0, len(keys), 500):
                    await client.unlink(*keys[i : i + 500])
            finally:
                await client.aclose()


async def _check_store(url: str, sessions: list[str], turns: int, compressions: int) -> str | None:
    """What is wrong with the store after a run, or ``None``: every session must hold its two
    messages per turn, plus one event marker per winning compression, gapless."""
    from host_stub.memory import open_memory

    store = open_memory(url, lambda m: 1)
    try:
        total = markers = 0
        for s in sessions:
            active = await store.get_history(s)
            archived = await store.get_archived(s)
            seqs = sorted(m.seq or 0 for m in [*active, *archived])
            if seqs != list(range(1, len(seqs) + 1)):
                return f"session {s}: seqs not gapless"
            if any(m.archived != "summarized" for m in archived):
                return f"session {s}: archived other than 'summarized'"
            total += sum(1 for m in [*active, *archived] if m.kind == "message")
            markers += sum(1 for m in [*active, *archived] if m.kind == "event-marker")
        if total != 2 * turns:
            return f"{total} messages stored for {turns} turns"
        if markers != compressions:
            return f"{markers} compression markers for {compressions} compressions"
        return None
    finally:
        await store.close()


# -- the parent ------------------------------------------------------------------------------------


_ctx: Any = None


def context() -> Any:
    """The ``forkserver`` context; its server imports this script (``__main__``), the host, the
    plugin and the backends once, and forks every child from that."""
    global _ctx
    if _ctx is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(
            [
                "__main__",
                "host_stub.host",
                "host_stub.memory.sqlite",
                "host_stub.memory.postgres",
                "host_stub.memory.redis",
                "plugin_memory_summary",
            ]
        )
        _ctx = ctx
    return _ctx


def plan(
    sessions: list[str], turns: int, processes: int, seed: int = 7
) -> list[list[tuple[str, int]]]:
    """Per process, its (session, turn) items in the order it runs them: round by round, the
    sessions shuffled each round."""
    rng = random.Random(seed)
    out: list[list[tuple[str, int]]] = [[] for _ in range(processes)]
    for t in range(turns):
        order = list(sessions)
        rng.shuffle(order)
        out[t % processes] += [(s, t) for s in order]
    return out


async def run_one(
    backend: str, processes: int, args: argparse.Namespace, sessions: list[str]
) -> dict[str, Any]:
    ctx = context()
    async with storage(backend) as url:
        events = ctx.Queue()
        go = ctx.Event()
        specs = [
            Spec(
                url=url,
                name=f"p{n}",
                items=items,
                workers=args.workers,
                latency=args.latency_ms / 1000,
                chat_latency=args.chat_latency_ms / 1000,
            )
            for n, items in enumerate(plan(sessions, args.turns, processes))
        ]
        procs = [
            ctx.Process(target=child_main, args=(spec, events, go), daemon=True) for spec in specs
        ]
        results: dict[str, dict[str, Any]] = {}
        try:
            for p in procs:
                p.start()
            ready = 0
            deadline = time.monotonic() + 120
            while ready < processes:
                kind, name, value = await asyncio.to_thread(_get, events, deadline, procs)
                if kind == "error":
                    raise RuntimeError(f"{backend} {name} failed:\n{value}")
                ready += kind == "ready"
            t_go = time.monotonic()
            go.set()
            deadline = time.monotonic() + 3600
            while len(results) < processes:
                kind, name, value = await asyncio.to_thread(_get, events, deadline, procs)
                if kind == "error":
                    raise RuntimeError(f"{backend} {name} failed:\n{value}")
                if kind == "done":
                    results[name] = value
            for p in procs:
                p.join(60)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(10)
            events.close()
            events.join_thread()
        done = list(results.values())
        turns = sum(r["turns"] for r in done)
        compressions = sum(r["compressions"] for r in done)
        problem = await _check_store(url, sessions, turns, compressions)
    latencies = [x for r in done for x in r["latencies"]]
    turn_phase = max(r["t_turns"] for r in done) - t_go
    drain = max(r["t_drained"] for r in done) - t_go
    return {
        "backend": backend,
        "processes": processes,
        "turns": turns,
        "errors": sum(r["errors"] for r in done),
        "turn_phase_s": turn_phase,
        "drain_s": drain,
        "turns_per_s": turns / turn_phase,
        "compressions": compressions,
        "compressions_per_s": compressions / drain,
        "lost_commits": sum(r["lost"] for r in done),
        "lease_refusals": sum(r["refused"] for r in done),
        "summarizer_calls": sum(r["summarizer_calls"] for r in done),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "check": problem or "ok",
    }


def _get(events: Any, deadline: float, procs: list[Any]) -> tuple[str, str, Any]:
    while True:
        try:
            return events.get(timeout=0.5)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError("children did not report in time") from None
            dead = [p.pid for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
            if dead:
                raise RuntimeError(f"children {dead} died without a report") from None


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=50, help="shared sessions (default 50)")
    p.add_argument("--turns", type=int, default=40, help="turns per session (default 40)")
    p.add_argument(
        "--latency-ms", type=float, default=200.0, help="summarizer latency (default 200)"
    )
    p.add_argument(
        "--chat-latency-ms",
        type=float,
        default=0.0,
        help="0 (default): turns are replayed; > 0: turns call a fake chat model this slow",
    )
    p.add_argument("--processes", default="1,2,4", help="process counts (default 1,2,4)")
    p.add_argument("--backends", default=",".join(BACKENDS), help="default sqlite,postgres,redis")
    p.add_argument("--workers", type=int, default=4, help="concurrent turn loops per process")
    p.add_argument(
        "--repeat", type=int, default=1, help="runs per setting; the median one is reported"
    )
    p.add_argument("--quick", action="store_true", help="a reduced run (smoke tests)")
    p.add_argument(
        "--out", default=None, help="directory for multiprocess.md / .json (default: bench/results)"
    )
    args = p.parse_args()
    if args.quick:
        args.sessions, args.turns = min(args.sessions, 6), min(args.turns, 8)
        args.latency_ms = min(args.latency_ms, 20.0)
        args.processes, args.repeat = "1,2", 1
    args.process_counts = [int(n) for n in args.processes.split(",") if n.strip()]
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    if min(args.sessions, args.turns, args.workers, args.repeat, *args.process_counts) < 1:
        p.error("--sessions, --turns, --workers, --repeat and --processes must be >= 1")
    unknown = sorted(set(args.backend_list) - set(BACKENDS))
    if unknown:
        p.error(f"unknown backends {unknown} (known: {', '.join(BACKENDS)})")
    return args


async def main(args: argparse.Namespace) -> None:
    started = time.monotonic()
    out = out_dir(args.out)
    used = versions(["asyncpg", "redis"])
    notes: list[str] = []
    runnable = []
    for backend in args.backend_list:
        why = await asyncio.to_thread(_probe, backend)
        if why is None:
            runnable.append(backend)
            used[f"{backend} server"] = await _server_version(backend) or "?"
        else:
            notes.append(f"{backend} left out: not reachable here ({why})")
            progress(f"{backend}: left out ({why})")
    print_versions(used)
    sessions = [f"mp-{i:03d}" for i in range(args.sessions)]
    rows = []
    all_runs: list[dict[str, Any]] = []
    for backend in runnable:
        for processes in args.process_counts:
            runs = []
            for n in range(args.repeat):
                progress(f"{backend}, {processes} processes, run {n + 1}/{args.repeat} ...")
                run = await run_one(backend, processes, args, sessions)
                progress(
                    f"  {run['turns_per_s']:.0f} turns/s, {run['compressions_per_s']:.1f} "
                    f"compressions/s, p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms, "
                    f"check {run['check']}"
                )
                runs.append(run)
                all_runs.append(run)
            # The run with the median turns/s stands for the setting; the range shows the noise.
            row = dict(sorted(runs, key=lambda r: r["turns_per_s"])[(len(runs) - 1) // 2])
            row["turns_range"] = (
                f"{min(r['turns_per_s'] for r in runs):.0f}-"
                f"{max(r['turns_per_s'] for r in runs):.0f}"
            )
            row["bad"] = [r["check"] for r in runs if r["check"] != "ok" or r["errors"]]
            rows.append(row)
    table = Table(
        f"{args.sessions} shared sessions x {args.turns} turns, summarizer {args.latency_ms:g} ms, "
        f"{args.workers} turn loops per process",
        [
            "backend",
            "processes",
            "turns/s",
            f"turns/s over {args.repeat} runs",
            "compressions/s",
            "p50 turn ms",
            "p99 turn ms",
            "turns",
            "compressions",
            "turn phase s",
            "drain s",
            "summarizer calls",
            "lease refusals",
            "lost commits",
            "store check",
        ],
        note=(
            "turns/s: turns / turn phase (start line to the last turn of the last process); "
            "compressions/s: winning compressions / drain (start line to the last compression "
            "of the last process). Each setting ran --repeat times; the row is the run with the "
            "median turns/s. Turns are "
            + (
                "replayed (no chat model): a turn costs the host, the plugin and the store."
                if not args.chat_latency_ms
                else f"model calls to a fake chat model of {args.chat_latency_ms:g} ms."
            )
        ),
    )
    for r in rows:
        table.add(
            r["backend"],
            r["processes"],
            r["turns_per_s"],
            r["turns_range"],
            r["compressions_per_s"],
            r["p50_ms"],
            r["p99_ms"],
            r["turns"],
            r["compressions"],
            r["turn_phase_s"],
            r["drain_s"],
            r["summarizer_calls"],
            r["lease_refusals"],
            r["lost_commits"],
            r["check"] if not r["bad"] else "; ".join(r["bad"]),
        )
    notes += [
        f"Machine: {os.cpu_count()} CPUs, shared with other jobs (see the load averages): all "
        "processes of a run share these CPUs, so more processes add concurrency but not CPU.",
        "Each process runs its own host with the memory-summary plugin from its entry point; "
        f"plugin settings: {', '.join(f'{k}={v}' for k, v in PLUGIN.items())}.",
        "A compression refused the lease (another process is compressing that session) is "
        "skipped; the session's next turn triggers again.",
        "The number of compressions is not fixed: when a process's summary slots are all busy "
        "the backlog grows and is folded later in fewer, larger compressions (up to "
        "max_batches_per_run batches each), so more processes make more, smaller ones.",
        "Lost commits: compressions whose commit lost the version race; the lease should keep "
        "this at 0.",
    ]
    errors = sum(r["errors"] for r in all_runs)
    if errors:
        notes.append(f"{errors} turns did not end with a reply")
    write_results(
        NAME,
        "Several host processes on one store: turns and compressions per second",
        [table],
        out=out,
        versions_used=used,
        settings={
            "sessions": args.sessions,
            "turns": args.turns,
            "latency_ms": args.latency_ms,
            "chat_latency_ms": args.chat_latency_ms,
            "processes": args.processes,
            "workers": args.workers,
            "repeat": args.repeat,
            "quick": args.quick,
        },
        runtime_s=time.monotonic() - started,
        notes=notes,
        extra={"runs": all_runs},
    )
    bad = [r for r in all_runs if r["check"] != "ok" or r["errors"]]
    if bad:
        print(f"store checks failed: {[(r['backend'], r['processes'], r['check']) for r in bad]}")
        raise SystemExit(1)


if __name__ == "__main__":
    asyncio.run(main(arguments()))
