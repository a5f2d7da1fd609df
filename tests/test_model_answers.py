"""Answers of the kind small local models give, fed to the real pipeline (issue 12's model path,
issue 17 points 1-3 and 9): prose is used, a cut-off JSON answer keeps its complete items, debris
and echoes fall back, an invented identifier is never stored and never protected, and the
previous summary is never emptied. Each answer below is shaped after what SmolLM2-135M-Instruct
and similar models returned through an OpenAI-compatible server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from plugin_harness import plugin_host

from host_stub.messages import Message
from host_stub.services import Completion
from host_stub.testing import FakeLLM

#: Manual compressions only; the test asks for them.
CONFIG = {"threshold": 1000, "keep_recent": 2, "auto_compress_threshold": 0, "recall_tokens": 0}

EARLY = [
    ("My booking reference is K7XQ2M and I am allergic to peanuts.", "Noted: K7XQ2M, no peanuts."),
    ("I fly from Lisbon to Oslo on 12 June 2024.", "Your flight LIS-OSL on 12 June 2024 is set."),
    ("Please book a window seat for me.", "Window seat 14A is booked on that flight."),
]
LATER = [
    ("Can you add a checked bag?", "One checked bag of 23 kg is added for 40 EUR."),
    ("Is breakfast included?", "A breakfast box is included on the Oslo flight."),
    ("Thanks, that is all for now.", "You're welcome, have a good trip."),
]

#: A plain-text answer, no JSON at all.
PROSE = (
    "The traveller, booking K7XQ2M, flies Lisbon to Oslo on 12 June 2024 in window seat 14A. "
    "They are allergic to peanuts."
)
#: The request sent back (what a fake that echoes its prompt, or a confused model, answers).
ECHO = "{prompt}"
#: JSON cut off by the length limit in its third member.
CUT_JSON = (
    '{"summary": "A checked bag of 23 kg was added for 40 EUR.", "stable_facts": '
    '["Breakfast box included on the Oslo flight", "The traveller asked ab'
)
#: Debris: the end of a JSON object offered as the answer.
DEBRIS = '},\n {\n "event": "I think they love playing games and going to the beach",\n'
#: JSON in a code fence, after a sentence of chatter.
FENCED = (
    'Here is the JSON object:\n```json\n{"summary": "A checked bag of 23 kg was added for 40 '
    'EUR; breakfast is included.", "decisions": ["Add one checked bag"]}\n```'
)
#: A summary that drops the early facts (it covers the new part only) and makes up an id.
INVENTS = json.dumps(
    {
        "summary": "The traveller added a bag. Reference lara-booking-guide-1234567890 was "
        "created for the trip.",
        "identifiers": ["lara-booking-guide-1234567890"],
    }
)


def first_answer(sent: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "summary": "The traveller (booking K7XQ2M, allergic to peanuts) flies Lisbon to "
            "Oslo on 12 June 2024, window seat 14A.",
            "user_profile": ["Allergic to peanuts", "Prefers a window seat"],
        }
    )


async def run(second: Any) -> tuple[dict[str, Any], dict[str, Any], str, list[Any]]:
    """Two compressions: the first answered well, the second with ``second``. Returns both
    results, the summary text after the second and the summarizer's calls."""
    llm = FakeLLM(default=first_answer)
    async with plugin_host(CONFIG, llm=llm) as h:
        for user, reply in EARLY:
            await h.host.run_turn("s", user, recorded=[Message(role="assistant", content=reply)])
        first = await h.plugin.compress("s")
        for user, reply in LATER:
            await h.host.run_turn("s", user, recorded=[Message(role="assistant", content=reply)])
        if second == ECHO:
            llm.enqueue(lambda sent: "\n\n".join(m["content"] for m in sent))
        else:
            llm.enqueue(second)
        result = await h.plugin.compress("s")
        text = await h.plugin.get_conversation_summary("s") or ""
        return first, result, text, llm.calls


EARLY_FACTS = ("K7XQ2M", "peanuts", "12 June 2024", "14A")


async def test_a_plain_prose_answer_is_used() -> None:
    first, result, text, _ = await run(PROSE)
    assert first["status"] == result["status"] == "done", result
    assert result["stats"]["fallback"] is None
    # The prose is on the record as the summarizer's digest (next to the first answer's, when
    # the summary's budget has room for both).
    digest = [line for line in text.splitlines() if "] Summary: The traveller" in line]
    assert digest and "The traveller, booking K7XQ2M, flies Lisbon to Oslo" in digest[0]
    for fact in EARLY_FACTS:
        assert fact in text, fact


async def test_a_json_answer_cut_off_keeps_its_complete_items() -> None:
    _, result, text, _ = await run(Completion(text=CUT_JSON, finish_reason="length"))
    assert result["status"] == "done" and result["stats"]["fallback"] is None, result
    assert "complete items were kept" in result["reason"]
    assert "A checked bag of 23 kg was added for 40 EUR." in text
    assert "Breakfast box included on the Oslo flight" in text
    assert "asked ab" not in text


