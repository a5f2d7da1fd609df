"""Budgets exact for every model: the host corrects its watermark with the ratio between the
provider's reported prompt tokens and its own count, per model, bounded and smoothed; a model
nobody knows gets one line naming the setting to add; a server that reports its window is asked."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAIServer

from host_stub import calibration, tokenizer
from host_stub.calibration import Calibration, calibrated_window, next_ratio
from host_stub.config import HostConfig, load_host_config
from host_stub.host import Host
from host_stub.llm import (
    LiteLLMService,
    server_urls,
    window_from_models,
    window_from_props,
)

MODEL = "openai/fake-model"
WINDOW = 8000
RESERVE = 256
#: The fake provider's tokenizer counts this much more than the host's.
SCALE = 1.25


def provider_count(body: dict[str, Any]) -> int:
    """A provider whose tokenizer counts 25% more than ours on every request."""
    counted = tokenizer.count_messages(MODEL, body["messages"]) or 0
    if body.get("tools"):
        counted += tokenizer.count_text(MODEL, json.dumps(body["tools"]))
    return math.ceil(SCALE * counted)


# -- the pure parts -----------------------------------------------------------------------------


def test_first_observation_replaces_the_prior_later_ones_are_smoothed() -> None:
    assert next_ratio(1.0, 0, 1.25) == 1.25
    assert next_ratio(1.25, 1, 1.35) == pytest.approx(1.30)
    assert next_ratio(1.25, 5, 1.25) == 1.25


def test_the_ratio_is_bounded() -> None:
    assert next_ratio(1.0, 0, 9.0) == calibration.MAX_RATIO
    assert next_ratio(1.0, 0, 0.01) == calibration.MIN_RATIO
    assert next_ratio(2.0, 3, 50.0) == calibration.MAX_RATIO


def test_small_prompts_and_missing_usage_are_ignored() -> None:
    cal = Calibration()
    assert cal.observe("m", 10, 20) is None  # the chat template, not the tokenizer
    assert cal.observe("m", 500, 0) is None
    assert cal.ratio("m") == 1.0
    state = cal.observe("m", 400, 500)
    assert state is not None and state.ratio == 1.25 and state.samples == 1
    assert cal.ratio("other") == 1.0
    assert cal.snapshot() == {"m": {"ratio": 1.25, "samples": 1, "last_observed": 1.25}}


def test_calibrated_window() -> None:
    assert calibrated_window(8000, 1.25) == 6400
    assert calibrated_window(8000, 1.0) == 8000


# -- the watermark against a provider that counts 25% more --------------------------------------


async def test_watermark_error_falls_under_3_percent_after_a_few_calls(tmp_path: Path) -> None:
    server = FakeOpenAIServer("Noted, go on.", count_prompt=provider_count)
    with server:
        config = HostConfig.model_validate(
            {
                "host": {
                    "memory": "memory://",
                    "model": MODEL,
                    "api_base": server.base_url,
                    "api_key": "sk-test",
                    "reserve_for_reply": RESERVE,
                    "models": {MODEL: {"context_window": WINDOW}},
                },
                "plugins": {"allow": []},
            }
        )
        async with Host(config) as host:
            errors = []
            for i in range(8):
                text = (
                    f"Day {i}: we walked along the river, ate dumplings and booked RES-{i}. " * 20
                )
                result = await host.run_turn("s", text)
                assert result.outcome == "replied", result.error
                usage = result.usage[-1]
                sent = server.requests[-1]
                truth = (provider_count(sent) + RESERVE) / WINDOW
                errors.append(abs(usage.usage_ratio - truth) / truth)
            report = host.calibration_report()
    # Uncalibrated, the watermark is a fifth low; after a few calls it is within 3%.
    assert errors[0] > 0.1, errors
    assert max(errors[3:]) < 0.03, errors
    assert report["model"] == MODEL and 1.15 < report["ratio"] < 1.35
    assert report["agent_calls"][MODEL]["samples"] == 8


async def test_no_calibration_when_turned_off() -> None:
    server = FakeOpenAIServer("ok", count_prompt=provider_count)
    with server:
        config = HostConfig.model_validate(
            {
                "host": {
                    "memory": "memory://",
                    "model": MODEL,
                    "api_base": server.base_url,
                    "api_key": "sk-test",
                    "calibrate_tokens": False,
                    "models": {MODEL: {"context_window": WINDOW}},
                },
                "plugins": {"allow": []},
            }
        )
        async with Host(config) as host:
            for _ in range(3):
                await host.run_turn("s", "A long enough message to count for calibration. " * 10)
            usage = (await host.build_prompt("s"))[2]
    assert usage.calibration == 1.0 and usage.context_window == WINDOW


async def test_summarizer_calls_calibrate_the_service() -> None:
    """Calls the host does not make (a summarizer's) still teach the service the model's
    ratio, which the host uses until the agent loop's own calls report usage."""
    server = FakeOpenAIServer("A summary.", count_prompt=provider_count)
    with server:
        llm = LiteLLMService(default_model=MODEL, api_base=server.base_url, api_key="sk-test")
        for _ in range(2):
            await llm.complete([{"role": "user", "content": "Summarize the trip so far. " * 20}])
        config = HostConfig.model_validate(
            {"host": {"memory": "memory://", "model": MODEL}, "plugins": {"allow": []}}
        )
        async with Host(config, llm=llm) as host:
            assert host.token_ratio() == pytest.approx(SCALE, rel=0.03)
            assert host.calibration_report()["service_calls"][MODEL]["samples"] == 2


async def test_estimated_usage_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider that reports no usage gives nothing to calibrate with."""
    server = FakeOpenAIServer(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
        }
    )
    with server:
        llm = LiteLLMService(default_model=MODEL, api_base=server.base_url, api_key="sk-test")
        done = await llm.complete([{"role": "user", "content": "Tell me about the trip. " * 20}])
    assert done.usage.estimated
    assert llm.calibration.snapshot() == {}


# -- unknown windows ------------------------------------------------------------------------------


async def test_an_unknown_model_gets_one_line_at_start_naming_the_setting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeOpenAIServer()
    with server:
        config = HostConfig.model_validate(
            {
                "host": {"memory": "memory://", "model": MODEL, "api_base": server.base_url},
                "plugins": {"allow": []},
            }
        )
        with caplog.at_level(logging.WARNING, logger="host_stub"):
            async with Host(config) as host:
                for _ in range(2):
                    await host.build_prompt("s")
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert f'[host.models."{MODEL}"] context_window' in lines[0]
    # The setting it names is the one the host config reads.
    path = tmp_path / "host.toml"
    path.write_text(f'[host.models."{MODEL}"]\ncontext_window = 32768\n')
    assert load_host_config(path).host.models[MODEL].context_window == 32768


@pytest.mark.parametrize(
    ("kwargs", "window"), [({"n_ctx": 16384}, 16384), ({"max_model_len": 24576}, 24576)]
)
async def test_the_window_the_server_reports_is_used(
    kwargs: dict[str, int], window: int, caplog: pytest.LogCaptureFixture
) -> None:
    server = FakeOpenAIServer(**kwargs)
    with server:
        config = HostConfig.model_validate(
            {
                "host": {"memory": "memory://", "model": MODEL, "api_base": server.base_url},
                "plugins": {"allow": []},
            }
        )
        with caplog.at_level(logging.WARNING, logger="host_stub"):
            async with Host(config) as host:
                assert host.context_window() == window
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_server_window_parsing() -> None:
    assert server_urls("http://h:8080/v1") == ("http://h:8080/props", "http://h:8080/v1/models")
    assert server_urls("http://h:8080/") == ("http://h:8080/props", "http://h:8080/models")
    assert window_from_props({"default_generation_settings": {"n_ctx": 4096}}) == 4096
    assert window_from_props({"n_ctx": 2048}) == 2048
    assert window_from_props({"n_ctx": 0}) is None
    assert window_from_props(["x"]) is None
    models = {"data": [{"id": "qwen", "max_model_len": 32768}, {"id": "llama"}]}
    assert window_from_models(models, "hosted_vllm/qwen") == 32768
    assert window_from_models(models, "llama") is None
    assert window_from_models({"data": [{"id": "only", "max_model_len": 8192}]}, "x") == 8192
    assert window_from_models({"data": "nope"}, "x") is None


# -- the replay report --------------------------------------------------------------------------


async def test_the_replay_report_shows_the_calibration() -> None:
    from host_stub.messages import Message
    from plugin_memory_summary.extras.report import render_report, run_replay

    summary = json.dumps({"goal": "plan the trip", "summary": "Lena plans a trip to Kyoto."})
    server = FakeOpenAIServer(summary, count_prompt=provider_count)
    messages = []
    for i in range(14):
        messages.append(Message(role="user", content=f"Question {i} about the Kyoto trip. " * 6))
        messages.append(Message(role="assistant", content=f"Answer {i}: take the train. " * 6))
    with server:
        config = HostConfig.model_validate(
            {
                "host": {
                    "memory": "memory://",
                    "model": MODEL,
                    "api_base": server.base_url,
                    "api_key": "sk-test",
                    "models": {MODEL: {"context_window": WINDOW}},
                },
                "plugins": {"allow": ["memory-summary"]},
                "plugin": {
                    "memory-summary": {"threshold": 8, "keep_recent": 4, "debounce_turns": 1}
                },
            }
        )
        report = await run_replay(config, messages, "trip")
    assert report.with_plugin.compressions, "the summarizer was never called"
    text = render_report(report)
    line = next(li for li in text.splitlines() if li.strip().startswith("token counts"))
    assert f"{MODEL}: the provider counts 1.2" in line and "watermark corrected x1.2" in line
    assert report.to_dict()["calibration"]["service_calls"][MODEL]["samples"] >= 1
