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
            # Only what its batch (the first two turns) says: the seat is booked later.
            "summary": "The traveller (booking K7XQ2M, allergic to peanuts) flies Lisbon to "
            "Oslo on 12 June 2024.",
            "user_profile": ["Allergic to peanuts"],
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
    # Each digest line keeps the range it speaks for (its provenance).
    digest = [line for line in text.splitlines() if "] Summary: The traveller" in line]
    assert any("The traveller, booking K7XQ2M, flies Lisbon to Oslo" in line for line in digest)
    assert [line.split("]")[0] for line in digest] == ["- [#1-4", "- [#5-11"]
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
    from plugin_memory_summary.summarizer.parsing import debris_reason

    assert debris_reason(debris) is not None


def test_prose_lines_a_weak_model_made_up_are_left_out() -> None:
    from plugin_memory_summary.summarizer.answers import read_answer

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


# --- meta-talk: an answer about itself, or spoken to the reader (issue "Weak models", point 1) --

#: What SmolLM2-135M-Instruct answered on a llama.cpp server, merged before as digest lines.
META_JSON = (
    "This response is a JSON object that contains the summary, stable facts, and identifiers."
)
META_CHATTER = (
    "I'm glad you enjoyed the chat, and I'm happy to help with your pet training needs... "
    "Feel free to ask if you have any other questions!"
)
META_FIELDS = json.dumps(
    {
        "summary": "The summary contains the key points of the conversation. Here is the summary.",
        "stable_facts": ["The transcript shows a chat between the user and the assistant."],
        "decisions": ["Let me know if you need anything else."],
    }
)
META_ZH = "这个摘要包含了对话的主要内容。希望对你有帮助！如果你还有其他问题，请随时告诉我。"


@pytest.mark.parametrize(
    "answer",
    [META_JSON, META_CHATTER, META_FIELDS, META_ZH],
    ids=["about-the-json", "assistant-chatter", "json-fields", "chinese"],
)
async def test_an_answer_that_only_talks_about_itself_or_to_the_user_falls_back(
    answer: str,
) -> None:
    _, result, text, _ = await run(answer)
    assert result["status"] == "error" and result["stats"]["fallback"] == "rules", result
    # Its own reason, one kind in the report.
    assert "answer rejected: meta-talk" in result["reason"], result["reason"]
    from plugin_memory_summary.extras.report.reasons import fallback_kinds

    assert [k for k, _, _ in fallback_kinds([result["reason"]])] == ["rejected: meta-talk"]
    for words in ("JSON object", "glad", "happy to help", "summary contains", "transcript shows"):
        assert words not in text, words
    assert "摘要包含" not in text and "帮助" not in text
    assert "23 kg" in text  # the rules engine merged the batch
    for fact in EARLY_FACTS:
        assert fact in text, fact


async def test_meta_sentences_are_left_out_and_the_content_is_kept() -> None:
    answer = (
        "Here is the summary of the conversation:\n"
        "A checked bag of 23 kg was added for 40 EUR. Breakfast is included on the Oslo flight.\n"
        "I hope this helps! Let me know if you need anything else."
    )
    _, result, text, _ = await run(answer)
    assert result["status"] == "done" and result["stats"]["fallback"] is None, result
    assert "3 item(s) left out: meta-talk" in result["reason"], result["reason"]
    digest = [line for line in text.splitlines() if "] Summary: " in line]
    assert digest and "A checked bag of 23 kg was added for 40 EUR." in digest[-1], text
    for words in ("Here is the summary", "hope this helps", "Let me know"):
        assert words not in text, words


