"""Shared pieces of the benchmark scripts: where the data is, how results are printed and
written, the token counter every system is measured with, the real host rig, timing helpers and
the sliding-window baseline.

The scripts run as ``python bench/<name>.py``, so this module is imported as ``common``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
#: Context budget every system gets (tokens the prompt may hold).
BUDGET = 4000
#: The host's own system prompt (the reference host's default).
SYSTEM_PROMPT = "You are a helpful assistant."

EXIT_NO_DATA = 2
EXIT_NOT_INSTALLED = 3


# -- arguments and data ----------------------------------------------------------------------------


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--data",
        default=None,
        help="data directory (default: $MEMORY_SUMMARY_DATA, else ../shared/data from the repo "
        "root)",
    )
    p.add_argument("--quick", action="store_true", help="a reduced run (smoke tests)")
    p.add_argument(
        "--out", default=None, help="directory for <name>.md / .json (default: bench/results)"
    )
    return p


def data_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    env = os.environ.get("MEMORY_SUMMARY_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


def require_data(arg: str | None, relative: str) -> Path:
    """The data file, or exit with a message naming the options that set the directory."""
    path = data_dir(arg) / relative
    if not path.exists():
        print(
            f"data set not found: {relative} under {data_dir(arg)} "
            "(pass --data DIR or set MEMORY_SUMMARY_DATA)",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_NO_DATA)
    return path


def out_dir(arg: str | None) -> Path:
    path = Path(arg) if arg else RESULTS
    path.mkdir(parents=True, exist_ok=True)
    return path


def command_line() -> str:
    """The command as typed, with paths outside the repository replaced by placeholders (a
    results file never names a place outside the project)."""
    args = ["python", _rel(sys.argv[0])]
    argv = sys.argv[1:]
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--data", "--out") and i + 1 < len(argv):
            args += [a, _rel(argv[i + 1], placeholder=f"<{a[2:]}>")]
            i += 2
            continue
        if a.startswith(("--data=", "--out=")):
            key, _, value = a.partition("=")
            args.append(f"{key}={_rel(value, placeholder=f'<{key[2:]}>')}")
        else:
            args.append(a)
        i += 1
    return shlex.join(args)


def _rel(path: str, placeholder: str = "<path>") -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return placeholder


# -- versions --------------------------------------------------------------------------------------

CORE_PACKAGES = (
    "plugin-memory-summary",
    "pydantic",
    "pluggy",
    "blinker",
    "tiktoken",
)


def versions(extra: Iterable[str] = ()) -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform(terse=True)}
    for name in (*CORE_PACKAGES, *extra):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["code"] = code_revision()
    out["cpus"] = str(os.cpu_count())
    out["load average at start"] = load_average()
    return out


def code_revision() -> str:
    """The commit the plugin and host code were measured at, and whether they had uncommitted
    changes (read-only git calls; "unknown" outside a git checkout)."""
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "plugin_memory_summary", "host_stub"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} + uncommitted changes" if dirty else head


def load_average() -> str:
    """The 1-minute load average: this machine is shared, and numbers taken under load are
    slower (and noisier) than on an idle one."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


def print_versions(v: dict[str, str]) -> None:
    print("versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))


# -- tables and results files ----------------------------------------------------------------------


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""

    def add(self, *row: Any) -> None:
        self.rows.append(list(row))

    def markdown(self) -> str:
        cells = [[fmt(c) for c in row] for row in self.rows]
        widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(self.columns)]

        def line(items: Sequence[str]) -> str:
            return "| " + " | ".join(s.ljust(w) for s, w in zip(items, widths, strict=True)) + " |"

        out = [f"### {self.title}", "", line(self.columns)]
        out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        out += [line(r) for r in cells]
        if self.note:
            out += ["", self.note]
        return "\n".join(out)


def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        if abs(value) >= 0.1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return str(value)


