"""``host-stub chat`` end to end, as a person uses it: in a pseudo-terminal, against the local
OpenAI-compatible server (streaming replies), with the plugin summarizing through the same model.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAIServer, Reply

from host_stub.cli import main

SCRIPT = Path(sys.executable).parent / "host-stub"
WAIT_S = 60.0

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")

#: Says only what the chat said (a grounding check drops an answer's invented claims). Its
#: goal, shown as the summary's goal, tells that the model's answer was used.
SUMMARY = "The user has a tomato plant called Rosa."
GOAL = "talk about the tomato plant Rosa"


def _reply(body: dict[str, Any]) -> Any:
    """Chat turns stream; the summarizer's call does not: it gets a structured summary."""
    if body.get("stream"):
        last = body["messages"][-1]["content"]
        return Reply.text(f"Echo: {last}. Tell me more.")
    return json.dumps(
        {
            "summary": SUMMARY,
            "conversation_goal": GOAL,
            "stable_facts": ["the tomato plant is called Rosa"],
            "identifiers": [],
        }
    )


class Terminal:
    """A child process on a pseudo-terminal: type lines, wait for text, with timeouts."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            close_fds=True,
            start_new_session=True,
        )
        os.close(slave)
        self.text = ""
        self.pos = 0  # what expect() has consumed

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        if not data:
            return False
        self.text += data.decode("utf-8", "replace")
        return True

    def expect(self, pattern: str, timeout: float = WAIT_S) -> str:
        """Wait for ``pattern`` after what was already consumed; return the text up to it."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.text.find(pattern, self.pos)
            if found >= 0:
                chunk = self.text[self.pos : found + len(pattern)]
                self.pos = found + len(pattern)
                return chunk
            left = deadline - time.monotonic()
            if left <= 0 or (not self._read(min(left, 0.5)) and self.proc.poll() is not None):
                if self.proc.poll() is not None:
                    self._read(0.1)
                    if self.text.find(pattern, self.pos) >= 0:
                        continue
                raise AssertionError(
                    f"no {pattern!r} within {timeout:.0f}s; terminal so far:\n{self.text[-3000:]}"
                )

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\r")

    def drain(self, timeout: float = WAIT_S) -> int:
        """Read until the child exits; return its exit code."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        while self._read(0.1):
            pass
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.master)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(default_reply=_reply) as s:
        yield s


def _config(tmp_path: Path, **plugin: Any) -> Path:
    path = tmp_path / "chat.toml"
    lines = [
        "[host]",
        "context_window = 8000",
        "",
        '[host.models."openai/fake-model"]',
        "context_window = 8000",
        "max_output_tokens = 1024",
        "",
        "[plugin.memory-summary]",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in plugin.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_chat_in_a_terminal_streams_summarizes_and_clears(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    # Compress after 8 messages (4 turns), keep the newest 2: the summary takes over quickly.
    config = _config(tmp_path, threshold=8, keep_recent=2, debounce_turns=1)
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", "COLUMNS": "120"}
    term = Terminal(
        [
            str(SCRIPT),
            "chat",
            "--model",
            "openai/fake-model",
            "--api-base",
            server.base_url,
            "--db",
            str(tmp_path / "chat.db"),
            "--config",
            str(config),
        ],
        env,
    )
    try:
        term.expect("chatting with openai/fake-model")
        term.expect("you> ")
        term.send("My tomato plant is called Rosa")
        shown = term.expect("you> ")
        assert "assistant> Echo: My tomato plant is called Rosa. Tell me more." in shown
        assert "no summary yet" in shown  # the status line after the reply
        term.send("/summary")
        assert "(no summary yet)" in term.expect("you> ")

        term.send("She lives on the balcony")
        term.expect("you> ")
        term.send("/compress")
        shown = term.expect("you> ")
        assert "[memory: 2 messages summarized, tokens " in shown, shown
        term.send("/summary")
        assert f"Goal: {GOAL}" in term.expect("you> ")
        # The summarized messages are archived, and /search still finds them.
        term.send("/search tomato Rosa")
        shown = term.expect("you> ")
        assert "#1 user, archived, " in shown and "My tomato plant is called Rosa" in shown, shown
        term.send("/search")
        assert "usage: /search QUERY" in term.expect("you> ")

        # The chat grows: the summary is part of every prompt now, and a compression after a
        # turn (threshold 8) runs in the background and is announced.
        for text in (
            "I water her every morning",
            "Tomatoes need sun",
            "And some patience",
            "Rosa has six tomatoes now",
        ):
            term.send(text)
            shown = term.expect("you> ")
            assert f"Echo: {text}." in shown
            assert "+ summary" in shown, shown  # the status line: messages + summary tokens
        assert "[memory: 6 messages summarized" in term.text, term.text[-3000:]
        term.send("/summary")
        term.expect("you> ")
        term.send("/clear")
        assert "[cleared" in term.expect("you> ")
        term.send("/search Rosa")
        assert "(nothing found for 'Rosa')" in term.expect("you> ")
        term.send("/summary")
        assert "(no summary yet)" in term.expect("you> ")
        term.send("/quit")
        assert term.drain() == 0
    finally:
        term.close()
    assert "Traceback" not in term.text
    chat_calls = [b for b in server.requests if b.get("stream")]
    summarizer_calls = [b for b in server.requests if not b.get("stream")]
    assert len(chat_calls) == 6 and summarizer_calls
    # After /compress the model gets the summary, not the summarized messages.
    later = chat_calls[2]["messages"]
    assert any(GOAL in str(m["content"]) for m in later if m["role"] == "system")
    assert not any(m["content"] == "My tomato plant is called Rosa" for m in later)


@pytest.mark.slow
def test_chat_ends_with_one_line_when_the_first_call_fails(
    server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.enqueue(Reply.error(401, "Incorrect API key provided", type="invalid_request_error"))
    env = {**os.environ, "OPENAI_API_KEY": "sk-wrong"}
    db = tmp_path / "chat.db"
    proc = subprocess.run(
        [
            str(SCRIPT),
            "chat",
            "--model",
            "openai/fake-model",
            "--api-base",
            server.base_url,
            "--db",
            str(db),
        ],
        input="hello\nnever read\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    *warnings, last = proc.stderr.strip().splitlines()
    assert last == (
        "host-stub: error: openai/fake-model: AuthenticationError: OpenAIException - "
        "Incorrect API key provided"
    )
    assert all(w.startswith("WARNING ") for w in warnings), proc.stderr  # "model not known"
    assert "Traceback" not in proc.stderr
    # What the user typed is kept.
    assert main(["sessions", "--json", "--db", str(db)]) == 0
    assert json.loads(capsys.readouterr().out)[0]["active"] == 1


def test_p19_chat_edits_lines_recalls_history_helps_and_says_it_resumes(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """Up recalls the line typed before (readline), ``/help`` lists the commands, and a chat on
    a stored session says it resumes and with how many messages."""
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", "COLUMNS": "120", "TERM": "xterm"}
    argv = [
        str(SCRIPT),
        "chat",
        "--model",
        "openai/fake-model",
        "--api-base",
        server.base_url,
        "--db",
        str(tmp_path / "chat.db"),
        "--config",
        str(_config(tmp_path)),
    ]
    term = Terminal(argv, env)
    try:
        shown = term.expect("you> ")
        assert "resuming" not in shown
        term.send("My tomato plant is called Rosa")
        term.expect("you> ")
        term.send("\x1b[A")  # Up, then Enter: the line before, sent again
        shown = term.expect("you> ")
        assert "Echo: My tomato plant is called Rosa." in shown, shown
        term.send("Rosa six tomatoes" + "\x1b[D" * 12 + "has ")  # Left 12 times, insert
        shown = term.expect("you> ")
        assert "Echo: Rosa has six tomatoes." in shown, shown
        term.send("/help")
        shown = term.expect("you> ")
        for command in ("/summary", "/compress", "/clear", "/help", "/quit"):
            assert command in shown, shown
        term.send("/quit")
        assert term.drain() == 0
    finally:
        term.close()
    chat_calls = [b for b in server.requests if b.get("stream")]
    assert [c["messages"][-1]["content"] for c in chat_calls] == [
        "My tomato plant is called Rosa",
        "My tomato plant is called Rosa",
        "Rosa has six tomatoes",
    ]
    term = Terminal(argv, env)
    try:
        shown = term.expect("you> ")
        assert "resuming session 'chat' with 6 messages (6 active); /clear starts it afresh" in (
            shown
        ), shown
        term.send("/quit")
        assert term.drain() == 0
    finally:
        term.close()
    assert "Traceback" not in term.text
