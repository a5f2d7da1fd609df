"""Issue 33, point 6: the server's reported token counts never let a prompt pass the window.

A server that always reports ``prompt_tokens=100`` (whatever it was sent) used to drive the
calibration ratio to its 0.5 floor: the host then took the window for twice its size and prompts
reached 6,931 tokens against 4,000. A report far from the host's own count is not believed (one
warning), and a ratio under 1 never widens the window: by the host's own tokenizer, no prompt
sent is over the window.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from fake_openai import FakeOpenAIServer
from faults import summary_from_messages

from host_stub import tokenizer
from host_stub.calibration import Calibration
from host_stub.config import HostConfig
from host_stub.host import Host
from host_stub.messages import Message

MODEL = "openai/fake-model"
WINDOW = 4000
RESERVE = 256


def constant_report(body: Any) -> int:
    """A server whose usage says 100 prompt tokens, whatever the prompt."""
    return 100


def reply(body: Any) -> str:
    """The summarizer gets a JSON digest of its transcript, a chat call a short answer."""
    return summary_from_messages(body.get("messages", []) if isinstance(body, dict) else [])


def turn(i: int) -> tuple[str, list[Message]]:
    user = (
        f"Day {i}: we walked along the river in Kyoto, ate dumplings near the station and "
        f"booked table RES-{1000 + i} for two at seven; remind me about the umbrella. "
    ) * 2
    answer = (
        f"Noted for day {i}: RES-{1000 + i} is booked at seven; take the umbrella, it will "
        "rain after five, and the river walk is best before the crowds arrive. "
    ) * 2
    return user, [Message(role="assistant", content=answer)]


def config(server: FakeOpenAIServer) -> HostConfig:
    return HostConfig.model_validate(
        {
            "host": {
                "memory": "memory://",
                "model": MODEL,
                "api_base": server.base_url,
                "api_key": "sk-test",
                "context_window": WINDOW,
                "reserve_for_reply": RESERVE,
            },
            "plugins": {"allow": ["memory-summary"]},
            "plugin": {"memory-summary": {"summary_timeout_s": 30}},
        }
    )


def prompt_tokens(host: Host, prompt: list[dict[str, Any]]) -> int:
    """The prompt as the host's own tokenizer counts it (tool definitions included)."""
    counted = tokenizer.count_messages(MODEL, prompt) or 0
    defs = host.tools.definitions()
    return counted + (host.count_text(json.dumps(defs)) if defs else 0)


@pytest.mark.parametrize("mode", ["replay", "model"])
async def test_point6_constant_prompt_tokens_never_let_a_prompt_pass_the_window(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Replayed turns (the summarizer's calls report usage) and model turns (the agent loop's
    calls do too), through the real host and a 4,000-token window: 0 prompts over it."""
    server = FakeOpenAIServer(reply, count_prompt=constant_report)
    over: list[int] = []
    sizes: list[int] = []
    turns = 70 if mode == "replay" else 45
    with server, caplog.at_level(logging.WARNING, logger="host_stub"):
        async with Host(config(server)) as host:
            for i in range(turns):
                user, recorded = turn(i)
                result = await host.run_turn(
                    "s", user, recorded=recorded if mode == "replay" else None
                )
                assert result.outcome == "replied", result.error
                for prompt in result.sent:
                    n = prompt_tokens(host, prompt)
                    sizes.append(n)
                    if n + RESERVE > WINDOW:
                        over.append(n)
                await host.settle(30)
            report = host.calibration_report()
    assert max(sizes) > WINDOW * 0.6, max(sizes)  # the window was filled: compressions ran
    assert not over, f"{len(over)} of {len(sizes)} prompts over the window, up to {max(over)}"
    assert report["ratio"] >= 1.0, report
    warnings = [r.getMessage() for r in caplog.records if "implausible" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert MODEL in warnings[0] and "prompt_tokens" in warnings[0]


def test_point6_implausible_reports_are_ignored_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cal = Calibration()
    with caplog.at_level(logging.WARNING, logger="host_stub"):
        assert cal.observe("m", 2000, 100) is None  # 0.05: not the same prompt
        assert cal.observe("m", 900, 100) is None
        assert cal.observe("m", 400, 4000) is None  # 10x
    assert cal.ratio("m") == 1.0 and cal.get("m") is None
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    state = cal.observe("m", 400, 500)  # 1.25: a tokenizer that counts more
    assert state is not None and state.ratio == 1.25
    assert cal.observe("m", 1000, 100) is None  # still ignored, and not said again
    assert cal.ratio("m") == 1.25
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


async def test_point6_a_provider_counting_fewer_tokens_never_widens_the_window() -> None:
    """A plausible ratio under 1 (a tokenizer that counts 20% fewer) is kept in the report, but
    the window the plugin fills is never more than the configured one in the host's tokens."""

    def fewer(body: Any) -> int:
        counted = tokenizer.count_messages(MODEL, body["messages"]) or 0
        if body.get("tools"):
            counted += tokenizer.count_text(MODEL, json.dumps(body["tools"]))
        return int(0.8 * counted)

    server = FakeOpenAIServer("Noted.", count_prompt=fewer)
    with server:
        async with Host(config(server)) as host:
            for i in range(4):
                await host.run_turn("s", turn(i)[0])
            usage = (await host.build_prompt("s"))[2]
            report = host.calibration_report()
    assert report["agent_calls"][MODEL]["ratio"] < 0.9
    assert usage.context_window == WINDOW and usage.calibration == 1.0
    assert usage.breakdown.reserved_for_reply == RESERVE
