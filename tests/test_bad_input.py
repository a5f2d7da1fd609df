"""Bad input: every one gets a clear one-line error naming the file, key or line, or a safe no-op,
and nothing already stored is lost (the store's rows are compared before and after).

* ``plugin.toml`` (a plugin package made in ``tmp_path``, found on ``sys.path``) and the shipped one;
* host config files: bad TOML, unknown keys, wrong types, out-of-range values, plugin settings
  that contradict each other, invalid UTF-8, a missing file or a directory;
* transcripts given to ``host-stub replay``: malformed JSON at line N, a wrong role, invalid UTF-8,
  wrong shapes, an escaped lone surrogate;
* lone surrogates in message content (append, compress, render), a 10 MB message, empty sessions
  and unknown session ids for every public plugin call and CLI command.

The CLI runs in a child from the ``procs`` forkserver (litellm already imported there, click's
global state fresh for each run).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import procs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from invariants import InvariantChecker
from plugin_harness import plugin_host

from host_stub.config import ConfigError, HostConfig, load_host_config
from host_stub.host import Host
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message, scrub_surrogates
from host_stub.plugins import get_plugin_manager, plugin_config, read_manifest
from host_stub.testing import FakeLLM, message_tokens
from host_stub.transcripts import TranscriptError, load_transcript
from plugin_memory_summary.base.text import cut_text
from plugin_memory_summary.summarizer.transcript import render_transcript

PLUGIN = {
    "threshold": 6,
    "keep_recent": 2,
    "debounce_turns": 1,
    "auto_compress_threshold": 0,
    "hard_compress_threshold": 0,
}


def one_line(message: str) -> str:
    lines = message.strip().splitlines()
    assert len(lines) == 1, f"not one line: {message!r}"
    return lines[0]


async def seeded_store(db: Path, session: str = "kept", turns: int = 8) -> dict[str, Any]:
    """A store holding one compressed session; returns its rows."""
    async with plugin_host(PLUGIN, db=db) as h:
        await h.turns(session, turns)
        await h.plugin.compress(session)
    rows = procs.dump(db)
    assert rows["messages"] and rows["metadata"]
    return rows


# -- plugin.toml ----------------------------------------------------------------------------------------

GOOD_MANIFEST = '[plugin]\nname = "tmp-plugin"\nrequires = ["memory"]\n'


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, manifest: bytes) -> str:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.toml").write_bytes(manifest)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return f"{name}.impl"


def test_a_good_manifest_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _package(tmp_path, monkeypatch, "goodpkg", GOOD_MANIFEST.encode())
    manifest, source = read_manifest(module)
    assert (
        manifest is not None and manifest.name == "tmp-plugin" and source == "goodpkg/plugin.toml"
    )


def test_the_shipped_manifest_is_valid_and_its_config_passes_the_schema() -> None:
    manifest, source = read_manifest("plugin_memory_summary.plugin")
    assert manifest is not None and source == "plugin_memory_summary/plugin.toml"
    assert set(manifest.requires) == {"memory", "llm"}
    pm, loaded = get_plugin_manager(
        HostConfig.model_validate({"plugins": {"allow": ["memory-summary"]}})
    )
    assert plugin_config(pm, loaded["memory-summary"], HostConfig()) is not None


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (b'[plugin]\nname = "x"\nrequires = ["memory"\n', "invalid TOML"),
        (b'[plugin]\nname = "x"\ncolour = "red"\n', "plugin.colour: unknown key"),
        (
            b'[plugin]\nname = "x"\nrequires = "memory"\n',
            "plugin.requires: Input should be a valid list",
        ),
        (b'[plugin]\ndescription = "no name"\n', "plugin.name: Field required"),
        (b'name = "at the top, not under [plugin]"\n', "plugin.name: Field required"),
        (b"[plugin]\nname = 7\n", "plugin.name: Input should be a valid string"),
        (
            b'[plugin]\nname = "x"\n[plugin.signals]\nlistens = "agent:turn:after"\n',
            "plugin.signals.listens: Input should be a valid list",
        ),
    ],
    ids=[
        "toml",
        "unknown-key",
        "requires-type",
        "no-name",
        "top-level",
        "name-type",
        "signals-type",
    ],
)
def test_a_malformed_manifest_is_one_line_naming_file_and_key(
    manifest: bytes, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _package(tmp_path, monkeypatch, "badpkg", manifest)
    with pytest.raises(ConfigError) as info:
        read_manifest(module)
    line = one_line(str(info.value))
    assert line.startswith("badpkg/plugin.toml: ") and expected in line, line


def test_a_toml_error_in_a_manifest_names_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _package(tmp_path, monkeypatch, "linepkg", b'[plugin]\nname = "x"\n\nversion = \n')
    with pytest.raises(ConfigError, match=r"linepkg/plugin.toml: invalid TOML: .*line 4"):
        read_manifest(module)


def test_a_manifest_in_invalid_utf8_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _package(tmp_path, monkeypatch, "latin1pkg", b'[plugin]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin1pkg/plugin.toml"):
        read_manifest(module)


@pytest.mark.parametrize(
    ("defaults", "expected"),
    [
        ({"threshold": "thirty"}, "config.threshold: Input should be a valid integer"),
        ({"threshold": 1}, "config.threshold: Input should be greater than or equal to 2"),
        ({"colour": "red"}, "config.colour: unknown key"),
        (
            {"threshold": 10, "keep_recent": 10},
            "keep_recent (10) must be smaller than threshold (10)",
        ),
    ],
)
def test_a_manifest_whose_defaults_fail_the_schema_fails_at_start(
    defaults: dict[str, Any], expected: str
) -> None:
    config = HostConfig.model_validate({"plugins": {"allow": ["memory-summary"]}})
    pm, loaded = get_plugin_manager(config)
    item = loaded["memory-summary"]
    assert item.manifest is not None
    item.manifest = item.manifest.model_copy(
        update={"config": {**item.manifest.config, **defaults}}
    )
    with pytest.raises(ConfigError) as info:
        plugin_config(pm, item, config)
    line = one_line(str(info.value))
    assert line.startswith("plugin_memory_summary/plugin.toml: ") and expected in line, line


async def test_a_manifest_requiring_a_service_the_host_lacks_fails_at_start(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    before = await seeded_store(db)
    config = HostConfig.model_validate({"plugins": {"allow": ["memory-summary"]}})
    host = Host(config, memory=SQLiteMemory(db, message_tokens), llm=FakeLLM())
    import host_stub.plugins as plugins

    real = plugins.read_manifest

    def manifest_needing_more(module: str) -> Any:
        manifest, source = real(module)
        return manifest.model_copy(update={"requires": [*manifest.requires, "vector-db"]}), source

    plugins.read_manifest = manifest_needing_more
    try:
        with pytest.raises(ConfigError) as info:
            await host.start()
    finally:
        plugins.read_manifest = real
        await host.memory.close()
    line = one_line(str(info.value))
    assert "plugin.requires: service 'vector-db' not provided" in line, line
    assert procs.dump(db) == before


# -- host config files ------------------------------------------------------------------------------------

CONFIG_ERRORS = [
    ("toml", '[host]\nmodel = "x"\n[host\n', "invalid TOML", "line 3"),
    ("unknown-host-key", '[host]\ncolour = "red"\n', "host.colour: unknown key", None),
    ("unknown-section", '[hots]\nmodel = "x"\n', "hots: unknown key", None),
    (
        "wrong-type",
        '[host]\nreserve_for_reply = "lots"\n',
        "host.reserve_for_reply: Input should be a valid integer",
        None,
    ),
    (
        "out-of-range",
        "[host]\nllm_retries = 99\n",
        "host.llm_retries: Input should be less than or equal to 10",
        None,
    ),
    (
        "zero-window",
        "[host]\ncontext_window = 0\n",
        "host.context_window: Input should be greater than 0",
        None,
    ),
    (
        "model-override",
        '[host.models."my/model"]\ncontext_window = -5\n',
        "host.models.my/model.context_window",
        None,
    ),
    (
        "plugins-type",
        '[plugins]\nallow = "memory-summary"\n',
        "plugins.allow: Input should be a valid list",
        None,
    ),
]

PLUGIN_CONFIG_ERRORS = [
    (
        "plugin-wrong-type",
        'threshold = "thirty"',
        "plugin.memory-summary.threshold: Input should be a valid integer",
    ),
    (
        "plugin-out-of-range",
        "threshold = 1",
        "plugin.memory-summary.threshold: Input should be greater than or equal to 2",
    ),
    ("plugin-unknown-key", "thresold = 40", "plugin.memory-summary.thresold: unknown key"),
    (
        "keep-recent-vs-threshold",
        "threshold = 10\nkeep_recent = 10",
        "keep_recent (10) must be smaller than threshold (10)",
    ),
    (
        "watermarks",
        "auto_compress_threshold = 0.95\nhard_compress_threshold = 0.9",
        "must be below hard_compress_threshold",
    ),
    (
        "bad-regex",
        'redact_patterns = ["(unclosed"]',
        "redact_patterns[0]: invalid regular expression",
    ),
    ("empty-regex", 'redact_patterns = ["a*"]', "matches the empty string"),
    (
        "enum",
        'fallback = "pray"',
        "plugin.memory-summary.fallback: Input should be 'rules' or 'trim'",
    ),
    (
        "nested",
        "[plugin.memory-summary.caps]\nlist_items = 0",
        "plugin.memory-summary.caps.list_items: Input should be greater than or equal to 1",
    ),
    (
        "lease",
        "lease_ttl_s = 0",
        "plugin.memory-summary.lease_ttl_s: Input should be greater than 0",
    ),
]


@pytest.mark.parametrize(
    ("name", "text", "expected", "where"), CONFIG_ERRORS, ids=[c[0] for c in CONFIG_ERRORS]
)
def test_host_config_errors_are_one_line_with_file_and_key(
    name: str, text: str, expected: str, where: str | None, tmp_path: Path
) -> None:
    path = tmp_path / "host.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_host_config(path)
    line = one_line(str(info.value))
    assert line.startswith(f"{path}: ") and expected in line, line
    if where:
        assert where in line, line


@pytest.mark.parametrize(
    ("name", "body", "expected"), PLUGIN_CONFIG_ERRORS, ids=[c[0] for c in PLUGIN_CONFIG_ERRORS]
)
async def test_plugin_config_errors_fail_at_start_not_at_turn_40(
    name: str, body: str, expected: str, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    before = await seeded_store(db)
    path = tmp_path / "host.toml"
    header = "" if body.startswith("[") else "[plugin.memory-summary]\n"
    path.write_text(f'[plugins]\nallow = ["memory-summary"]\n{header}{body}\n')
    config = load_host_config(path)  # the file itself is well formed
    host = Host(config, memory=SQLiteMemory(db, message_tokens), llm=FakeLLM())
    try:
        with pytest.raises(ConfigError) as info:
            await host.start()
    finally:
        await host.memory.close()
    line = one_line(str(info.value))
    assert line.startswith(f"{path}: ") and expected in line, line
    assert procs.dump(db) == before


async def test_a_config_for_a_plugin_that_is_not_loaded_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "host.toml"
    path.write_text("[plugin.memory-sumary]\nthreshold = 40\n")
    host = Host(
        load_host_config(path),
        memory=SQLiteMemory(tmp_path / "x.db", message_tokens),
        llm=FakeLLM(),
    )
    with pytest.raises(
        ConfigError, match=r"host.toml: plugin.memory-sumary: no such plugin loaded"
    ):
        await host.start()
    await host.memory.close()


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_a_config_path_that_is_not_a_file(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    if kind == "directory":
        path.mkdir()
    with pytest.raises(ConfigError) as info:
        load_host_config(path)
    line = one_line(str(info.value))
    assert line.startswith(f"{path}: ") and ("not found" in line or "cannot read" in line), line


def test_a_config_file_in_invalid_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[host]\nsystem_prompt = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="latin1.toml"):
        load_host_config(path)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("[host\n", "invalid TOML"),
        ("[host]\ncolour = 1\n", "host.colour: unknown key"),
        (
            "[plugin.memory-summary]\nthreshold = 10\nkeep_recent = 10\n",
            "keep_recent (10) must be smaller",
        ),
        ('[host]\nmemory = "mysql://db"\n', "mysql://db"),
    ],
    ids=["toml", "unknown-key", "keep-recent", "memory-url"],
)
def test_cli_config_errors_exit_2_with_one_line_and_touch_nothing(
    config: str, expected: str, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    before = asyncio.run(seeded_store(db))
    path = tmp_path / "host.toml"
    path.write_text(config)
    for argv in (["sessions"], ["summary", "kept"], ["compress", "kept"], ["clear", "kept"]):
        args = ["--config", str(path)] + ([] if "memory" in config else ["--db", str(db)])
        code, out, err = procs.run_cli([*args, *argv])
        assert code == 2, (argv, code, out, err)
        line = one_line(err)
        assert line.startswith("host-stub: error: ") and expected in line, line
    assert procs.dump(db) == before


def test_cli_config_in_invalid_utf8_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[host]\nsystem_prompt = "caf\xe9"\n')
    code, out, err = procs.run_cli(
        ["--config", str(path), "--db", str(tmp_path / "x.db"), "sessions"]
    )
    assert code == 2 and one_line(err).startswith("host-stub: error: "), (code, err)


# -- transcripts -------------------------------------------------------------------------------------------

TRANSCRIPTS = [
    (
        "json-line",
        "t.jsonl",
        b'{"role":"user","content":"a"}\n{"role":"assistant","content":"b"}\n{"role":"user",\n',
        "t.jsonl:3: malformed JSON",
    ),
    (
        "role",
        "t.jsonl",
        b'{"role":"user","content":"a"}\n{"role":"robot","content":"b"}\n',
        "t.jsonl:2: role:",
    ),
    (
        "utf8",
        "t.jsonl",
        b'{"role":"user","content":"a"}\n{"role":"user","content":"caf\xe9"}\n',
        "t.jsonl:2: invalid UTF-8",
    ),
    (
        "utf8-json",
        "t.json",
        b'[{"role":"user","content":"a"},\n{"role":"user","content":"\xff"}]',
        "t.json:2: invalid UTF-8",
    ),
    (
        "not-an-object",
        "t.jsonl",
        b'{"role":"user","content":"a"}\n["user","b"]\n',
        "t.jsonl:2: expected a message object",
    ),
    (
        "content-type",
        "t.json",
        b'[{"role":"user","content":"a"},{"role":"assistant","content":5}]',
        "t.json: message 2: content",
    ),
    (
        "tool-calls",
        "t.json",
        b'[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f"}}]}]',
        "t.json: message 1: tool_calls.0.id",
    ),
    (
        "not-a-list",
        "t.json",
        b'{"role":"user","content":"a"}',
        "t.json: expected a list of messages",
    ),
    ("empty-json", "t.json", b"", "t.json: no messages"),
    (
        "json-error-line",
        "t.json",
        b'[\n{"role":"user","content":"a"},\n{"role":"user" "content":"b"}\n]',
        "t.json:3: malformed JSON",
    ),
]


@pytest.mark.parametrize(
    ("name", "file", "data", "expected"), TRANSCRIPTS, ids=[t[0] for t in TRANSCRIPTS]
)
def test_malformed_transcripts_are_one_line_naming_file_and_line(
    name: str, file: str, data: bytes, expected: str, tmp_path: Path
) -> None:
    path = tmp_path / file
    path.write_bytes(data)
    with pytest.raises(TranscriptError) as info:
        load_transcript(path)
    line = one_line(str(info.value))
    assert line.startswith(str(tmp_path)) and expected in line, line


@pytest.mark.parametrize("case", ["json-line", "role", "utf8", "content-type"])
def test_cli_replay_of_a_malformed_transcript_exits_2_and_stores_nothing(
    case: str, tmp_path: Path
) -> None:
    _, file, data, expected = next(t for t in TRANSCRIPTS if t[0] == case)
    db = tmp_path / "store.db"
    before = asyncio.run(seeded_store(db))
    path = tmp_path / file
    path.write_bytes(data)
    code, out, err = procs.run_cli(["replay", str(path), "--db", str(db), "--baseline", "off"])
    assert code == 2, (code, out, err)
    line = one_line(err)
    assert line.startswith("host-stub: error: ") and expected in line, line
    assert procs.dump(db) == before


def test_an_empty_jsonl_transcript_is_refused_like_an_empty_json_one(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    before = asyncio.run(seeded_store(db))
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"\n\n")
    with pytest.raises(TranscriptError, match="empty.jsonl: no messages"):
        load_transcript(path)
    code, out, err = procs.run_cli(
        ["replay", str(path), "--db", str(db), "--baseline", "off", "--json"]
    )
    assert code == 2 and "no messages" in one_line(err), (out, err)
    assert procs.dump(db) == before


def test_cli_replay_of_an_escaped_lone_surrogate_does_not_crash(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    before = asyncio.run(seeded_store(db))
    path = tmp_path / "surrogate.jsonl"
    path.write_bytes(
        b'{"role":"user","content":"hi \\ud800 there"}\n{"role":"assistant","content":"ok"}\n'
    )
    code, out, err = procs.run_cli(
        ["replay", str(path), "--db", str(db), "--baseline", "off", "--json"]
    )
    assert procs.dump(db)["metadata"] == before["metadata"]
    assert code in (0, 2), err
    if code == 2:
        assert one_line(err).startswith("host-stub: error: ")


# -- lone surrogates, huge messages ---------------------------------------------------------------------------

SURROGATES = [
    "lone high \ud800 in the middle",
    "lone low \udfff",
    "pair written apart \ud83d\ude00 ok",
    "\udbff",
]


async def _surrogate_session(h: Any) -> list[Message]:
    stored: list[Message] = []
    for i, text in enumerate(SURROGATES):
        result = await h.host.run_turn(
            "s", f"{text} {i}", recorded=[Message(role="assistant", content=f"echo {text}")]
        )
        stored.extend(result.messages)
    for result in await h.turns("s", 3):
        stored.extend(result.messages)
    return stored


@pytest.mark.parametrize(
    "summarizer",
    [
        "llm",
        "rules",
    ],
)
async def test_lone_surrogates_append_compress_and_render_in_memory(summarizer: str) -> None:
    llm = FakeLLM(default_model=None) if summarizer == "rules" else None
    async with plugin_host(PLUGIN, llm=llm) as h:
        stored = await _surrogate_session(h)
        checker = InvariantChecker(h.host.memory, "s")
        checker.expect(stored)
        result = await h.plugin.compress("s")
        assert result["status"] in ("done", "skipped"), result
        await checker.check()
        # Whatever left the process is encodable: the summarizer requests, the summary, the
        # prompt the chat model would get.
        for call in h.llm.calls:
            json.dumps(call["messages"], ensure_ascii=False).encode("utf-8")
        summary = await h.plugin.get_conversation_summary("s")
        assert summary
        summary.encode("utf-8")
        _, prompt, _, _ = await h.host.build_prompt("s")
        json.dumps(prompt, ensure_ascii=False).encode("utf-8")
        context = await h.plugin.memory_context("s")
        context.recent_transcript.encode("utf-8")
        assert any(c["status"] == "done" for c in h.finals()) or result["status"] == "done"


@given(st.text(alphabet=st.characters(codec=None, exclude_categories=())))
def test_scrubbed_text_has_no_surrogate_and_text_without_one_is_kept(text: str) -> None:
    scrubbed = scrub_surrogates(text)
    scrubbed.encode("utf-8")  # no lone surrogate left
    if not any("\ud800" <= ch <= "\udfff" for ch in text):
        assert scrubbed is text
    else:
        # a pair written as two code points is joined, a lone one becomes U+FFFD
        assert scrubbed == text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def test_render_never_emits_a_lone_surrogate() -> None:
    messages = [Message(role="user", content=t, seq=i) for i, t in enumerate(SURROGATES, 1)]
    rendered = render_transcript(messages, tool_truncate_chars=10, message_truncate_chars=100)
    rendered.encode("utf-8")
    assert "\U0001f600" in rendered  # a pair written as two code points is joined
    for text in SURROGATES:
        for limit in range(len(text) + 2):
            cut_text(text, limit).encode("utf-8")


async def test_lone_surrogates_on_sqlite_do_not_crash_the_turn(tmp_path: Path) -> None:
    async with plugin_host(PLUGIN, db=tmp_path / "s.db") as h:
        stored = await _surrogate_session(h)
        checker = InvariantChecker(h.host.memory, "s")
        checker.expect(stored)
        assert (await h.plugin.compress("s"))["status"] == "done"
        await checker.check()


async def test_a_10mb_message_is_stored_counted_compressed_and_cut_for_the_summarizer(
    tmp_path: Path,
) -> None:
    # Past the default size limit (200,000 characters): this host takes any size.
    async with plugin_host(PLUGIN, db=tmp_path / "big.db", host={"max_message_chars": 0}) as h:
        big = ("lorem ipsum dolor sit amet, ORDER-778899 " * 250_000)[:10_000_000]
        t0 = time.monotonic()
        first = await h.host.run_turn(
            "s", big, recorded=[Message(role="assistant", content="noted")]
        )
        assert first.outcome == "replied"
        stored = [*first.messages]
        assert first.messages[0].tokens == message_tokens(Message(role="user", content=big))
        for result in await h.turns("s", 3):
            stored.extend(result.messages)
        result = await h.plugin.compress("s")
        assert result["status"] in ("done", "skipped"), result
        finals = [*h.finals(), result]
        assert any(f["status"] == "done" for f in finals), finals
        elapsed = time.monotonic() - t0
        checker = InvariantChecker(h.host.memory, "s")
        checker.expect(stored)
        await checker.check()
        # The summarizer got the giant message cut to message_truncate_chars (4000).
        assert h.llm.calls
        for call in h.llm.calls:
            assert len(json.dumps(call["messages"])) < 30_000
        archived = await h.host.memory.get_archived("s")
        assert archived[0].content == big and archived[0].archived == "summarized"
        assert elapsed < 60, f"10 MB turn and compression took {elapsed:.1f}s"


# -- empty sessions and unknown ids -----------------------------------------------------------------------------


async def test_every_public_call_on_an_unknown_session_is_a_safe_no_op(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    before = await seeded_store(db)
    async with plugin_host(PLUGIN, db=db) as h:
        p = h.plugin
        assert await p.get_conversation_summary("nope") is None
        assert await p.show("nope") is None
        result = await p.compress("nope")
        assert result["status"] == "skipped" and "nothing to compress" in result["reason"]
        context = await p.memory_context("nope")
        assert (context.summary, context.active_messages, context.recent_transcript) == (
            None,
            0,
            "",
        )
        rebuilt = await p.rebuild("nope")
        assert rebuilt["status"] == "skipped", rebuilt
        assert await h.host.delete_messages("nope", [1, 2]) == []
        request_id = await h.host.request_compression("nope")
        for _ in range(100):
            if h.finals(request_id):
                break
            await asyncio.sleep(0.01)
        assert [f["status"] for f in h.finals(request_id)] == ["skipped"]
        assert await h.host.memory.get_history("nope") == []
        assert await p.get_conversation_summary("nope") is None
        sessions = {s.session_id for s in await h.host.memory.list_sessions()}
        assert sessions == {"kept"}
        # Summary management on an unknown id works on a record of its own (pinning ahead of a
        # conversation is allowed), never on another session's.
        assert (await p.pin("nope-pin", "likes tea")).payload.pinned_facts == ["likes tea"]
        assert (await p.unpin("nope-pin", "likes tea")).payload.pinned_facts == []
        assert (await p.edit("nope-edit", "edited")).payload.summary == "edited"
        assert await h.host.memory.get_history("nope-pin") == []
    after = procs.dump(db)
    # The session that exists is untouched; no message anywhere changed.
    assert after["messages"] == before["messages"] and after["sessions"] == before["sessions"]
    kept = [r for r in after["metadata"] if r[1] == "kept"]
    assert kept == [r for r in before["metadata"] if r[1] == "kept"]


async def test_empty_sessions_compress_to_nothing_and_keep_system_messages(tmp_path: Path) -> None:
    async with plugin_host(PLUGIN, db=tmp_path / "store.db") as h:
        # Only a system message (core memory), then a session cleared of everything.
        [system] = await h.host.memory.append("sys-only", [Message(role="system", content="rules")])
        await h.turns("cleared", 8)
        await h.plugin.scheduler.wait_idle()  # a compression the turns started has ended
        await h.host.clear("cleared")
        for session in ("sys-only", "cleared"):
            result = await h.plugin.compress(session)
            assert result["status"] == "skipped" and "nothing to compress" in result["reason"]
            assert (await h.plugin.rebuild(session))["status"] == "skipped"
            assert await h.plugin.get_conversation_summary(session) is None
        assert await h.host.memory.get_history("sys-only") == [system]
        assert await h.host.memory.get_archived("sys-only") == []
        _, prompt, _, _ = await h.host.build_prompt("cleared")
        assert [m["role"] for m in prompt] == ["system"]


def test_cli_commands_on_unknown_sessions_say_so_and_touch_nothing(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    before = asyncio.run(seeded_store(db))
    for argv in (
        ["summary", "nope"],
        ["summary", "nope", "--json"],
        ["compress", "nope"],
        ["rebuild", "nope"],
    ):
        code, out, err = procs.run_cli(["--db", str(db), *argv])
        assert code == 2 and not out.strip(), (argv, out, err)
        assert one_line(err) == f"host-stub: error: unknown session 'nope' in sqlite:///{db}"
    after = procs.dump(db)
    assert after["messages"] == before["messages"] and after["sessions"] == before["sessions"]
    assert [r for r in after["metadata"] if r[1] == "kept"] == [
        r for r in before["metadata"] if r[1] == "kept"
    ]
    code, out, err = procs.run_cli(["--db", str(db), "clear"])
    assert code == 2 and one_line(err) == "host-stub: error: name a SESSION or pass --all"
    # Clear on an unknown id is a mistake (a typo) and creates nothing; so is pin, unless
    # --create says facts are pinned before the first message. The session that exists keeps
    # every row.
    code, out, err = procs.run_cli(["--db", str(db), "clear", "nope"])
    assert code == 2 and not out.strip(), (out, err)
    assert one_line(err) == f"host-stub: error: unknown session 'nope' in sqlite:///{db}"
    assert procs.dump(db)["sessions"] == before["sessions"]
    code, out, err = procs.run_cli(["--db", str(db), "pin", "nope", "a fact"])
    assert code == 2 and "unknown session 'nope'" in one_line(err), (out, err)
    code, out, err = procs.run_cli(["--db", str(db), "pin", "nope", "a fact", "--create"])
    assert code == 0 and "(1 pinned fact)" in out and not err.strip(), (out, err)
    code, out, err = procs.run_cli(["--db", str(db), "summary", "kept"])
    assert code == 0 and "messages summarized" in out, out
    final = procs.dump(db)
    assert final["messages"] == before["messages"]
    for table in ("sessions", "metadata"):
        kept = [r for r in final[table] if "kept" in r[:2]]
        assert kept == [r for r in before[table] if "kept" in r[:2]], table


def test_cli_on_an_empty_store(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"

    async def create() -> None:
        memory = SQLiteMemory(db, message_tokens)
        await memory.list_sessions()
        await memory.close()

    asyncio.run(create())
    code, out, err = procs.run_cli(["--db", str(db), "sessions"])
    assert (code, out.strip()) == (0, "no sessions"), err
    code, out, err = procs.run_cli(["--db", str(db), "sessions", "--json"])
    assert (code, json.loads(out)) == (0, [])
    # A missing file or directory is not created by a command that only reads.
    code, out, err = procs.run_cli(["--db", str(tmp_path / "no-such-dir" / "x.db"), "sessions"])
    assert code == 2 and one_line(err).startswith("host-stub: error: no such store: "), err
    assert not (tmp_path / "no-such-dir").exists()