#: Sentences about the answer itself or spoken to its reader, English and Chinese.
META_TALK = [
    META_JSON,
    META_CHATTER,
    "The summary contains the user's travel plans and their booking reference.",
    "The transcript shows a conversation about flights to Oslo.",
    "This conversation is a transcript between a user and an AI assistant.",
    "The chat log shows the user asking about a checked bag.",
    "Here is the summary of the conversation.",
    "Sure! Here's a short summary.",
    "Sure!",
    "Below is the JSON object you asked for.",
    "The user and the assistant had a friendly conversation.",
    "I have summarized the key facts of the conversation.",
    "Note: the summary above does not include the tool results.",
    "I hope this helps!",
    "Hope this helps.",
    "Let me know if you need anything else.",
    "If you have any other questions, feel free to ask.",
    "Please don't hesitate to reach out.",
    "As an AI, I do not have personal experiences.",
    "You're welcome, enjoy your trip!",
    "Thank you for sharing your story with me.",
    "Is there anything else I can help you with?",
    "这个摘要包含了用户的旅行计划。",
    "以上内容是对话的总结。",
    "以下是对话的摘要：",
    "这段对话是一段客服聊天记录。",
    "好的！",
    "用户和助手进行了一次愉快的对话。",
    "希望对你有帮助。",
    "如果您还有其他问题，请随时告诉我。",
    "我很高兴能帮助你。",
]

#: The conversation's content, in the words a digest uses: none of it is meta-talk.
CONTENT = [
    "Caroline said she was glad she went to the support group.",
    "Melanie is happy to help at the shelter.",
    "Melanie hopes this helps her kids learn to swim.",
    "Caroline asked Melanie to let her know how the race went.",
    "Jon told Gina to feel free to use his studio.",
    'Gina wrote "I hope this helps" on the card for Jon.',
    "The user booked window seat 14A on the Oslo flight.",
    "The traveller, booking K7XQ2M, flies Lisbon to Oslo on 12 June 2024.",
    "The response from the airline came after two days.",
    "The answer to the quiz was Paris.",
    "The summary report for the board was sent to Bob on 8 May.",
    "The user thanked the assistant for the flight details.",
    "Melanie's conversation with her mentor inspired her to paint.",
    "The document lists the visa requirements for Norway.",
    "A summary of the trip was posted on the blog.",
    "The conversation ended with Jon feeling motivated to open his dance studio.",
    "Tim finds bliss in reading a great fantasy book to escape and feel free.",
    "Here's a photo of the horse painting Melanie made.",
    "本次对话主要讨论了宠物训练。",
    "I'm happy that dance has such a special meaning to both of us.",
    "今天健身教练夸我身材练的非常不错，我很开心。",
    "卡罗琳说她很高兴参加了支持小组。",
    "梅兰妮很乐意在收容所帮忙。",
    "用户预订了14A靠窗座位。",
    "用户希望这个方法对孩子有帮助。",
]


@pytest.mark.parametrize("sentence", META_TALK)
def test_meta_talk_is_recognised(sentence: str) -> None:
    from plugin_memory_summary.summarizer.parsing import meta_lead, meta_talk_reason

    assert meta_talk_reason(sentence) is not None or not meta_lead(sentence), sentence


@pytest.mark.parametrize("sentence", CONTENT)
def test_the_conversations_content_is_not_meta_talk(sentence: str) -> None:
    from plugin_memory_summary.summarizer.parsing import meta_lead, meta_talk_reason

    assert meta_talk_reason(sentence) is None, sentence
    assert meta_lead(sentence) == sentence


def test_a_json_answer_of_meta_talk_is_rejected_with_its_own_reason() -> None:
    from plugin_memory_summary.summarizer.answers import AnswerRejected, read_answer

    with pytest.raises(AnswerRejected, match="^meta-talk"):
        read_answer(
            META_FIELDS,
            cut_off=False,
            instructions="You write short summaries.",
            source="user: My dog pulls on the leash. assistant: Try short training sessions.",
        )
    answer = read_answer(
        json.dumps(
            {
                "summary": "The summary contains the facts. The dog pulls on the leash.",
                "stable_facts": [
                    "I'm happy to help with your pet training needs.",
                    "The dog is called Rex",
                ],
            }
        ),
        cut_off=False,
        instructions="You write short summaries.",
        source="user: My dog Rex pulls on the leash. assistant: Try short training sessions.",
    )
    assert answer.digest == ["The dog pulls on the leash."]
    assert answer.payload.stable_facts == ["The dog is called Rex"]
    assert any("left out" in n and "meta-talk" in n for n in answer.notes)
