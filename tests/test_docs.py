"""The README, the docs, plugin.toml and the CI script tell the truth about the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

from host_stub import docgen, hookspecs, signals
from host_stub.config import HostConfig, load_host_config
from host_stub.host import Host
from host_stub.memory.inmemory import InMemoryMemory
from host_stub.plugins import PluginManifest
from host_stub.testing import FakeLLM, simple_count
from plugin_memory_summary.base.config import MemorySummaryConfig

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("*/*.md"))]
CI_RUN = ROOT / ".ci" / "run"


def readme() -> str:
    return README.read_text(encoding="utf-8")


def doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def all_docs() -> str:
    """The README and every page of docs/, one after another."""
    return "\n".join(path.read_text(encoding="utf-8") for path in DOCS)


def code_blocks(language: str, text: str | None = None) -> list[str]:
    return re.findall(
        rf"^```{language}\n(.*?)^```$", readme() if text is None else text, re.DOTALL | re.MULTILINE
    )


def quick_start() -> list[str]:
    """The commands of the README's first shell block, comments left out."""
    block = code_blocks("sh")[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


# -- generated tables ----------------------------------------------------------------------------
def test_the_docs_are_up_to_date_with_the_generator() -> None:
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        assert docgen.render_readme(text) == text, f"run: python -m host_stub.docgen {path.name}"


def test_the_docs_have_every_generated_section() -> None:
    text = all_docs()
    assert set(docgen.SECTIONS) == {"hooks", "signals", "services"}
    assert "config" in docgen.sections()  # the plugin's, through its docs_sections hook
    for name in docgen.sections():
        assert f"<!-- BEGIN GENERATED: {name} -->" in text
        assert f"<!-- END GENERATED: {name} -->" in text


def test_every_hook_signal_and_config_key_is_documented() -> None:
    text = all_docs()
    hooks = [name for name, _ in docgen.hookspec_functions()]
    assert hooks == [
        "startup",
        "plugin_config_schema",
        "register_commands",
        "plugin_models",
        "docs_sections",
        "chat_commands",
        "agent_prompt",
        "agent_tools",
        "prune_history",
        "before_model_call",
        "memory_clear",
        "shutdown",
    ]
    missing = [h for h in hooks if f"`{h}`" not in text]
    missing += [s for s in signals.PAYLOADS if f"`{s}`" not in text]
    keys = [key for key, _, _ in docgen.config_rows(MemorySummaryConfig)]
    assert "caps.identifiers" in keys
    missing += [k for k in keys if f"`{k}`" not in text]
    assert not missing, f"not documented in README.md or docs/: {missing}"


def test_every_service_method_is_described() -> None:
    rows = [line.split(" | ") for line in docgen.render_services().splitlines()[2:]]
    members = [
        (service, name)
        for service, protocol, _ in docgen.service_protocols()
        for name, _ in docgen.protocol_members(protocol)
    ]
    assert len(rows) == len(members) and ("memory", "trim_history") in members
    assert ("memory", "append_snapshot") in members  # an optional method is listed too
    assert any("Optional:" in row[2] and "append_snapshot" in row[1] for row in rows)
    undescribed = [row[1] for row in rows if row[2].strip() == docgen.NONE]
    assert not undescribed, f"give these a docstring: {undescribed}"


def test_the_hosts_members_and_its_optional_ones_are_in_the_contracts() -> None:
    from host_stub import services

    text = (ROOT / "docs" / "contracts.md").read_text(encoding="utf-8")
    members = [name for name, _ in docgen.protocol_members(services.HostProtocol)]
    members += [name for name, _ in docgen.protocol_members(services.YieldsToTurns)]
    assert "after_turns" in members
    missing = [name for name in members if f"`{name}" not in text]
    assert not missing, f"not in docs/contracts.md: {missing}"
    assert isinstance(Host(), services.YieldsToTurns)  # the reference host offers it


def test_config_table_shows_ranges_choices_and_aalis_names() -> None:
    table = docgen.sections()["config"]()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    assert "2 ≤ x ≤ 100 000" in rows["`threshold`"] and "`keepRecent`" in rows["`keep_recent`"]
    assert "0 < x ≤ 1" in rows["`summary_token_ratio`"]
    assert "`summary` / `window` / `off`" in rows["`strategy`"]
    assert "`summaryModelMode`" in rows["`summary_model`"] and "unset" in rows["`summary_model`"]
    assert "≥ 1" in rows["`keep_recent_tokens`"]
    for key in (
        "threshold",
        "keep_recent",
        "summary_token_ratio",
        "auto_compress_threshold",
        "summary_prompt",
        "summary_model",
    ):
        assert rows[f"`{key}`"].rstrip(" |").split("|")[-1].strip() != docgen.NONE


def test_render_readme_replaces_only_marked_blocks_and_checks_markers() -> None:
    text = "intro\n<!-- BEGIN GENERATED: signals -->\nstale\n<!-- END GENERATED: signals -->\nend\n"
    out = docgen.render_readme(text)
    assert out.startswith("intro\n<!-- BEGIN GENERATED: signals -->\n| signal |")
    assert out.endswith("<!-- END GENERATED: signals -->\nend\n") and "stale" not in out
    assert docgen.render_readme(out) == out
    with pytest.raises(ValueError, match="unbalanced"):
        docgen.render_readme("<!-- BEGIN GENERATED: hooks -->\n")
    with pytest.raises(ValueError, match="unknown"):
        docgen.render_readme("<!-- BEGIN GENERATED: x -->\n<!-- END GENERATED: x -->")


def test_docgen_check_exits_1_when_out_of_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "doc.md"
    empty = "<!-- BEGIN GENERATED: hooks -->\n<!-- END GENERATED: hooks -->\n"
    path.write_text(empty, encoding="utf-8")
    before = path.read_text(encoding="utf-8")
    assert docgen.main([str(path), "--check"]) == 1
    assert path.read_text(encoding="utf-8") == before
    assert "out of date" in capsys.readouterr().err
    assert docgen.main([str(path)]) == 0
    assert "`agent_prompt`" in path.read_text(encoding="utf-8")
    assert docgen.main([str(path), "--check"]) == 0


# -- plugin.toml ---------------------------------------------------------------------------------
def test_both_plugin_toml_copies_are_identical() -> None:
    root = (ROOT / "plugin.toml").read_bytes()
    shipped = (ROOT / "plugin_memory_summary" / "plugin.toml").read_bytes()
    assert root == shipped, "plugin.toml and plugin_memory_summary/plugin.toml differ"


def _compare(toml: dict[str, Any], model: dict[str, Any], where: str) -> list[str]:
    problems = [f"{where}{k}: not a config key" for k in toml.keys() - model.keys()]
    for key, default in model.items():
        if isinstance(default, dict):
            problems += _compare(toml.get(key, {}), default, f"{where}{key}.")
        elif key not in toml:
            if default is not None:
                problems.append(f"{where}{key}: missing from plugin.toml (default {default!r})")
        elif toml[key] != default or type(toml[key]) is not type(default):
            problems.append(f"{where}{key}: plugin.toml {toml[key]!r} != model default {default!r}")
    return problems


def test_plugin_toml_config_equals_the_model_defaults() -> None:
    data = tomllib.loads((ROOT / "plugin.toml").read_text(encoding="utf-8"))
    problems = _compare(data["config"], MemorySummaryConfig().model_dump(), "config.")
    assert not problems, "\n".join(problems)
    manifest = PluginManifest.model_validate(data["plugin"] | {"config": data["config"]})
    assert manifest.name == "memory-summary"
    declared = set(manifest.signals["listens"]) | set(manifest.signals["emits"])
    assert declared <= set(signals.PAYLOADS)


# -- README examples -----------------------------------------------------------------------------
async def test_the_full_host_config_example_starts_a_host(tmp_path: Path) -> None:
    block = next(b for b in code_blocks("toml", doc("configuration.md")) if b.startswith("[host]"))
    path = tmp_path / "host.toml"
    path.write_text(block, encoding="utf-8")
    config = load_host_config(path)
    assert config.plugin["memory-summary"]["threshold"] == 40

    async with Host(
        config, memory=InMemoryMemory(token_counter=lambda m: 1), llm=FakeLLM()
    ) as host:
        cfg = host.plugins["memory-summary"].config
    assert isinstance(cfg, MemorySummaryConfig)
    assert (cfg.threshold, cfg.keep_recent, cfg.caps.identifiers) == (40, 16, 60)
    assert cfg.caps.list_items == MemorySummaryConfig().caps.list_items


async def test_the_plugin_example_runs_in_a_host(capsys: pytest.CaptureFixture[str]) -> None:
    page = doc("writing-a-plugin.md")
    source = next(b for b in code_blocks("python", page) if "def create_plugin" in b)
    module = types.ModuleType("my_pkg")
    exec(compile(source, "docs/writing-a-plugin.md", "exec"), module.__dict__)
    manifest_toml = next(b for b in code_blocks("toml", page) if b.startswith("[plugin]"))
    manifest = tomllib.loads(manifest_toml)
    PluginManifest.model_validate(manifest["plugin"] | {"config": manifest["config"]})
    plugin = module.create_plugin()
    llm = FakeLLM(default="hello")
    config = HostConfig.model_validate({"plugins": {"allow": []}, "host": {"model": "fake/chat"}})
    async with Host(
        config,
        memory=InMemoryMemory(token_counter=lambda m: simple_count(str(m.content))),
        llm=llm,
        plugins=[("my-plugin", plugin)],
    ) as host:
        result = await host.run_turn("s1", "hi")
    assert result.outcome == "replied"
    assert llm.calls[0]["messages"][-1] == {"role": "system", "content": manifest["config"]["hint"]}
    assert "s1 replied" in capsys.readouterr().out


def test_documented_cli_commands_exist() -> None:
    used = set(re.findall(r"^host-stub (\w[\w-]*)", all_docs(), re.MULTILINE))
    used |= set(re.findall(r"`host-stub (\w[\w-]*)", all_docs()))
    out = subprocess.run(
        [sys.executable, "-m", "host_stub.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    ).stdout
    listed = set(re.findall(r"^  (\w[\w-]*)\s", out.split("Commands:", 1)[1], re.MULTILINE))
    expected = {"replay", "chat", "sessions", "clear", "summary", "compress", "rebuild", "pin"}
    assert expected <= listed
    assert used <= listed, f"the docs name commands that do not exist: {used - listed}"


# -- CI ------------------------------------------------------------------------------------------
def test_ci_installs_and_tests_exactly_as_the_readme_says() -> None:
    commands = quick_start()
    setup = next(c for c in commands if "pip install" in c)
    test = next(c for c in commands if c.split()[0] == "pytest")
    script = CI_RUN.read_text(encoding="utf-8")
    lines = [line.strip() for line in script.splitlines()]
    assert setup in lines, f"the README's set-up command is not a line of .ci/run: {setup}"
    develop = next(c for c in commands if c.startswith("pip install") and "[dev]" in c)
    assert develop in lines, f"the README's develop install is not a line of .ci/run: {develop}"
    assert any(line == test or line.startswith(test + " ") for line in lines), test
    assert "python -m host_stub.docgen README.md docs/*.md --check" in lines
    assert "set -euo pipefail" in lines
    assert CI_RUN.stat().st_mode & 0o111, ".ci/run is not executable"
    assert not re.search(r"/(work|tmp)/", script)


def test_ci_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(CI_RUN)], check=True)


def test_the_docs_name_no_local_paths() -> None:
    assert not re.search(r"(?<![\w.])/(work|tmp)/", all_docs())


def test_the_docs_link_only_to_files_that_exist() -> None:
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            assert (path.parent / target).exists(), f"{path.name} links to a missing {target}"


def test_the_readme_is_short_and_links_every_page() -> None:
    text = readme()
    assert len(text.splitlines()) <= 160
    for path in DOCS[1:]:
        page = path.relative_to(ROOT).as_posix()
        assert f"]({page})" in text, f"the README does not link {page}"


def test_hookspec_module_is_the_documented_contract() -> None:
    assert hookspecs.ENTRY_POINT_GROUP in doc("writing-a-plugin.md")


def benchmark_rows() -> list[tuple[str, str, str]]:
    """(what, command, result) of the benchmark table in docs/benchmarks.md."""
    section = doc("benchmarks.md").split("\n| what |", 1)[1].split("\n\n", 1)[0]
    section = "| what |" + section
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    cells = [[c.strip() for c in row.strip().strip("|").split(" | ")] for row in rows]
    return [(c[0], c[1], c[2]) for c in cells]


def test_every_benchmark_figure_in_the_readme_is_in_the_results_file_of_its_script() -> None:
    rows = benchmark_rows()
    assert len(rows) >= 6
    script = ""
    for what, command, result in rows:
        found = re.search(r"bench/(\w+)\.py", command)
        if found:
            script = found.group(1)
        assert script, f"README benchmark row {what!r} names no script"
        # A mode of a script writes its own file: `bench/x.py --mode` -> results/x_mode.md;
        # `--name N` names it: results/N.md.
        name = script
        mode = re.search(rf"bench/{script}\.py --(\w+)", command)
        named = re.search(r"--name (\w+)", command)
        if named:
            name = named.group(1)
        elif mode and (ROOT / "bench" / "results" / f"{script}_{mode.group(1)}.md").exists():
            name = f"{script}_{mode.group(1)}"
        # Thousands separators differ between tables ("1186", "1,186"): compare without them.
        text = (ROOT / "bench" / "results" / f"{name}.md").read_text(encoding="utf-8")
        text = re.sub(r"(?<=\d),(?=\d{3})", "", text)
        figures = re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?!\d)", result.replace(",", ""))
        assert figures, what
        for figure in figures:
            assert re.search(rf"(?<![\d.]){re.escape(figure)}(?!\d|\.\d)", text), (
                f"README benchmark row {what!r}: {figure} is not in bench/results/{name}.md"
            )


