"""bench/README.md quotes the results files whole (``bench/quote_results.py``): a quoted table
that differs from the file its script wrote fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_modules import BENCH, load_bench

quotes = load_bench("quote_results")

RESULTS = """## Token economy

Command: `python bench/token_economy.py`
Runtime: 1.0 s

### Per conversation

| a | b |
|---|---|
| 1 | 2 |

- a note
"""


def results_dir(tmp_path: Path, **files: str) -> Path:
    out = tmp_path / "results"
    out.mkdir()
    for name, text in files.items():
        (out / f"{name}.md").write_text(text, encoding="utf-8")
    return out


def test_the_bench_readme_quotes_every_results_file_as_it_is() -> None:
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    names = quotes.BEGIN.findall(readme)
    # The sections that show a run's tables: each quotes its file.
    assert {"overhead", "overhead_flatness", "startup", "token_economy", "retention"} <= set(names)
    assert {"peers", "scale", "model_replay"} <= set(names)
    assert quotes.render(readme, BENCH / "results") == readme, (
        "bench/README.md differs from bench/results: run python bench/quote_results.py"
    )


def test_a_quote_drops_the_title_and_moves_headings_one_level_down() -> None:
    out = quotes.quote(RESULTS)
    assert out.startswith("Command: `python bench/token_economy.py`\n")
    assert "#### Per conversation\n" in out and "## Token economy" not in out
    assert out.endswith("- a note")


def test_render_replaces_only_the_marked_blocks(tmp_path: Path) -> None:
    results = results_dir(tmp_path, token_economy=RESULTS)
    text = (
        "## Token economy\n\nReading: prose.\n\n"
        "<!-- BEGIN RESULTS: token_economy -->\nstale | 9 |\n<!-- END RESULTS: token_economy -->\n"
        "\nAfter.\n"
    )
    out = quotes.render(text, results)
    assert out.startswith(
        "## Token economy\n\nReading: prose.\n\n<!-- BEGIN RESULTS: token_economy -->\n"
    )
    assert "stale" not in out and "| 1 | 2 |" in out
    assert out.endswith("- a note\n<!-- END RESULTS: token_economy -->\n\nAfter.\n")
    assert quotes.render(out, results) == out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "x\n<!-- BEGIN RESULTS: token_economy -->\nold\n",
            r"README:2: 'BEGIN RESULTS: token_economy' has no END",
        ),
        (
            "<!-- END RESULTS: token_economy -->\n",
            r"README:1: 'END RESULTS: token_economy' has no BEGIN",
        ),
        (
            "<!-- BEGIN RESULTS: token_economy -->\n<!-- END RESULTS: other -->\n"
            "<!-- END RESULTS: token_economy -->\n",
            r"README:1: 'BEGIN RESULTS: token_economy' has no END marker before the next",
        ),
        (
            "<!-- BEGIN RESULTS: missing -->\n<!-- END RESULTS: missing -->\n",
            r"README:1: results file missing.md does not exist",
        ),
    ],
)
def test_a_broken_marker_or_a_missing_file_names_its_line(
    tmp_path: Path, text: str, message: str
) -> None:
    results = results_dir(tmp_path, token_economy=RESULTS)
    with pytest.raises(quotes.QuoteError, match=message):
        quotes.render(text, results)


def test_check_exits_1_when_out_of_date_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = results_dir(tmp_path, token_economy=RESULTS)
    readme = tmp_path / "README.md"
    stale = "<!-- BEGIN RESULTS: token_economy -->\nold\n<!-- END RESULTS: token_economy -->\n"
    readme.write_text(stale, encoding="utf-8")
    args = ["--readme", str(readme), "--results", str(results)]
    assert quotes.main([*args, "--check"]) == 1
    assert readme.read_text(encoding="utf-8") == stale
    assert "out of date" in capsys.readouterr().err
    assert quotes.main(args) == 0
    assert "| 1 | 2 |" in readme.read_text(encoding="utf-8")
    assert quotes.main([*args, "--check"]) == 0


def test_a_broken_marker_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("<!-- BEGIN RESULTS: nothing -->\n", encoding="utf-8")
    assert quotes.main(["--readme", str(readme), "--results", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {readme}:1:")


def test_a_missing_readme_is_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.md"
    assert quotes.main(["--readme", str(missing), "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.md" in err
