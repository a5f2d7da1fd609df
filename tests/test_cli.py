"""The ``host-stub`` command line, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import require
from fake_openai import FakeOpenAIServer

from host_stub.cli import main
from host_stub.datasets import load_tau_bench

SCRIPT = Path(sys.executable).parent / "host-stub"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def conversation(tmp_path: Path) -> Path:
    """One tau-bench trajectory written as the user's own JSONL file."""
    conv = load_tau_bench(require("tau_bench/airline_dev.json"))[0]
    path = tmp_path / "trip.jsonl"
    path.write_text("\n".join(json.dumps(m.to_openai()) for m in conv.messages) + "\n")
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "host.toml"
    path.write_text(
        "[host]\ncontext_window = 8000\n\n[plugin.memory-summary]\nthreshold = 10\nkeep_recent = 4\ndebounce_turns = 1\n"
    )
    return path


@pytest.mark.slow
def test_replay_then_inspect(
    conversation: Path, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "m.db")
    code, out, err = run(["replay", str(conversation), "--db", db, "--config", str(config)], capsys)
    assert code == 0, err
    assert "compression:" in out and "replayed 32 messages" in out
    code, out, _ = run(["sessions", "--json", "--db", db], capsys)
    sessions = json.loads(out)
    assert code == 0 and sessions[0]["session_id"] == "trip" and sessions[0]["archived"] > 0
    code, out, _ = run(["summary", "trip", "--json", "--db", db, "--config", str(config)], capsys)
    record = json.loads(out)
    assert code == 0 and record["compressions"] >= 1 and "mia_li_3668" in record["text"]
    code, out, _ = run(["summary", "trip", "--db", db], capsys)
    assert code == 0 and "messages summarized" in out
    code, out, _ = run(["compress", "trip", "--json", "--db", db, "--config", str(config)], capsys)
    assert code == 0 and json.loads(out)["status"] in ("done", "skipped")
    code, out, _ = run(["rebuild", "trip", "--json", "--db", db, "--config", str(config)], capsys)
    assert code == 0 and json.loads(out)["status"] in ("done", "skipped")
    code, out, _ = run(["clear", "trip", "--json", "--db", db], capsys)
    assert code == 0 and "summary" in json.loads(out)
    code, out, _ = run(["summary", "trip", "--db", db], capsys)
    assert "no summary" in out


def test_clear_of_an_unknown_session_is_a_user_error_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "m.db")
    code, out, err = run(["clear", "trip-typo", "--db", db], capsys)
    assert code == 2 and out == "" and not Path(db).exists()
    assert (
        err.strip()
        == f"host-stub: error: no such store: sqlite:///{db} (replay, demo or chat create one)"
    )
    # Facts pinned before the first message (pin --create makes the store) make the session
    # known to clear; a typo is still unknown.
    code, _, err = run(["pin", "trip", "allergic to nuts", "--create", "--db", db], capsys)
    assert code == 0, err
    code, out, err = run(["clear", "trip-typo", "--db", db], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"host-stub: error: unknown session 'trip-typo' in sqlite:///{db}"
    code, out, _ = run(["sessions", "--json", "--db", db], capsys)
    assert code == 0 and json.loads(out) == []
    code, out, err = run(["clear", "trip", "--json", "--db", db], capsys)
    assert code == 0 and "summary" in json.loads(out), err
    code, out, _ = run(["summary", "trip", "--db", db], capsys)
    assert "no summary" in out


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "file not found"),
        ('{"role": "user", "content": "hi"}\n{"role": "user", "content": \n', ":2: malformed JSON"),
        ('{"role": "robot", "content": "hi"}\n', ":1: role: Input should be"),
        (b'{"role": "user", "content": "\xff"}\n', ":1: invalid UTF-8"),
    ],
)
def test_bad_transcript_is_one_line_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes | None, expected: str
) -> None:
    path = tmp_path / "bad.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    db = tmp_path / "m.db"
    code, out, err = run(["replay", str(path), "--db", str(db)], capsys)
    assert code == 2 and expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "host.toml"
    config.write_text("[plugin.memory-summary]\nthreshhold = 3\n")
    code, _, err = run(
        ["sessions", "--config", str(config), "--db", str(tmp_path / "m.db")], capsys
    )
    assert code == 2 and "host.toml: plugin.memory-summary.threshhold: unknown key" in err
    assert len(err.strip().splitlines()) == 1


