"""Races between real OS processes on one SQLite file (see ``procs.py``): each child is a real host
with the plugin, the SQLite backend and a scripted (optionally slow, optionally paused)
summarizer. While they race, this process checks every invariant of DESIGN.md on the same file,
over and over (``InvariantChecker`` orders its reads so a concurrent commit cannot fool it).

* compress during compress: one compression wins, the other is turned away by the lease (or finds
  nothing left), the summarizer runs once, versions only go up;
* clear during compress: the summary never comes back, whichever point the compression was at;
* turn during compress: nothing appended meanwhile is archived, nothing archived was unsummarized;
* two hosts replaying into the same sessions: a log of every lease hold shows no overlap within a
  session.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import procs
import pytest
from invariants import InvariantChecker
from plugin_harness import plugin_host

from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message

SESSION = "s"
from plugin_memory_summary.plugin import LEASE_BUSY  # noqa: E402

LEASE_REASON = LEASE_BUSY
#: Races need a lease that outlives the slowest compression here.
LONG_LEASE = {"lease_ttl_s": 30.0}
#: A plain word (an identifier found in no message would never be stored at all).
SEED_CANARY = "seedcanaryword"


def _stored(items: list[dict[str, Any]]) -> list[Message]:
    return [Message(role=m["role"], content=m["content"], seq=m["seq"]) for m in items]


def _canary_summary(sent: list[dict[str, Any]]) -> str:
    return json.dumps({"summary": f"Seed summary {SEED_CANARY}."})


async def _seed(
    db: Path, turns: int, *, prefix: str = "seed", compress: bool = False
) -> list[Message]:
    """``turns`` turns into SESSION from this process, optionally compressed (the summary carries
    :data:`SEED_CANARY`)."""
    from host_stub.testing import FakeLLM

    async with plugin_host(procs.CHILD_PLUGIN, db=db, llm=FakeLLM(default=_canary_summary)) as h:
        out: list[Message] = []
        for i in range(turns):
            user, reply = procs.turn_texts(prefix, i)
            result = await h.host.run_turn(
                SESSION, user, recorded=[Message(role="assistant", content=reply)]
            )
            out.extend(result.messages)
        if compress:
            assert (await h.plugin.compress(SESSION))["status"] == "done"
        return out


async def _watch(
    db: Path,
    sessions: list[str],
    *waits: Callable[[], Any],
    expected: dict[str, list[Message]] | None = None,
) -> tuple[list[Any], int]:
    """Run the blocking ``waits`` (children's results) in threads while checking the invariants
    of ``sessions`` on ``db`` in a loop; a last check after they all returned. Returns their
    values and how many checks ran."""
    memory = SQLiteMemory(db, token_counter=lambda m: 1)
    checkers = {s: InvariantChecker(memory, s) for s in sessions}
    try:
        gathered = asyncio.gather(*(asyncio.to_thread(w) for w in waits))
        while not gathered.done():
            for checker in checkers.values():
                await checker.check()
            await asyncio.sleep(0.01)
        values = await gathered
        for s, checker in checkers.items():
            await checker.check((expected or {}).get(s, []))
        # And a full check from scratch.
        for s in sessions:
            fresh = InvariantChecker(memory, s)
            fresh.expect((expected or {}).get(s, []))
            await fresh.check()
        return values, sum(c.checks for c in checkers.values())
    finally:
        await memory.close()


def _versions(db: Path, session: str = SESSION) -> tuple[int, int]:
    row = procs.summary_row(db, session)
    if row is None or row[0] is None:
        return (row[1] if row else 0), 0
    return row[1], json.loads(row[0])["covered_up_to_seq"]


def _summarizer_transcripts(path: Path) -> list[str]:
    return [entry["messages"][-1]["content"] for entry in procs.read_jsonl(path)]


def _assert_archived_were_summarized(
    db: Path, transcripts: list[str], session: str = SESSION, also: str = ""
) -> int:
    """Every message archived ``summarized`` reached a summarizer request (or ``also``); event
    markers, which are never summarized, aside."""
    rows = procs.raw(
        db,
        "SELECT seq, body FROM messages WHERE session_id = ? AND archived = 'summarized'"
        " AND kind = 'message'",
        (session,),
    )
    seen = "\n".join([*transcripts, also])
    for seq, body in rows:
        content = json.loads(body)["content"]
        assert content in seen, f"seq {seq} ({content!r}) archived as summarized, never summarized"
    return len(rows)


# -- compress during compress --------------------------------------------------------------------------


def test_compress_during_compress_one_wins_and_the_summarizer_runs_once(tmp_path: Path) -> None:
    db = tmp_path / "host.db"
    expected = asyncio.run(_seed(db, 10))
    ctx = procs.context()
    go = ctx.Event()
    specs = [
        procs.ChildSpec(
            str(db),
            name=name,
            plugin=LONG_LEASE,
            llm_delay=0.3,
            go=go,
            llm_log=str(tmp_path / f"llm-{name}.jsonl"),
            lease_log=str(tmp_path / f"lease-{name}.jsonl"),
        )
        for name in ("a", "b")
    ]
    rounds = 3
    with procs.children(*specs) as (a, b):
        version = _versions(db)[0]
        for round_ in range(rounds):
            if round_:
                expected += _stored(a.call("turns", SESSION, 100 * round_, 6))
            go.clear()
            a.send("compress", SESSION, True)
            b.send("compress", SESSION, True)
            go.set()
            results, checks = asyncio.run(
                _watch(
                    db,
                    [SESSION],
                    lambda: a.result("compress"),
                    lambda: b.result("compress"),
                    expected={SESSION: expected},
                )
            )
            statuses = sorted(r["status"] for r in results)
            assert statuses == ["done", "skipped"], results
            loser = next(r for r in results if r["status"] == "skipped")
            assert loser["reason"] == LEASE_REASON or loser["reason"].startswith(
                "nothing to compress"
            ), loser
            new_version, _ = _versions(db)
            assert new_version == version + 1, "exactly one commit per round"
            version = new_version
            assert checks >= 2
        for child in (a, b):
            child.stop()
    calls = sum(len(procs.read_jsonl(tmp_path / f"llm-{n}.jsonl")) for n in "ab")
    assert calls == rounds, f"{calls} summarizer calls for {rounds} compressions"
    holds = [h for n in "ab" for h in procs.read_jsonl(tmp_path / f"lease-{n}.jsonl")]
    _assert_no_overlap(holds)


# -- clear during compress ------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["llm", "before-commit", "in-commit"])
def test_clear_during_compress_the_summary_never_comes_back(point: str, tmp_path: Path) -> None:
    db = tmp_path / "host.db"
    asyncio.run(_seed(db, 6, compress=True))  # a summary exists (with the seed canary)
    extra = asyncio.run(_seed(db, 6, prefix="more"))
    assert extra
    ctx = procs.context()
    gate = ctx.Event()
    a_spec = procs.ChildSpec(str(db), name="a", plugin=LONG_LEASE, pauses={point: gate})
    b_spec = procs.ChildSpec(str(db), name="b", plugin=LONG_LEASE)
    with procs.children(a_spec, b_spec) as (a, b):
        a.send("compress", SESSION)
        a.wait_at(point)
        if point == "in-commit":
            # ``a`` holds SQLite's write lock inside its commit: the clear waits for it, then wins.
            b.send("clear", SESSION)
            time.sleep(0.3)
            gate.set()
            cleared = b.result("clear")
        else:
            cleared = b.call("clear", SESSION)
            gate.set()
        assert cleared["summary"]["sessions"] == 1
        result = a.result("compress")
        if point == "in-commit":
            assert result["status"] == "done", result  # it committed before the clear
        else:
            assert result == {"status": "skipped", "reason": "session cleared during compression"}
        # Neither process, nor a fresh one, sees a summary; the raw rows hold none.
        assert a.call("summary", SESSION) is None
        assert b.call("summary", SESSION) is None
        row = procs.summary_row(db, SESSION)
        assert row is not None and row[0] is None and row[2] == 1, row
        dump = procs.raw(db, "SELECT namespace, key, value FROM metadata")
        for needle in (SEED_CANARY, "ORDER-12345", "Summary: reply"):
            assert needle not in repr(dump), f"{needle} left in the metadata table: {dump}"
        # The cleared epoch has nothing archived as summarized, and a later compression of the
        # new epoch summarizes only the new epoch.
        epoch = procs.raw(db, "SELECT epoch FROM sessions WHERE session_id = ?", (SESSION,))[0][0]
        assert not procs.raw(
            db,
            "SELECT seq FROM messages WHERE session_id = ? AND epoch = ? AND archived IS NOT NULL",
            (SESSION, epoch),
        )
        new = _stored(b.call("turns", SESSION, 500, 6))
        assert b.call("compress", SESSION)["status"] == "done"
        text = b.call("summary", SESSION)
        assert text and SEED_CANARY not in text
        for child in (a, b):
            child.stop()
    assert all(m.seq for m in new)
    _, checks = asyncio.run(_watch(db, [SESSION], expected={SESSION: new}))
    assert checks == 1


# -- turn during compress --------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["llm", "before-commit"])
def test_turns_during_compress_are_never_archived_unsummarized(point: str, tmp_path: Path) -> None:
    db = tmp_path / "host.db"
    seeded = asyncio.run(_seed(db, 8))
    last_seeded = max(m.seq or 0 for m in seeded)
    ctx = procs.context()
    gate = ctx.Event()
    llm_log = tmp_path / "llm-a.jsonl"
    a_spec = procs.ChildSpec(
        str(db), name="a", plugin=LONG_LEASE, pauses={point: gate}, llm_log=str(llm_log)
    )
    b_spec = procs.ChildSpec(str(db), name="b", plugin=LONG_LEASE)
    with procs.children(a_spec, b_spec) as (a, b):
        a.send("compress", SESSION)
        a.wait_at(point)
        during = _stored(b.call("turns", SESSION, 0, 5))
        gate.set()
        (result,), _ = asyncio.run(
            _watch(
                db, [SESSION], lambda: a.result("compress"), expected={SESSION: [*seeded, *during]}
            )
        )
        assert result["status"] == "done", result
        for child in (a, b):
            child.stop()
    assert min(m.seq or 0 for m in during) > last_seeded
    _, covered = _versions(db)
    assert covered <= last_seeded, "the compression covered messages appended after its snapshot"
    active = {
        seq
        for (seq,) in procs.raw(
            db, "SELECT seq FROM messages WHERE session_id = ? AND archived IS NULL", (SESSION,)
        )
    }
    assert {m.seq for m in during} <= active, "a message appended during the compression left"
    assert _assert_archived_were_summarized(db, _summarizer_transcripts(llm_log)) == covered


def test_turns_racing_a_slow_summarizer_free_running(tmp_path: Path) -> None:
    """No pause: one process compresses in a loop with a slow summarizer while another appends
    turns as fast as it can; this process checks the invariants all along."""
    db = tmp_path / "host.db"
    seeded = asyncio.run(_seed(db, 8))
    ctx = procs.context()
    go = ctx.Event()
    a_spec = procs.ChildSpec(
        str(db),
        name="a",
        plugin=LONG_LEASE,
        llm_delay=0.15,
        go=go,
        llm_log=str(tmp_path / "llm-a.jsonl"),
    )
    b_spec = procs.ChildSpec(str(db), name="b", plugin=LONG_LEASE, go=go)
    with procs.children(a_spec, b_spec) as (a, b):
        for _ in range(4):
            a.send("compress", SESSION, True)
        for k in range(4):
            b.send("turns", SESSION, 10 * k, 8, True)
        go.set()
        values, checks = asyncio.run(
            _watch(
                db,
                [SESSION],
                *[lambda: a.result("compress", 120)] * 4,
                *[lambda: b.result("turns", 120)] * 4,
            )
        )
        appended = [m for v in values[4:] for m in _stored(v)]
        done = [v for v in values[:4] if v["status"] == "done"]
        for child in (a, b):
            child.stop()
    assert done, values[:4]
    assert checks >= 5
    _, fresh_checks = asyncio.run(_watch(db, [SESSION], expected={SESSION: [*seeded, *appended]}))
    assert fresh_checks == 1
    _assert_archived_were_summarized(db, _summarizer_transcripts(tmp_path / "llm-a.jsonl"))


# -- two hosts, one file, turn-triggered compressions: the lease log --------------------------------------


def _assert_no_overlap(holds: list[dict[str, Any]]) -> dict[str, int]:
    """Within each lease name, hold intervals (taken after acquire returned, up to just before
    release was called) never overlap, and every release found the lease still its own."""
    assert all(h["released"] for h in holds), [h for h in holds if not h["released"]]
    per: dict[str, list[dict[str, Any]]] = {}
    for h in holds:
        per.setdefault(h["name"], []).append(h)
    for name, items in per.items():
        items.sort(key=lambda h: h["t_acquire"])
        for prev, nxt in zip(items, items[1:], strict=False):
            assert nxt["t_acquire"] >= prev["t_release"], (
                f"{name}: pid {nxt['pid']} took the lease at {nxt['t_acquire']:.4f} while pid "
                f"{prev['pid']} held it until {prev['t_release']:.4f}"
            )
    return {name: len(items) for name, items in per.items()}


def test_two_hosts_on_one_file_never_overlap_their_leases(tmp_path: Path) -> None:
    db = tmp_path / "host.db"
    sessions = ["s0", "s1"]
    ctx = procs.context()
    go = ctx.Event()
    plugin = {"threshold": 8, "keep_recent": 4, "debounce_turns": 1, **LONG_LEASE}
    specs = [
        procs.ChildSpec(
            str(db),
            name=name,
            plugin=plugin,
            llm_delay=0.05,
            go=go,
            lease_log=str(tmp_path / f"lease-{name}.jsonl"),
            llm_log=str(tmp_path / f"llm-{name}.jsonl"),
        )
        for name in ("a", "b")
    ]
    per_batch, batches = 4, 12
    with procs.children(*specs) as kids:

        def drive() -> list[list[Any]]:
            """Both processes write the same session at once, batch after batch; after every
            batch of each session both wait until their compressions have ended, so the next
            batches meet at the lease again however fast the turns run on this machine."""
            out: list[list[Any]] = [[] for _ in kids]
            for k in range(batches):
                for child in kids:
                    child.send("turns", sessions[k % 2], per_batch * k, per_batch, k == 0)
                if k == 0:
                    go.set()
                for got, child in zip(out, kids, strict=True):
                    got.append(child.result("turns", 120))
                if k % 2:
                    for child in kids:
                        child.call("drain", timeout=120)
            return out

        (values,), checks = asyncio.run(_watch(db, sessions, drive))
        statuses = [c.call("drain", timeout=120) for c in kids]
        for child in kids:
            child.stop()
    expected: dict[str, list[Message]] = {s: [] for s in sessions}
    for per_child in values:
        for k, batch in enumerate(per_child):
            expected[sessions[k % 2]].extend(_stored(batch))
    _, _ = asyncio.run(_watch(db, sessions, expected=expected))
    for s in sessions:  # gapless across both processes
        seqs = sorted(m.seq or 0 for m in expected[s])
        assert seqs == sorted(set(seqs))
    holds = [h for n in "ab" for h in procs.read_jsonl(tmp_path / f"lease-{n}.jsonl")]
    counts = _assert_no_overlap(holds)
    assert len(holds) >= 4, counts
    # The two processes met at the lease: each held it at some point, or the one that never did
    # was turned away by it (a run that renews its lease may keep winning the race).
    holders = {h["pid"] for h in holds}
    for child, per in zip(kids, statuses, strict=True):
        met = child.pid in holders or any(s.get("reason") == LEASE_BUSY for s in per)
        assert met, f"process {child.pid} never held the lease nor found it busy"
    finals = [s for per in statuses for s in per if s["status"] != "start"]
    starts = [s for per in statuses for s in per if s["status"] == "start"]
    assert len(finals) == len(starts), "a request without exactly one final status"
    done = [s for s in finals if s["status"] == "done"]
    assert done and {s["session_id"] for s in done} == set(sessions)
    transcripts = [t for n in "ab" for t in _summarizer_transcripts(tmp_path / f"llm-{n}.jsonl")]
    for s in sessions:
        _assert_archived_were_summarized(db, transcripts, s)
    assert checks >= 2
    print(f"lease holds per session: {counts}; compressions done: {len(done)} of {len(finals)}")
