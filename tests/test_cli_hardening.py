"""Issue 14, points 3 and 8-20: replay that resumes, bad input at the edge, and the command line
as a new user meets it. Each test is named after its point; every mistake is one line on stderr,
exit code 2, and nothing stored (the store's rows are compared before and after).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import procs
import pytest
from fake_openai import FakeOpenAIServer, Reply
from hypothesis import assume, given
from hypothesis import strategies as st
from test_memory_contract import BACKENDS, CLEANUP

from host_stub.checks import MessageRejected, cut_to_limit, message_problem
from host_stub.config import HostConfig
from host_stub.host import Host
from host_stub.memory import open_memory
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message
from host_stub.session_ids import MAX_SESSION_ID_CHARS, InvalidSessionId, session_id_problem
from host_stub.testing import message_tokens
from host_stub.transcripts import (
    REPLAY_KEY,
    TranscriptError,
    load_transcript,
    with_replay_keys,
)
from plugin_memory_summary.extras.commands import status_line

SCRIPT = Path(sys.executable).parent / "host-stub"

#: Compress often, so a replay of the conversation below has compressions in it.
CONFIG = (
    "[host]\ncontext_window = 8000\n\n[plugin.memory-summary]\n"
    "threshold = 8\nkeep_recent = 3\ndebounce_turns = 1\n"
)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"not one line: {text!r}"
    return lines[0]


def conversation(turns: int = 12) -> list[dict[str, Any]]:
    """A conversation with a tool call every third turn."""
    out: list[dict[str, Any]] = []
    for i in range(1, turns + 1):
        out.append({"role": "user", "content": f"Question {i}: what about booking RES-{1000 + i}?"})
        if i % 3 == 0:
            call = {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"ref": f"RES-{i}"})},
            }
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"found {i}"})
        out.append({"role": "assistant", "content": f"Answer {i}: RES-{1000 + i} is confirmed."})
    return out


def write_jsonl(path: Path, messages: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(m) + "\n" for m in messages), encoding="utf-8")
    return path


def config_file(tmp_path: Path, text: str = CONFIG) -> Path:
    path = tmp_path / "host.toml"
    path.write_text(text)
    return path


async def stored(db: Path, session: str) -> list[Message]:
    """Every message of ``session`` (active and archived, markers left out), oldest first."""
    memory = SQLiteMemory(db, message_tokens)
    try:
        messages = [*await memory.get_archived(session), *await memory.get_history(session)]
    finally:
        await memory.close()
    return sorted((m for m in messages if not m.is_marker), key=lambda m: m.seq or 0)


def seeded(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A store holding session 'kept' (a replayed conversation); returns it and its rows."""
    db = tmp_path / "store.db"
    path = write_jsonl(tmp_path / "kept.jsonl", conversation(6))
    code, out, err = procs.run_cli(
        [
            "replay",
            str(path),
            "--db",
            str(db),
            "--baseline",
            "off",
            "--config",
            str(config_file(tmp_path)),
        ]
    )
    assert code == 0 and "compression:" in out, err
    return db, procs.dump(db)


# -- 3: resumable, idempotent replay ---------------------------------------------------------------


def test_p3_replaying_the_same_file_again_stores_nothing_more(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    path = write_jsonl(tmp_path / "trip.jsonl", conversation())
    args = ["replay", str(path), "--db", str(db), "--config", str(config_file(tmp_path))]
    code, out, err = procs.run_cli([*args, "--baseline", "off"])
    assert code == 0 and "compression:" in out, err
    before = procs.dump(db)
    code, out, err = procs.run_cli(args)
    assert code == 0, err
    assert (
        out.strip()
        == "nothing to replay: session 'trip' already holds all 32 messages of trip.jsonl"
    )
    assert procs.dump(db) == before
    assert len(asyncio.run(stored(db, "trip"))) == 32


@pytest.mark.parametrize("kept", [1, 5, 7, 8, 31], ids=lambda k: f"first-{k}-stored")
def test_p3_a_replay_cut_short_resumes_where_it_stopped(kept: int, tmp_path: Path) -> None:
    """A crash leaves the first ``kept`` messages stored, mid-turn too (5: the user message of
    turn 3 without its tool call; 7: the call and its result without the answer after them):
    running the same replay again stores each message of the file exactly once, in order."""
    raw = conversation()
    path = write_jsonl(tmp_path / "trip.jsonl", raw)
    db = tmp_path / "m.db"
    keyed = with_replay_keys(load_transcript(path))

    async def crashed_run() -> None:
        memory = SQLiteMemory(db, message_tokens)
        try:
            await memory.append("trip", keyed[:kept])
        finally:
            await memory.close()

    asyncio.run(crashed_run())
    code, out, err = procs.run_cli(
        ["replay", str(path), "--db", str(db), "--config", str(config_file(tmp_path))]
    )
    assert code == 0, err
    assert (
        f"resuming: session 'trip' already holds the first {kept} of the 32 messages; "
        f"replaying the other {32 - kept}"
    ) in err
    messages = asyncio.run(stored(db, "trip"))
    assert [m.to_openai() for m in messages] == [Message.model_validate(m).to_openai() for m in raw]
    assert [m.metadata[REPLAY_KEY] for m in messages] == [m.metadata[REPLAY_KEY] for m in keyed]


def test_p3_a_grown_file_replays_only_its_new_messages(tmp_path: Path) -> None:
    raw = conversation()
    db = tmp_path / "m.db"
    path = write_jsonl(tmp_path / "trip.jsonl", raw[:20])
    assert procs.run_cli(["replay", str(path), "--db", str(db), "--baseline", "off"])[0] == 0
    write_jsonl(path, raw)
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db), "--baseline", "off"])
    assert code == 0 and "replaying the other 12" in err, err
    assert len(asyncio.run(stored(db, "trip"))) == 32


