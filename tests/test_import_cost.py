"""What ``import plugin_memory_summary`` does and does not do, checked in fresh processes without
timing anything: no litellm, no ``regex`` (every pattern is compiled on first use), no summarizer,
rules engine, output parser or identifier scanner, and no pydantic model built (their validators
are built on first use). The per-turn path (injecting an existing summary) loads none of those
four either.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
import textwrap

import plugin_memory_summary
from plugin_memory_summary.base.patterns import LazyRegex
from plugin_memory_summary.extras.report.screen import TERMINAL_SETTINGS
from plugin_memory_summary.safety.redact import Redactor

#: Modules that ``import plugin_memory_summary`` (and ``create_plugin()``) must not load.
NOT_AT_IMPORT = (
    "litellm",
    "regex",
    "plugin_memory_summary.summarizer.summarize",
    "plugin_memory_summary.summarizer.rules",
    "plugin_memory_summary.summarizer.prompts",
    "plugin_memory_summary.extras.commands",
    "plugin_memory_summary.summarizer.parsing",
    "plugin_memory_summary.base.identifiers",
)

_CHECK = """
import sys

NOT_AT_IMPORT = {not_at_import!r}


def loaded():
    return sorted(m for m in NOT_AT_IMPORT if m in sys.modules)


import plugin_memory_summary
assert loaded() == [], ("after import", loaded())

from pydantic import BaseModel

built = sorted(
    f"{{m}}.{{name}}"
    for m in list(sys.modules)
    if m.startswith(("plugin_memory_summary", "host_stub"))
    for name, value in vars(sys.modules[m]).items()
    if isinstance(value, type)
    and issubclass(value, BaseModel)
    and value.__module__ == m
    and value.__pydantic_complete__
)
assert built == [], ("models built at import", built)

plugin = plugin_memory_summary.create_plugin()
assert loaded() == [], ("after create_plugin()", loaded())
print("ok")
"""

_PER_TURN = """
import sys

from host_stub.hookspecs import PromptView
from host_stub.services import MetadataEntry
import plugin_memory_summary


class LLM:
    default_model = "fake/model"

    def max_output_tokens(self, model=None):
        return 4096

    def count_tokens(self, text, model=None):
        return len(str(text)) // 4


class Bus:
    def connect(self, name, receiver, typed=False):
        pass


class Host:
    bus = Bus()


plugin = plugin_memory_summary.create_plugin()
plugin.startup(
    host=Host(),
    config=plugin_memory_summary.MemorySummaryConfig(),
    memory=None,
    llm=LLM(),
    message_archive=None,
)
record = plugin_memory_summary.SummaryRecord(text="Goal: book a table for 4", covered_up_to_seq=3)
view = PromptView(
    session_id="s",
    model="fake/model",
    context_window=8000,
    messages=[],
    summary=MetadataEntry(
        namespace="summary", key="s", value=record.model_dump(mode="json"), version=1
    ),
)
contribution = plugin.agent_prompt(view)
assert contribution is not None and "book a table for 4" in contribution.content, contribution
late = sorted(
    m
    for m in (
        "litellm",
        "plugin_memory_summary.summarizer.summarize",
        "plugin_memory_summary.summarizer.rules",
        "plugin_memory_summary.summarizer.parsing",
        "plugin_memory_summary.base.identifiers",
    )
    if m in sys.modules
)
assert late == [], ("loaded by the per-turn path", late)
print("ok")
"""


def _run(code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_import_loads_no_regex_summarizer_or_litellm_and_builds_no_model() -> None:
    _run(_CHECK.format(not_at_import=NOT_AT_IMPORT))


def test_injecting_a_summary_loads_neither_the_summarizer_nor_the_rules_engine() -> None:
    _run(textwrap.dedent(_PER_TURN))


def _lazy_patterns() -> list[tuple[str, LazyRegex]]:
    found: list[tuple[str, LazyRegex]] = []
    prefix = "plugin_memory_summary."
    for info in pkgutil.walk_packages(plugin_memory_summary.__path__, prefix):
        module = importlib.import_module(info.name)
        short = info.name.removeprefix(prefix)
        for name, value in vars(module).items():
            values = value if isinstance(value, list | tuple) else [value]
            found += [(f"{short}.{name}", v) for v in values if isinstance(v, LazyRegex)]
    found += [(f"redact.{name}", p) for name, p in Redactor().passes]
    return found


def test_every_lazy_pattern_compiles_once() -> None:
    """Patterns are no longer compiled at import, so a broken one would only show on first use:
    compile them all here."""
    patterns = _lazy_patterns()
    assert len(patterns) > 40
    for name, lazy in patterns:
        compiled = lazy()
        assert lazy() is compiled, name
        assert lazy.compiled, name


# -- commands that count tokens but call no model ----------------------------------------------

_COMMANDS = r"""
import contextlib, io, json, sys
from host_stub.cli import main

