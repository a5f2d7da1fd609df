"""The host knows no plugin: ``host_stub`` never imports or names the plugin package, works
without it, and gets the plugin's commands, chat commands and docs through hooks only."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from fake_openai import FakeOpenAIServer

from host_stub.memory.sqlite import SQLiteMemory

ROOT = Path(__file__).resolve().parent.parent
HOST = ROOT / "host_stub"
SCRIPT = Path(sys.executable).parent / "host-stub"

#: The plugin's package, its distribution and its entry-point name, however spelt.
PLUGIN_NAMES = re.compile(r"plugin[_-]memory[_-]summary|memory[_-]summary", re.IGNORECASE)


def test_no_file_of_host_stub_names_the_plugin() -> None:
    files = [p for p in HOST.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len([p for p in files if p.suffix == ".py"]) > 20
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PLUGIN_NAMES.search(line)
    ]
    assert not found, "host_stub names the plugin:\n" + "\n".join(found)


def test_the_name_scan_would_find_an_import_or_a_name() -> None:
    for line in (
        "from plugin_memory_summary.base.config import MemorySummaryConfig",
        'item = host.plugins.get("memory-summary")',
        "pip install 'plugin-memory-summary[redis]'",
    ):
        assert PLUGIN_NAMES.search(line), line


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_importing_every_host_module_loads_no_plugin() -> None:
    done = _python(
        """
        import importlib, pkgutil, sys
        import host_stub
        names = [m.name for m in pkgutil.walk_packages(host_stub.__path__, "host_stub.")]
        for name in names:
            importlib.import_module(name)
        assert len(names) > 20, names
        print([m for m in sys.modules if m.partition(".")[0] == "plugin_memory_summary"])
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


#: Runs ``host_stub`` as if no plugin were installed: the entry-point group is empty.
_WITHOUT_PLUGINS = """
import contextlib, io, json, sys
import importlib.metadata as metadata

real = metadata.entry_points


def entry_points(**params):
    if params.get("group") == "host_stub.plugins":
        return metadata.EntryPoints(())
    return real(**params)


metadata.entry_points = entry_points
import host_stub.plugins

host_stub.plugins.entry_points = entry_points

from host_stub import docgen
from host_stub.cli import main

shown = {}
for name, argv in (
    ("help", ["--help"]),
    ("sessions", ["sessions", "--db", sys.argv[1]]),
    ("clear", ["clear", "s", "--type", "summary", "--db", sys.argv[1]]),
):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    shown[name] = [code, out.getvalue(), err.getvalue()]
shown["sections"] = sorted(docgen.sections())
shown["loaded"] = [m for m in sys.modules if m.partition(".")[0] == "plugin_memory_summary"]
print(json.dumps(shown))
"""


def test_the_host_cli_and_docs_work_without_any_plugin(tmp_path: Path) -> None:
    """No plugin installed: the host's own commands and doc sections, nothing else, and
    ``clear --type`` knows only the host's history."""
    db = tmp_path / "m.db"

    async def make_store() -> None:  # a store with no session: read-only commands open it
        memory = SQLiteMemory(db, lambda m: 1)
        await memory.list_sessions()
        await memory.close()

    asyncio.run(make_store())
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PLUGINS, str(db)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    code, out, _ = shown["help"]
    listed = set(re.findall(r"^  (\w[\w-]*)\s", out.split("Commands:", 1)[1], re.MULTILINE))
    assert code == 0 and listed == {"chat", "clear", "search", "sessions"}, out
    assert shown["sessions"][:2] == [0, "no sessions\n"]
    code, _, err = shown["clear"]
    assert code == 2 and "unknown --type 'summary': this host clears history" in err
    assert shown["sections"] == ["hooks", "services", "signals"]
    assert shown["loaded"] == []


