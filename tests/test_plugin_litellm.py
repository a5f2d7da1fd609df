"""The plugin's summarizer through the real litellm HTTP path, against a scripted OpenAI-compatible
server (``tests/fake_openai.py``).

The host replays recorded turns (no chat model call), so every request the server sees is the
summarizer's. Each test runs two compressions of one session: the first answered with a valid
JSON summary (the "old summary"), the second with the reply under test. We check what the server
received, what the store holds afterwards, the final ``session:compressing`` status, what the next
prompt carries, and that no turn failed.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAIServer, Reply
from invariants import InvariantChecker, check_sent

from host_stub import signals
from host_stub.config import HostConfig
from host_stub.host import Host
from host_stub.llm import LiteLLMService, ensure_litellm
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message, ToolCall, ToolCallFunction
from host_stub.services import SUMMARY_NAMESPACE
from plugin_memory_summary.summarizer.prompts import DEFAULT_PROMPTS
from plugin_memory_summary.summarizer.speed import Sample

MODEL = "openai/fake-model"
WINDOW = 8000
SUMMARY_RATIO = 0.1
#: max(512, window x ratio) (no system prompt, no reply reserve: nothing fixed to take out of the
#: window), under summary_max_tokens and the model's max output (2000).
BUDGET = 800
KEEP = 4
PLUGIN = {
    "threshold": 1000,  # compressions only when the test asks
    "keep_recent": KEEP,
    "auto_compress_threshold": 0,
    "hard_compress_threshold": 0,
    "summary_timeout_s": 1.0,
    "summary_token_ratio": SUMMARY_RATIO,
    # No recall tools: their definitions would be fixed tokens the budget is a share of.
    "recall_tokens": 0,
}
SESSION = "booking"
USER_ID = "lena_ortiz_5120"

FIRST_SUMMARY = {
    "summary": "SUMMARY-A: the user reviewed reservations RSV000Q and RSV001Q.",
    "conversation_goal": "Change a flight booking",
    "stable_facts": ["User id lena_ortiz_5120", "Reservation RSV000Q is confirmed"],
    # Every item says only what the conversation said (a grounding check drops the others).
    "user_profile": ["Checks each reservation of lena_ortiz_5120 in turn"],
    "decisions": ["Confirmed reservations RSV000Q and RSV001Q"],
    "open_questions": ["Which date to move to?"],
    "timeline": [{"when": "turn 1", "event": "asked about RSV001Q"}],
    "identifiers": ["RSV000Q", USER_ID],
}
SECOND_SUMMARY = {
    "summary": "SUMMARY-B: reservations up to turn 6 reviewed; 5 bags on RSV005Q.",
    "conversation_goal": "Change a flight booking",
    "stable_facts": ["Reservation RSV005Q has 5 checked bags"],
    "decisions": ["Add bags to RSV005Q"],
    "identifiers": ["RSV005Q"],
}
REFUSAL = "I'm sorry, I can't help with that."
PROSE = (
    "SUMMARY-PROSE: The user lena_ortiz_5120 reviewed reservation RSV004Q, then asked about "
    "two more bookings and their bags."
)
#: Cut off by the length limit inside its first field: no complete item.
LENGTH_CUT = '{"summary": "SUMMARY-CUT: this answer was cut off before'
#: Cut off by the length limit after two complete members: those are kept.
LENGTH_PARTIAL = (
    '{"summary": "SUMMARY-PARTIAL: RSV005Q has 5 bags.", "stable_facts": ["RSV006Q is '
    'confirmed", "RSV004Q has 4 ba'
)


def turn(i: int) -> tuple[Message, list[Message]]:
    """One booking turn: the user asks, the assistant calls a tool, the tool answers, the
    assistant replies. Reservation codes are unique per turn."""
    code = f"RSV{i:03d}Q"
    call = ToolCall(
        id=f"call_{i}",
        function=ToolCallFunction(
            name="get_reservation_details", arguments=json.dumps({"reservation_id": code})
        ),
    )
    return (
        Message(role="user", content=f"Turn {i}: please check reservation {code} for {USER_ID}."),
        [
            Message(role="assistant", content=None, tool_calls=[call]),
            Message(
                role="tool",
                tool_call_id=call.id,
                name="get_reservation_details",
                content=json.dumps({"reservation_id": code, "status": "confirmed", "bags": i}),
            ),
            Message(role="assistant", content=f"Reservation {code} is confirmed with {i} bags."),
        ],
    )


@dataclass
class Rig:
    host: Host
    server: FakeOpenAIServer
    checker: InvariantChecker
    statuses: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Any] = field(default_factory=list)

    @property
    def plugin(self) -> Any:
        return self.host.get_plugin("memory-summary")

    async def replay(self, indices: range) -> None:
        for i in indices:
            user, recorded = turn(i)
            result = await self.host.run_turn(SESSION, user, recorded=recorded)
            assert result.error is None and result.outcome == "replied", result.error
            check_sent(result.sent)
            self.turns.append(result)
            await self.checker.check(result.messages)

    async def compress(self) -> dict[str, Any]:
        before = len(self.statuses)
        final = await self.plugin.compress(SESSION)
        emitted = [s for s in self.statuses[before:] if s["status"] != "start"]
        assert len(emitted) == 1, emitted  # exactly one final status per request
        assert (emitted[0]["status"], emitted[0]["reason"]) == (final["status"], final["reason"])
        await self.checker.check()
        return final

    async def record(self) -> dict[str, Any]:
        entry = await self.host.memory.get_metadata(SUMMARY_NAMESPACE, SESSION)
        assert entry is not None and entry.value is not None
        return {**entry.value, "_version": entry.version}

    async def archived(self) -> list[Message]:
        return await self.host.memory.get_archived(SESSION)


@pytest.fixture(scope="module")
def litellm() -> Any:
    return ensure_litellm()


@pytest.fixture
async def rig(tmp_path: Path, fake_openai: FakeOpenAIServer, litellm: Any) -> Any:
    fake_openai.default_reply = Reply.error(599, "no reply scripted for this request")
    llm = LiteLLMService(
        default_model=MODEL,
        api_base=fake_openai.base_url,
        api_key="sk-test",
        model_overrides={MODEL: {"context_window": WINDOW, "max_output_tokens": 2000}},
    )
    memory = SQLiteMemory(
        tmp_path / "litellm.db", token_counter=lambda m: llm.count_tokens([m], "gpt-4o-mini")
    )
    config = HostConfig.model_validate(
        {
            "plugins": {"allow": ["memory-summary"]},
            "host": {"context_window": WINDOW, "reserve_for_reply": 0, "system_prompt": ""},
            "plugin": {"memory-summary": PLUGIN},
        }
    )
    host = Host(config, memory=memory, llm=llm)
    rig = Rig(host=host, server=fake_openai, checker=InvariantChecker(memory, SESSION))

    async def on_compressing(sender: Any, **payload: Any) -> None:
        rig.statuses.append(payload)

    host.bus.connect(signals.SESSION_COMPRESSING, on_compressing)
    async with host:
        yield rig


def transcript_of(body: dict[str, Any]) -> str:
    user = body["messages"][-1]["content"]
    match = re.search(r"<transcript>\n(.*)\n</transcript>", user, re.S)
    assert match is not None, "no <transcript> block in the summarizer's user message"
    return match.group(1)


def assert_summarizer_request(
    body: dict[str, Any], covered_turns: range, kept_turns: range
) -> None:
    """The request litellm sent: model, budget, temperature, system prompt, and a user message
    quoting exactly the summarized turns between <transcript> tags."""
    assert body["model"] == "fake-model"
    assert body["max_tokens"] == BUDGET
    assert body["temperature"] == pytest.approx(0.3)
    assert body.get("stream") in (None, False)
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user"]
    assert body["messages"][0]["content"] == DEFAULT_PROMPTS["en"]
    transcript = transcript_of(body)
    for i in covered_turns:
        code = f"RSV{i:03d}Q"
        assert f"user: Turn {i}: please check reservation {code} for {USER_ID}." in transcript
        assert "call get_reservation_details(" in transcript
        assert "tool result (get_reservation_details): " in transcript
        assert f"assistant: Reservation {code} is confirmed with {i} bags." in transcript
    for i in kept_turns:
        assert f"RSV{i:03d}Q" not in transcript, f"kept turn {i} was sent to the summarizer"


async def first_compression(rig: Rig) -> dict[str, Any]:
    """Turns 0-4, then a compression answered with FIRST_SUMMARY: turns 0-3 summarized, turn 4
    (its 4 messages) kept. The summarizer's speed is known, its calls quick: each compression is
    one request (a model of unknown speed is first sent a small part: test_weak_models.py)."""
    rig.plugin.tokens.speed.observe(MODEL, Sample(0, 0, 0, 0.0))
    await rig.replay(range(5))
    rig.server.enqueue(json.dumps(FIRST_SUMMARY))
    final = await rig.compress()
    assert final["status"] == "done", final
    assert len(rig.server.requests) == 1
    assert_summarizer_request(rig.server.requests[0], range(4), range(4, 5))
    record = await rig.record()
    assert record["text"].startswith("Goal: Change a flight booking")
    assert "Summary: SUMMARY-A" in record["text"]
    return record


async def second_compression(rig: Rig, reply: Any) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Turns 5-7, then a compression answered with ``reply``: turns 4-6 go to the summarizer,
    turn 7 is kept. Returns the final status, the record and the seconds it took."""
    await rig.replay(range(5, 8))
    rig.server.enqueue(reply)
    started = time.monotonic()
    final = await rig.compress()
    elapsed = time.monotonic() - started
    assert len(rig.server.requests) == 2, "the summarizer request was retried or not sent"
    body = rig.server.requests[1]
    assert_summarizer_request(body, range(4, 7), [*range(0, 4), 7])
    # Incremental: a few lines of the previous summary go along as context, the old turns and
    # the whole previous summary do not (the rules engine merges the model's digest into it).
    user = body["messages"][-1]["content"]
    assert "Earlier in the conversation (context only, already recorded):" in user
    assert "Goal: Change a flight booking" in user.split("<transcript>")[0]
    assert "SUMMARY-A" not in user
    return final, await rig.record(), elapsed


