"""The report groups why compressions fell back by kind, lists every kind (or says how many more),
and keeps the useful part of an error (issue 17, point 7)."""

from __future__ import annotations

from host_stub.testing import simple_count
from plugin_memory_summary.base.config import MemorySummaryConfig
from plugin_memory_summary.base.text import cut_middle
from plugin_memory_summary.extras.report.models import CompressionEvent
from plugin_memory_summary.extras.report.reasons import fallback_kinds, reason_kind, reason_parts
from plugin_memory_summary.extras.report.text import KINDS_SHOWN, compression_line, fallback_lines
from plugin_memory_summary.safety.redact import Redactor
from plugin_memory_summary.summarizer.speed import Speed, timeout_reason
from plugin_memory_summary.summarizer.summarize import error_line, summarize_batches

CONTEXT_ERROR = (
    "BadRequestError: litellm.BadRequestError: OpenAIException - Error code: 400 - {'error': "
    "{'message': \"This model's maximum context length is 2048 tokens. However, you requested "
    "3517 tokens (3017 in the messages, 500 in the completion). Please reduce the length of the "
    "messages or completion.\", 'type': 'invalid_request_error'}}"
)


def test_reasons_that_differ_only_in_their_details_are_one_kind() -> None:
    reasons = [
        "answer rejected: lost identifiers: K7XQ2M, HG-583920",
        "answer rejected: lost identifiers: RY-20417",
        "answer rejected: refusal: 'I cannot help with that'",
        "answer rejected: refusal: 'As an AI'",
        "answer rejected: nothing usable in the answer (3 left out)",
    ]
    kinds = fallback_kinds(reasons)
    assert [(k, n) for k, n, _ in kinds] == [
        ("rejected: lost identifiers", 2),
        ("rejected: refusal", 2),
        ("rejected: nothing usable in the answer", 1),
    ]


def test_a_run_counts_once_per_kind_and_notes_are_no_reasons() -> None:
    reason = (
        "answer rejected: JSON fragments, not prose; answer rejected: JSON fragments, not prose; "
        "answer cut off at the length limit: its complete items were kept"
    )
    assert reason_parts(reason) == ["answer rejected: JSON fragments, not prose"] * 2
    assert [(k, n) for k, n, _ in fallback_kinds([reason])] == [
        ("rejected: JSON fragments, not prose", 1)
    ]


def test_every_kind_is_listed_or_counted_as_more() -> None:
    reasons = [f"answer rejected: kind{chr(97 + i)} of answer" for i in range(KINDS_SHOWN + 3)]
    lines = fallback_lines(reasons, pad="")
    assert len(lines) == KINDS_SHOWN + 1
    assert lines[-1].startswith("+3 more kinds (3 compressions): ")
    listed = " ".join(lines)
    for i in range(KINDS_SHOWN + 3):
        assert f"kind{chr(97 + i)} of answer" in listed


def test_an_error_keeps_its_class_and_its_numbers() -> None:
    reason = f"BadRequestError: {error_line(CONTEXT_ERROR)}"
    assert "maximum context length is 2048 tokens" in reason and "3517" in reason
    assert "OpenAIException" not in reason and "{" not in reason
    assert reason_kind(reason) == "error: BadRequestError"
    lines = fallback_lines([reason, reason], pad="")
    assert lines[0].startswith("2 x error: BadRequestError: ")
    assert "2048" in lines[0]
    line = compression_line(
        CompressionEvent(
            turn=3,
            status="error",
            trigger="auto",
            reason=reason,
            messages_summarized=9,
            model="openai/m",
            fallback="rules",
        )
    )
    assert "error: BadRequestError" in line and "2048" in line


def test_a_long_error_is_cut_in_the_middle() -> None:
    long = "Upstream failure: " + "x" * 500 + " (needed 9,731 tokens, the window is 8,192)"
    cut = cut_middle(long, 160)
    assert len(cut) <= 160 and "…" in cut
    assert cut.startswith("Upstream failure") and cut.endswith("the window is 8,192)")
    assert error_line(long).endswith("the window is 8,192)")