def test_with_the_plugin_its_commands_and_docs_come_through_hooks() -> None:
    done = _python(
        """
        import contextlib, io, json
        from host_stub import docgen
        from host_stub.cli import main

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["--help"])
        print(json.dumps([code, out.getvalue(), sorted(docgen.sections())]))
        """
    )
    assert done.returncode == 0, done.stderr
    code, out, sections = json.loads(done.stdout.strip().splitlines()[-1])
    listed = set(re.findall(r"^  (\w[\w-]*)\s", out.split("Commands:", 1)[1], re.MULTILINE))
    assert code == 0
    assert {"replay", "demo", "summary", "compress", "rebuild", "pin"} <= listed
    assert sections == ["config", "hooks", "services", "signals"]


def _write_chat(path: Path, turns: int) -> Path:
    lines = []
    for i in range(turns):
        lines.append(
            {"role": "user", "content": f"Question {i}: what about booking RES-{1000 + i}?"}
        )
        lines.append({"role": "assistant", "content": f"Booking RES-{1000 + i} is confirmed."})
    path.write_text("".join(json.dumps(m) + "\n" for m in lines), encoding="utf-8")
    return path


def test_chat_gets_the_plugins_commands_and_says_a_resumed_session_was_summarized(
    tmp_path: Path,
) -> None:
    """The plugin's ``/summary`` and ``/compress`` come through ``chat_commands`` and are listed
    first; a command that takes no argument says so; a resumed session whose prompt carries a
    summary says its archived messages went into it."""
    db = str(tmp_path / "m.db")
    config = tmp_path / "host.toml"
    config.write_text("[plugin.memory-summary]\nthreshold = 10\nkeep_recent = 4\n")
    replayed = subprocess.run(
        [str(SCRIPT), "replay", str(_write_chat(tmp_path / "s.jsonl", 12)), "--db", db]
        + ["--config", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["archived"] > 0
    with FakeOpenAIServer(default_reply="Hello from the fake model.") as server:
        proc = subprocess.run(
            [str(SCRIPT), "chat", "--session", "s", "--model", "openai/fake-model"]
            + ["--api-base", server.base_url, "--db", db, "--config", str(config)],
            input="/summary now\n/help\n/summary\n/quit\n",
            capture_output=True,
            text=True,
            env={**os.environ, "OPENAI_API_KEY": "sk-test"},
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(
        r"resuming session 's' with 2\d messages \(\d+ active, \d+ archived into "
        r"the summary\); /clear starts it afresh",
        out,
    ), out
    assert "/summary takes no arguments; /help lists the commands" in out
    listed = re.findall(r"^  (/\w+) ", out, re.MULTILINE)
    assert listed == ["/summary", "/compress", "/search", "/clear", "/help", "/quit"], out
    assert "RES-10" in out.split("/help lists the commands")[-1]  # the summary's text


# -- one extension rule: a signal's receivers answer nothing ---------------------------------------
PACKAGES = (HOST, ROOT / "plugin_memory_summary")


def _signal_answers_used(source: str) -> list[int]:
    """Lines where code uses what ``<...>bus.send(...)`` returns (receivers' answers): any
    ``await ...bus.send(...)`` that is not a statement of its own."""
    tree = ast.parse(source)
    as_statement = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if node.func.attr != "send" or not name.endswith("bus"):
            continue
        parent_ok = any(
            isinstance(a, ast.Await) and a.value is node and id(a) in as_statement
            for a in ast.walk(tree)
        )
        if not parent_ok:
            found.append(node.lineno)
    return found


def test_no_signal_receivers_return_value_is_used_by_host_or_plugin() -> None:
    """Hooks for anything that answers, signals only for observers: nothing reads what a send
    returns (``EventBus.send`` returns ``None``)."""
    files = [p for package in PACKAGES for p in package.rglob("*.py")]
    assert len(files) > 60
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in files
        for line in _signal_answers_used(path.read_text(encoding="utf-8"))
    ]
    assert not found, "signal receivers' answers used:\n" + "\n".join(found)


def test_the_signal_answer_scan_would_find_a_use() -> None:
    used = """
    async def clear(self):
        for value in await self.bus.send("memory:clear", scope="all"):
            pass
        results = await host.bus.send("x")
        await self.bus.send("session:compressing", status="done")
    """
    assert _signal_answers_used(textwrap.dedent(used)) == [3, 5]
