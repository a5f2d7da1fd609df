"""Issue 33: defects an outside probe found, each test named after its point.

12. JSONL lines were split on every Unicode line break (``str.splitlines``), not on ``\\n`` only;
13. a line of deeply nested JSON was a ``RecursionError`` traceback;
14. with the plugin denied, its commands crashed with ``KeyError``; a store path that cannot be
    opened was a traceback;
15. read-only commands created storage (an empty file became a store, a PostgreSQL schema and
    its tables were made);
18. ``run_turn`` without a model spoke of missing credentials; the README's quick start did not
    say it needs a key or a server;
19. smaller ones: empty and over-long pins, a closed pipe, "1 messages", two wordings for an
    unknown session, no ``--version``, ``search --role`` without help.

A mistake is one line on stderr, exit code 2, and nothing stored changes (the store's rows and
the files are compared before and after).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import procs
import pytest
from test_cli_hardening import config_file, conversation, one_line, seeded, stored, write_jsonl
from test_memory_contract import pg_drop, pg_url

from host_stub.config import HostConfig
from host_stub.host import Host
from host_stub.transcripts import TranscriptError, load_transcript
from plugin_memory_summary.extras import commands as plugin_commands
from plugin_memory_summary.extras.commands import status_line
from plugin_memory_summary.extras.report import CompressionEvent, compression_line

SCRIPT = Path(sys.executable).parent / "host-stub"
ROOT = Path(__file__).resolve().parent.parent
#: The longest fact ``pin`` takes (documented in docs/usage.md).
MAX_PIN_CHARS = 500


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes (a folder as ``b"<dir>"``, a symbolic link as
    ``b"-> target"``)."""
    out: dict[str, bytes] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(folder))] = b"-> " + os.fsencode(os.readlink(p))
        else:
            out[str(p.relative_to(folder))] = b"<dir>" if p.is_dir() else p.read_bytes()
    return out


# -- 12: JSONL is split on "\n" only ---------------------------------------------------------------

#: Valid inside a JSON string as themselves (str.splitlines breaks lines at them).
UNICODE_BREAKS = ["\u2028", "\u2029", "\x85"]
#: Control characters: JSON wants them escaped inside a string; raw, the line is malformed (and
#: is named by its own number).
CONTROL_BREAKS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]


def _raw_line(message: dict[str, Any], separator: str) -> str:
    """``message`` as one JSON line with ``separator`` raw (unescaped) inside its content."""
    return json.dumps(message, ensure_ascii=False).replace("@", separator)


@pytest.mark.parametrize("separator", UNICODE_BREAKS, ids=lambda s: f"U+{ord(s):04X}")
def test_point12_jsonl_lines_are_split_on_newline_only(separator: str, tmp_path: Path) -> None:
    text = f"before{separator}after"
    raw = [{"role": "user", "content": "before@after"}, {"role": "assistant", "content": "ok@"}]
    path = tmp_path / "sep.jsonl"
    path.write_text("".join(_raw_line(m, separator) + "\r\n" for m in raw), encoding="utf-8")
    assert separator in path.read_text(encoding="utf-8")
    assert [m.content for m in load_transcript(path)] == [text, f"ok{separator}"]
    db = tmp_path / "m.db"
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db), "--baseline", "off"])
    assert code == 0, (out, err)
    assert [m.content for m in asyncio.run(stored(db, "sep"))] == [text, f"ok{separator}"]
    # A malformed line is named by its number counted in "\n" only.
    path.write_text(
        "".join(_raw_line(m, separator) + "\n" for m in raw) + "{oops\n", encoding="utf-8"
    )
    with pytest.raises(TranscriptError) as caught:
        load_transcript(path)
    assert str(caught.value).startswith(f"{path}:3: malformed JSON"), caught.value


