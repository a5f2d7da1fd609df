"""Issue 14, point 7: an over-long summarizer reply must not block the event loop. The reply's
length is checked before anything looks at its text: the plugin refuses an answer longer than
``summary_reply_max_chars`` before parsing it (unusable output: the fallback runs, nothing of it
is stored), and the host's LLM service refuses a reply longer than ``max_reply_chars`` before
counting its tokens. No test here measures time: each one checks that the slow steps are never
reached."""

from __future__ import annotations

from typing import Any

import pytest
from fake_openai import FakeOpenAIServer, Reply
from plugin_harness import MODEL_DIGEST, json_summary, plugin_host

from host_stub.config import HostConfig
from host_stub.llm import LiteLLMService, ensure_litellm
from host_stub.testing import FakeLLM
from plugin_memory_summary.base.config import MemorySummaryConfig
from plugin_memory_summary.summarizer import answers
from plugin_memory_summary.summarizer.prompts import DEFAULT_PROMPTS

MARK = "HUGE-REPLY-7731 "
#: The probe's size: 20 MB of prose-like text.
HUGE = (MARK + "The user booked flight HAT136 and asked about order W2378156. ") * 260_000


def _refuse_long_text(monkeypatch: pytest.MonkeyPatch, limit: int) -> list[str]:
    """Make every parsing step of the summarizer path fail the test if it sees more than
    ``limit`` characters; returns the names of the steps that were called at all."""
    called: list[str] = []
    for name in (
        "parse_summary_output",
        "plain_text_gate",
        "debris_reason",
        "echo_reason",
        "answer_gate",
    ):
        original = getattr(answers, name)

        def guard(
            text: str, *args: Any, _name: str = name, _f: Any = original, **kwargs: Any
        ) -> Any:
            called.append(_name)
            assert len(text) <= limit, f"{_name} was given {len(text):,} characters"
            return _f(text, *args, **kwargs)

        monkeypatch.setattr(answers, name, guard)
    return called


def _huge_summarizer(sent: list[dict[str, Any]]) -> str:
    if sent[0]["content"] in DEFAULT_PROMPTS.values():
        return HUGE
    return "ok"


async def test_p7_an_over_long_summarizer_reply_is_refused_before_parsing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert len(HUGE) > 20_000_000
    cap = 100_000  # the default
    called = _refuse_long_text(monkeypatch, cap)
    llm = FakeLLM(default=json_summary)
    async with plugin_host({"threshold": 100, "keep_recent": 2}, llm=llm) as h:
        await h.turns("s", 3)
        assert (await h.plugin.compress("s"))["status"] == "done"
        await h.turns("s", 3, start=3)
        llm.default = _huge_summarizer
        result = await h.plugin.compress("s")
        # Unusable output: the fallback (rules) merged, the old summary's facts stay.
        assert result["status"] == "error" and result["stats"]["fallback"] == "rules", result
        assert "too long" in result["reason"], result
        after = await h.plugin.show("s")
        assert after is not None and after.compressions == 2
        assert MODEL_DIGEST in after.text
        assert (
            MARK.strip() not in after.text and MARK.strip() not in after.payload.model_dump_json()
        )
        assert "parse_summary_output" in called  # the first, normal answer was parsed
    assert MemorySummaryConfig().summary_reply_max_chars == cap


async def test_p7_the_reply_cap_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_long_text(monkeypatch, 2_000)
    llm = FakeLLM(default=lambda sent: '{"summary": "' + "word " * 1_000 + '"}')
    async with plugin_host(
        {"threshold": 100, "keep_recent": 2, "summary_reply_max_chars": 2_000}, llm=llm
    ) as h:
        await h.turns("s", 3)
        result = await h.plugin.compress("s")
        assert result["stats"]["fallback"] == "rules", result
        assert "summary_reply_max_chars is 2,000" in result["reason"], result
    with pytest.raises(ValueError, match="summary_reply_max_chars"):
        MemorySummaryConfig(summary_reply_max_chars=10)


@pytest.fixture(scope="module")
def litellm() -> Any:
    return ensure_litellm()


def _service(server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> LiteLLMService:
    service = LiteLLMService(
        default_model="openai/fake-model",
        api_base=server.base_url,
        api_key="sk-test",
        timeout=10,
        max_reply_chars=5_000,
    )

    def no_count(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("an over-long reply was counted")

    monkeypatch.setattr(service, "count_tokens", no_count)
    return service


async def test_p7_the_llm_service_refuses_an_over_long_reply_before_counting_it(
    fake_openai: FakeOpenAIServer, litellm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from host_stub.llm import ReplyTooLongError

    service = _service(fake_openai, monkeypatch)
    # Without usage in the body the service would count the reply's tokens itself.
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "y" * 50_000},
                "finish_reason": "stop",
            }
        ],
    }
    fake_openai.enqueue(Reply.raw(body))
    with pytest.raises(ReplyTooLongError, match=r"50,000 characters \(max_reply_chars is 5,000\)"):
        await service.complete([{"role": "user", "content": "hi"}])
    # The stream stops at the chunk that goes over, before the rest is read.
    fake_openai.enqueue(Reply.text("z" * 20_000, chunks=["z" * 2_000] * 10))
    seen = []
    with pytest.raises(ReplyTooLongError):
        async for item in service.stream([{"role": "user", "content": "hi"}]):
            seen.append(item)
    assert sum(len(s) for s in seen) <= 5_000


async def test_p7_the_host_passes_its_reply_cap_to_the_service() -> None:
    from host_stub.host import Host

    config = HostConfig.model_validate(
        {"host": {"model": "openai/x", "memory": "memory://", "llm_max_reply_chars": 12_345}}
    )
    async with Host(config) as host:
        assert isinstance(host.llm, LiteLLMService) and host.llm.max_reply_chars == 12_345
    assert HostConfig().host.llm_max_reply_chars == 1_000_000
