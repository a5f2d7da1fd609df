"""``host-stub demo`` and ``host-stub replay``: the generated conversation, the report, the plot,
and the one-line user errors."""

from __future__ import annotations

import importlib.util
import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAIServer, Reply

from host_stub.cli import main
from host_stub.messages import Message, tool_groups
from plugin_memory_summary.extras.demo import DEMO_CONFIG, EARLY_FACTS, FACTS, generate_conversation

SVG = "{http://www.w3.org/2000/svg}"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output is not a terminal unless a test says so (CI may set FORCE_COLOR)."""
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    monkeypatch.delenv("FORCE_COLOR", raising=False)


# -- the generated conversation ------------------------------------------------------------------
def test_the_conversation_is_long_realistic_and_the_same_every_time() -> None:
    raw = generate_conversation()
    assert raw == generate_conversation() and raw != generate_conversation(seed=8)
    messages = [Message.model_validate(m) for m in raw]
    roles = Counter(m.role for m in messages)
    assert roles["user"] == 300 and roles["tool"] >= 100
    # Tool calls are OpenAI-shaped, each answered right after it by its own id.
    groups = tool_groups(messages)
    assert len(groups) == roles["tool"] and all(complete for _, _, complete in groups)
    ids = [c.id for m in messages for c in m.tool_calls or []]
    assert len(ids) == len(set(ids)) and all(re.fullmatch(r"call_[0-9a-f]{16}", i) for i in ids)
    tools = {c.function.name for m in messages for c in m.tool_calls or []}
    assert {"get_weather", "run_tests", "read_file", "book_restaurant"} <= tools
    # Facts come on the first day and are asked for on the last.
    first_day = " ".join(str(m.content) for m in messages[:16])
    assert all(v in first_day for v in EARLY_FACTS.values())
    assert FACTS["booking_ref"] in str(messages[-7].content)
    # Chinese passages, English otherwise.
    han = [m for m in messages if re.search(r"[\u4e00-\u9fff]{4}", str(m.content))]
    assert 10 <= len(han) <= len(messages) // 5
    with pytest.raises(ValueError):
        generate_conversation(turns=5)


# -- the demo ------------------------------------------------------------------------------------
def _svg_points(root: ET.Element, gid: str) -> int:
    """Vertices of the line drawn with id ``gid`` (matplotlib writes one path per line)."""
    group = root.find(f".//{SVG}g[@id='{gid}']")
    assert group is not None, f"no element {gid!r} in the SVG"
    path = group.find(f"{SVG}path")
    assert path is not None
    return len(re.findall(r"[ML]\s*-?[\d.]+\s+-?[\d.]+", path.get("d", "")))


def _svg_markers(root: ET.Element, gid: str) -> int:
    group = root.find(f".//{SVG}g[@id='{gid}']")
    assert group is not None, f"no element {gid!r} in the SVG"
    return len(group.findall(f".//{SVG}use"))


def test_demo_replays_reports_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, svg = tmp_path / "demo.db", tmp_path / "context.svg"
    code, out, err = run(["demo", "--turns", "80", "--db", str(db), "--plot", str(svg)], capsys)
    assert code == 0, err
    lines = out.splitlines()
    compressions = [line for line in lines if line.startswith("compression: ")]
    assert len(compressions) >= 2 and all("(rules engine" in line for line in compressions)
    assert re.search(r"^  compressions       (\d+) ", out, re.M)[1] == str(len(compressions))
    assert "replayed 242 messages in 80 turns into session 'demo'" in out
    assert "context window     8,000 tokens" in out
    row = re.search(r"^    max\s+([\d,]+)\s+([\d,]+)$", out, re.M)
    with_max, without_max = (int(v.replace(",", "")) for v in row.groups())
    assert with_max < 8000 < without_max
    assert re.search(
        r"^  prompt prefix      \d+% of prompt tokens reused from the previous call's prompt "
        r"\(median per call \d+%, \d+ calls\)$",
        out,
        re.M,
    )
    assert re.search(r"^  early facts        \d of 8 still in the summary", out, re.M)
    assert "final summary:" in out and "inspect it: host-stub summary demo" in out
    assert f"plot: {svg}" in out

    root = ET.parse(svg).getroot()
    assert _svg_points(root, "with-plugin") == 80  # one point per turn
    assert _svg_points(root, "without-plugin") >= 2
    assert _svg_markers(root, "compressions") == len(compressions)  # one marker each
    assert root.find(f".//{SVG}g[@id='context-window']") is not None
    assert root.find(f".//{SVG}g[@id='soft-mark']") is not None

    # What the demo stored can be inspected like any session.
    code, out, _ = run(["sessions", "--json", "--db", str(db)], capsys)
    (session,) = json.loads(out)
    assert code == 0 and session["session_id"] == "demo" and session["archived"] > 0
    code, out, _ = run(["summary", "demo", "--db", str(db)], capsys)
    assert code == 0 and f"in {len(compressions)} compressions" in out


def test_demo_json_matches_the_plot_data_and_a_replayed_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "context.png"
    conversation = tmp_path / "demo.jsonl"
    code, out, err = run(
        [
            "demo",
            "--turns",
            "60",
            "--json",
            "--plot",
            str(png),
            "--save",
            str(conversation),
            "--baseline",
            "replay",
        ],
        capsys,
    )
    assert code == 0, err
    report = json.loads(out)  # nothing but the JSON on stdout
    assert png.read_bytes().startswith(b"\x89PNG")
    w, b = report["with_plugin"], report["without_plugin"]
    assert len(w["context"]) == len(b["context"]) == report["turns"] == 60
    # The baseline replayed without the plugin equals the one computed from the run itself.
    assert b["context"] == w["uncompressed"]
    assert w["max"] == max(w["context"]) and b["max"] == max(b["context"])
    assert report["summary_model"] is None and report["fell_back"] == 0
    assert report["summary_compressions"] == len(w["compressions"]) >= 1
    assert report["active"] + report["archived"] == report["messages"]
    assert "temporary" in report["store"]
    # --save wrote the very conversation the demo replayed.
    saved = [json.loads(line) for line in conversation.read_text(encoding="utf-8").splitlines()]
    assert saved == generate_conversation(turns=60)


def test_demo_progress_bar_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    code, out, err = run(["demo", "--turns", "40", "--baseline", "off"], capsys)
    assert code == 0, err
    assert "with the plugin" in out and "turns" in out  # the bar was drawn
    assert re.search(r"compression: \d+ messages summarized at turn \d+, tokens ", out)
    assert "report: demo (40 turns, seed 7)" in out and "without plugin" in out


def test_demo_config_is_shown_and_can_be_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["demo", "--print-config"], capsys)
    assert code == 0 and out == DEMO_CONFIG
    config = tmp_path / "mine.toml"
    config.write_text(out.replace("context_window = 8000", "context_window = 4000"))
    code, out, err = run(
        ["demo", "--turns", "30", "--config", str(config), "--json", "--baseline", "off"], capsys
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["context_window"] == 4000 and report["without_plugin"] is None
    assert "temporary" in report["store"]  # the file names no store: still a temporary one


def test_p21_print_config_states_the_plugins_real_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 33, point 21: ``demo --print-config`` said the threshold's default is 30 (it is
    unset). Every default the demo's config names is the config model's own, each said as
    ``default: VALUE`` on the line of its key."""
    import tomllib

    from host_stub.docgen import config_rows
    from plugin_memory_summary.base import MemorySummaryConfig

    code, out, _ = run(["demo", "--print-config"], capsys)
    assert code == 0 and out == DEMO_CONFIG
    defaults = {
        key: "unset" if value is None else json.dumps(value)
        for key, info, _ in config_rows(MemorySummaryConfig)
        for value in [info.get_default(call_default_factory=True)]
    }
    section = out.split("[plugin.memory-summary]\n", 1)[1]
    stated = {}
    for line in section.splitlines():
        if "default" not in line:
            continue
        found = re.fullmatch(r"(\w+) = .*#.* default: (\S+?)[,;)]?(?: .*)?", line)
        assert found, f"a default not said as `key = value  # default: VALUE`: {line!r}"
        stated[found[1]] = found[2]
    set_keys = set(tomllib.loads(out)["plugin"]["memory-summary"])
    assert set(stated) == set_keys, "every key the demo sets says the plugin's default"
    for key, value in stated.items():
        assert value == defaults[key], f"{key}: the demo config says default {value}"
    assert stated["threshold"] == "unset"