def test_p22_slow_tests_are_deselected_by_default_and_ci_runs_them_all() -> None:
    """Issue 14 point 22: the default run leaves the slow tests out (``-m 'not slow'`` in the
    pytest options); CI opts back in to every test."""
    import shlex
    import tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "pytest"
    ]["ini_options"]
    addopts = shlex.split(options["addopts"])
    assert addopts[addopts.index("-m") + 1] == "not slow"
    assert any(m.startswith("slow:") for m in options["markers"])
    runs = [
        shlex.split(line)
        for line in CI_RUN.read_text(encoding="utf-8").splitlines()
        if line.strip().startswith("pytest ")
    ]
    assert len(runs) == 1
    marks = [runs[0][i + 1] for i, arg in enumerate(runs[0]) if arg == "-m"]
    assert marks[-1:] == ["slow or not slow"]  # the last -m wins over the one in addopts


def test_the_version_has_one_source() -> None:
    """pyproject.toml holds the version; the package and the host's manifest read it from the
    installed metadata, and no other file repeats it."""
    import tomllib

    import plugin_memory_summary
    from host_stub.config import HostConfig
    from host_stub.plugins import get_plugin_manager

    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "version"
    ]
    assert plugin_memory_summary.__version__ == version
    for name in ("plugin.toml", "plugin_memory_summary/plugin.toml"):
        assert "version =" not in (ROOT / name).read_text(encoding="utf-8"), name
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    _, loaded = get_plugin_manager(HostConfig())
    manifest = loaded["memory-summary"].manifest
    assert manifest is not None and manifest.version == version