@pytest.mark.parametrize("separator", CONTROL_BREAKS, ids=lambda s: f"U+{ord(s):04X}")
def test_point12_a_raw_control_character_is_named_on_its_own_line(
    separator: str, tmp_path: Path
) -> None:
    lines = [
        json.dumps({"role": "user", "content": "hello"}),
        _raw_line({"role": "assistant", "content": "a@b"}, separator),
        json.dumps({"role": "user", "content": "again"}),
    ]
    path = tmp_path / "ctl.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(tmp_path / "m.db")])
    assert code == 2, (out, err)
    assert one_line(err) == (
        f"host-stub: error: {path}:2: malformed JSON: Invalid control character at"
    )
    assert not (tmp_path / "m.db").exists()


# -- 13: deeply nested JSON ----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_point13_deeply_nested_json_is_one_line(suffix: str, tmp_path: Path) -> None:
    first = json.dumps({"role": "user", "content": "hello"})
    path = tmp_path / f"deep{suffix}"
    if suffix == ".jsonl":
        path.write_text(first + "\n" + "[" * 2000 + "\n", encoding="utf-8")
        where = f"{path}:2"
    else:
        path.write_text("[" + first + ",\n" + "[" * 2000 + "\n", encoding="utf-8")
        where = f"{path}:2"
    db = tmp_path / "m.db"
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db)])
    assert code == 2, (out, err)
    line = one_line(err)
    assert line.startswith(f"host-stub: error: {where}: "), line
    assert "nested too deeply" in line, line
    assert not db.exists()


# -- 14: the plugin denied; a store that cannot be opened -----------------------------------------


@pytest.mark.parametrize(
    "plugins", ['deny = ["memory-summary"]', "allow = []"], ids=["deny", "allow-none"]
)
def test_point14_the_plugins_commands_say_it_is_not_loaded(plugins: str, tmp_path: Path) -> None:
    db, before = seeded(tmp_path)
    config = config_file(tmp_path, f"[plugins]\n{plugins}\n")
    new = tmp_path / "new.db"
    for argv in (
        ["summary", "kept", "--db", str(db)],
        ["compress", "kept", "--db", str(db)],
        ["rebuild", "kept", "--db", str(db)],
        ["pin", "kept", "a fact", "--db", str(db)],
        ["pin", "fresh", "a fact", "--create", "--db", str(new)],
    ):
        code, out, err = procs.run_cli([*argv, "--config", str(config)])
        assert code == 2 and not out.strip(), (argv, out, err)
        assert one_line(err) == (
            f"host-stub: error: the memory-summary plugin is not loaded ({config}: "
            f"[plugins] {'deny names it' if 'deny' in plugins else 'allow leaves it out'})"
        ), argv
    assert procs.dump(db) == before
    assert not new.exists()


def test_point14_a_store_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", conversation(2))
    (tmp_path / "plain.txt").write_text("not a folder")
    (tmp_path / "link.db").symlink_to(tmp_path / "nowhere" / "x.db")  # its folder does not exist
    before = files(tmp_path)
    for db in (tmp_path / "plain.txt" / "x.db", tmp_path / "link.db"):
        for argv in (
            ["replay", str(path), "--baseline", "off"],
            ["pin", "s", "a fact", "--create"],
            ["demo", "--turns", "20", "--baseline", "off"],
        ):
            code, out, err = procs.run_cli([*argv, "--db", str(db)])
            assert code == 2, (argv, db, out, err)
            line = one_line(err)
            assert line.startswith(f"host-stub: error: {db}: cannot open: "), line
    assert files(tmp_path) == before


# -- 15: read-only commands open existing stores only ----------------------------------------------

READ_ONLY = [
    ["sessions"],
    ["summary", "s"],
    ["search", "s", "words"],
    ["compress", "s"],
    ["rebuild", "s"],
    ["pin", "s", "a fact"],
    ["clear", "s"],
    ["clear", "--all"],
]