def test_p3_another_conversation_into_a_replayed_session_is_refused(tmp_path: Path) -> None:
    db, before = seeded(tmp_path)
    other = conversation(6)
    other[2]["content"] = "a different question"
    path = write_jsonl(tmp_path / "other.jsonl", other)
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db), "--session", "kept"])
    assert code == 2 and not out.strip()
    line = one_line(err)
    assert line.startswith("host-stub: error: session 'kept': message 3 differs"), line
    assert "--session NAME" in line
    assert procs.dump(db) == before


# -- 8: messages with no content ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"role":"user"}', "t.jsonl:2: a user message needs content (it has none)"),
        ('{"role":"user","content":null}', "t.jsonl:2: a user message needs content"),
        ('{"role":"tool","tool_call_id":"c","content":null}', "a tool message needs content"),
        ('{"role":"assistant","content":null}', "an assistant message needs content or tool"),
        ('{"role":"system","content":[]}', "a system message needs content"),
    ],
    ids=["missing", "null", "tool", "assistant", "empty-list"],
)
def test_p8_a_message_without_content_is_refused_and_nothing_stored(
    line: str, expected: str, tmp_path: Path
) -> None:
    db, before = seeded(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text('{"role":"user","content":"hi"}\n' + line + "\n")
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db)])
    assert code == 2 and expected in one_line(err), err
    assert procs.dump(db) == before


async def test_p8_the_host_refuses_a_message_without_content_before_storing(tmp_path: Path) -> None:
    from host_stub.testing import FakeLLM

    async with Host(
        HostConfig(), memory=SQLiteMemory(tmp_path / "h.db", message_tokens), llm=FakeLLM()
    ) as host:
        with pytest.raises(MessageRejected, match="a user message needs content"):
            await host.run_turn("s", Message(role="user"))
        assert await host.memory.list_sessions() == []


# -- 9: the per-message size limit -------------------------------------------------------------------


def test_p9_an_over_long_message_is_refused_naming_the_limit(tmp_path: Path) -> None:
    db, before = seeded(tmp_path)
    big = "x" * 250_000  # over the default limit, 200,000 characters
    path = write_jsonl(
        tmp_path / "big.jsonl",
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": big}],
    )
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db)])
    assert code == 2, err
    assert one_line(err) == (
        f"host-stub: error: {path}:2: message has 250,000 characters, over the limit of 200,000 "
        "(host.max_message_chars; 0 = no limit)"
    )
    assert procs.dump(db) == before


