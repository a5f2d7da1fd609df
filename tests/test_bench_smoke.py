"""The benchmark scripts in ``bench/`` run: each in ``--quick`` mode, in a subprocess, printing its
table and writing its results (``--out`` a temporary directory, never ``bench/results``).

These are smoke tests, not timed tests: no number is asserted. ``bench/peers.py`` and
``bench/host_floor.py`` need the peers (LangChain v1, LangMem), which are never installed with
the plugin; when this interpreter lacks them the script must exit with status 3 and say how to
install them (a non-zero status, so a job that expects peer numbers cannot pass without them).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import require

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

#: script -> (data sets it reads, results files it writes besides <name>.md / <name>.json)
SCRIPTS = {
    "overhead": ((), ()),
    "startup": ((), ()),
    "token_economy": (("locomo/locomo_dev.json",), ("tokens_per_turn.svg", "tokens_per_turn.png")),
    "retention": (("locomo/locomo_dev.json", "tau_bench/airline_dev.json"), ()),
    "scale": ((), ()),
    "recall": (("locomo/locomo_dev.json",), ()),
    "adapters": (("locomo/locomo_dev.json", "tau_bench/airline_dev.json"), ()),
}


def run_script(name: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--quick", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def assert_results(name: str, out: Path, done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\n| " in done.stdout and "|---" in done.stdout, done.stdout[-2000:]
    assert "versions: " in done.stdout
    md, js = out / f"{name}.md", out / f"{name}.json"
    assert md.is_file() and js.is_file()
    data = json.loads(js.read_text(encoding="utf-8"))
    assert data["name"] == name and data["tables"] and all(t["rows"] for t in data["tables"])
    assert data["command"].startswith(f"python bench/{name}.py --quick")
    # Results never name a place outside the repository.
    assert str(out) not in md.read_text(encoding="utf-8")
    assert str(out) not in js.read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCRIPTS))
def test_script_runs_quick_and_writes_its_results(name: str, tmp_path: Path) -> None:
    data_sets, files = SCRIPTS[name]
    for relative in data_sets:
        require(relative)
    done = run_script(name, tmp_path)
    assert_results(name, tmp_path, done)
    for file in files:
        assert (tmp_path / file).is_file(), file


def peers_importable() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("langchain", "langmem"))


#: The scripts that run the peers, and the data sets they read.
PEER_SCRIPTS = {
    "peers": ("locomo/locomo_dev.json", "tau_bench/airline_dev.json"),
    "host_floor": ("tau_bench/airline_dev.json",),
}


@pytest.mark.parametrize("name", list(PEER_SCRIPTS))
def test_peers_script_runs_or_says_how_to_install_the_peers(name: str, tmp_path: Path) -> None:
    for relative in PEER_SCRIPTS[name]:
        require(relative)
    done = run_script(name, tmp_path)
    if peers_importable():
        assert_results(name, tmp_path, done)
        assert "langmem" in done.stdout and "langchain" in done.stdout  # the versions it ran with
    else:
        assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
        assert "peers not installed" in done.stderr
        assert "pip install -e '.[bench]'" in done.stderr
        assert not (tmp_path / f"{name}.md").exists()


def test_missing_data_is_a_clear_error(tmp_path: Path) -> None:
    done = run_script("token_economy", tmp_path, "--data", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert "data set not found: locomo/locomo_dev.json" in done.stderr
    assert "--data DIR" in done.stderr and "MEMORY_SUMMARY_DATA" in done.stderr