@pytest.mark.parametrize("command", READ_ONLY, ids=lambda c: "-".join(c))
def test_point15_an_empty_file_is_not_made_a_store(command: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for args, url in (
        (["--db", str(empty)], f"sqlite:///{empty}"),
        (["--db", str(tmp_path / "nodir" / "new.db")], f"sqlite:///{tmp_path / 'nodir/new.db'}"),
    ):
        code, out, err = procs.run_cli([*command, *args])
        assert code == 2 and not out.strip(), (command, out, err)
        line = one_line(err)
        assert line.startswith(f"host-stub: error: no such store: {url}"), line
    assert files(tmp_path) == {"empty.db": b""}


def test_point15_open_memory_without_create_makes_nothing(tmp_path: Path) -> None:
    from host_stub.memory import StoreNotFound, open_memory
    from host_stub.testing import message_tokens

    async def sessions(url: str, *, create: bool) -> list[str]:
        store = open_memory(url, message_tokens, create=create)
        try:
            return [s.session_id for s in await store.list_sessions()]
        finally:
            await store.close()

    (tmp_path / "empty.db").write_bytes(b"")
    for name, reason in (("empty.db", "the file is empty"), ("none.db", "no such file")):
        url = f"sqlite:///{tmp_path / name}"
        with pytest.raises(StoreNotFound) as caught:
            asyncio.run(sessions(url, create=False))
        assert str(caught.value) == f"no such store: {url}: {reason}"
    assert files(tmp_path) == {"empty.db": b""}
    url = f"sqlite:///{tmp_path / 'made.db'}"
    assert asyncio.run(sessions(url, create=True)) == []  # made, then found
    assert asyncio.run(sessions(url, create=False)) == []


async def _schema_exists(url: str) -> bool:
    import asyncpg
    from test_memory_contract import PG_URL

    schema = url.rpartition("schema=")[2]
    conn = await asyncpg.connect(PG_URL, timeout=5)
    try:
        return bool(await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema))
    finally:
        await conn.close()


def test_point15_a_missing_postgres_schema_is_not_created() -> None:
    url = pg_url()  # a schema name nobody created
    schema = url.rpartition("schema=")[2]
    try:
        for command in (["sessions"], ["summary", "s"], ["search", "s", "words"]):
            code, out, err = procs.run_cli([*command, "--memory", url])
            assert code == 2 and not out.strip(), (command, out, err)
            line = one_line(err)
            assert line.startswith("host-stub: error: no such store: postgresql://"), line
            assert f"schema '{schema}' does not exist" in line, line
            assert not asyncio.run(_schema_exists(url)), command
        # The store a replay made is found (and read) by the same commands.
        code, out, err = procs.run_cli(["pin", "s", "a fact", "--create", "--memory", url])
        assert code == 0, err
        code, out, err = procs.run_cli(["summary", "s", "--memory", url])
        assert code == 0 and "a fact" in out, err
    finally:
        asyncio.run(pg_drop(url))


# -- 18: no model ------------------------------------------------------------------------------


def test_point18_a_turn_without_a_model_says_no_model_is_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async def turn() -> Any:
        config = HostConfig.model_validate({"host": {"memory": "memory://"}})
        async with Host(config) as host:
            return await host.run_turn("lena", "hello")

    result = asyncio.run(turn())
    assert result.outcome == "error"
    assert "no model configured" in (result.error or ""), result.error
    assert "[host] model" in (result.error or "") and "--model" in (result.error or "")
    assert "credentials" not in (result.error or "")


