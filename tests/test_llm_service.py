"""LiteLLMService against litellm's real HTTP code path, talking to a scripted fake server."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAIServer, Reply
from pydantic import ValidationError

from host_stub.llm import LiteLLMService, ModelOverride, ensure_litellm
from host_stub.messages import Message, ToolCall, ToolCallFunction
from host_stub.services import Completion, LLMService

MODEL = "openai/fake-model"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def litellm() -> Any:
    return ensure_litellm()


@pytest.fixture
def service(fake_openai: FakeOpenAIServer, litellm: Any) -> LiteLLMService:
    return LiteLLMService(
        default_model=MODEL, api_base=fake_openai.base_url, api_key="sk-test", timeout=5
    )


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Any socket connect fails (and is recorded)."""
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError(f"network blocked in this test: {address!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


# -- plain completions ---------------------------------------------------------------------------


async def test_complete_sends_the_request_and_returns_a_completion(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.enqueue(
        Reply.text(
            "Hello there!", usage={"prompt_tokens": 21, "completion_tokens": 3, "total_tokens": 24}
        )
    )
    messages = [
        Message(role="system", content="Be brief.", seq=1, tokens=3, metadata={"x": 1}),
        {"role": "user", "content": "Hi"},
    ]

    result = await service.complete(messages, max_tokens=50, temperature=0.3)

    body = fake_openai.last_request
    assert body["model"] == "fake-model"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert body["max_tokens"] == 50
    assert body["temperature"] == 0.3
    assert "tools" not in body
    assert not body.get("stream")
    assert fake_openai.request_headers()["authorization"] == "Bearer sk-test"

    assert isinstance(result, Completion)
    assert result.text == "Hello there!"
    assert result.finish_reason == "stop"
    assert result.usage.prompt_tokens == 21
    assert result.usage.completion_tokens == 3
    assert result.usage.total_tokens == 24
    assert result.model == MODEL
    assert result.tool_calls is None
    assert result.cost is None  # litellm has no price for this model and no override gives one


async def test_optional_parameters_are_not_sent_when_unset(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    await service.complete([{"role": "user", "content": "Hi"}])
    body = fake_openai.last_request
    assert "max_tokens" not in body
    assert "temperature" not in body
    assert "tools" not in body


async def test_explicit_model_wins_over_the_default(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    result = await service.complete([{"role": "user", "content": "Hi"}], model="openai/other")
    assert fake_openai.last_request["model"] == "other"
    assert result.model == "openai/other"


async def test_no_model_at_all_is_a_clear_error(litellm: Any) -> None:
    with pytest.raises(ValueError, match="default_model"):
        await LiteLLMService().complete([{"role": "user", "content": "Hi"}])


async def test_base_url_without_v1_prefix(fake_openai: FakeOpenAIServer, litellm: Any) -> None:
    svc = LiteLLMService(default_model=MODEL, api_base=fake_openai.url, api_key="sk-test")
    fake_openai.enqueue("plain path")
    assert (await svc.complete([{"role": "user", "content": "Hi"}])).text == "plain path"
    assert fake_openai.request_paths() == ["/chat/completions"]


async def test_finish_reason_length_is_passed_through(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.enqueue(Reply.length("The summary was cut"))
    result = await service.complete([{"role": "user", "content": "Summarize"}], max_tokens=5)
    assert result.finish_reason == "length"
    assert result.text == "The summary was cut"


async def test_empty_content_gives_empty_text(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.enqueue(Reply.empty())
    result = await service.complete([{"role": "user", "content": "Hi"}])
    assert result.text == ""
    assert result.finish_reason == "stop"


async def test_null_content_gives_empty_text(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.enqueue(Reply.text(None))
    assert (await service.complete([{"role": "user", "content": "Hi"}])).text == ""


async def test_callable_reply_sees_the_request(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.enqueue(lambda body: "echo: " + body["messages"][-1]["content"])
    result = await service.complete([{"role": "user", "content": "ping"}])
    assert result.text == "echo: ping"
    assert fake_openai.errors == []


async def test_missing_usage_is_counted(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.enqueue(
        Reply.raw(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "fake-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "four tokens of text"},
                        "finish_reason": "stop",
                    }
                ],
            }
        )
    )
    result = await service.complete([{"role": "user", "content": "How many tokens is this?"}])
    assert result.text == "four tokens of text"
    assert result.usage.prompt_tokens > 0
    assert result.usage.completion_tokens > 0
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens


# -- tool calls ----------------------------------------------------------------------------------


async def test_tool_calls_round_trip(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.enqueue(
        Reply.tool_calls(
            [{"id": "call_w1", "name": "get_weather", "arguments": {"city": "Paris"}}]
        ),
        "It is sunny in Paris.",
    )
    question = Message(role="user", content="Weather in Paris?")

    first = await service.complete([question], tools=[WEATHER_TOOL])

    assert fake_openai.last_request["tools"] == [WEATHER_TOOL]
    assert first.finish_reason == "tool_calls"
    assert first.tool_calls == [
        {
            "id": "call_w1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    json.dumps(first.tool_calls)  # plain data

    # Feed the call and its result back, as Message objects built from the Completion.
    assistant = Message(
        role="assistant",
        content=first.text or None,
        tool_calls=[ToolCall.model_validate(c) for c in first.tool_calls],
    )
    result = Message(role="tool", tool_call_id="call_w1", content='{"sky": "sunny"}')
    second = await service.complete([question, assistant, result], tools=[WEATHER_TOOL])

    sent = fake_openai.last_request["messages"]
    assert sent[1]["role"] == "assistant"
    assert sent[1]["tool_calls"] == [
        {
            "id": "call_w1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert sent[2] == {"role": "tool", "tool_call_id": "call_w1", "content": '{"sky": "sunny"}'}
    assert second.text == "It is sunny in Paris."
    assert second.tool_calls is None


# -- failures ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "exception_name"),
    [
        (400, "BadRequestError"),
        (401, "AuthenticationError"),
        (429, "RateLimitError"),
        (500, "InternalServerError"),
        (503, "ServiceUnavailableError"),
    ],
)
async def test_error_status_raises_after_one_request(
    service: LiteLLMService,
    fake_openai: FakeOpenAIServer,
    litellm: Any,
    status: int,
    exception_name: str,
) -> None:
    fake_openai.enqueue(Reply.error(status, "scripted failure"))
    with pytest.raises(getattr(litellm, exception_name)) as info:
        await service.complete([{"role": "user", "content": "Hi"}])
    assert isinstance(info.value, litellm.exceptions.APIError | litellm.APIConnectionError) or (
        info.value.status_code == status
    )
    assert "scripted failure" in str(info.value)
    assert len(fake_openai.requests) == 1  # num_retries=0: exactly one request


async def test_hanging_server_times_out_within_the_timeout(
    service: LiteLLMService, fake_openai: FakeOpenAIServer, litellm: Any
) -> None:
    fake_openai.enqueue(Reply.hang())  # never answers: raising at all is the timeout's doing
    with pytest.raises((litellm.Timeout, TimeoutError)):
        await service.complete([{"role": "user", "content": "Hi"}], timeout=0.5)
    assert len(fake_openai.requests) == 1


async def test_garbage_body_raises(
    service: LiteLLMService, fake_openai: FakeOpenAIServer, litellm: Any
) -> None:
    fake_openai.enqueue(Reply.garbage())
    with pytest.raises(litellm.InternalServerError, match="not json"):
        await service.complete([{"role": "user", "content": "Hi"}])
    assert len(fake_openai.requests) == 1


async def test_retries_are_configurable(fake_openai: FakeOpenAIServer, litellm: Any) -> None:
    svc = LiteLLMService(
        default_model=MODEL, api_base=fake_openai.base_url, api_key="sk-test", num_retries=1
    )
    fake_openai.enqueue(Reply.error(500, "first attempt fails"), "second attempt works")
    result = await svc.complete([{"role": "user", "content": "Hi"}])
    assert result.text == "second attempt works"
    assert len(fake_openai.requests) == 2


# -- streaming -----------------------------------------------------------------------------------

# litellm's stream handler (``is_model_response_stream_empty``) reads every attribute in
# ``dir(delta)``, ``model_fields`` and ``model_computed_fields`` included, which pydantic >= 2.11
# deprecates on instances. litellm adds a global "ignore" filter for it at import, but pytest
# resets the filters for each test, so under ``filterwarnings = error`` the warning is raised
# inside litellm, which turns it into a ``MidStreamFallbackError`` and the stream fails. It is
# litellm's code, not ours, so only this exact message is ignored, only on the streaming tests.
litellm_stream_deprecation = pytest.mark.filterwarnings(
    "ignore:Accessing the 'model_(computed_)?fields' attribute on the instance is deprecated"
    ":pydantic.warnings.PydanticDeprecatedSince211"
)


@litellm_stream_deprecation
async def test_stream_yields_deltas_then_a_completion(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.enqueue(
        Reply.text(
            "Hello streaming world",
            chunks=["Hello", " streaming", " world"],
            usage={"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
        )
    )
    items = [
        item
        async for item in service.stream(
            [{"role": "user", "content": "Hi"}], max_tokens=20, temperature=0.1
        )
    ]

    *deltas, final = items
    assert deltas == ["Hello", " streaming", " world"]
    assert isinstance(final, Completion)
    assert final.text == "Hello streaming world"
    assert final.finish_reason == "stop"
    assert final.usage.prompt_tokens == 9
    assert final.usage.completion_tokens == 3
    assert final.model == MODEL

    body = fake_openai.last_request
    assert body["stream"] is True
    assert body["max_tokens"] == 20
    assert body["temperature"] == 0.1


@litellm_stream_deprecation
async def test_stream_assembles_tool_calls(
    service: LiteLLMService, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.enqueue(
        Reply.tool_calls(
            [
                {"id": "call_a", "name": "get_weather", "arguments": {"city": "Oslo"}},
                {"id": "call_b", "name": "get_weather", "arguments": {"city": "Rome"}},
            ]
        )
    )
    items = [
        i async for i in service.stream([{"role": "user", "content": "?"}], tools=[WEATHER_TOOL])
    ]
    final = items[-1]
    assert isinstance(final, Completion)
    assert all(isinstance(i, str) for i in items[:-1])
    assert final.finish_reason == "tool_calls"
    assert final.tool_calls == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        },
        {
            "id": "call_b",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
        },
    ]
    assert fake_openai.last_request["tools"] == [WEATHER_TOOL]


async def test_stream_error_status_raises(
    service: LiteLLMService, fake_openai: FakeOpenAIServer, litellm: Any
) -> None:
    fake_openai.enqueue(Reply.error(500, "stream refused"))
    with pytest.raises(litellm.InternalServerError):
        async for _ in service.stream([{"role": "user", "content": "Hi"}]):
            pass
    assert len(fake_openai.requests) == 1


async def test_stream_hang_times_out(
    service: LiteLLMService, fake_openai: FakeOpenAIServer, litellm: Any
) -> None:
    fake_openai.enqueue(Reply.hang())  # never answers: raising at all is the timeout's doing
    with pytest.raises((litellm.Timeout, TimeoutError)):
        async for _ in service.stream([{"role": "user", "content": "Hi"}], timeout=0.5):
            pass


# -- cost ----------------------------------------------------------------------------------------


async def test_cost_of_a_known_model_via_mock_response(litellm: Any, no_network: list) -> None:
    svc = LiteLLMService(default_model="gpt-4o-mini", mock_response="Hi from the mock")
    result = await svc.complete([{"role": "user", "content": "Hello"}])
    assert result.text == "Hi from the mock"
    assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens > 0
    info = litellm.get_model_info("gpt-4o-mini")
    expected = (
        result.usage.prompt_tokens * info["input_cost_per_token"]
        + result.usage.completion_tokens * info["output_cost_per_token"]
    )
    assert result.cost == pytest.approx(expected)
    assert result.cost > 0
    assert no_network == []


async def test_cost_from_override_prices(fake_openai: FakeOpenAIServer, litellm: Any) -> None:
    svc = LiteLLMService(
        default_model=MODEL,
        api_base=fake_openai.base_url,
        api_key="sk-test",
        model_overrides={
            MODEL: {"input_cost_per_token": 0.001, "output_cost_per_token": 0.002},
        },
    )
    fake_openai.enqueue(
        Reply.text("x", usage={"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110})
    )
    result = await svc.complete([{"role": "user", "content": "Hi"}])
    assert result.cost == pytest.approx(100 * 0.001 + 10 * 0.002)


# -- model windows -------------------------------------------------------------------------------


def test_window_of_a_known_model(litellm: Any, no_network: list) -> None:
    svc = LiteLLMService(default_model="gpt-4o-mini")
    assert svc.context_window() == 128000
    assert svc.context_window("gpt-4o-mini") == 128000
    assert svc.max_output_tokens() == 16384
    assert no_network == []


def test_unknown_model_uses_defaults_with_one_warning(
    litellm: Any, caplog: pytest.LogCaptureFixture
) -> None:
    svc = LiteLLMService(default_context_window=32000, default_max_output_tokens=2000)
    with caplog.at_level(logging.WARNING, logger="host_stub.llm"):
        assert svc.context_window(MODEL) == 32000
        assert svc.context_window(MODEL) == 32000
        assert svc.max_output_tokens(MODEL) == 2000
    warnings = [r for r in caplog.records if r.name == "host_stub.llm"]
    assert len(warnings) == 1
    assert MODEL in warnings[0].getMessage()


def test_overrides_win(litellm: Any, caplog: pytest.LogCaptureFixture) -> None:
    svc = LiteLLMService(
        model_overrides={
            MODEL: {"context_window": 65536, "max_output_tokens": 1024},
            "gpt-4o-mini": ModelOverride(context_window=1000),
        }
    )
    with caplog.at_level(logging.WARNING, logger="host_stub.llm"):
        assert svc.context_window(MODEL) == 65536
        assert svc.max_output_tokens(MODEL) == 1024
    assert not [r for r in caplog.records if r.name == "host_stub.llm"]
    # A partial override: the rest still comes from litellm.
    assert svc.context_window("gpt-4o-mini") == 1000
    assert svc.max_output_tokens("gpt-4o-mini") == 16384


def test_bad_override_fails_at_construction() -> None:
    with pytest.raises(ValidationError):
        LiteLLMService(model_overrides={MODEL: {"context_windw": 10}})
    with pytest.raises(ValidationError):
        LiteLLMService(model_overrides={MODEL: {"context_window": 0}})


def test_window_look_up_never_reaches_the_network(litellm: Any, no_network: list) -> None:
    # litellm's public get_model_info would ask an Ollama server (/api/show) for this one.
    svc = LiteLLMService(api_base="http://127.0.0.1:9")
    for model in ("ollama/llama3.2", "ollama_chat/qwen2.5", "huggingface/meta-llama/Llama-3-8b"):
        assert svc.context_window(model) == 8192
        assert svc.max_output_tokens(model) == 4096
    assert no_network == []


# -- token counting ------------------------------------------------------------------------------


def test_count_tokens_of_text(litellm: Any) -> None:
    svc = LiteLLMService(default_model="gpt-4o-mini")
    assert svc.count_tokens("") == 0
    assert 1 <= svc.count_tokens("hello") <= 2
    english = "The quick brown fox jumps over the lazy dog."
    assert 8 <= svc.count_tokens(english) <= 12


def test_count_tokens_of_chinese_counts_real_tokens(litellm: Any) -> None:
    svc = LiteLLMService(default_model=MODEL)  # unknown model: the bundled cl100k_base encoding
    assert svc.count_tokens("你好，世界") > 2
    sentence = "我们今天讨论了项目的进度，并决定下周一之前完成数据库迁移的所有测试工作。"
    count = svc.count_tokens(sentence)
    assert count > len(sentence) / 4 * 2  # a chars/4 estimate would be far too low
    assert count <= len(sentence) * 2


def test_count_tokens_of_messages(litellm: Any) -> None:
    svc = LiteLLMService(default_model="gpt-4o-mini")
    as_models = [
        Message(role="system", content="You are helpful."),
        Message(role="user", content="What is the capital of France?", seq=3, tokens=99),
        Message(
            role="assistant",
            content=None,
            tool_calls=[
                ToolCall(
                    id="c1",
                    function=ToolCallFunction(name="lookup", arguments='{"q": "France capital"}'),
                )
            ],
        ),
        Message(role="tool", tool_call_id="c1", content="Paris"),
    ]
    as_dicts = [m.to_openai() for m in as_models]
    n = svc.count_tokens(as_models)
    assert n == svc.count_tokens(as_dicts)
    text_only = sum(svc.count_tokens(m.content or "") for m in as_models)
    assert n > text_only  # per-message overhead and tool call arguments count too
    assert svc.count_tokens([]) == 0


def test_count_tokens_with_image_parts_does_not_fetch(litellm: Any, no_network: list) -> None:
    svc = LiteLLMService(default_model="gpt-4o-mini")
    msg = Message(
        role="user",
        content=[
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}},
        ],
    )
    assert svc.count_tokens([msg]) > svc.count_tokens("What is in this picture?")
    assert no_network == []


@pytest.mark.parametrize(
    "model",
    [
        "ollama/llama3.2",
        "meta-llama/Llama-3-8b",
        "replicate/llama-2-70b",
        "huggingface/meta-llama/Llama-2-7b-chat-hf",
        "cohere/command-r",
    ],
)
def test_count_tokens_never_reaches_the_network(litellm: Any, no_network: list, model: str) -> None:
    svc = LiteLLMService(default_model=model)
    assert svc.count_tokens("你好，世界 hello world " + model) > 2
    assert svc.count_tokens([{"role": "user", "content": "hello " + model}]) > 2
    assert no_network == []


# -- contract ------------------------------------------------------------------------------------


def test_satisfies_the_protocol() -> None:
    assert isinstance(LiteLLMService(default_model=MODEL), LLMService)


def test_importing_the_module_does_not_import_litellm() -> None:
    code = (
        "import sys, host_stub.llm\n"
        "assert 'litellm' not in sys.modules, sorted(m for m in sys.modules if 'litellm' in m)\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.slow
def test_first_calls_emit_no_user_warning() -> None:
    """A fresh process, UserWarnings as errors: the first complete / stream / error through
    litellm must not fail on pydantic's ``ReadOnly`` advisory, which litellm otherwise emits from
    inside the first call (so whichever test made the first call failed). litellm adds "ignore"
    filters for it at import; pytest resets the filters for every test, so this re-adds "error"
    after the import, as pytest does."""
    code = textwrap.dedent(
        """
        import asyncio
        import warnings
        from fake_openai import FakeOpenAIServer, Reply
        from host_stub.llm import LiteLLMService, ensure_litellm

        ensure_litellm()
        warnings.filterwarnings("error", category=UserWarning)

        async def main(server):
            svc = LiteLLMService(
                default_model="openai/fake-model", api_base=server.base_url, api_key="sk-test"
            )
            msgs = [{"role": "user", "content": "Hi"}]
            server.enqueue("one", Reply.tool_calls([{"name": "f", "arguments": {}}], content="x"))
            assert (await svc.complete(msgs)).text == "one"
            items = [i async for i in svc.stream(msgs)]
            assert items[-1].tool_calls[0]["function"]["name"] == "f"
            server.enqueue(Reply.error(500))
            try:
                await svc.complete(msgs)
            except Exception as exc:
                assert "InternalServerError" in type(exc).__name__, exc
            else:
                raise AssertionError("no error")
            print("ok")

        with FakeOpenAIServer() as server:
            asyncio.run(main(server))
        """
    )
    tests_dir = str(Path(__file__).parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"


def test_fake_server_stop_releases_hanging_requests_and_threads() -> None:
    import http.client
    import threading

    def handler_threads() -> int:
        return sum("process_request_thread" in t.name for t in threading.enumerate())

    baseline = handler_threads()
    server = FakeOpenAIServer().start()
    server.enqueue(Reply.hang())  # until stopped
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    caller = threading.Thread(
        target=lambda: _post_ignoring_errors(conn, "/v1/chat/completions", {"messages": []})
    )
    caller.start()
    deadline = time.monotonic() + 5
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.requests == [{"messages": []}]
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2.0
    caller.join(5)
    conn.close()
    assert not caller.is_alive()
    assert handler_threads() == baseline
    server.stop()  # idempotent


def _post_ignoring_errors(conn: Any, path: str, body: Any) -> None:
    try:
        conn.request(
            "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        conn.getresponse().read()
    except Exception:  # the server went away: that is the point of the test
        pass
