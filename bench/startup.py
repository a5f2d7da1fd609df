"""Import and start-up cost in fresh processes: ``import plugin_memory_summary``, and a reference
host started with the plugin (loaded from its entry point, default LLM service, SQLite store), and
whether litellm got imported on the way.

Each sample is a new interpreter (``sys.executable``) that times itself with ``perf_counter``;
a bare interpreter (``python -c pass``) is timed the same way for reference.

    python bench/startup.py [--quick] [--out DIR] [--runs N]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    Table,
    out_dir,
    parser,
    percentile,
    print_versions,
    progress,
    versions,
    write_results,
)

TARGET_MS = 150.0

#: Runs in the fresh process; prints one JSON line. ``DB`` is filled in.
PROBE = r"""
import time
t0 = time.perf_counter()
c0 = time.process_time()
import sys, json, asyncio
import plugin_memory_summary
t_import = time.perf_counter()
c_import = time.process_time()
from host_stub.config import HostConfig
from host_stub.host import Host
t_host_import = time.perf_counter()

async def start():
    config = HostConfig.model_validate({
        "host": {"memory": "sqlite:///" + DB},
        "plugins": {"allow": ["memory-summary"]},
    })
    host = Host(config)
    t = time.perf_counter()
    await host.start()
    started = time.perf_counter()
    # first use of the store (the SQLite connection opens lazily)
    await host.memory.list_sessions()
    opened = time.perf_counter()
    assert "memory-summary" in host.plugins
    await host.stop()
    return t, started, opened

t_start, t_started, t_opened = asyncio.run(start())
c_end = time.process_time()
print(json.dumps({
    "import_plugin_cpu_ms": (c_import - c0) * 1000,
    "total_cpu_ms": (c_end - c0) * 1000,
    "import_plugin_ms": (t_import - t0) * 1000,
    "import_host_ms": (t_host_import - t_import) * 1000,
    "host_start_ms": (t_started - t_start) * 1000,
    "store_open_ms": (t_opened - t_started) * 1000,
    "total_ms": (t_opened - t0) * 1000,
    "litellm_imported": "litellm" in sys.modules,
    "modules": len(sys.modules),
}))
"""

IMPORT_TIME = "import plugin_memory_summary"


def probe_env(pycache: str | None) -> dict[str, str]:
    """With ``pycache``: bytecode written to and read from that directory (as an installed
    package has it; nothing is written into the repository). Without: no bytecode at all, every
    module of the project compiled from source (``PYTHONDONTWRITEBYTECODE``, as in this dev
    environment)."""
    env = dict(os.environ)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if pycache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def run_probe(db: str, env: dict[str, str]) -> dict[str, Any]:
    code = f"DB = {db!r}\n" + PROBE
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    wall = (time.perf_counter() - start) * 1000
    data = json.loads(done.stdout.strip().splitlines()[-1])
    data["process_wall_ms"] = wall
    return data


def bare_interpreter() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - start) * 1000


def import_profile(env: dict[str, str], top: int = 12) -> list[tuple[str, float, float]]:
    """The imports with the most self time under ``import plugin_memory_summary``
    (``-X importtime``: self and cumulative, microseconds -> ms; importtime inflates both)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", IMPORT_TIME],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line[len("import time:") :].split("|")
        try:
            own, cumulative = int(parts[0]), int(parts[1])
        except ValueError:
            continue
        rows.append((parts[2].strip(), own / 1000, cumulative / 1000))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=None, help="fresh processes to time")
    args = p.parse_args()
    out = out_dir(args.out)
    v = versions()
    print_versions(v)
    runs = args.runs or (3 if args.quick else 20)
    started = time.perf_counter()
    warm: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    bare = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        warm_env = probe_env(str(Path(tmp) / "pycache"))
        cold_env = probe_env(None)
        run_probe(str(Path(tmp) / "warmup.db"), warm_env)  # writes the bytecode cache
        for i in range(runs):
            progress(f"run {i + 1}/{runs}")
            bare.append(bare_interpreter())
            warm.append(run_probe(str(Path(tmp) / f"warm{i}.db"), warm_env))
            cold.append(run_probe(str(Path(tmp) / f"cold{i}.db"), cold_env))
        profile = import_profile(warm_env)

    table = Table(
        f"Fresh-process start-up, {runs} runs each (ms); warm = bytecode cached (an installed "
        "package), cold = every project module compiled from source",
        [
            "measure",
            "warm min",
            "warm p50",
            "warm max",
            "cold min",
            "cold p50",
            f"target < {TARGET_MS:.0f} ms (warm p50)",
        ],
    )

    def row(label: str, key: str, target: bool = False) -> None:
        w = [s[key] for s in warm]
        c = [s[key] for s in cold]
        p50 = percentile(w, 50)
        verdict = ("met" if p50 < TARGET_MS else "missed") if target else ""
        table.add(
            label,
            round(min(w), 1),
            round(p50, 1),
            round(max(w), 1),
            round(min(c), 1),
            round(percentile(c, 50), 1),
            verdict,
        )

    row("import plugin_memory_summary", "import_plugin_ms", target=True)
    row("import plugin_memory_summary, CPU time", "import_plugin_cpu_ms", target=True)
    row("+ import host_stub.host", "import_host_ms")
    row("+ Host.start() with the plugin", "host_start_ms")
    row("+ first store use (SQLite open, schema)", "store_open_ms")
    row("import + host start, in-process total", "total_ms", target=True)
    row("import + host start, CPU time", "total_cpu_ms", target=True)
    row("whole process wall time (interpreter included)", "process_wall_ms")
    table.add(
        "bare interpreter (python -c pass)",
        round(min(bare), 1),
        round(percentile(bare, 50), 1),
        round(max(bare), 1),
        "",
        "",
        "",
    )
    imported = sum(1 for s in warm + cold if s["litellm_imported"])
    table.add(
        "litellm imported",
        f"{imported} of {2 * runs} runs",
        "",
        "",
        "",
        "",
        "met" if not imported else "missed",
    )
    table.add(
        "modules loaded after start",
        round(percentile([s["modules"] for s in warm], 50)),
        "",
        "",
        "",
        "",
        "",
    )

    slow = Table(
        "Imports with the most self time under `import plugin_memory_summary` (python -X "
        "importtime, warm, one run; importtime inflates times)",
        ["module", "self ms", "cumulative ms"],
    )
    for name, own, cumulative in profile:
        slow.add(name, round(own, 1), round(cumulative, 1))
    write_results(
        "startup",
        "Import and start-up",
        [table, slow],
        out=out,
        versions_used=v,
        settings={"runs": runs, "quick": args.quick},
        runtime_s=time.perf_counter() - started,
        notes=[
            "Host.start() builds the default LiteLLMService (litellm imported lazily, on the first "
            "call that needs it) and the SQLite store from `sqlite:///<tmp>/start.db`; the plugin "
            "comes from its entry point.",
        ],
        extra={"warm": warm, "cold": cold, "bare_ms": bare},
    )


if __name__ == "__main__":
    main()
