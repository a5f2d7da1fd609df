"""bench/model_replay.py against a small OpenAI-compatible server on 127.0.0.1 (quick mode): it
replays LoCoMo messages and the demo with the server as the summarizer and writes its results.
The server answers in prose taken from the transcript it is sent, and every third answer is JSON
debris: the bench must count the compressions that used the answers, group the others' reasons by
kind and find no debris stored."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from datasets import require
from fake_openai import FakeOpenAIServer

ROOT = Path(__file__).resolve().parent.parent

DEBRIS = '},\n {\n "event": "I think they love playing games",\n "when": "8 May"\n'


def digest_of(body: dict[str, Any], counter: itertools.count[int]) -> str:
    """Prose of a summarizer: the first lines of the transcript it was sent, labels left out;
    every third answer is debris."""
    if next(counter) % 3 == 2:
        return DEBRIS
    user = body["messages"][-1]["content"]
    match = re.search(r"<transcript>\n(.*)\n</transcript>", user, re.S)
    lines = match.group(1).splitlines() if match else []
    said = [re.sub(r"^\S*\s*\[[^\]]*\]\s*", "", line).strip() for line in lines]
    said = [s.split(": ", 1)[-1] for s in said if len(s) > 20][:2]
    return " ".join(s.rstrip(".") + "." for s in said) or "The two talked about their week."


def test_model_replay_runs_against_an_openai_compatible_server(tmp_path: Path) -> None:
    require("locomo/locomo_dev.json")
    counter = itertools.count()
    with FakeOpenAIServer(default_reply=lambda body: digest_of(body, counter)) as server:
        done = subprocess.run(
            [
                sys.executable,
                str(ROOT / "bench" / "model_replay.py"),
                "--quick",
                "--api-base",
                server.base_url,
                "--model",
                "openai/fake-model",
                "--api-key",
                "sk-test",
                "--out",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        requests = list(server.requests)
    assert done.returncode == 0, done.stderr[-3000:]
    assert requests, "the summarizer was never called"
    data = json.loads((tmp_path / "model_replay.json").read_text(encoding="utf-8"))
    assert data["command"].startswith("python bench/model_replay.py --quick")
    runs = data["extra"]["runs"]
    model_runs = {k: v for k, v in runs.items() if k.endswith("openai/fake-model")}
    assert len(model_runs) == 2  # LoCoMo and the demo
    calls = sum(r["summarizer_calls"] for r in model_runs.values())
    assert calls == len(requests)
    for name, r in model_runs.items():
        assert r["compressions"] >= 1, name
        assert 0 < r["answers_used"] < r["summarizer_calls"], name  # prose used, debris not
        assert r["model_answer_used"] >= 1, name
        assert r["debris"] == [], name
        assert len(r["latencies_s"]) == r["summarizer_calls"], name
        assert "love playing games" not in r["final_summary"], name
    kinds = [row[1] for row in data["tables"][1]["rows"]]
    assert "rejected: JSON fragments, not prose" in kinds
    md = (tmp_path / "model_replay.md").read_text(encoding="utf-8")
    assert "early facts kept" in md and "latency p50 s" in md
    assert str(tmp_path) not in md