def test_p21_the_docs_quote_the_demo_as_it_runs_now() -> None:
    """Issue 33, point 21: docs/usage.md's demo output, its Inspect blocks and
    docs/demo-context.svg are what the demo and the inspection commands print and draw now
    (``python -m plugin_memory_summary.extras.demo.docs`` writes them); a drift fails here."""
    from plugin_memory_summary.extras.demo import docs

    root = Path(__file__).resolve().parent.parent
    page = (root / docs.PAGE).read_text(encoding="utf-8")
    made = docs.run_demo()
    assert set(re.findall(r"<!-- BEGIN DEMO RUN: ([\w-]+) -->", page)) == set(docs.COMMANDS)
    assert docs.render(page, made.blocks) == page, (
        "docs/usage.md is out of date: run python -m plugin_memory_summary.extras.demo.docs"
    )
    problem = docs.svg_problem((root / docs.PLOT).read_bytes(), made.svg)
    assert problem is None, f"docs/demo-context.svg: {problem}"
    # What varies from run to run is left out; the plot and the output tell the same run.
    output = made.blocks["demo-output"]
    assert "\n  time " not in output
    compressions = re.search(r"^  compressions       (\d+) ", output, re.M)
    assert compressions and f"{compressions[1]} compressions</text>" in made.svg.decode()
    # A changed figure is found.
    drifted = page.replace(f"compressions       {compressions[1]} ", "compressions       999 ")
    assert drifted != page and docs.render(drifted, made.blocks) == page


