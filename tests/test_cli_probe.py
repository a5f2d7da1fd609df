"""Four defects an outside probe found, each test named after its point:

1. a replay (and a chat turn) waited for every asyncio task its turn started, litellm's
   never-ending logging worker included: ``replay --model M --api-base URL`` hung for the
   600-second settle limit after its first blocking compression;
2. ``demo --save FILE`` overwrote any existing file, a SQLite store included;
3. ``clear SESSION --all`` cleared every session;
4. replaying the file ``demo --save`` wrote into the demo's store appended every message again.

A mistake is one line on stderr, exit code 2, and nothing changed (the store's rows and the
file's bytes are compared before and after).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import procs
from fake_openai import FakeOpenAIServer
from test_cli_hardening import config_file, conversation, one_line, seeded, stored, write_jsonl

from host_stub import signals
from host_stub.config import HostConfig
from host_stub.hookspecs import hookimpl
from host_stub.host import Host
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message
from host_stub.testing import FakeLLM, message_tokens
from host_stub.transcripts import REPLAY_KEY, load_transcript
from plugin_memory_summary.extras.report.replay import replay_series

# -- 1: settling after a turn waits for the host's and the plugins' own work only --------------


class Busy:
    """A plugin whose first model call starts a task that never ends (as litellm's logging
    worker does at its first call) and a piece of its own background work that ends when
    ``gate`` is set; ``wait_idle`` reports its own work, as the memory plugin's does."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.stray: asyncio.Task[Any] | None = None
        self.work: asyncio.Task[Any] | None = None
        self.host: Any = None

    @hookimpl
    def startup(self, host: Any) -> None:
        self.host = host

    @hookimpl
    async def before_model_call(self, view: Any) -> None:
        if self.stray is None:
            self.stray = asyncio.ensure_future(asyncio.Event().wait())
        if self.gate is not None and self.work is None:
            self.work = asyncio.ensure_future(self._work(view.session_id))

    async def _work(self, session_id: str) -> None:
        assert self.gate is not None
        await self.gate.wait()
        await self.host.bus.send(
            signals.SESSION_COMPRESSING,
            request_id="busy",
            session_id=session_id,
            status="done",
            stats={"messages_summarized": 2, "covered_up_to_seq": 2, "llm_calls": 1},
        )

    async def wait_idle(self, timeout: float | None = None) -> bool:
        if self.work is None:
            return True
        done, _ = await asyncio.wait({self.work}, timeout=timeout)
        return bool(done)


def bare_host(plugin: Busy) -> Host:
    config = HostConfig.model_validate({"host": {"memory": "memory://"}, "plugins": {"allow": []}})
    return Host(config, llm=FakeLLM(default="ok"), plugins=[("busy", plugin)])


def recorded_turns(n: int) -> list[tuple[list[Message], list[Message]]]:
    return [
        ([Message(role="user", content=f"q{i}")], [Message(role="assistant", content=f"a{i}")])
        for i in range(n)
    ]


async def test_point1_replay_with_model_does_not_wait_for_litellm_background_task() -> None:
    """The replay's settle step (600 seconds at most) returns at once although the first turn
    started a task that never ends."""
    plugin = Busy()
    host = bare_host(plugin)
    await host.start()
    try:
        async with asyncio.timeout(30):  # a guard: the old code waited the full 600 s
            series = await replay_series(host, "s", recorded_turns(3), settle_s=600)
        assert plugin.stray is not None and not plugin.stray.done()
        assert len(series.context) == 3
    finally:
        await host.stop()
        if plugin.stray is not None:
            plugin.stray.cancel()


async def test_point1_settle_waits_for_plugin_work_and_not_for_a_stray_task() -> None:
    gate = asyncio.Event()
    plugin = Busy(gate)
    host = bare_host(plugin)
    statuses: list[str] = []

    async def on_status(sender: Any, **payload: Any) -> None:
        statuses.append(payload["status"])

    await host.start()
    host.bus.connect(signals.SESSION_COMPRESSING, on_status)
    try:
        await host.run_turn("s", "hello", recorded=[Message(role="assistant", content="hi")])
        assert plugin.stray is not None and plugin.work is not None
        assert await host.settle(0) is False  # the plugin's own work still runs
        gate.set()
        async with asyncio.timeout(30):
            assert await host.settle(600) is True
        assert statuses == ["done"]  # settled once the plugin's work had reported
        assert not plugin.stray.done()
    finally:
        await host.stop()
        if plugin.stray is not None:
            plugin.stray.cancel()


def test_point1_replay_with_model_through_the_cli_finishes_in_seconds(tmp_path: Path) -> None:
    """``host-stub replay FILE --model M --api-base URL`` with a small window: a blocking
    compression calls the model (litellm starts its logging worker there), and the replay ends
    without waiting for that worker."""
    raw = conversation(24)
    for message in raw:
        if message["role"] == "tool":
            message["content"] = "result " * 200
    path = write_jsonl(tmp_path / "tools.jsonl", raw)
    config = config_file(tmp_path, "[host]\ncontext_window = 3000\n")
    with FakeOpenAIServer("A summary of the conversation so far.") as server:
        code, out, err = procs.run_cli(
            [
                "replay",
                str(path),
                "--db",
                str(tmp_path / "m.db"),
                "--config",
                str(config),
                "--model",
                "openai/fake",
                "--api-base",
                server.base_url,
                "--baseline",
                "off",
            ],
            timeout=90,  # the old code hung for 600 s
        )
        calls = len(server.requests)
    assert code == 0, err
    assert "(openai/fake, hard watermark)" in out, out
    assert calls >= 1
    assert len(asyncio.run(stored(tmp_path / "m.db", "tools"))) == len(raw)