DIR = {tmp!r}
db = DIR + "/m.db"
config = DIR + "/host.toml"
seen = []
for argv in (
    ["replay", DIR + "/chat.jsonl", "--db", db, "--config", config],
    ["sessions", "--db", db],
    ["summary", "chat", "--db", db, "--config", config],
    ["compress", "chat", "--json", "--db", db, "--config", config],
    ["rebuild", "chat", "--json", "--db", db, "--config", config],
    ["demo", "--turns", "20", "--db", DIR + "/demo.db"],
):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    assert code == 0, (argv, code, out.getvalue())
    if argv[0] == "compress":
        assert json.loads(out.getvalue())["status"] == "done", out.getvalue()
    seen.append((argv[0], "litellm" in sys.modules))
print(json.dumps(seen))
"""


def _chat(n: int) -> list[dict[str, object]]:
    """An ``n``-message conversation with a tool call every few turns."""
    out: list[dict[str, object]] = []
    i = 0
    while len(out) < n:
        out.append({"role": "user", "content": f"Question {i}: what about booking RES-{1000 + i}?"})
        if i % 3 == 0:
            call = {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"ref": f"RES-{1000 + i}"})},
            }
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": '{"ok": true}'})
        out.append({"role": "assistant", "content": f"Booking RES-{1000 + i} is confirmed."})
        i += 1
    return out[:n] if out[n - 1]["role"] != "tool" else out[: n + 1]


def test_commands_that_count_tokens_without_a_model_never_import_litellm(tmp_path) -> None:
    """``replay`` without ``--model``, ``sessions``, ``summary``, ``compress`` and ``rebuild`` on
    the rules engine, and ``demo`` count tokens and look up the window, but call no model: they
    must not pay litellm's import (seconds)."""
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(m) for m in _chat(60)) + "\n")
    (tmp_path / "host.toml").write_text(
        "[plugin.memory-summary]\nthreshold = 200\nkeep_recent = 4\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", _COMMANDS.format(tmp=str(tmp_path))],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert [name for name, _ in seen] == [
        "replay",
        "sessions",
        "summary",
        "compress",
        "rebuild",
        "demo",
    ]
    assert [name for name, imported in seen if imported] == []


#: What the light commands must not import (seconds or tens of milliseconds each, and nothing
#: they need): litellm, the tokenizer, rich, the ``regex`` engine and the summarizer.
HEAVY = (
    "litellm",
    "tiktoken",
    "rich",
    "regex",
    "plugin_memory_summary.summarizer.summarize",
    "plugin_memory_summary.summarizer.rules",
)

_ONE_COMMAND = r"""
import contextlib, io, json, sys
from host_stub.cli import main

out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
assert code == 0, (sys.argv, code, out.getvalue())
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _heavy_loaded(argv: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _ONE_COMMAND.format(heavy=HEAVY), *argv],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={k: v for k, v in os.environ.items() if k not in TERMINAL_SETTINGS},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_light_commands_import_no_tokenizer_rich_regex_or_summarizer(tmp_path) -> None:
    """``sessions`` and ``summary`` read what is stored: they import none of :data:`HEAVY`. A
    ``replay`` whose output is not a terminal counts tokens (tiktoken) and prunes old tool
    output, whose placeholder names the identifiers it held (the identifier scanner: regex), but
    draws no progress bar: no rich, and without a compression no summarizer."""
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(m) for m in _chat(30)) + "\n")
    (tmp_path / "host.toml").write_text("[plugin.memory-summary]\nthreshold = 200\n")
    db = str(tmp_path / "m.db")
    config = ["--config", str(tmp_path / "host.toml")]
    replay = _heavy_loaded(["replay", str(tmp_path / "chat.jsonl"), "--db", db, *config])
    assert replay == ["regex", "tiktoken"]
    assert _heavy_loaded(["sessions", "--db", db]) == []
    assert _heavy_loaded(["summary", "chat", "--db", db, *config]) == []
