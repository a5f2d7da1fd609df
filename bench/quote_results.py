"""Quote the results files in bench/README.md, so the tables it shows are the ones the scripts
wrote.

``python bench/quote_results.py`` rewrites every block of the README between
``<!-- BEGIN RESULTS: <name> -->`` and ``<!-- END RESULTS: <name> -->`` with
``results/<name>.md`` as it is: its title left out (the README's section has its own heading) and
its headings one level down, under that section. With ``--check`` it changes nothing and exits
1 when a block differs from its file (the tests run it). Run it after a bench writes its results;
the prose around a block is the reader's summary of it and is updated by hand.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

__all__ = ["QuoteError", "main", "quote", "render"]

BENCH = Path(__file__).resolve().parent

BEGIN = re.compile(r"^<!-- BEGIN RESULTS: (?P<name>[\w-]+) -->$", re.M)
END = "<!-- END RESULTS: {name} -->"
ANY_END = re.compile(r"^<!-- END RESULTS: (?P<name>[\w-]+) -->$", re.M)
ANY_MARKER = re.compile(r"^<!-- (?:BEGIN|END) RESULTS: [\w-]+ -->$", re.M)
HEADING = re.compile(r"^(#+) ", re.M)


class QuoteError(ValueError):
    """A marker without its end, or a block naming a results file that does not exist."""


def quote(results: str) -> str:
    """A results file as the README quotes it: without its title (the first line when it is a
    heading, and the blank lines after it), every heading one level down."""
    lines = results.strip("\n").split("\n")
    if lines and lines[0].startswith("#"):
        lines = lines[1:]
        while lines and not lines[0].strip():
            lines = lines[1:]
    return HEADING.sub(r"#\1 ", "\n".join(lines))


def render(readme: str, results_dir: Path, *, where: str = "README") -> str:
    """``readme`` with every marked block replaced by its results file, quoted. Raises
    :class:`QuoteError` (naming ``where`` and the line) for a marker without its pair or a block
    whose file does not exist."""

    def line(at: int) -> int:
        return readme.count("\n", 0, at) + 1

    out: list[str] = []
    pos = scan = 0  # copied up to pos (an END marker is copied); looked at up to scan
    while True:
        begin = BEGIN.search(readme, scan)
        stray = ANY_END.search(readme, scan, begin.start() if begin else len(readme))
        if stray is not None:
            raise QuoteError(
                f"{where}:{line(stray.start())}: 'END RESULTS: {stray.group('name')}' "
                "has no BEGIN marker"
            )
        if begin is None:
            out.append(readme[pos:])
            return "".join(out)
        name = begin.group("name")
        end = readme.find(END.format(name=name), begin.end())
        if end < 0 or ANY_MARKER.search(readme, begin.end(), end) is not None:
            raise QuoteError(
                f"{where}:{line(begin.start())}: 'BEGIN RESULTS: {name}' has no END marker "
                "before the next marker"
            )
        path = results_dir / f"{name}.md"
        if not path.is_file():
            raise QuoteError(
                f"{where}:{line(begin.start())}: results file {path.name} does not exist "
                f"in {results_dir}"
            )
        out.append(readme[pos : begin.end()])
        out.append("\n" + quote(path.read_text(encoding="utf-8")) + "\n")
        pos, scan = end, end + len(END.format(name=name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when out of date")
    p.add_argument("--readme", type=Path, default=BENCH / "README.md")
    p.add_argument("--results", type=Path, default=BENCH / "results")
    args = p.parse_args(argv)
    try:
        text = args.readme.read_text(encoding="utf-8")
        new = render(text, args.results, where=str(args.readme))
    except (OSError, QuoteError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if new == text:
        return 0
    if args.check:
        print(f"{args.readme}: out of date; run python bench/quote_results.py", file=sys.stderr)
        return 1
    args.readme.write_text(new, encoding="utf-8")
    print(f"{args.readme}: updated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