async def test_fenced_json_after_chatter_is_read_as_json() -> None:
    _, result, text, _ = await run(FENCED)
    assert result["status"] == "done" and result["stats"]["fallback"] is None, result
    assert "breakfast is included" in text
    assert "```" not in text and "Here is the JSON object" not in text


@pytest.mark.parametrize(
    ("answer", "reason"),
    [(DEBRIS, "JSON"), (ECHO, "echoes the request")],
    ids=["debris", "echo"],
)
async def test_debris_and_echoes_fall_back_and_the_report_says_why(
    answer: str, reason: str
) -> None:
    _, result, text, _ = await run(answer)
    assert result["status"] == "error" and result["stats"]["fallback"] == "rules", result
    assert reason in result["reason"], result["reason"]
    assert "love playing games" not in text and "<transcript>" not in text
    assert "Output only the JSON object" not in text
    # The rules engine merged the batch; the first summary's facts are all there.
    assert "23 kg" in text
    for fact in EARLY_FACTS:
        assert fact in text, fact


async def test_an_answer_that_drops_facts_and_invents_an_id_loses_nothing_and_adds_no_id() -> None:
    _, result, text, calls = await run(INVENTS)
    assert result["status"] == "done", result
    assert "lara-booking-guide-1234567890" not in text
    assert "The traveller added a bag." in text
    for fact in EARLY_FACTS:
        assert fact in text, fact


async def test_an_invented_identifier_is_never_protected_against_the_next_answer() -> None:
    # Issue 17, point 3: a first summary that invented an id made the next good answer fail
    # for "losing" it. The id is never stored, so the next answer is judged on its own.
    llm = FakeLLM(default=first_answer)
    async with plugin_host(CONFIG, llm=llm) as h:
        for user, reply in EARLY:
            await h.host.run_turn("s", user, recorded=[Message(role="assistant", content=reply)])
        llm.enqueue(INVENTS)
        await h.plugin.compress("s")
        record = await h.plugin.show("s")
        assert record is not None
        assert "lara-booking-guide-1234567890" not in record.payload.identifiers
        assert "K7XQ2M" in record.payload.identifiers  # from the conversation itself
        for user, reply in LATER:
            await h.host.run_turn("s", user, recorded=[Message(role="assistant", content=reply)])
        second = await h.plugin.compress("s")
        assert second["status"] == "done" and second["stats"]["fallback"] is None, second


async def test_the_summarizer_input_is_little_more_than_what_it_digests() -> None:
    # Issue 12, point 4: the request carries short instructions, a few lines of the previous
    # summary once per run, and the transcript; not the whole previous summary again.
    _, _, _, calls = await run(PROSE)
    second = calls[-1]["messages"]
    user = second[-1]["content"]
    context, transcript = user.split("<transcript>", 1)
    assert "14A" not in context  # the previous record is not resent
    assert len(second[0]["content"]) + len(context) < 1500


#: Prose whose lines open with the conversation's own bracketed timestamps (issue 17, point 9).
STAMPED = (
    "[5:23 pm on 8 May, 2023]: A 23 kg bag, 40 EUR.\n"
    "[5:25 pm on 8 May, 2023]: Breakfast box on the Oslo flight.\n"
    "[5:26 pm on 8 May, 2023] Traveller: all done."
)


async def test_prose_whose_lines_open_with_bracketed_timestamps_is_used() -> None:
    _, result, text, _ = await run(STAMPED)
    assert result["status"] == "done" and result["stats"]["fallback"] is None, result
    assert "Breakfast box on the Oslo flight." in text


@pytest.mark.parametrize(
    "debris",
    [
        '[5:23 pm on 8 May, 2023] {"event": "bag added", "when": "8 May"},',
        '["5:23 pm on 8 May, 2023", "bag added"],\n["5:25 pm", "breakfast"]',
    ],
    ids=["object-after-stamp", "list-of-strings"],
)
def test_json_after_a_timestamp_is_still_debris(debris: str) -> None:
    from plugin_memory_summary.parsing import debris_reason

    assert debris_reason(debris) is not None


def test_prose_lines_a_weak_model_made_up_are_left_out() -> None:
    from plugin_memory_summary.answers import read_answer

    source = (
        "user: I went to the LGBTQ support group yesterday, the transgender stories inspired me."
    )
    answer = read_answer(
        "A recent LGBTQ support group shared inspiring transgender stories. "
        "Melanie praised the wonderful baking contest results for everyone's families.",
        cut_off=False,
        instructions="You write short summaries.",
        source=source,
    )
    assert answer.digest == ["A recent LGBTQ support group shared inspiring transgender stories."]
    assert any("left out" in n for n in answer.notes)