@pytest.mark.parametrize("limit", [300_000, 0])
def test_p9_the_limit_is_configurable(limit: int, tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    path = write_jsonl(
        tmp_path / "big.jsonl",
        [{"role": "user", "content": "y" * 250_000}, {"role": "assistant", "content": "ok"}],
    )
    config = config_file(tmp_path, f"[host]\nmax_message_chars = {limit}\n")
    code, out, err = procs.run_cli(
        ["replay", str(path), "--db", str(db), "--config", str(config), "--baseline", "off"]
    )
    assert code == 0, err
    assert asyncio.run(stored(db, "big"))[0].content == "y" * 250_000
    if limit:
        small = config_file(tmp_path, "[host]\nmax_message_chars = 1000\n")
        code, _, err = procs.run_cli(
            ["replay", str(path), "--db", str(tmp_path / "n.db"), "--config", str(small)]
        )
        assert code == 2 and "over the limit of 1,000" in err


async def test_p9_the_host_refuses_an_over_long_input_and_cuts_a_tool_output(
    tmp_path: Path,
) -> None:
    from host_stub.testing import FakeLLM

    config = HostConfig.model_validate({"host": {"max_message_chars": 100}})
    async with Host(
        config, memory=SQLiteMemory(tmp_path / "h.db", message_tokens), llm=FakeLLM()
    ) as host:
        with pytest.raises(MessageRejected, match="101 characters, over the limit of 100"):
            await host.run_turn("s", "z" * 101)
        assert await host.memory.list_sessions() == []
    cut = cut_to_limit("w" * 1000, 100)
    kept = cut.index("\n")
    assert len(cut) <= 100 and cut[:kept] == "w" * kept
    assert cut[kept:] == f"\n[cut: {1000 - kept} more characters over host.max_message_chars]"
    assert cut_to_limit("short", 100) == "short" and cut_to_limit("w" * 1000, 0) == "w" * 1000
    assert message_problem(Message(role="user", content="a" * 100), 100) is None


# -- 10: an empty file, a tool result without its call ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("e.jsonl", b""),
        ("e.jsonl", b"\n\n"),
        ("e.json", b""),
        ("e.json", b"[]"),
        ("e.json", b'{"messages": []}'),
    ],
    ids=["jsonl", "jsonl-blank-lines", "json", "json-list", "json-object"],
)
def test_p10_an_empty_transcript_is_the_same_error_whatever_its_kind(
    name: str, data: bytes, tmp_path: Path
) -> None:
    db, before = seeded(tmp_path)
    path = tmp_path / name
    path.write_bytes(data)
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db)])
    assert code == 2, (out, err)
    assert one_line(err) == f"host-stub: error: {path}: no messages (the conversation is empty)"
    assert procs.dump(db) == before


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (
            [
                {"role": "user", "content": "a"},
                {"role": "tool", "tool_call_id": "c9", "content": "r"},
            ],
            ":2: tool result for call 'c9' without its call",
        ),
        (
            [{"role": "user", "content": "a"}, {"role": "tool", "content": "r"}],
            ":2: a tool result needs tool_call_id",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
                {"role": "tool", "tool_call_id": "c1", "content": "again"},
            ],
            ":4: tool result for call 'c1' without its call",
        ),
    ],
    ids=["no-call", "no-id", "answered-twice"],
)
def test_p10_a_tool_result_without_its_call_is_refused(
    messages: list[dict[str, Any]], expected: str, tmp_path: Path
) -> None:
    db, before = seeded(tmp_path)
    path = write_jsonl(tmp_path / "t.jsonl", messages)
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db)])
    assert code == 2 and expected in one_line(err), err
    assert procs.dump(db) == before


# -- 11: one session-id rule for every backend ----------------------------------------------------------

BAD_IDS = {
    "empty": "",
    "newline": "a\nb",
    "carriage-return": "a\rb",
    "rtl-override": "abc\u202edef",
    "zero-width": "a\u200bb",
    "10kb": "s" * 10_000,
    "edge-space": " a",
}


@pytest.mark.parametrize("name", sorted(BAD_IDS))
def test_p11_a_bad_session_id_is_refused_at_the_command_line(name: str, tmp_path: Path) -> None:
    db, before = seeded(tmp_path)
    path = write_jsonl(tmp_path / "t.jsonl", conversation(2))
    bad = BAD_IDS[name]
    for argv in (
        ["replay", str(path), "--session", bad],
        ["summary", bad],
        ["pin", bad, "a fact", "--create"],
        ["clear", bad],
        ["chat", "--model", "openai/x", "--session", bad],
    ):
        code, out, err = procs.run_cli([*argv, "--db", str(db)])
        assert code == 2, (argv, out, err)
        line = one_line(err)
        assert line.startswith("host-stub: error: invalid session id "), line
    assert procs.dump(db) == before


def test_p11_a_file_name_that_is_no_session_id_asks_for_session(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / ("x" * 140 + ".jsonl"), conversation(2))
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(tmp_path / "m.db")])
    assert code == 2 and "name one with --session" in one_line(err), err
    assert not (tmp_path / "m.db").exists()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
