"""The demo's output quoted in ``docs/usage.md``, and ``docs/demo-context.svg``, made by a run.

``python -m plugin_memory_summary.extras.demo.docs`` runs, in a temporary folder, the commands
``docs/usage.md`` quotes: ``host-stub demo --db demo.db --plot docs/demo-context.svg``, then the
inspection commands on its store. It rewrites each block between ``<!-- BEGIN DEMO RUN: name
-->`` and ``<!-- END DEMO RUN: name -->`` with what they printed, and the plot; with ``--check``
it changes nothing and exits 1 when the page or the plot is out of date (a test runs it so).

The run is the same on every machine: the demo's seeded conversation, the offline rules engine, a
replay that waits for each compression before the next turn. What is not the same from run to
run is left out of the quotes: the report's ``time`` line (the run's wall time). The final
summary and the ``summary`` command's text are cut after a few lines (``...``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COMMANDS", "DemoRun", "main", "render", "run_demo", "svg_problem"]

#: The page the blocks are in, and the plot, relative to the repository's root.
PAGE = Path("docs/usage.md")
PLOT = Path("docs/demo-context.svg")

#: Lines of the final summary (and of the ``summary`` command's text) quoted before ``...``.
SUMMARY_LINES = 8

#: Block -> the commands whose output it quotes, in the order they run (on the store the first
#: one makes).
COMMANDS: dict[str, list[list[str]]] = {
    "demo-output": [["demo", "--db", "demo.db", "--plot", str(PLOT)]],
    "demo-inspect": [
        ["sessions", "--db", "demo.db"],
        ["summary", "demo", "--db", "demo.db"],
    ],
    "demo-commands": [
        ["compress", "demo", "--db", "demo.db"],
        ["rebuild", "demo", "--db", "demo.db"],
        ["pin", "demo", "the user is allergic to nuts", "--db", "demo.db"],
        ["clear", "demo", "--type", "bogus", "--db", "demo.db"],
        ["clear", "demo", "--db", "demo.db"],
    ],
}

#: Settings by which output that is not a terminal would be taken for one (a progress bar).
_TERMINAL = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS")

_BLOCK = re.compile(
    r"(<!-- BEGIN DEMO RUN: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END DEMO RUN: (?P=name) -->)",
    re.DOTALL,
)


@dataclass(frozen=True)
class DemoRun:
    """What the run printed, block by block (markdown), and the plot it drew."""

    blocks: dict[str, str]
    svg: bytes


def _shown(argv: list[str]) -> str:
    """A command line as a user types it (an argument with a space quoted)."""
    return " ".join(f'"{a}"' if " " in a else a for a in ["host-stub", *argv])


def _cut_summary(lines: list[str], start: int) -> list[str]:
    """``lines`` with the indented summary after ``lines[start]`` cut to
    :data:`SUMMARY_LINES` lines and ``  ...``."""
    end = start + 1
    while end < len(lines) and (not lines[end] or lines[end].startswith("  ")):
        end += 1
    while end > start + 1 and not lines[end - 1]:
        end -= 1  # the blank line before the next part stays after the cut
    body = lines[start + 1 : end]
    if len(body) > SUMMARY_LINES:
        body = [*body[:SUMMARY_LINES], "  ..."]
    return [*lines[: start + 1], *body, *lines[end:]]


def _quoted(argv: list[str], out: str) -> list[str]:
    """What a command printed, as quoted: the wall time left out, long summaries cut."""
    lines = out.rstrip("\n").splitlines()
    if argv[0] == "demo":
        lines = [line for line in lines if not line.startswith("  time ")]
        if "final summary:" in lines:
            lines = _cut_summary(lines, lines.index("final summary:"))
    elif argv[0] == "summary" and len(lines) > 1 + SUMMARY_LINES // 4:
        lines = [*lines[: 1 + SUMMARY_LINES // 4], "..."]
    return lines


@contextlib.contextmanager
def _plain_output() -> Iterator[None]:
    """No setting that would make captured output look like a terminal, for the run."""
    saved = {name: os.environ.pop(name) for name in _TERMINAL if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _run_cli(argv: list[str]) -> tuple[int, str]:
    """``host-stub ARGV`` in this process: its exit code, and what it printed (stdout, then
    stderr)."""
    from host_stub.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue() + err.getvalue()


def run_demo() -> DemoRun:
    """Run :data:`COMMANDS` in a temporary folder; the blocks and the plot they made."""
    blocks: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="host-stub-demo-docs-") as tmp, _plain_output():
        (Path(tmp) / PLOT.parent).mkdir(parents=True)
        with contextlib.chdir(tmp):
            for name, commands in COMMANDS.items():
                lines: list[str] = []
                for argv in commands:
                    code, out = _run_cli(argv)
                    if code not in (0, 2):  # 2: the quoted mistake (clear --type bogus)
                        raise RuntimeError(f"{_shown(argv)} exited with {code}:\n{out}")
                    lines += [f"$ {_shown(argv)}", *_quoted(argv, out)]
                blocks[name] = "```text\n" + "\n".join(lines) + "\n```\n"
            svg = (Path(tmp) / PLOT).read_bytes()
    return DemoRun(blocks, svg)


def render(text: str, blocks: dict[str, str]) -> str:
    """``text`` with every ``DEMO RUN`` block replaced by the run's. Raises ``ValueError`` for a
    block the run did not make, or a marker without its partner."""
    begins = re.findall(r"<!-- BEGIN DEMO RUN: ([\w-]+) -->", text)
    ends = re.findall(r"<!-- END DEMO RUN: ([\w-]+) -->", text)
    if begins != ends:
        raise ValueError(f"unbalanced DEMO RUN markers: begins {begins}, ends {ends}")
    unknown = sorted(set(begins) - set(blocks))
    if unknown:
        raise ValueError(f"unknown DEMO RUN block(s): {', '.join(unknown)}")
    return _BLOCK.sub(lambda m: m.group(1) + blocks[m.group("name")] + m.group(4), text)


def _matplotlib_version(svg: bytes) -> str | None:
    found = re.search(rb"Matplotlib v([\w.]+)", svg)
    return found[1].decode() if found else None


def _figures(svg: bytes) -> tuple[str | None, int, int]:
    """What the plot says, whatever matplotlib drew it: its title, the compression markers and
    the points of the line with the plugin."""
    text = svg.decode("utf-8", "replace")
    title = re.search(r">(demo \(.*?compressions?)</text>", text)
    markers = re.search(r'<g id="compressions">(.*?)</g>', text, re.DOTALL)
    line = re.search(r'<g id="with-plugin">\s*<path d="([^"]*)"', text, re.DOTALL)
    return (
        title[1] if title else None,
        markers[1].count("<use ") if markers else 0,
        len(re.findall(r"[ML]\s*-?[\d.]+\s+-?[\d.]+", line[1])) if line else 0,
    )


def svg_problem(kept: bytes, made: bytes) -> str | None:
    """Why the plot ``kept`` in the docs is not the one the run ``made``, or ``None``. Drawn by
    the same matplotlib, the bytes must be equal; by another, what they show (title, markers,
    points)."""
    if _matplotlib_version(kept) == _matplotlib_version(made):
        return None if kept == made else "the plot differs from the run's"
    a, b = _figures(kept), _figures(made)
    if a != b:
        return f"the plot shows {a}, the run {b} (title, compressions, points)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m plugin_memory_summary.extras.demo.docs",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument(
        "--root", type=Path, default=Path("."), help="the repository (default: this folder)"
    )
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if the docs are out of date"
    )
    args = parser.parse_args(argv)
    page, plot = args.root / PAGE, args.root / PLOT
    try:
        text = page.read_text(encoding="utf-8")
        kept = plot.read_bytes() if plot.exists() else b""
    except OSError as exc:
        print(f"demo docs: error: {exc}", file=sys.stderr)
        return 2
    run = run_demo()
    try:
        rendered = render(text, run.blocks)
    except ValueError as exc:
        print(f"demo docs: error: {page}: {exc}", file=sys.stderr)
        return 2
    stale = []
    if rendered != text:
        stale.append(str(PAGE))
    if not kept or svg_problem(kept, run.svg) is not None:
        stale.append(str(PLOT))
    if not stale:
        return 0
    if args.check:
        print(
            f"demo docs: {' and '.join(stale)} out of date; run: "
            "python -m plugin_memory_summary.extras.demo.docs",
            file=sys.stderr,
        )
        return 1
    page.write_text(rendered, encoding="utf-8")
    plot.write_bytes(run.svg)
    print(f"demo docs: rewrote {' and '.join(stale)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