# -- 2: demo --save does not overwrite a file unless --force -------------------------------------


def test_point2_demo_save_refuses_an_existing_sqlite_store(tmp_path: Path) -> None:
    db, rows = seeded(tmp_path)
    before = db.read_bytes()
    code, out, err = procs.run_cli(
        ["demo", "--turns", "20", "--save", str(db), "--db", str(tmp_path / "new.db")]
    )
    assert code == 2 and not out.strip()
    assert one_line(err) == (
        f"host-stub: error: --save {db}: the file exists (pass --force to overwrite it)"
    )
    assert db.read_bytes() == before and procs.dump(db) == rows
    assert not (tmp_path / "new.db").exists()


def test_point2_demo_save_refuses_an_existing_file_and_force_overwrites_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "demo.jsonl"
    path.write_text("keep me\n")
    args = ["demo", "--turns", "20", "--baseline", "off", "--save", str(path)]
    code, out, err = procs.run_cli(args)
    assert code == 2 and not out.strip()
    assert str(path) in one_line(err) and "--force" in err
    assert path.read_text() == "keep me\n"
    code, out, err = procs.run_cli([*args, "--force"])
    assert code == 0, err
    assert len(load_transcript(path)) > 20


# -- 3: clear SESSION --all -------------------------------------------------------------------------


def test_point3_clear_session_and_all_is_a_usage_error(tmp_path: Path) -> None:
    db, before = seeded(tmp_path)
    code, out, err = procs.run_cli(["clear", "kept", "--all", "--db", str(db)])
    assert code == 2 and not out.strip()
    assert one_line(err) == (
        "host-stub: error: name a SESSION or pass --all, not both (--all clears every session)"
    )
    assert procs.dump(db) == before


# -- 4: a file already in the store is recognised ----------------------------------------------------


def test_point4_replaying_the_demo_saved_file_into_its_store_appends_nothing(
    tmp_path: Path,
) -> None:
    db, path = tmp_path / "demo.db", tmp_path / "demo.jsonl"
    code, _, err = procs.run_cli(
        ["demo", "--turns", "20", "--baseline", "off", "--db", str(db), "--save", str(path)]
    )
    assert code == 0, err
    total = len(load_transcript(path))
    before = procs.dump(db)
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db)])
    assert code == 0, err
    assert one_line(out) == (
        f"nothing to replay: session 'demo' already holds all {total} messages of demo.jsonl"
    )
    assert procs.dump(db) == before


def store_without_keys(db: Path, session: str, raw: list[dict[str, Any]]) -> None:
    """``raw`` stored as a session that carries no replay keys (a store an older demo wrote)."""

    async def run() -> None:
        memory = SQLiteMemory(db, message_tokens)
        try:
            await memory.append(session, [Message.model_validate(m) for m in raw])
        finally:
            await memory.close()

    asyncio.run(run())


def test_point4_a_stored_session_without_replay_keys_is_recognised_by_its_messages(
    tmp_path: Path,
) -> None:
    raw = conversation()
    db = tmp_path / "m.db"
    store_without_keys(db, "trip", raw)
    path = write_jsonl(tmp_path / "trip.jsonl", raw)
    before = procs.dump(db)
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db)])
    assert code == 0, err
    assert one_line(out) == (
        f"nothing to replay: session 'trip' already holds all {len(raw)} messages of trip.jsonl"
    )
    assert procs.dump(db) == before


def test_point4_a_file_that_extends_a_session_without_keys_replays_only_the_rest(
    tmp_path: Path,
) -> None:
    raw = conversation()
    db = tmp_path / "m.db"
    store_without_keys(db, "trip", raw[:20])
    path = write_jsonl(tmp_path / "trip.jsonl", raw)
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db), "--baseline", "off"])
    assert code == 0, err
    assert (
        f"resuming: session 'trip' already holds the first 20 of the {len(raw)} messages; "
        f"replaying the other {len(raw) - 20}"
    ) in err
    messages = asyncio.run(stored(db, "trip"))
    assert [m.to_openai() for m in messages] == [Message.model_validate(m).to_openai() for m in raw]
    assert [REPLAY_KEY in m.metadata for m in messages] == [False] * 20 + [True] * (len(raw) - 20)


def test_point4_a_different_file_into_a_session_without_keys_is_refused(tmp_path: Path) -> None:
    raw = conversation()
    db = tmp_path / "m.db"
    store_without_keys(db, "trip", raw)
    other = json.loads(json.dumps(raw))
    other[1]["content"] = "another answer"
    path = write_jsonl(tmp_path / "trip.jsonl", other)
    before = procs.dump(db)
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db)])
    assert code == 2 and not out.strip()
    line = one_line(err)
    assert line.startswith("host-stub: error: session 'trip': message 2 differs"), line
    assert procs.dump(db) == before


def test_point2_demo_save_never_overwrites_the_demo_store_itself(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    code, out, err = procs.run_cli(
        ["demo", "--turns", "20", "--db", str(db), "--save", str(db), "--force"]
    )
    assert code == 2 and not out.strip()
    assert one_line(err) == (
        f"host-stub: error: --save {db}: that file is the demo's store; save the conversation "
        "elsewhere"
    )
    assert not db.exists()