def test_a_timeout_is_one_reason_that_names_the_setting() -> None:
    reason = timeout_reason(60.0, Speed(0.002, 0.05, 2))
    assert reason_parts(reason) == [reason]
    assert reason_kind(reason) == "timed out"
    assert "summary_timeout_s" in fallback_lines([reason], pad="")[0]


class FailingLLM:
    default_model = "m"

    async def complete(self, messages, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError(CONTEXT_ERROR)

    def max_output_tokens(self, model=None):  # type: ignore[no-untyped-def]
        return 4096

    def context_window(self, model=None):  # type: ignore[no-untyped-def]
        return 128_000


async def test_a_provider_error_reason_keeps_the_numbers_at_its_end() -> None:
    from host_stub.messages import Message

    outcome = await summarize_batches(
        None,
        [[Message(role="user", content="hello there, plan my trip", seq=1, tokens=6)]],
        llm=FailingLLM(),  # type: ignore[arg-type]
        model="m",
        config=MemorySummaryConfig(),
        budget=300,
        lang="en",
        redactor=Redactor(),
        count_tokens=simple_count,
    )
    (error,) = outcome.errors
    assert error.startswith("RuntimeError: This model's maximum context length is 2048")
    assert "3017 in the messages" in error


async def test_a_replay_counts_a_compression_once_when_requests_joined_it() -> None:
    """Two requests that joined one run each get its final status with the same stats: the
    replay report counts one compression (and the summarizer calls once), the joined one
    apart."""
    from typing import Any

    from host_stub import signals
    from host_stub.config import HostConfig
    from host_stub.hookspecs import hookimpl
    from host_stub.host import Host
    from host_stub.messages import Message
    from host_stub.testing import FakeLLM
    from plugin_memory_summary.extras.report.replay import replay_series

    stats = {"messages_summarized": 4, "covered_up_to_seq": 4, "llm_calls": 1, "llm_seconds": [0.1]}

    class Joined:
        def __init__(self) -> None:
            self.host: Any = None

        @hookimpl
        def startup(self, host: Any) -> None:
            self.host = host

        @hookimpl
        async def before_model_call(self, view: Any) -> None:
            if view.messages and view.messages[-1].seq == 3:
                for request_id in ("r1", "r2"):  # the run, and a request that joined it
                    await self.host.bus.send(
                        signals.SESSION_COMPRESSING,
                        request_id=request_id,
                        session_id=view.session_id,
                        status="done",
                        stats=dict(stats),
                    )

    config = HostConfig.model_validate({"host": {"memory": "memory://"}, "plugins": {"allow": []}})
    host = Host(config, llm=FakeLLM(default="ok"), plugins=[("joined", Joined())])
    await host.start()
    try:
        turns = [
            ([Message(role="user", content=f"q{i}")], [Message(role="assistant", content="a")])
            for i in range(3)
        ]
        series = await replay_series(host, "s", turns, settle_s=0)
    finally:
        await host.stop()
    assert len(series.compressions) == 1
    assert sum(e.llm_calls for e in series.compressions) == 1
    assert series.other_statuses == {"joined": 1}


def test_meta_talk_is_a_kind_of_its_own_and_leaving_it_out_is_a_note() -> None:
    # Issue "Weak models": an answer that only spoke of itself or to the reader.
    reasons = [
        "answer rejected: meta-talk: the answer spoke of itself or to the reader, not of the "
        "conversation (2 left out)",
        "answer cut off (finish_reason=length) and answer rejected: meta-talk: the answer "
        "spoke of itself or to the reader, not of the conversation (1 left out)",
        # A used answer whose meta-talk was left out: a note, not a reason.
        "3 item(s) left out: meta-talk",
    ]
    assert [(k, n) for k, n, _ in fallback_kinds(reasons)] == [
        ("rejected: meta-talk", 1),
        ("cut off, then rejected: meta-talk", 1),
    ]