@pytest.mark.slow
def test_p21_the_readme_quick_start_runs_and_watches_it_compress(tmp_path: Path) -> None:
    """The README's first commands, as written, in an empty folder: the demo saves its
    conversation, and the replay with the demo's config compresses it (the default window
    would not)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    block = re.search(r"^```sh\n(.*?)^```$", (root / "README.md").read_text(), re.S | re.M)
    assert block is not None
    commands = [c for c in block[1].splitlines() if c.startswith("host-stub ")]
    assert commands[0] == "host-stub demo --save conversation.jsonl", commands
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    outputs = []
    for command in commands:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, (command, proc.stderr)
        outputs.append(proc.stdout)
    replayed = outputs[-1]
    assert commands[-1].startswith("host-stub replay conversation.jsonl")
    assert "compression: " in replayed and "0 compressions" not in replayed, replayed
    # Without the demo's config (the default model's window) the same file never compresses.
    proc = subprocess.run(
        ["bash", "-c", "host-stub replay conversation.jsonl --db other.db --baseline off"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and ": 0 compressions," in proc.stdout, proc.stderr


# -- replay with a model -------------------------------------------------------------------------
@pytest.fixture
def conversation(tmp_path: Path) -> Path:
    path = tmp_path / "trip.jsonl"
    path.write_text(
        "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in generate_conversation(turns=24)),
        encoding="utf-8",
    )
    return path


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "host.toml"
    path.write_text(
        "[host]\ncontext_window = 8000\n\n"
        '[host.models."openai/fake-model"]\ncontext_window = 8000\nmax_output_tokens = 1024\n\n'
        "[plugin.memory-summary]\nthreshold = 12\nkeep_recent = 4\ndebounce_turns = 1\n"
        "summary_timeout_s = 10\n"
    )
    return path


def _summary(body: dict[str, Any]) -> str:
    return json.dumps(
        {"summary": "Lena plans a trip to Japan; booking K7XQ2M.", "identifiers": ["K7XQ2M"]}
    )


def test_replay_with_a_model_summarizes_through_it(
    conversation: Path,
    small: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeOpenAIServer(default_reply=_summary) as server:
        code, out, err = run(
            [
                "replay",
                str(conversation),
                "--model",
                "openai/fake-model",
                "--api-base",
                server.base_url,
                "--db",
                str(tmp_path / "m.db"),
                "--config",
                str(small),
                "--json",
            ],
            capsys,
        )
        assert code == 0, err
        report = json.loads(out)
        assert report["summary_model"] == "openai/fake-model" and report["fell_back"] == 0
        assert report["with_plugin"]["compressions"]
        models = {c["model"] for c in report["with_plugin"]["compressions"]}
        assert models == {"openai/fake-model"}
        assert "K7XQ2M" in report["summary"]
        # The recorded replies stand in for the chat model: only the summarizer was called.
        assert server.requests and not any(r.get("stream") for r in server.requests)


def test_replay_reports_compressions_that_fell_back(
    conversation: Path,
    small: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeOpenAIServer(default_reply=Reply.error(500, "model overloaded")) as server:
        code, out, err = run(
            [
                "replay",
                str(conversation),
                "--model",
                "openai/fake-model",
                "--api-base",
                server.base_url,
                "--db",
                str(tmp_path / "m.db"),
                "--config",
                str(small),
            ],
            capsys,
        )
    assert code == 0, err
    count = int(re.search(r"^  compressions       (\d+) ", out, re.M)[1])
    assert count >= 1
    assert (
        f"  fell back          {count} of {count} compressions used the rules fallback, by kind:"
        in out
    )
    assert "model overloaded" in out
    assert "openai/fake-model failed, fallback rules" in out
    assert "final summary:" in out  # the rules engine still wrote one


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--model", "nonexistent-provider/xyz"], {}, "unknown model 'nonexistent-provider/xyz'"),
        (
            ["--model", "gpt-4o-mini"],
            {"OPENAI_API_KEY": None},
            "needs OPENAI_API_KEY, which is not set",
        ),
        (
            ["--model", "openai/m", "--api-base", "http://127.0.0.1:1/v1"],
            {"OPENAI_API_KEY": "k"},
            "cannot reach --api-base http://127.0.0.1:1/v1",
        ),
        (["--plot", "context.txt"], {}, "the plot must be a .svg or .png file"),
        (["--memory", "bogus://x"], {}, "unknown scheme 'bogus'"),
    ],
)
def test_replay_user_errors_are_one_line_and_store_nothing(
    conversation: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str | None],
    expected: str,
) -> None:
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    db = tmp_path / "m.db"
    store = [] if "--memory" in args else ["--db", str(db)]
    code, out, err = run(["replay", str(conversation), *store, *args], capsys)
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "compression" not in out
    if store:  # nothing stored: the store is not even created
        assert not db.exists()


def test_replay_plot_without_matplotlib_names_the_extra(
    conversation: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    code, _, err = run(
        [
            "replay",
            str(conversation),
            "--db",
            str(tmp_path / "m.db"),
            "--plot",
            str(tmp_path / "p.svg"),
        ],
        capsys,
    )
    assert code == 2
    assert err.strip() == (
        "host-stub: error: plotting needs matplotlib: pip install 'plugin-memory-summary[plot]'"
    )


def test_chat_preflight_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    db = ["--db", str(tmp_path / "m.db")]
    code, _, err = run(
        ["chat", "--model", "openai/m", "--api-base", "http://127.0.0.1:1/v1", *db], capsys
    )
    assert code == 2 and "cannot reach --api-base http://127.0.0.1:1/v1" in err
    code, _, err = run(["chat", "--model", "no-such-provider/m", *db], capsys)
    assert code == 2 and "unknown model 'no-such-provider/m'" in err
    monkeypatch.delenv("OPENAI_API_KEY")
    code, _, err = run(["chat", "--model", "gpt-4o-mini", *db], capsys)
    assert code == 2 and "needs OPENAI_API_KEY" in err
    assert len(err.strip().splitlines()) == 1


# -- what the report found in the plugin ---------------------------------------------------------
async def test_compression_stats_count_the_previous_summary_before_as_after() -> None:
    from host_stub.config import HostConfig
    from host_stub.host import open_host
    from host_stub.transcripts import split_turns
    from plugin_memory_summary.base.decisions import conversation_messages

    config = HostConfig.model_validate(
        {
            "host": {"memory": "memory://", "context_window": 8000},
            "plugin": {
                "memory-summary": {
                    "threshold": 100,
                    "keep_recent": 2,
                    "auto_compress_threshold": 0,
                    "hard_compress_threshold": 0,
                }
            },
        }
    )
    turns = split_turns([Message.model_validate(m) for m in generate_conversation(turns=30)])
    async with open_host(config) as host:
        plugin = host.get_plugin("memory-summary")
        for inputs, recorded in turns[:10]:
            await host.run_turn("s", inputs, recorded=recorded)
        first = await plugin.compress("s")
        assert first["status"] == "done"
        for inputs, recorded in turns[10:20]:
            await host.run_turn("s", inputs, recorded=recorded)
        record = await plugin.show("s")
        active = conversation_messages(await host.memory.get_history("s"))
        in_context = sum(m.tokens or 0 for m in active) + plugin.tokens.count(record.text)
        second = await plugin.compress("s")
    assert second["status"] == "done"
    # tokens_after counts the summary the context will hold; tokens_before must count the one
    # it held.
    assert second["stats"]["tokens_before"] == in_context