async def test_the_readme_python_quick_start_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's Python quick start, as written, against its config example pointed at a
    local OpenAI-compatible server (the only change: the model and the server's address)."""
    from fake_openai import FakeOpenAIServer

    config = next(b for b in code_blocks("toml") if b.startswith("[host]"))
    source = next(b for b in code_blocks("python") if "open_host" in b)
    assert source.rstrip().endswith("asyncio.run(main())")
    with FakeOpenAIServer("Noted.", n_ctx=8192) as server:
        # Two chat replies, then the summarizer's digest of the first exchange.
        server.enqueue("Noted.", "Noted.", "Lena's booking reference is K7XQ2M.")
        config = config.replace('model = "gpt-4o-mini"', 'model = "openai/fake-model"', 1)
        config, n = re.subn(
            r'^# api_base = "[^"]*"', f'api_base = "{server.base_url}"', config, flags=re.M
        )
        assert n == 1
        (tmp_path / "host.toml").write_text(config, encoding="utf-8")
        monkeypatch.chdir(tmp_path)
        # No key anywhere: a host embedded in Python sends the placeholder to a local server.
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        namespace: dict[str, Any] = {}
        # Run main() in this test's event loop rather than a second one.
        body = source.rstrip().removesuffix("asyncio.run(main())")
        exec(compile(body, "README.md", "exec"), namespace)
        await namespace["main"]()
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["Noted.", "Noted."]
    status, summarized = out[2].split()
    assert status == "done" and int(summarized) >= 1
    assert "K7XQ2M" in "\n".join(out[3:])  # the summary keeps the booking reference
    assert (tmp_path / "memory.db").exists()