def test_replay_keeps_what_is_stored_when_the_next_file_is_bad(
    conversation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "m.db")
    assert run(["replay", str(conversation), "--db", db], capsys)[0] == 0
    bad = tmp_path / "trip2.jsonl"
    bad.write_text("{not json\n")
    assert run(["replay", str(bad), "--db", db], capsys)[0] == 2
    code, out, _ = run(["sessions", "--json", "--db", db], capsys)
    assert [s["session_id"] for s in json.loads(out)] == ["trip"]


@pytest.mark.slow
def test_installed_script_and_chat_against_a_local_server(tmp_path: Path) -> None:
    with FakeOpenAIServer(default_reply="Hello from the fake model.") as server:
        env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
        proc = subprocess.run(
            [
                str(SCRIPT),
                "chat",
                "--model",
                "openai/fake-model",
                "--api-base",
                server.base_url,
                "--db",
                str(tmp_path / "chat.db"),
            ],
            input="hi there\n/summary\n/quit\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Hello from the fake model." in proc.stdout and "(no summary yet)" in proc.stdout
        body = server.requests[0]
        assert body["model"] == "fake-model" and body["stream"] is True
        assert body["messages"][-1] == {"role": "user", "content": "hi there"}


def test_chat_without_model_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["chat", "--db", str(tmp_path / "m.db")], capsys)
    assert code == 2 and "chat needs a model" in err


@pytest.mark.parametrize(
    "url", ["postgresql://nobody:secret@127.0.0.1:1/test", "redis://:secret@127.0.0.1:1/0"]
)
def test_unreachable_store_server_is_one_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["sessions", "--memory", url], capsys)
    assert code == 2 and "cannot connect" in err and "Traceback" not in err
    assert "secret" not in err and len(err.strip().splitlines()) == 1


def test_search_finds_archived_messages_as_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conversation = tmp_path / "gym.jsonl"
    lines = [{"role": "user", "content": "My locker code is 4417-ZEBRA."}]
    lines.append({"role": "assistant", "content": "Noted."})
    for i in range(30):
        lines.append({"role": "user", "content": f"question {i} about climbing grades"})
        lines.append({"role": "assistant", "content": f"answer {i}"})
    conversation.write_text("\n".join(json.dumps(m) for m in lines) + "\n")
    config = tmp_path / "host.toml"
    config.write_text("[plugin.memory-summary]\nthreshold = 10\nkeep_recent = 4\n")
    db = str(tmp_path / "m.db")
    code, _, err = run(["replay", str(conversation), "--db", db, "--config", str(config)], capsys)
    assert code == 0, err

    code, out, err = run(["search", "gym", "locker code", "--json", "--db", db], capsys)
    assert code == 0, err
    hits = json.loads(out)
    assert hits[0]["seq"] == 1 and hits[0]["role"] == "user"
    assert hits[0]["status"] == "archived (summarized)" and hits[0]["date"]
    assert hits[0]["text"] == "My locker code is 4417-ZEBRA."
    code, out, _ = run(["search", "gym", "4417-ZEBRA", "--db", db], capsys)
    first, *rest = out.splitlines()
    assert code == 0 and first.startswith("#1 user, archived, ")
    assert first.endswith(": My locker code is 4417-ZEBRA.")
    assert rest == [rest[0]] and rest[0].startswith("#2 assistant")  # the reply to it, lower
    code, out, _ = run(
        ["search", "gym", "locker", "--role", "assistant", "--json", "--db", db], capsys
    )
    assert code == 0 and [h["seq"] for h in json.loads(out)] == [2]
    code, out, _ = run(["search", "gym", "volcano", "--db", db], capsys)
    assert code == 0 and out.strip() == "nothing found for 'volcano' in session 'gym'"
    code, out, _ = run(["search", "gym", "climbing", "--limit", "3", "--json", "--db", db], capsys)
    assert code == 0 and len(json.loads(out)) == 3

    # Mistakes are one line, exit code 2.
    code, out, err = run(["search", "gmy", "locker", "--db", db], capsys)
    assert (code, out) == (2, "")
    assert err.strip() == f"host-stub: error: unknown session 'gmy' in sqlite:///{db}"
    code, out, err = run(["search", "gym", "  ", "--db", db], capsys)
    assert code == 2 and err.strip() == (
        "host-stub: error: the query is empty: give the words to look for"
    )