async def test_p11_every_backend_applies_the_same_rule(backend: str, tmp_path: Path) -> None:
    url = BACKENDS[backend](tmp_path)
    memory = open_memory(url, message_tokens)
    try:
        for name, bad in BAD_IDS.items():
            with pytest.raises(InvalidSessionId, match="invalid session id"):
                await memory.append(bad, [Message(role="user", content="hi")])
            with pytest.raises(InvalidSessionId):
                await memory.clear(bad)
            with pytest.raises(InvalidSessionId):
                await memory.save_metadata("summary", bad, {"x": name})
        longest = "長" * MAX_SESSION_ID_CHARS  # 384 bytes of UTF-8: within every index
        [message] = await memory.append(longest, [Message(role="user", content="hi")])
        assert message.seq == 1
        assert [s.session_id for s in await memory.list_sessions()] == [longest]
    finally:
        await memory.close()
        if backend in CLEANUP:
            await CLEANUP[backend](url)


def test_the_session_id_rule_by_example() -> None:
    for ok in ("s", "trip", "my chat", "对话-2025", "user@example:7/a+b", "x" * 128):
        assert session_id_problem(ok) is None, ok
    assert "at most 128 characters (this one has 10,000)" in str(session_id_problem("s" * 10_000))
    assert "U+202E" in str(session_id_problem("a\u202eb"))
    assert "cannot be empty" in str(session_id_problem(""))


@given(st.text(alphabet=st.characters(max_codepoint=0x7F), min_size=1, max_size=40))
def test_the_ascii_shortcut_follows_the_character_rule(session_id: str) -> None:
    # Printable ASCII skips the per-character look-up; it must judge as the look-up does: the
    # same id with one allowed non-ASCII letter added takes the look-up.
    assume(session_id == session_id.strip(" "))
    problem = session_id_problem(session_id)
    assert problem == session_id_problem(session_id + "\u00e9"), session_id