def write_results(
    name: str,
    title: str,
    tables: Sequence[Table],
    *,
    out: Path,
    versions_used: dict[str, str],
    settings: dict[str, Any],
    runtime_s: float,
    notes: Sequence[str] = (),
    extra: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Print every table and write ``<out>/<name>.md`` and ``<out>/<name>.json``."""
    command = command_line()
    versions_used = {**versions_used, "load average at end": load_average()}
    for table in tables:
        print()
        print(table.markdown())
    print()
    print(f"runtime: {runtime_s:.1f} s")
    md = [
        f"## {title}",
        "",
        f"Command: `{command}`  ",
        f"Runtime: {runtime_s:.1f} s  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions_used.items()) + "  ",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
        "",
    ]
    for table in tables:
        md += [table.markdown(), ""]
    md += [f"- {n}" for n in notes]
    md_path = out / f"{name}.md"
    md_path.write_text("\n".join(md).rstrip() + "\n", encoding="utf-8")
    json_path = out / f"{name}.json"
    payload = {
        "name": name,
        "title": title,
        "command": command,
        "runtime_s": round(runtime_s, 2),
        "versions": versions_used,
        "settings": settings,
        "tables": [
            {"title": t.title, "columns": t.columns, "rows": t.rows, "note": t.note} for t in tables
        ],
        "notes": list(notes),
        "extra": extra or {},
    }
    json_path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"wrote {_rel(str(md_path), '<out>/' + md_path.name)} and {json_path.name}")
    return md_path, json_path


# -- statistics and timing -------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))
    return ordered[k]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def us(seconds: float) -> float:
    return seconds * 1e6


@contextlib.contextmanager
def timer(sink: list[float]) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        sink.append(time.perf_counter() - start)


# -- tokens ----------------------------------------------------------------------------------------


def _tiktoken_cache() -> None:
    """Point tiktoken at the encodings litellm bundles (without importing litellm), so counting
    never reaches the network."""
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return
    bundled = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
    if bundled.is_dir():
        os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled)


class TokenCounter:
    """tiktoken ``cl100k_base`` (what litellm counts with offline for every model) with the
    OpenAI chat formula litellm uses: per message 3 tokens + role + content + name + tool calls,
    plus 3 per prompt. Texts are cached, as the reference LLM service caches them, unless
    ``cached=False`` (every count encodes: the peers' comparison gives every system that)."""

    name = "tiktoken cl100k_base, OpenAI chat formula"

    def __init__(self, *, cached: bool = True) -> None:
        _tiktoken_cache()
        import tiktoken

        self._encoding = tiktoken.get_encoding("cl100k_base")
        self.cached = cached
        self.text = lru_cache(maxsize=65536)(self._text) if cached else self._text

    def _text(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))

    def message(self, m: dict[str, Any]) -> int:
        n = 3 + self.text(str(m.get("role", "")))
        content = m.get("content")
        if isinstance(content, str):
            n += self.text(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    n += self.text(str(part.get("text", "")))
                else:
                    n += 85  # an image or other part, as litellm counts a default image
        if m.get("name"):
            n += 1 + self.text(str(m["name"]))
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            n += self.text(str(fn.get("name", ""))) + self.text(str(fn.get("arguments", "")))
        if m.get("tool_call_id"):
            n += self.text(str(m["tool_call_id"]))
        return n

    def messages(self, items: Iterable[dict[str, Any]]) -> int:
        items = list(items)
        return sum(self.message(m) for m in items) + 3 if items else 0

    def stored(self, m: dict[str, Any]) -> int:
        """What the host stores for one message: ``count_tokens([message])``."""
        return self.message(m) + 3


# -- tool pairs ------------------------------------------------------------------------------------


def tool_pair_violations(prompt: Sequence[dict[str, Any]]) -> int:
    """Orphan tool results plus tool-call groups that lack a result, in an OpenAI-format prompt
    (positional pairing, as chat APIs require)."""
    violations = 0
    i = 0
    while i < len(prompt):
        m = prompt[i]
        if m.get("role") == "assistant" and m.get("tool_calls"):
            end = i + 1
            while end < len(prompt) and prompt[end].get("role") == "tool":
                end += 1
            wanted = sorted(str(c.get("id")) for c in m["tool_calls"])
            got = sorted(str(r.get("tool_call_id")) for r in prompt[i + 1 : end])
            violations += wanted != got
            i = end
        elif m.get("role") == "tool":
            violations += 1
            i += 1
        else:
            i += 1
    return violations


def tool_units(history: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """``(start, end)`` index ranges that must stay together: an assistant message with tool
    calls and the tool results right after it; every other message is a unit of its own."""
    units = []
    i = 0
    while i < len(history):
        end = i + 1
        if history[i].get("role") == "assistant" and history[i].get("tool_calls"):
            while end < len(history) and history[end].get("role") == "tool":
                end += 1
        units.append((i, end))
        i = end
    return units


def sliding_window(
    history: Sequence[dict[str, Any]],
    budget: int,
    fixed_tokens: int,
    tokens: Sequence[int],
    *,
    keep_groups: bool = True,
) -> int:
    """Index of the first history message the sliding-window baseline keeps: the newest messages
    whose tokens fit ``budget - fixed_tokens`` (always at least the newest unit). System messages
    are not in ``history``: they are core memory and always sent. With ``keep_groups`` a tool
    group is kept or dropped whole; without it, the window may start inside one."""
    room = budget - fixed_tokens
    start = len(history)
    total = 0
    if keep_groups:
        for a, b in reversed(tool_units(history)):
            size = sum(tokens[a:b])
            if total + size > room and start < len(history):
                break
            total += size
            start = a
    else:
        for i in range(len(history) - 1, -1, -1):
            if total + tokens[i] > room and start < len(history):
                break
            total += tokens[i]
            start = i
    return start


# -- the real host rig -----------------------------------------------------------------------------


@dataclass
class Rig:
    """A reference host on a real SQLite file, with the plugin loaded from its entry point (or
    no plugin at all), and what the plugin reported."""

    host: Any
    llm: Any
    statuses: list[dict[str, Any]] = field(default_factory=list)
    tmp: Any = None

    @property
    def plugin(self) -> Any:
        return self.host.get_plugin("memory-summary")

    def finals(self, status: str | None = None) -> list[dict[str, Any]]:
        return [
            s
            for s in self.statuses
            if s["status"] in ("done", "error", "skipped")
            and (status is None or s["status"] == status)
        ]

    async def drain(self) -> None:
        """Wait for the plugin's background compressions (the tasks its scheduler holds)."""
        if "memory-summary" not in self.host.plugins:
            return
        while pending := self.plugin.scheduler.pending():
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        await self.host.stop()
        if self.tmp is not None:
            self.tmp.cleanup()


async def make_rig(
    llm: Any,
    plugin_config: dict[str, Any] | None,
    *,
    context_window: int | None = BUDGET,
    reserve_for_reply: int = 0,
    db_dir: Path | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    model: str | None = None,
    memory: str | None = None,
) -> Rig:
    """``plugin_config`` None = a host without the plugin; a dict = the plugin from its entry
    point with that config over its defaults. ``memory``: a store URL instead of the SQLite
    file."""
    from host_stub import signals
    from host_stub.config import HostConfig
    from host_stub.host import Host

    tmp = None
    if db_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-")
        db_dir = Path(tmp.name)
    host_section: dict[str, Any] = {
        "memory": memory or f"sqlite:///{db_dir / 'bench.db'}",
        "system_prompt": system_prompt,
        "reserve_for_reply": reserve_for_reply,
    }
    if context_window:
        host_section["context_window"] = context_window
    if model:
        host_section["model"] = model
    config = HostConfig.model_validate(
        {
            "host": host_section,
            "plugins": {"allow": ["memory-summary"] if plugin_config is not None else []},
            "plugin": {"memory-summary": plugin_config} if plugin_config is not None else {},
        }
    )
    host = Host(config, llm=llm)
    rig = Rig(host=host, llm=llm, tmp=tmp)

    async def on_status(sender: Any, **payload: Any) -> None:
        rig.statuses.append(payload)

    await host.start()
    host.bus.connect(signals.SESSION_COMPRESSING, on_status)
    return rig


def sent_usage(result: Any) -> list[Any]:
    """Per model call of a turn, the usage the prompt actually sent was measured with (the
    ``rebuilt`` one when a hard compression ran before the call)."""
    usage = result.usage
    return [u for i, u in enumerate(usage) if not (i + 1 < len(usage) and usage[i + 1].rebuilt)]


def verbatim_count(prompt: Sequence[dict[str, Any]]) -> int:
    """Conversation messages sent verbatim (system messages, summary included, left out)."""
    return sum(1 for m in prompt if m.get("role") != "system")


# -- text matching for retention -------------------------------------------------------------------

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours ourselves out
    over own same she should so some such than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours yourself yourselves yeah yes oh wow really
    so thanks thank hey hi hello im ive its dont thats youre i'm i've it's don't that's you're
    also got get going just like lot much one really things thing well that's what's""".split()
)

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def content_words(text: str) -> set[str]:
    return {w for w in words(text) if w not in STOPWORDS and len(w) >= 3}


def answer_tokens(text: str) -> set[str]:
    out = {w for w in words(text) if w not in STOPWORDS}
    return out or set(words(text))


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(main: Callable[[], Any]) -> None:
    """Run an async main in a fresh loop."""
    asyncio.run(main())
