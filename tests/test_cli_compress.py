"""Issue 33, point 16: ``host-stub compress SESSION`` compresses until the session's prompt fits
the target a compression aims at (``fill_target`` of the window), in bounded runs, or says how
much is left over it and why (exit code 1).

The sessions are built through the host, as a user would: a conversation replayed with the
plugin off, then compressed by the command with the rules engine (no model)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from host_stub.cli import main
from plugin_memory_summary.base import MemorySummaryConfig

#: Words for messages the rules engine can summarize (sentences, not one repeated token).
WORDS = (
    "Lena asked about the ryokan in Kyoto and the train from Tokyo, the budget for food, "
    "the museum tickets, a rainy day plan, the hotel breakfast and the airport bus"
).split()

WINDOW = 4000
#: Each run folds one batch of at most this many transcript tokens: a long session needs several.
BATCH = 700


def sentence(i: int, words: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words)) + f" (note {i})."


def long_conversation(turns: int, words: int = 60) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(1, turns + 1):
        out.append({"role": "user", "content": f"Question {i}: {sentence(i, words)}"})
        out.append({"role": "assistant", "content": f"Answer {i}: {sentence(i + 3, words)}"})
    return out


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output is not a terminal unless a test says so (CI may set FORCE_COLOR)."""
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    monkeypatch.delenv("FORCE_COLOR", raising=False)


def configs(tmp_path: Path, extra: str = "") -> tuple[Path, Path]:
    """The config the replay runs with (the plugin off: nothing compressed yet) and the one
    ``compress`` runs with (the plugin's defaults but one batch per run)."""
    host = f"[host]\ncontext_window = {WINDOW}\nreserve_for_reply = 256\n\n"
    replay = tmp_path / "replay.toml"
    replay.write_text(host + '[plugin.memory-summary]\nstrategy = "off"\n')
    compress = tmp_path / "compress.toml"
    compress.write_text(
        host + f"[plugin.memory-summary]\nmax_batches_per_run = 1\nbatch_tokens = {BATCH}\n{extra}"
    )
    return replay, compress


def replayed(
    tmp_path: Path, messages: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> tuple[Path, Path]:
    """A store holding session 'long' (``messages`` replayed, nothing compressed) and the
    config to compress it with."""
    tmp_path.mkdir(exist_ok=True)
    replay, compress = configs(tmp_path)
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(m) + "\n" for m in messages), encoding="utf-8")
    db = tmp_path / "m.db"
    code, out, err = run(
        ["replay", str(path), "--db", str(db), "--config", str(replay), "--baseline", "off"],
        capsys,
    )
    assert code == 0, err
    assert "0 compressions" in out, out
    return db, compress


def target() -> int:
    """The prompt tokens a compression aims under: ``fill_target`` of the window."""
    return int(MemorySummaryConfig().fill_target * WINDOW)