# -- 12-14: the store options ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["sessions"], ["replay", "t.jsonl"], ["summary", "s"]])
def test_p12_db_url_is_refused_with_a_pointer_to_memory(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "t.jsonl", conversation(2))
    url = "postgresql://user@127.0.0.1:5432/test"
    code, out, err = procs.run_cli([*command, "--db", url])
    assert code == 2, (out, err)
    assert one_line(err) == (
        f"host-stub: error: --db takes the path of a SQLite file, not a URL ({url!r}): "
        f"use --memory {url} for a store URL"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


@pytest.mark.parametrize("command", [["sessions"], ["summary", "s"], ["replay", "other.jsonl"]])
def test_p13_a_db_that_is_not_a_database_is_one_line(command: list[str], tmp_path: Path) -> None:
    conv = write_jsonl(tmp_path / "conversation.jsonl", conversation(2))
    write_jsonl(tmp_path / "other.jsonl", conversation(2))
    data = conv.read_bytes()
    argv = [str(tmp_path / a) if a.endswith(".jsonl") else a for a in command]
    code, out, err = procs.run_cli([*argv, "--db", str(conv)])
    assert code == 2, (out, err)
    assert one_line(err) == (
        f"host-stub: error: {conv}: cannot open: not a SQLite database (file is not a database)"
    )
    assert conv.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conversation.jsonl", "other.jsonl"]


@pytest.mark.parametrize(
    "command",
    [
        ["sessions"],
        ["summary", "s"],
        ["compress", "s"],
        ["rebuild", "s"],
        ["pin", "s", "fact"],
        ["clear", "s"],
        ["clear", "--all"],
    ],
)
def test_p14_read_only_commands_do_not_create_a_store(command: list[str], tmp_path: Path) -> None:
    for store, url in (
        (["--db", str(tmp_path / "typo.db")], f"sqlite:///{tmp_path / 'typo.db'}"),
        (
            ["--memory", f"sqlite:///{tmp_path / 'no' / 'dir' / 'x.db'}"],
            f"sqlite:///{tmp_path / 'no' / 'dir' / 'x.db'}",
        ),
    ):
        code, out, err = procs.run_cli([*command, *store])
        assert code == 2, (command, out, err)
        assert one_line(err) == (
            f"host-stub: error: no such store: {url} (replay, demo or chat create one)"
        )
    assert list(tmp_path.iterdir()) == []


# -- 15-17: unknown sessions, clear, rebuild ---------------------------------------------------------------


def test_p15_unknown_sessions_are_refused_and_nothing_is_created(tmp_path: Path) -> None:
    db, before = seeded(tmp_path)
    for argv in (["summary", "nosuch"], ["compress", "nosuch"], ["rebuild", "nosuch"]):
        code, out, err = procs.run_cli([*argv, "--db", str(db)])
        assert code == 2 and not out.strip(), (argv, out, err)
        assert one_line(err) == f"host-stub: error: unknown session 'nosuch' in sqlite:///{db}"
    code, out, err = procs.run_cli(["pin", "nosuch", "a fact", "--db", str(db)])
    assert code == 2 and not out.strip()
    assert one_line(err) == (
        f"host-stub: error: unknown session 'nosuch' in sqlite:///{db} "
        "(pin --create pins ahead of it)"
    )
    assert procs.dump(db) == before
    code, out, err = procs.run_cli(["pin", "nosuch", "a fact", "--create", "--db", str(db)])
    assert code == 0 and out.strip() == "pinned in session 'nosuch' (1 pinned fact)", err
    code, out, err = procs.run_cli(["summary", "nosuch", "--db", str(db)])
    assert code == 0 and "a fact" in out, err


def test_p16_clear_refuses_an_unknown_type_and_prints_plain_words(tmp_path: Path) -> None:
    db, before = seeded(tmp_path)
    code, out, err = procs.run_cli(["clear", "kept", "--type", "bogus", "--db", str(db)])
    assert code == 2 and not out.strip()
    assert one_line(err) == (
        "host-stub: error: unknown --type 'bogus': this host clears history, summary"
    )
    assert procs.dump(db) == before
    code, out, err = procs.run_cli(["clear", "kept", "--type", "summary", "--db", str(db)])
    assert (code, out.strip()) == (0, "cleared session 'kept': summary"), err
    code, out, err = procs.run_cli(["clear", "--all", "--db", str(db)])
    assert (code, out.strip()) == (0, "cleared 1 session: history, summary"), err
    assert "{" not in out


def test_p17_rebuild_says_it_rebuilt(tmp_path: Path) -> None:
    db, _ = seeded(tmp_path)
    code, out, err = procs.run_cli(["rebuild", "kept", "--db", str(db)])
    assert code == 0, err
    line = one_line(out)
    assert line.startswith("rebuilt: the summary now covers "), line
    assert "skipped: nothing to compress" not in line
    result = {
        "status": "skipped",
        "reason": "nothing to compress (2 active messages)",
        "stats": {"rebuilt_from": 14},
    }
    assert status_line(result, "rebuild") == (
        "rebuilt: the summary now covers 14 archived messages; nothing more to compress"
    )


# -- 18: the rest of what a new user meets -----------------------------------------------------------------


def test_p18_a_plugin_config_error_leaves_no_database_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", conversation(2))
    config = config_file(tmp_path, "[plugin.memory-summary]\nthreshold = 10\nkeep_recent = 10\n")
    db = tmp_path / "new.db"
    for argv in (["replay", str(path)], ["chat", "--model", "openai/x"]):
        code, out, err = procs.run_cli([*argv, "--db", str(db), "--config", str(config)])
        assert code == 2 and "keep_recent (10) must be smaller" in one_line(err), (argv, err)
        assert not db.exists(), argv


def test_p18_a_bad_memory_url_is_reported_as_coming_from_memory(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", conversation(2))
    for argv in (["sessions"], ["summary", "s"], ["replay", str(path)]):
        code, out, err = procs.run_cli([*argv, "--memory", "mysql://db"])
        assert code == 2, (argv, err)
        line = one_line(err)
        assert line.startswith("host-stub: error: --memory: memory URL 'mysql://db'"), line
        assert "<defaults>" not in line


def test_p18_help_names_every_store_and_every_option(tmp_path: Path) -> None:
    code, out, _ = procs.run_cli(["sessions", "--help"])
    assert code == 0
    for scheme in ("sqlite:///", "postgresql://", "redis://", "memory://"):
        assert scheme in out
    code, out, _ = procs.run_cli(["chat", "--help"])
    assert "a stored session resumes" in " ".join(out.split())
    code, out, _ = procs.run_cli(["clear", "--help"])
    assert "Print what was cleared as JSON" in " ".join(out.split())


def test_p18_pinned_facts_and_token_numbers_read_well(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    long = [
        {**m, "content": f"{m['content']} " + "many words here " * 60} if m.get("content") else m
        for m in conversation(16)
    ]
    path = write_jsonl(tmp_path / "long.jsonl", long)
    config = config_file(  # no compression during the replay: the command does it
        tmp_path,
        "[plugin.memory-summary]\nthreshold = 100000\nkeep_recent = 4\n"
        "auto_compress_threshold = 0\nhard_compress_threshold = 0\n",
    )
    code, _, err = procs.run_cli(
        ["replay", str(path), "--db", str(db), "--config", str(config), "--baseline", "off"]
    )
    assert code == 0, err
    code, out, err = procs.run_cli(["compress", "long", "--db", str(db), "--config", str(config)])
    assert code == 0, err
    assert re.fullmatch(
        r"done(: manual)? \(\d+ messages summarized, tokens \d{1,3}(,\d{3})+ -> [\d,]+\)",
        out.strip(),
    ), out
    code, out, err = procs.run_cli(["pin", "long", "the user is allergic to nuts", "--db", str(db)])
    assert (code, out.strip()) == (0, "pinned in session 'long' (1 pinned fact)"), err
    result = {
        "status": "done",
        "stats": {"messages_summarized": 1200, "tokens_before": 31200, "tokens_after": 1034},
    }
    assert status_line(result) == "done (1,200 messages summarized, tokens 31,200 -> 1,034)"
    failed = {
        "status": "error",
        "reason": "InternalServerError: litellm.InternalServerError: InternalServerError: "
        "OpenAIException - the summarizer broke",
        "stats": {"messages_summarized": 20, "fallback": "rules"},
    }
    assert status_line(failed) == (
        "error: InternalServerError: OpenAIException - the summarizer broke "
        "(20 messages summarized, fallback rules)"
    )


def test_p18_a_summarizer_failure_is_said_once(tmp_path: Path) -> None:
    """The compression line (or the status of compress) says the model failed and the fallback
    wrote it; the plugin's WARNING does not say it a second time."""
    path = write_jsonl(tmp_path / "t.jsonl", conversation())
    later = tmp_path / "later.toml"  # no compression while replaying: compress does it
    later.write_text(
        "[plugin.memory-summary]\nthreshold = 100000\nkeep_recent = 4\n"
        "auto_compress_threshold = 0\nhard_compress_threshold = 0\n"
    )
    unsummarized = write_jsonl(tmp_path / "u.jsonl", conversation())
    code, _, err = procs.run_cli(
        ["replay", str(unsummarized), "--db", str(tmp_path / "m.db"), "--config", str(later)]
    )
    assert code == 0, err
    with FakeOpenAIServer(default_reply=Reply.error(500, "the summarizer broke")) as server:
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        proc = subprocess.run(
            [
                str(SCRIPT),
                "replay",
                str(path),
                "--db",
                str(tmp_path / "m.db"),
                "--config",
                str(config_file(tmp_path)),
                "--model",
                "openai/fake-model",
                "--api-base",
                server.base_url,
                "--baseline",
                "off",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        assert "openai/fake-model failed, fallback rules: " in proc.stdout
        assert "the summarizer broke" in proc.stdout
        assert "summarizer failed" not in proc.stderr, proc.stderr
        # compress, a plugin command: its status line says it once; no key is needed either.
        proc = subprocess.run(
            [
                str(SCRIPT),
                "compress",
                "u",
                "--db",
                str(tmp_path / "m.db"),
                "--config",
                str(later),
                "--model",
                "openai/fake-model",
                "--api-base",
                server.base_url,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        assert "the summarizer broke" in proc.stdout and "fallback rules" in proc.stdout
        assert "summarizer failed" not in proc.stderr, proc.stderr


# -- 20: a local server that checks no key ------------------------------------------------------------------


def test_p20_a_local_api_base_works_without_an_api_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    with FakeOpenAIServer(default_reply="Hello without a key.") as server:
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
            input="hi there\n/quit\n",
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Hello without a key." in proc.stdout
        assert server.requests and server.requests[0]["messages"][-1]["content"] == "hi there"


def test_without_api_base_a_missing_key_is_still_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    proc = subprocess.run(
        [str(SCRIPT), "chat", "--model", "gpt-4o-mini", "--db", str(tmp_path / "c.db")],
        input="",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "needs OPENAI_API_KEY" in one_line(proc.stderr)
    assert not (tmp_path / "c.db").exists()


def test_transcript_keys_are_positions_and_digests(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", conversation(2))
    keys = [m.metadata[REPLAY_KEY] for m in with_replay_keys(load_transcript(path))]
    assert [k.split(":")[0] for k in keys] == ["1", "2", "3", "4"]
    assert len(set(keys)) == 4
    with pytest.raises(TranscriptError):
        load_transcript(tmp_path / "missing.jsonl")