async def assert_next_turns_carry(rig: Rig, present: list[str], absent: list[str]) -> None:
    """Two more turns succeed; the summary injected into their prompts holds ``present`` and
    none of ``absent``."""
    await rig.replay(range(8, 10))
    for result in rig.turns[-2:]:
        for prompt in result.sent:
            system = "\n".join(m["content"] for m in prompt if m["role"] == "system")
            assert "<conversation-summary>" in system
            for text in present:
                assert text in system, text
            whole = json.dumps(prompt)
            for text in absent:
                assert text not in whole, text


def assert_no_plugin_errors(caplog: pytest.LogCaptureFixture) -> None:
    errors = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.startswith(("plugin_memory_summary", "host_stub"))
    ]
    assert not errors, [r.getMessage() for r in errors]


# -- a valid answer -------------------------------------------------------------------------------


async def test_json_answer_is_merged_field_by_field(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    first = await first_compression(rig)
    payload = first["payload"]
    assert payload["conversation_goal"] == FIRST_SUMMARY["conversation_goal"]
    assert payload["open_questions"] == FIRST_SUMMARY["open_questions"]
    # The prose and the lists are the record's digest of the range the answer covers, next to
    # the conversation's own sentences (a fact said twice is kept once).
    digest = [e for e in payload["excerpts"] if e["speaker"] == "Summary"]
    assert {(e["seq"], e["to_seq"]) for e in digest} == {(1, 16)}
    texts = {e["text"] for e in digest}
    assert FIRST_SUMMARY["summary"] in texts
    # Items whose words the summary already holds elsewhere may be left out; these are not.
    assert "Checks each reservation of lena_ortiz_5120 in turn" in texts
    # The decision says what the record already holds (both ids, "confirmed"): it may be left
    # out of the digest, its content is not.
    assert all(w in first["text"] for w in ("RSV000Q", "RSV001Q", "confirmed"))
    assert "- [#1-16] Summary: SUMMARY-A: the user reviewed" in first["text"]
    assert set(FIRST_SUMMARY["identifiers"]) <= set(payload["identifiers"])
    assert first["model"] == MODEL and first["fallback"] is None
    archived = await rig.archived()
    assert {m.archived for m in archived if not m.is_marker} == {"summarized"}
    assert max(m.seq or 0 for m in archived if not m.is_marker) == first["covered_up_to_seq"] == 16

    final, record, _ = await second_compression(rig, json.dumps(SECOND_SUMMARY))
    assert final["status"] == "done" and final["stats"]["messages_summarized"] == 12
    assert final["stats"]["model"] == MODEL and final["stats"]["fallback"] is None
    merged = record["payload"]
    # Merged, never replaced: the first answer's digest stays next to the second's.
    texts = {e["text"] for e in merged["excerpts"]}
    assert FIRST_SUMMARY["summary"] in texts and SECOND_SUMMARY["summary"] in texts
    # The identifiers of the old summary are carried whatever the model returns.
    assert {"RSV000Q", USER_ID, "RSV005Q"} <= set(merged["identifiers"])
    assert "Summary: SUMMARY-B" in record["text"]
    assert record["compressions"] == 2 and record["_version"] > first["_version"]
    assert record["covered_up_to_seq"] > first["covered_up_to_seq"]
    await assert_next_turns_carry(rig, ["SUMMARY-B", "RSV005Q", "RSV000Q"], [])
    assert_no_plugin_errors(caplog)


async def test_prose_answer_is_used_and_the_identifiers_it_says_are_kept(rig: Rig) -> None:
    first = await first_compression(rig)
    final, record, _ = await second_compression(rig, PROSE)
    assert final["status"] == "done", final
    assert "Summary: SUMMARY-PROSE" in record["text"]
    assert record["model"] == MODEL and record["fallback"] is None
    # The identifiers kept are the ones an item says: the prose's, and the first record's that
    # it still says; none is carried as a bare id.
    kept = set(record["payload"]["identifiers"])
    assert {USER_ID, "RSV004Q"} <= kept
    assert all(i in record["text"] for i in kept)
    assert {i for i in first["payload"]["identifiers"] if i in record["text"]} <= kept
    # The first answer's digest is not emptied by a plain-text one (issue 17, point 2).
    before = {e["text"] for e in first["payload"]["excerpts"]}
    after = {e["text"] for e in record["payload"]["excerpts"]}
    assert FIRST_SUMMARY["summary"] in before & after
    await assert_next_turns_carry(rig, ["SUMMARY-PROSE"], [])


async def test_an_answer_cut_off_at_the_length_limit_keeps_its_complete_items(rig: Rig) -> None:
    await first_compression(rig)
    final, record, _ = await second_compression(rig, Reply.length(LENGTH_PARTIAL))
    assert final["status"] == "done", final
    assert "cut off" in final["reason"] and "complete items were kept" in final["reason"]
    assert "Summary: SUMMARY-PARTIAL: RSV005Q has 5 bags." in record["text"]
    texts = {e["text"] for e in record["payload"]["excerpts"]}
    # The complete item's fact is kept (the conversation's own sentence, which says more,
    # covers it); the cut one is not.
    assert "RSV006Q is confirmed" in record["text"]
    assert not any(t.endswith("4 ba") for t in texts) and "4 ba." not in record["text"]


# -- answers that must not be stored --------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    name: str
    reply: Any
    #: In the final status' reason.
    reason: str
    #: Must never reach the record or a later prompt.
    forbidden: tuple[str, ...]


BAD = [
    Bad(
        "garbage",
        Reply.garbage(b"<html>GARBAGE-BODY this is not json</html>"),
        "invalid response",
        ("GARBAGE-BODY", "<html>"),
    ),
    Bad("refusal", REFUSAL, "refusal", (REFUSAL, "I'm sorry")),
    Bad(
        "http-500",
        Reply.error(500, "UPSTREAM-EXPLODED"),
        "InternalServerError",
        ("UPSTREAM-EXPLODED", "InternalServerError"),
    ),
    # Never answers (until the server stops): a fallback proves the summarizer timeout fired.
    Bad("hang", Reply.hang(), "timed out", ("Timeout", "timed out")),
    Bad("length", Reply.length(LENGTH_CUT), "finish_reason=length", ("SUMMARY-CUT",)),
    Bad("empty", Reply.empty(), "empty answer", ()),
    Bad(
        "json-debris",
        'SUMMARY-DEBRIS: },\n {\n "event": "I think they love playing games',
        "JSON fragments",
        ("SUMMARY-DEBRIS", "love playing games"),
    ),
    Bad(
        "invented-identifiers",
        "SUMMARY-INVENTED: booked lara-booking-guide-1234567890 for the user.",
        "nothing usable",
        ("SUMMARY-INVENTED", "lara-booking-guide-1234567890"),
    ),
]


@pytest.mark.parametrize("bad", BAD, ids=[b.name for b in BAD])
async def test_unusable_answer_falls_back_to_the_rules_engine(
    rig: Rig, bad: Bad, caplog: pytest.LogCaptureFixture
) -> None:
    first = await first_compression(rig)
    final, record, elapsed = await second_compression(rig, bad.reply)
    assert final["status"] == "error", final
    assert bad.reason in final["reason"], final["reason"]
    assert final["stats"]["fallback"] == "rules"
    # The rules engine merged the batch into the old summary: its text and identifiers stay,
    # the new turns' codes arrive, nothing of the bad answer does.
    assert record["fallback"] == "rules" and record["model"] is None
    assert record["compressions"] == 2 and record["covered_up_to_seq"] > first["covered_up_to_seq"]
    assert "SUMMARY-A" in record["text"]
    assert {"RSV000Q", USER_ID} <= set(record["payload"]["identifiers"])
    assert any(f"RSV{i:03d}Q" in record["text"] for i in range(4, 7))
    stored = json.dumps(record)
    for text in (*bad.forbidden, final["reason"]):
        assert text not in stored, text
    archived = await rig.archived()
    assert {m.archived for m in archived} == {"summarized"}
    await assert_next_turns_carry(rig, ["SUMMARY-A"], list(bad.forbidden))
    assert_no_plugin_errors(caplog)


@pytest.mark.parametrize(
    "bad", [b for b in BAD if b.name in ("http-500", "refusal", "hang")], ids=lambda b: b.name
)
async def test_unusable_answer_with_trim_fallback_keeps_the_old_summary(
    tmp_path: Path, fake_openai: FakeOpenAIServer, litellm: Any, bad: Bad
) -> None:
    """``fallback = "trim"``: the old record stays exactly as it was, and the batch is archived
    as ``fallback-trim`` (not ``summarized``: no summary covers it)."""
    llm = LiteLLMService(
        default_model=MODEL,
        api_base=fake_openai.base_url,
        api_key="sk-test",
        model_overrides={MODEL: {"context_window": WINDOW, "max_output_tokens": 2000}},
    )
    memory = SQLiteMemory(
        tmp_path / "trim.db", token_counter=lambda m: llm.count_tokens([m], "gpt-4o-mini")
    )
    config = HostConfig.model_validate(
        {
            "plugins": {"allow": ["memory-summary"]},
            "host": {"context_window": WINDOW, "reserve_for_reply": 0, "system_prompt": ""},
            "plugin": {"memory-summary": {**PLUGIN, "fallback": "trim"}},
        }
    )
    host = Host(config, memory=memory, llm=llm)
    rig = Rig(host=host, server=fake_openai, checker=InvariantChecker(memory, SESSION))

    async def on_compressing(sender: Any, **payload: Any) -> None:
        rig.statuses.append(payload)

    host.bus.connect(signals.SESSION_COMPRESSING, on_compressing)
    async with host:
        first = await first_compression(rig)
        final, record, _ = await second_compression(rig, bad.reply)
        assert final["status"] == "error" and bad.reason in final["reason"], final
        assert final["stats"]["fallback"] == "trim"
        assert record["_version"] == first["_version"]
        assert {k: v for k, v in record.items() if k != "_version"} == {
            k: v for k, v in first.items() if k != "_version"
        }
        archived = [m for m in await rig.archived() if not m.is_marker]
        reasons = {m.seq: m.archived for m in archived}
        assert all(r == "summarized" for s, r in reasons.items() if s <= first["covered_up_to_seq"])
        trimmed = [s for s, r in reasons.items() if r == "fallback-trim"]
        assert len(trimmed) == 12 and min(trimmed) == first["covered_up_to_seq"] + 1
        await assert_next_turns_carry(rig, ["SUMMARY-A"], list(bad.forbidden))