def test_p16_compress_runs_until_the_session_is_under_the_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, config = replayed(tmp_path, long_conversation(40), capsys)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # a terminal: one progress line per run
    code, out, err = run(["compress", "long", "--db", str(db), "--config", str(config)], capsys)
    assert code == 0, err
    progress = [line for line in err.splitlines() if line.startswith("run ")]
    assert len(progress) >= 3, err  # one run folds one batch: it took several
    for number, line in enumerate(progress, 1):
        assert re.match(
            rf"run {number}: done: manual \(\d+ messages summarized, tokens [\d,]+ -> ", line
        )
        assert re.search(r"; prompt [\d,]+ tokens, ([\d,]+ over|under) the target", line), line
    assert "under the target" in progress[-1] and "over the target" in progress[0]
    line = out.strip()
    assert "\n" not in line, out
    found = re.fullmatch(
        r"done: manual \((\d+) messages summarized in (\d+) runs, tokens ([\d,]+) -> ([\d,]+)\); "
        r"prompt ([\d,]+) tokens, under the target of ([\d,]+) \(75% of the 4,000-token window\)",
        line,
    )
    assert found, line
    summarized, runs, _, _, prompt, aim = (int(g.replace(",", "")) for g in found.groups())
    assert runs == len(progress) and summarized > 40 and prompt <= aim == target()

    # --json: the same facts.
    db, config = replayed(tmp_path / "again", long_conversation(40), capsys)
    code, out, err = run(
        ["compress", "long", "--json", "--db", str(db), "--config", str(config)], capsys
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["status"] == "done" and data["reached"] is True and data["stopped"] is None
    assert data["target"] == {"tokens": target(), "share": 0.75, "context_window": WINDOW}
    assert len(data["runs"]) == runs and data["stats"]["messages_summarized"] == summarized
    assert [r["status"] for r in data["runs"]] == ["done"] * runs
    assert data["prompt_tokens"] == data["runs"][-1]["prompt_tokens"] <= target()
    assert data["over_target"] == 0
    assert data["prompt_tokens_before"] > target()


def test_p16_compress_says_how_much_is_left_when_it_cannot_get_under(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The newest exchange alone is over the target (one huge message): the command archives
    what it can, then stops, saying how many tokens are left over the target and why; exit 1."""
    messages = long_conversation(6)
    messages.append({"role": "user", "content": "Please read this: " + sentence(99, 3000)})
    messages.append({"role": "assistant", "content": "Read it."})
    db, config = replayed(tmp_path, messages, capsys)
    code, out, err = run(["compress", "long", "--db", str(db), "--config", str(config)], capsys)
    assert code == 1, (out, err)
    assert err == ""  # not a terminal: no progress lines, and no error line either
    line = out.strip()
    found = re.fullmatch(
        r"done: manual \((\d+) messages summarized in (\d+) runs?, tokens [\d,]+ -> [\d,]+\); "
        r"prompt ([\d,]+) tokens, still ([\d,]+) over the target of ([\d,]+) \(75% of the "
        r"4,000-token window\): stopped: (.+)",
        line,
    )
    assert found, line
    prompt, over, aim = (int(found[i].replace(",", "")) for i in (3, 4, 5))
    assert aim == target() and over == prompt - aim > 0
    assert found[6] == "nothing to compress (2 active messages)", line

    code, out, err = run(
        ["compress", "long", "--json", "--db", str(db), "--config", str(config)], capsys
    )
    assert code == 1, err
    data = json.loads(out)
    assert data["reached"] is False and data["over_target"] == data["prompt_tokens"] - target()
    assert data["stopped"] == "nothing to compress (2 active messages)"
    assert [r["status"] for r in data["runs"]] == ["skipped"]


def test_p16_max_runs_bounds_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, config = replayed(tmp_path, long_conversation(40), capsys)
    code, out, err = run(
        ["compress", "long", "--max-runs", "1", "--db", str(db), "--config", str(config)], capsys
    )
    assert code == 1, err
    assert re.fullmatch(
        r"done: manual \(\d+ messages summarized in 1 run, tokens [\d,]+ -> [\d,]+\); prompt "
        r"[\d,]+ tokens, still [\d,]+ over the target of 3,000 \(75% of the 4,000-token window\): "
        r"stopped: --max-runs 1 reached \(run it again to go on\)",
        out.strip(),
    ), out
    code, out, err = run(
        ["compress", "long", "--max-runs", "0", "--db", str(db), "--config", str(config)], capsys
    )
    assert code == 2 and err.strip().startswith("host-stub: error:") and "--max-runs" in err


def test_p16_a_session_under_the_target_gets_one_run_and_the_line_of_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, config = replayed(tmp_path, long_conversation(3, words=10), capsys)
    code, out, err = run(["compress", "long", "--db", str(db), "--config", str(config)], capsys)
    assert code == 0, err
    assert re.fullmatch(
        r"done: manual \(4 messages summarized, tokens [\d,]+ -> [\d,]+\)", out.strip()
    ), out
    code, out, err = run(["compress", "long", "--db", str(db), "--config", str(config)], capsys)
    assert (code, out.strip()) == (0, "skipped: nothing to compress (2 active messages)"), err
