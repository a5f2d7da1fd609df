"""Issue 33, point 7: a slow summarizer does not get a pile of calls.

A call given up on (its timeout passed) is still being served: the server does not know the
client left. It counts as occupying the server until it would plausibly have finished, on every
path (background and blocking compressions, every session of the process), so at most one
abandoned call per model is outstanding: new calls wait for it, or the rules engine does their
work. A run gives up on the model after its first timeout, so a compression ends within about
twice ``summary_timeout_s`` (a blocking one within ``hard_deadline_s``).

The server (``tests/fake_openai.py``) works on every summarizer request for 2.5 times the
client's timeout and counts the requests it is serving. Nothing here sleeps to order events.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fake_openai import FakeOpenAIServer, Reply
from faults import summary_from_messages

from host_stub import signals
from host_stub.config import HostConfig
from host_stub.host import Host
from host_stub.messages import Message

MODEL = "openai/fake-model"
TIMEOUT = 0.4
#: What the server takes for each request: far past the client's timeout.
HOLD = 4 * TIMEOUT
DEADLINE = 2 * TIMEOUT
#: Time for the work around the calls (the rules engine, the store) on a busy machine.
SLACK = 0.8


def slow_reply(body: Any) -> Reply:
    messages = body.get("messages", []) if isinstance(body, dict) else []
    return Reply.slow(summary_from_messages(messages), HOLD)


def turn(session: str, i: int) -> tuple[str, list[Message]]:
    user = (
        f"{session} day {i}: we walked along the river, ate dumplings near the station and "
        f"booked table RES-{1000 + i} for two at seven; remind me about the umbrella. "
    ) * 2
    answer = (
        f"Noted for day {i}: RES-{1000 + i} is booked at seven; take the umbrella, it will "
        "rain after five, and the river walk is best before the crowds arrive. "
    ) * 2
    return user, [Message(role="assistant", content=answer)]


def host_config(server: FakeOpenAIServer) -> HostConfig:
    return HostConfig.model_validate(
        {
            "host": {
                "memory": "memory://",
                "model": MODEL,
                "api_base": server.base_url,
                "api_key": "sk-test",
                "context_window": 6000,
                "reserve_for_reply": 0,
            },
            "plugins": {"allow": ["memory-summary"]},
            "plugin": {
                "memory-summary": {
                    "summary_timeout_s": TIMEOUT,
                    "hard_deadline_s": DEADLINE,
                    "auto_compress_threshold": 0.7,
                    "hard_compress_threshold": 0.95,
                    "fallback": "rules",
                    "recall_tokens": 0,
                }
            },
        }
    )


async def test_point7_a_slow_summarizer_gets_no_pile_of_calls() -> None:
    server = FakeOpenAIServer(slow_reply)
    started: dict[str, float] = {}
    finals: list[dict[str, Any]] = []

    async def on_compressing(sender: Any, **payload: Any) -> None:
        rid = payload["request_id"]
        if payload["status"] == "start":
            started[rid] = time.monotonic()
        else:
            finals.append({**payload, "wall": time.monotonic() - started.pop(rid)})

    with server:
        host = Host(host_config(server))
        host.bus.connect(signals.SESSION_COMPRESSING, on_compressing)
        async with host:
            # litellm's first call sets itself up for seconds: not part of what is measured.
            server.enqueue("ok")
            await host.llm.complete([{"role": "user", "content": "hello"}], timeout=30)

            async def chat(session: str) -> None:
                for i in range(60):
                    user, recorded = turn(session, i)
                    result = await host.run_turn(session, user, recorded=recorded)
                    assert result.outcome == "replied", result.error

            await asyncio.gather(chat("a"), chat("b"))
            assert await host.settle(30)
    assert not server.errors, server.errors
    ran = [f for f in finals if f["stats"].get("llm_calls")]
    assert ran, finals  # the summarizer was called
    assert any(f["stats"].get("trigger") == "hard" for f in finals), finals
    # At the server: at most one call given up on and one being waited for.
    assert server.peak_in_flight <= 2, server.spans
    # Every compression within about twice the timeout (a blocking one within its deadline).
    for f in finals:
        assert f["wall"] <= 2 * TIMEOUT + SLACK, f
        assert f["stats"].get("llm_calls", 0) <= 1, f  # no second call after a timeout


async def test_point7_a_call_cut_by_a_deadline_keeps_the_server_busy_for_every_session() -> None:
    """The blocking path: a compression with a deadline shorter than the summarizer's timeout
    gives its call up at the deadline; the server still works on it, so the next sessions'
    compressions do not pile theirs up behind it (the rules engine does their work) and each one
    meets its deadline. Before, each of the four sent its call: four at once at the server."""
    server = FakeOpenAIServer(lambda body: Reply.slow(summary_from_messages([]), 3.0))
    deadline = 0.3
    with server:
        config = host_config(server)
        config.plugin["memory-summary"].update(
            {"summary_timeout_s": 1.0, "auto_compress_threshold": 0, "hard_compress_threshold": 0}
        )
        async with Host(config) as host:
            server.enqueue("ok")
            await host.llm.complete([{"role": "user", "content": "hello"}], timeout=30)
            plugin = host.get_plugin("memory-summary")
            sessions = [f"s{n}" for n in range(4)]
            for session in sessions:
                for i in range(6):
                    user, recorded = turn(session, i)
                    await host.run_turn(session, user, recorded=recorded)
            finals = []
            for session in sessions:
                started = time.monotonic()
                final = await plugin.request(session, "manual", deadline_s=deadline)
                finals.append((final, time.monotonic() - started))
            assert await host.settle(30)
    assert server.peak_in_flight <= 2, server.spans
    calls = [f["stats"]["llm_calls"] for f, _ in finals]
    assert calls[0] == 1 and sum(calls) <= 2, finals
    assert len(server.requests) == 1 + sum(calls)  # and the warm-up
    for final, wall in finals:
        assert final["status"] in ("done", "error"), final
        assert final["stats"]["messages_summarized"] > 0, final
        assert wall <= deadline + SLACK, (final, wall)