def test_point18_the_readme_quick_start_says_it_needs_a_key_or_a_server() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Use it from Python")
    section = " ".join(text[start : text.index("\n## ", start + 1)].split())
    assert "OPENAI_API_KEY" in section and "api_base" in section, section
    code = subprocess.run(
        [sys.executable, "-m", "host_stub.docgen", "README.md", "docs/usage.md", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert code.returncode == 0, code.stdout + code.stderr


# -- 19: the smaller ones ----------------------------------------------------------------------


def test_point19_pin_refuses_an_empty_or_over_long_fact(tmp_path: Path) -> None:
    db, before = seeded(tmp_path)
    for fact, says in (
        ("", "the fact is empty: give the words to pin"),
        ("   ", "the fact is empty: give the words to pin"),
        (
            "x" * 5000,
            f"the fact has 5,000 characters, over the limit of {MAX_PIN_CHARS:,} for a pinned "
            "fact: pin a shorter one",
        ),
    ):
        for extra in ([], ["--create"]):
            code, out, err = procs.run_cli(["pin", "kept", fact, "--db", str(db), *extra])
            assert code == 2 and not out.strip(), (out, err)
            assert one_line(err) == f"host-stub: error: {says}"
    assert procs.dump(db) == before
    assert plugin_commands.MAX_PIN_CHARS == MAX_PIN_CHARS
    code, out, err = procs.run_cli(["pin", "kept", "y" * MAX_PIN_CHARS, "--db", str(db)])
    assert code == 0, err


def test_point19_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    db, _ = seeded(tmp_path)
    for argv in (["sessions"], ["summary", "kept"]):  # a host command, a plugin command
        process = subprocess.Popen(
            [str(SCRIPT), *argv, "--db", str(db)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # the reader is gone before the first line (as `| head -0`)
        with process.stderr:
            err = process.stderr.read().decode()
        code = process.wait(timeout=120)
        assert err == "", (argv, err)
        assert code == 1, (argv, code)  # as click (and Python's own advice) end on EPIPE


def test_point19_one_of_a_thing_is_singular(tmp_path: Path) -> None:
    config = config_file(tmp_path)
    one = write_jsonl(tmp_path / "one.jsonl", conversation(1))
    code, out, err = procs.run_cli(
        ["replay", str(one), "--db", str(tmp_path / "a.db"), "--baseline", "off"]
    )
    assert code == 0, err
    assert "replayed 2 messages in 1 turn into session 'one': 0 compressions," in out, out
    three = write_jsonl(tmp_path / "three.jsonl", conversation(3))
    db = tmp_path / "b.db"
    code, out, err = procs.run_cli(
        ["replay", str(three), "--db", str(db), "--baseline", "off", "--config", str(config)]
    )
    assert code == 0, err
    assert "1 compression," in out and "1 compressions" not in out, out
    assert "(1 compression)" in out, out  # the report's summary row
    code, out, err = procs.run_cli(["summary", "three", "--db", str(db)])
    assert code == 0, err
    assert " in 1 compression, covered through seq " in out.splitlines()[0], out
    event = CompressionEvent(turn=3, status="done", trigger="", reason="", messages_summarized=1)
    assert compression_line(event).startswith("1 message summarized at turn 3"), event
    archived = CompressionEvent(turn=0, status="done", trigger="", reason="", messages_archived=1)
    assert compression_line(archived).startswith("1 message archived without a summary")
    done = {"status": "done", "stats": {"messages_summarized": 1}}
    assert status_line(done) == "done (1 message summarized)"


def test_point19_an_unknown_session_is_said_one_way(tmp_path: Path) -> None:
    db, before = seeded(tmp_path)
    for argv in (
        ["summary", "nope"],
        ["compress", "nope"],
        ["rebuild", "nope"],
        ["search", "nope", "words"],
        ["clear", "nope"],
    ):
        code, out, err = procs.run_cli([*argv, "--db", str(db)])
        assert code == 2 and not out.strip(), (argv, out, err)
        assert one_line(err) == f"host-stub: error: unknown session 'nope' in sqlite:///{db}"
    assert procs.dump(db) == before


def test_point19_version_and_role_help() -> None:
    from importlib.metadata import version

    code, out, err = procs.run_cli(["--version"])
    assert code == 0, err
    assert out.strip() == f"host-stub, version {version('plugin-memory-summary')}"
    code, out, err = procs.run_cli(["search", "--help"])
    assert code == 0, err
    role = " ".join(out[out.index("--role") :].split("--limit")[0].split())
    assert "Only messages of this role" in role, role


def test_point19_the_pin_limit_is_documented() -> None:
    usage = " ".join((ROOT / "docs" / "usage.md").read_text(encoding="utf-8").split())
    assert f"at most {MAX_PIN_CHARS} characters" in usage
