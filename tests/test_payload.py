"""The summary payload: identifiers, parsing, the plain-text gate, caps, rendering, budgets."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugin_memory_summary.base.config import PayloadCaps
from plugin_memory_summary.base.identifiers import extract_identifiers
from plugin_memory_summary.record.fitting import (
    PayloadFitter,
    apply_caps,
    fit_to_budget,
    render_payload,
)
from plugin_memory_summary.record.summary_model import InProgressTask, SummaryPayload, TimelineEvent
from plugin_memory_summary.summarizer.parsing import (
    parse_summary_output,
    payload_from_text,
    plain_text_gate,
    refusal_reason,
)


def by_thirds(text: str) -> int:
    return len(text) // 3 + 1


class CountingByThirds:
    """:func:`by_thirds`, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        return by_thirds(text)


# --- extract_identifiers ----------------------------------------------------------------------


def test_identifiers_from_an_airline_chat_in_first_seen_order() -> None:
    text = (
        "My user id is mia_li_3668. Book HAT136 on 2024-05-20 and pay with certificate_7504069, "
        "then credit_card_4421486. Again: mia_li_3668 and HAT136."
    )
    assert extract_identifiers(text) == [
        "mia_li_3668",
        "HAT136",
        "2024-05-20",
        "certificate_7504069",
        "credit_card_4421486",
    ]


def test_identifiers_emails_urls_and_paths() -> None:
    text = (
        "Write to mia.li3818@example.com, see https://example.com/a/b?x=1. "
        "Config in /etc/app/x.conf and C:\\Users\\x\\cfg.ini, code in src/a/b.py; and/or km/h."
    )
    assert extract_identifiers(text) == [
        "mia.li3818@example.com",
        "https://example.com/a/b?x=1",
        "/etc/app/x.conf",
        "C:\\Users\\x\\cfg.ini",
        "src/a/b.py",
    ]


def test_identifiers_caps_codes_and_json_id_values() -> None:
    text = json.dumps(
        {
            "reservation_id": "HATHAT",
            "order_no": "abcdef",
            "status": "available",
            "address1": "975 Sunset Drive",
            "last_four": "7447",
            "zip": "78750",
            "reservations": ["ZFA04Y", "NO6JO3"],
        }
    )
    assert extract_identifiers(text) == ["HATHAT", "abcdef", "78750", "ZFA04Y", "NO6JO3"]
    assert extract_identifiers("IMPORTANT: PLEASE call JFK about PNR QWERTY") == ["QWERTY"]
    assert extract_identifiers("Reservation HATHAT CONFIRMED.") == ["HATHAT"]
    assert extract_identifiers("codes: ABCDE, FGHIJ") == ["ABCDE", "FGHIJ"]
    assert extract_identifiers("Ah ha, JUST DOING IT!") == []  # shouting, not codes


def test_identifiers_numbers_versions_dates_times() -> None:
    # A bare 5-digit number is an amount ("12345 yen") unless something names it as a code.
    text = (
        "1234 and 3.14 and 06:00:00 and 12345 are not ids; order 12345, v1.2.3, 1.2.3, "
        "05/20/2024 and 2024-05-11T08:12:34 are; address1 and hello are not."
    )
    assert extract_identifiers(text) == [
        "12345",
        "v1.2.3",
        "1.2.3",
        "05/20/2024",
        "2024-05-11T08:12:34",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "For Kyoto the outlook is sunny, 10-22 °C.",
        "How much is 12,000 yen, or 12000 yen, or 1,200 yen in euros?",
        "That is 5199.99 EUR at a rate of 0.0061; prices range 1000-2000 yen.",
        '{"amount": 12000, "from": "JPY", "rate": 0.00612, "result": 73.44, "n": 1234567}',
        "We need a 7-day pass and a 24-hour ticket at a 5-star hotel.",
    ],
)
def test_amounts_ranges_decimals_and_counts_are_not_identifiers(text: str) -> None:
    assert extract_identifiers(text) == []


def test_plain_numbers_named_quoted_or_long_are_identifiers() -> None:
    assert extract_identifiers("order 58392, #58391 and 订单号58390") == ["58392", "58391", "58390"]
    assert extract_identifiers("Booking reference number: 583920.") == ["583920"]
    # Quoted in JSON: a code (amounts are JSON numbers); an id key takes a JSON number too.
    assert extract_identifiers('{"zip": "78750", "order_id": 58392011, "qty": 58392}') == [
        "78750",
        "58392011",
    ]
    # 7+ digits: phone, account and order numbers; a hyphenated pair that is not a range.
    assert extract_identifiers("Call 5551234567 or 555-1234; card 7741-0932.") == [
        "5551234567",
        "555-1234",
        "7741-0932",
    ]
    # Dates keep being identifiers, with any separator.
    assert extract_identifiers("on 2025-04-03 or 2025/04/03") == ["2025-04-03", "2025/04/03"]


def test_flight_numbers_with_a_two_letter_airline_code() -> None:
    text = "Out on LH 716 (or LH716), back on MU 219; UA93 is full. HAT136 too."
    assert extract_identifiers(text) == ["LH 716", "LH716", "MU 219", "UA93", "HAT136"]
    # Not flights: times, status codes, roads, a state and its zip code, short product names.
    assert extract_identifiers("at 11 AM or 5 PM, OK 200, US 101, CA 94105, MP3 and PM 2") == []
    # An airline code glued into a longer word is not one.
    assert extract_identifiers("XLH 716 and ABLH716") == ["ABLH716"]


def test_upper_case_words_need_something_naming_them_as_codes() -> None:
    # Constants and shouting are not codes.
    assert (
        extract_identifiers("Convert with RATES[row['currency']]; RATES = {} reuses RATES.") == []
    )
    assert extract_identifiers("MAX_RETRIES and DEFAULT_TIMEOUT stay in app/config.py") == [
        "app/config.py"
    ]
    assert extract_identifiers('{"cabin": "ECONOMY", "RATES": {"EUR": 1}}') == []
    # Named ("reservation HXDUBJ", "PNR: QWERTY"), quoted, or in a list of codes: codes.
    assert extract_identifiers("Some changes in reservation HXDUBJ, please.") == ["HXDUBJ"]
    assert extract_identifiers("Your reservation ID is **HATHAT**.") == ["HATHAT"]
    assert extract_identifiers('Two reservations: "M05KNL" and "UHDAHF".') == ["M05KNL", "UHDAHF"]
    assert extract_identifiers('{"reservations": ["HXDUBJ", "DXG8T6"]}') == ["HXDUBJ", "DXG8T6"]
    assert extract_identifiers("Under your profile: DF89BM, COVE6R, and IIHXDG.") == [
        "DF89BM",
        "COVE6R",
        "IIHXDG",
    ]
    assert extract_identifiers("The IDs:\n\n- 4NQLHD\n- AJVCTQ\n- ZB7LBX") == [
        "4NQLHD",
        "AJVCTQ",
        "ZB7LBX",
    ]
    assert extract_identifiers("Pick AQLBTL, KA7I60 or I57WUD") == ["AQLBTL", "KA7I60", "I57WUD"]


def test_identifiers_in_chinese_text_and_empty_text() -> None:
    assert extract_identifiers("订单号A12345已发货，用户ID是mia_li_3668。") == [
        "A12345",
        "mia_li_3668",
    ]
    assert extract_identifiers("") == []
    assert extract_identifiers("just some ordinary words here") == []


# --- parse_summary_output ---------------------------------------------------------------------


def test_parse_plain_json() -> None:
    payload = parse_summary_output(
        json.dumps(
            {
                "summary": "User booked a flight.",
                "conversation_goal": "Fly to Seattle",
                "stable_facts": ["Flight HAT136"],
                "identifiers": ["HAT136"],
            }
        )
    )
    assert payload is not None
    assert payload.summary == "User booked a flight."
    assert payload.conversation_goal == "Fly to Seattle"
    assert payload.stable_facts == ["Flight HAT136"]
    assert payload.identifiers == ["HAT136"]


@pytest.mark.parametrize(
    "text",
    [
        'Here you go:\n```json\n{"summary": "S", "decisions": ["D"]}\n```\nDone.',
        '```\n{"summary": "S", "decisions": ["D"]}\n```',
        '```json\n{"summary": "S", "decisions": ["D"]}',
        'Sure {not json} and then {"summary": "S", "decisions": ["D"]} trailing',
        '{"summary": "S", "decisions": ["D",],}',
        '{"payload": {"summary": "S", "decisions": ["D"]}}',
    ],
)
def test_parse_is_tolerant_of_wrappers(text: str) -> None:
    payload = parse_summary_output(text)
    assert payload is not None
    assert payload.summary == "S"
    assert payload.decisions == ["D"]


def test_parse_takes_the_outermost_object() -> None:
    text = '{"summary": "outer", "in_progress_tasks": [{"goal": "g", "done": ["a"]}]}'
    payload = parse_summary_output(text)
    assert payload is not None
    assert payload.summary == "outer"
    assert payload.in_progress_tasks == [InProgressTask(goal="g", done=["a"])]


def test_parse_coerces_strings_and_aliases() -> None:
    text = json.dumps(
        {
            "summary": ["line one", "line two"],
            "goal": "the goal",
            "user_preferences": "likes aisle seats",
            "resolved_points": ["refund issued"],
            "pending_questions": "which date?",
            "retrieval_hints": "baggage",
            "stable_facts": [42, {"fact": "gold member"}, ["nested"], None, True, ""],
            "in_progress_tasks": ["rebook flight", {"task": "refund", "pending": "confirm"}],
            "timeline": [
                "2024-05-20: booked HAT136",
                "[May 21] changed seat",
                "no date here",
                {"date": "May 22", "what": "cancelled"},
            ],
        }
    )
    payload = parse_summary_output(text)
    assert payload is not None
    assert payload.summary == "line one\nline two"
    assert payload.conversation_goal == "the goal"
    assert payload.user_profile == ["likes aisle seats"]
    assert payload.decisions == ["refund issued"]
    assert payload.open_questions == ["which date?"]
    assert payload.retrieval_hints == ["baggage"]
    assert payload.stable_facts == ["42", "gold member", "nested"]
    assert payload.in_progress_tasks == [
        InProgressTask(goal="rebook flight"),
        InProgressTask(goal="refund", todo=["confirm"]),
    ]
    assert payload.timeline == [
        TimelineEvent(when="2024-05-20", event="booked HAT136"),
        TimelineEvent(when="May 21", event="changed seat"),
        TimelineEvent(event="no date here"),
        TimelineEvent(when="May 22", event="cancelled"),
    ]


def test_parse_drops_fields_of_unusable_types() -> None:
    payload = parse_summary_output('{"summary": {"x": 1}, "decisions": ["kept"]}')
    assert payload is not None
    assert payload.summary == ""
    assert payload.decisions == ["kept"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no json here at all",
        "[1, 2, 3]",
        '["summary"]',
        '{"foo": 1, "bar": "baz"}',
        '{"summary": {"x": 1}}',
        '{"summary": "", "stable_facts": []}',
        '{"summary": 12}',
        "{broken json",
    ],
)
def test_parse_rejects_what_does_not_fit(text: str) -> None:
    assert parse_summary_output(text) is None


# --- refusals and the gate --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "I'm sorry, but I can't help with that.",
        "I cannot summarize this conversation.",
        "Sorry, I am unable to do that.",
        "As an AI language model, I do not keep memories.",
        "Well. I can't help with summarizing private chats.",
        "抱歉，我无法完成这个请求。",
        "我无法提供该摘要。",
        "作为一个AI，我不能总结这段对话。",
        "很抱歉，这超出了我的能力。",
    ],
)
def test_refusals_are_recognised(text: str) -> None:
    reason = refusal_reason(text)
    assert reason is not None and reason.startswith("refusal")
    assert plain_text_gate(text, None) == reason


@pytest.mark.parametrize(
    "text",
    [
        "The user said I'm sorry for the delay and rebooked HAT136.",
        "用户对延误表示抱歉，并改签了航班。",
        "The agent explained it cannot refund basic economy tickets.",
    ],
)
def test_ordinary_summaries_are_not_refusals(text: str) -> None:
    assert refusal_reason(text) is None
    assert plain_text_gate(text, None) is None


@pytest.mark.parametrize(
    "text",
    [
        "Error: rate limit exceeded",
        'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom',
        "ValueError: could not parse",
        '{"error": {"message": "bad request"}}',
        "500 Internal Server Error",
        "<!DOCTYPE html><html><body>Bad gateway</body></html>",
    ],
)
def test_error_dumps_are_rejected(text: str) -> None:
    reason = plain_text_gate(text, None)
    assert reason is not None and reason.startswith("error output")


def test_gate_rejects_empty_output() -> None:
    assert plain_text_gate("", None) == "empty output"
    assert plain_text_gate(" \n\t", None) == "empty output"


def test_gate_does_not_ask_prose_to_repeat_the_previous_identifiers() -> None:
    # The model digests the new part only; the merge carries every previous identifier.
    previous = SummaryPayload(identifiers=["mia_li_3668", "HAT136", "certificate_7504069"])
    assert plain_text_gate("The user mia_li_3668 wants to fly.", previous) is None


@pytest.mark.parametrize(
    "text",
    [
        'Summary: },\n {\n "event": "I think they love playing games',
        'The JSON object is: {"summary": "Mia booked", "facts": [',
        "}, {\n],",
    ],
)
def test_gate_rejects_json_debris_offered_as_prose(text: str) -> None:
    assert plain_text_gate(text) == "JSON fragments, not prose"


def test_gate_accepts_prose_that_starts_with_a_bracketed_time() -> None:
    # Issue 17, point 9.
    text = "[5:23 pm on 8 May, 2023] Caroline told Melanie about the support group."
    assert plain_text_gate(text) is None


def test_payload_from_text_keeps_identifiers_and_pinned_facts() -> None:
    previous = SummaryPayload(
        summary="old", identifiers=["mia_li_3668"], pinned_facts=["Always fly economy."]
    )
    payload = payload_from_text("  User mia_li_3668 booked HAT136 on 2024-05-20.  ", previous)
    assert payload.summary == "User mia_li_3668 booked HAT136 on 2024-05-20."
    assert payload.identifiers == ["mia_li_3668", "HAT136", "2024-05-20"]
    assert payload.pinned_facts == ["Always fly economy."]
    assert payload_from_text("plain", None) == SummaryPayload(summary="plain")


# --- caps -------------------------------------------------------------------------------------


def test_caps_keep_the_newest_items_and_cut_long_ones() -> None:
    caps = PayloadCaps(
        list_items=3,
        item_chars=10,
        timeline_items=2,
        identifiers=2,
        goal_chars=10,
        summary_chars=100,
    )
    payload = SummaryPayload(
        summary="s" * 150,
        conversation_goal="g" * 30,
        stable_facts=["a", "b", "c", "d", "e"],
        decisions=["x" * 25],
        timeline=[TimelineEvent(event=f"e{i}") for i in range(5)],
        identifiers=["ID00001", "ID00002", "ID00003", "averyveryverylongidentifier"],
        in_progress_tasks=[
            InProgressTask(goal=f"t{i}", done=["1", "2", "3", "4"]) for i in range(4)
        ],
        pinned_facts=["a pinned fact that is much longer than ten characters"] * 2,
    )
    capped = apply_caps(payload, caps)
    assert capped.stable_facts == ["c", "d", "e"]
    assert capped.decisions == ["xxxxxxxxx…"]
    assert [e.event for e in capped.timeline] == ["e3", "e4"]
    assert capped.identifiers == ["ID00002", "ID00003"]
    assert [t.goal for t in capped.in_progress_tasks] == ["t1", "t2", "t3"]
    assert capped.in_progress_tasks[0].done == ["2", "3", "4"]
    assert len(capped.conversation_goal) == 10
    assert len(capped.summary) == 100
    assert capped.pinned_facts == payload.pinned_facts
    assert apply_caps(capped, caps) == capped


def test_caps_deduplicate_keeping_the_newest_position() -> None:
    payload = SummaryPayload(
        decisions=["a", "b", "a", "  ", "c"], identifiers=["X12345", "Y12345", "X12345"]
    )
    capped = apply_caps(payload, PayloadCaps())
    assert capped.decisions == ["b", "a", "c"]
    assert capped.identifiers == ["Y12345", "X12345"]


def test_caps_never_split_graphemes() -> None:
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # one grapheme, five code points
    accented = "e\u0301"  # e + combining acute
    caps = PayloadCaps(item_chars=10)
    capped = apply_caps(
        SummaryPayload(stable_facts=["abcdefg" + family + "xyz", accented * 8]), caps
    )
    first, second = capped.stable_facts
    assert first == "abcdefg…"
    assert len(second) <= 10 and second.endswith("…")
    assert second[:-1] == accented * ((len(second) - 1) // 2)


def test_caps_zero_identifiers() -> None:
    capped = apply_caps(SummaryPayload(identifiers=["X12345"]), PayloadCaps(identifiers=0))
    assert capped.identifiers == []


def test_caps_order_identifiers_by_recorded_source() -> None:
    payload = SummaryPayload(
        identifiers=["K7XQ2M", "LH 716", "RES-1", "RES-2", "HAT001", "HAT002", "NEW123"],
        identifier_sources={
            "user": ["K7XQ2M", "LH 716"],
            "assistant": ["RES-1"],
            "tool": ["HAT001", "HAT002"],
            "argument": ["RES-2"],
        },
    )
    # Tool-result ids first (dropped first), then assistant and unrecorded ones (NEW123 comes
    # from a model-written merge), then what a tool call used, then what the user typed; stable
    # within a tier.
    capped = apply_caps(payload, PayloadCaps())
    assert capped.identifiers == [
        "HAT001",
        "HAT002",
        "RES-1",
        "NEW123",
        "RES-2",
        "K7XQ2M",
        "LH 716",
    ]
    small = apply_caps(payload, PayloadCaps(identifiers=3))
    assert small.identifiers == ["RES-2", "K7XQ2M", "LH 716"]
    assert small.identifier_sources == {"argument": ["RES-2"], "user": ["K7XQ2M", "LH 716"]}
    assert apply_caps(small, PayloadCaps(identifiers=3)) == small
    # Without recorded sources nothing is reordered.
    plain = SummaryPayload(identifiers=["B12345", "A12345"])
    assert apply_caps(plain, PayloadCaps()).identifiers == ["B12345", "A12345"]


def test_identifier_sources_are_bookkeeping_only() -> None:
    payload = SummaryPayload(
        summary="Trip.",
        identifiers=["K7XQ2M", "HAT001"],
        identifier_sources={"user": ["K7XQ2M"], "tool": ["HAT001"]},
    )
    # Identifiers are never listed bare: each is said inside an item that says what it is.
    assert render_payload(payload) == "Summary: Trip."
    assert render_payload(payload, "zh") == "摘要：Trip."
    # Stored and read back (the summary record is JSON).
    assert SummaryPayload.model_validate(payload.model_dump(mode="json")) == payload
    # A damaged field never makes a payload unreadable: unknown sources and non-strings go.
    damaged = SummaryPayload.model_validate(
        {
            "identifiers": ["K7XQ2M"],
            "identifier_sources": {"user": ["K7XQ2M", 3, "", "K7XQ2M"], "robot": ["X"], "tool": 9},
        }
    )
    assert damaged.identifier_sources == {"user": ["K7XQ2M"]}
    assert SummaryPayload.model_validate({"identifier_sources": "user"}).identifier_sources == {}
    # A model's answer never sets it.
    answer = {"summary": "S", "identifiers": ["X12345"], "identifier_sources": {"user": ["X"]}}
    parsed = parse_summary_output(json.dumps(answer))
    assert parsed is not None and parsed.identifier_sources == {}


def test_fit_and_plain_text_keep_the_sources_of_the_identifiers_they_keep() -> None:
    payload = SummaryPayload(
        summary="A long summary line about the trip. " * 10,
        identifiers=[f"HAT{i:03d}" for i in range(20)] + ["K7XQ2M"],
        identifier_sources={"tool": [f"HAT{i:03d}" for i in range(20)], "user": ["K7XQ2M"]},
    )
    fitted = fit_to_budget(payload, 10, by_thirds)
    # The list is bookkeeping, never rendered, so it costs the budget nothing: the summary is
    # cut and every identifier stays, with its source.
    assert fitted.identifiers == payload.identifiers and len(fitted.summary) < 40
    kept = set(fitted.identifiers)
    assert {i for ids in fitted.identifier_sources.values() for i in ids} == kept
    assert fitted.identifier_sources["user"] == ["K7XQ2M"]
    text = "Trip planned: K7XQ2M, " + ", ".join(payload.identifiers[:-1]) + " and LH 716."
    from_text = payload_from_text(text, payload)
    assert from_text.identifiers[-1] == "LH 716"
    assert from_text.identifier_sources == payload.identifier_sources  # LH 716: unrecorded


def test_summary_cap_drops_oldest_lines_first() -> None:
    summary = "\n".join(f"line {i} " + "x" * 40 for i in range(10))
    capped = apply_caps(SummaryPayload(summary=summary), PayloadCaps(summary_chars=100))
    assert len(capped.summary) <= 100
    assert capped.summary.endswith("line 9 " + "x" * 40)


# --- rendering --------------------------------------------------------------------------------


def full_payload() -> SummaryPayload:
    return SummaryPayload(
        summary="The user is rebooking a trip.",
        conversation_goal="Fly JFK to SEA",
        stable_facts=["Gold member"],
        user_profile=["Prefers aisle seats"],
        decisions=["Booked HAT136"],
        open_questions=["Is insurance needed?"],
        in_progress_tasks=[InProgressTask(goal="Rebook", done=["searched"], todo=["pay"])],
        timeline=[
            TimelineEvent(when="2024-05-20", event="flight booked"),
            TimelineEvent(event="seat changed"),
        ],
        retrieval_hints=["baggage", "refund"],
        identifiers=["mia_li_3668", "HAT136"],
        pinned_facts=["Never book red-eye flights"],
    )


def test_render_english() -> None:
    text = render_payload(full_payload())
    assert text.splitlines() == [
        "Goal: Fly JFK to SEA",
        "Summary: The user is rebooking a trip.",
        "Pinned facts:",
        "- Never book red-eye flights",
        "User profile:",
        "- Prefers aisle seats",
        "Facts:",
        "- Gold member",
        "Decisions:",
        "- Booked HAT136",
        "In progress:",
        "- Rebook (done: searched) (to do: pay)",
        "Open questions:",
        "- Is insurance needed?",
        "Timeline:",
        "- [2024-05-20] flight booked",
        "- seat changed",
        # No line of bare identifiers: mia_li_3668 is bookkeeping until an item says it.
        "Keywords: baggage, refund",
    ]


def test_render_never_lists_identifiers_bare() -> None:
    payload = SummaryPayload(
        conversation_goal="Refund order K7XQ2M",
        identifiers=["K7XQ2M", "certificate_7504069", "HAT136", "2024-05-04T06:04:48"],
    )
    text = render_payload(payload)
    assert text == "Goal: Refund order K7XQ2M"
    for name in ("Identifiers", "标识符"):
        assert name not in text and name not in render_payload(payload, "zh")


def test_render_chinese_and_only_non_empty_sections() -> None:
    text = render_payload(
        SummaryPayload(summary="摘要内容", identifiers=["A12345", "B12345"]), "zh"
    )
    assert text == "摘要：摘要内容"
    assert "目标" in render_payload(full_payload(), "zh-CN")
    assert render_payload(SummaryPayload()) == ""
    assert render_payload(SummaryPayload(summary="line 1\nline 2")) == "Summary:\nline 1\nline 2"


# --- fit_to_budget ----------------------------------------------------------------------------


def test_fit_returns_the_payload_when_it_fits_with_one_count() -> None:
    calls: list[str] = []

    def counter(text: str) -> int:
        calls.append(text)
        return by_thirds(text)

    payload = full_payload()
    assert fit_to_budget(payload, 10_000, counter) == payload
    assert len(calls) == 1


def test_fit_sacrifices_keywords_first_and_identifiers_last() -> None:
    payload = full_payload()
    full = by_thirds(render_payload(payload))
    fitted = fit_to_budget(payload, full - 3, by_thirds)
    assert fitted.retrieval_hints == ["refund"] or fitted.retrieval_hints == []
    assert fitted.identifiers == payload.identifiers
    assert fitted.pinned_facts == payload.pinned_facts
    assert by_thirds(render_payload(fitted)) <= full - 3

    tight = by_thirds(
        render_payload(
            SummaryPayload(identifiers=payload.identifiers, pinned_facts=payload.pinned_facts)
        )
    )
    fitted = fit_to_budget(payload, tight, by_thirds)
    assert fitted.identifiers == payload.identifiers
    assert fitted.pinned_facts == payload.pinned_facts
    assert fitted.retrieval_hints == [] and fitted.timeline == [] and fitted.summary == ""


def test_fit_cuts_pinned_facts_only_as_the_last_resort() -> None:
    payload = SummaryPayload(
        identifiers=["X12345"], pinned_facts=["first pinned fact", "second pinned fact"]
    )
    fitted = fit_to_budget(payload, by_thirds("Pinned facts:\n- first pinned fact"), by_thirds)
    assert fitted.pinned_facts == ["first pinned fact"]
    assert fitted.identifiers == []


def test_fit_returns_empty_when_nothing_fits() -> None:
    assert fit_to_budget(full_payload(), 0, by_thirds) == SummaryPayload()


def test_fit_uses_few_counts_on_a_large_payload() -> None:
    counter = CountingByThirds()
    payload = SummaryPayload(
        summary="\n".join(f"Summary line {i} about the trip and the bags." for i in range(30)),
        conversation_goal="g" * 120,
        stable_facts=[f"fact {i}" for i in range(6)],
        decisions=[f"decision {i}" for i in range(6)],
        timeline=[TimelineEvent(when=f"2024-05-{i:02d}", event=f"event {i}") for i in range(1, 13)],
        retrieval_hints=[f"hint{i}" for i in range(6)],
        identifiers=[f"ID{i:06d}" for i in range(40)],
        pinned_facts=["pinned"],
    )
    for budget in (50, 150, 300, 500):
        counter.calls = 0
        fitted = fit_to_budget(payload, budget, counter)
        assert by_thirds(render_payload(fitted)) <= budget
        assert counter.calls <= 12


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
payloads = st.builds(
    SummaryPayload,
    summary=st.text(max_size=400),
    conversation_goal=texts,
    stable_facts=st.lists(texts, max_size=8),
    user_profile=st.lists(texts, max_size=8),
    decisions=st.lists(texts, max_size=8),
    open_questions=st.lists(texts, max_size=8),
    in_progress_tasks=st.lists(
        st.builds(
            InProgressTask,
            goal=texts,
            done=st.lists(texts, max_size=4),
            todo=st.lists(texts, max_size=4),
        ),
        max_size=4,
    ),
    timeline=st.lists(st.builds(TimelineEvent, when=texts, event=texts), max_size=14),
    retrieval_hints=st.lists(texts, max_size=8),
    identifiers=st.lists(st.from_regex(r"[A-Za-z0-9_]{5,20}", fullmatch=True), max_size=45),
    pinned_facts=st.lists(texts, max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payload=payloads,
    budget=st.integers(min_value=0, max_value=600),
    lang=st.sampled_from(["en", "zh"]),
)
def test_fit_always_fits(payload: SummaryPayload, budget: int, lang: str) -> None:
    fitted = fit_to_budget(payload, budget, by_thirds, lang)
    if budget >= by_thirds(""):
        assert by_thirds(render_payload(fitted, lang)) <= budget
    else:
        assert fitted == SummaryPayload()
    # Nothing invented: every kept list item and identifier was in the input.
    assert set(fitted.identifiers) <= set(payload.identifiers)
    assert set(fitted.pinned_facts) <= set(payload.pinned_facts)
    assert set(fitted.retrieval_hints) <= set(payload.retrieval_hints)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payload=payloads,
    budgets=st.lists(st.integers(min_value=0, max_value=600), min_size=1, max_size=8),
    lang=st.sampled_from(["en", "zh"]),
)
def test_one_fitter_at_many_budgets_gives_what_a_fresh_fit_gives(
    payload: SummaryPayload, budgets: list[int], lang: str
) -> None:
    """The renderings a fitter keeps from earlier budgets never change a later budget's answer
    (a counter by length shrinks with the candidates, as tokens do), and it keeps no part of
    the caller's payload."""
    before = payload.model_copy(deep=True)
    fitter = PayloadFitter(payload, by_thirds, lang)
    for budget in budgets:
        fitted, text = fitter.fit(budget)
        assert fitted == fit_to_budget(payload, budget, by_thirds, lang)
        assert text == (render_payload(fitted, lang) if fitted != SummaryPayload() else "")
    assert fitter.rendering() == render_payload(payload, lang)
    payload.pinned_facts.append("changed after")
    assert fitter.fit(10_000)[0] == before


def test_a_fitter_renders_few_candidates_for_a_budget_near_an_earlier_one() -> None:
    """A prompt near the window's edge asks for a slightly smaller block at each call: after the
    first budget's search, each next one renders and counts a candidate or two, not a whole
    binary search."""
    counter = CountingByThirds()
    payload = SummaryPayload(
        summary="\n".join(f"Summary line {i} about the trip and the bags." for i in range(30)),
        stable_facts=[f"fact {i}" for i in range(6)],
        timeline=[TimelineEvent(when=f"2024-05-{i:02d}", event=f"event {i}") for i in range(1, 13)],
        identifiers=[f"ID{i:06d}" for i in range(40)],
    )
    fitter = PayloadFitter(payload, counter)
    first = counter.calls
    fitter.fit(400)
    fresh = counter.calls - first
    assert fresh >= 6
    later = []
    for budget in range(399, 360, -3):
        counter.calls = 0
        fitted, _ = fitter.fit(budget)
        assert fitted == fit_to_budget(payload, budget, by_thirds)
        later.append(counter.calls)
    assert sum(later) <= len(later) * 3, later
    assert sum(later) < fresh * len(later) / 2


@settings(max_examples=100, deadline=None)
@given(payload=payloads)
def test_caps_hold_for_any_payload(payload: SummaryPayload) -> None:
    caps = PayloadCaps(
        list_items=3,
        item_chars=12,
        timeline_items=4,
        identifiers=5,
        goal_chars=15,
        summary_chars=100,
    )
    capped = apply_caps(payload, caps)
    for name in ("stable_facts", "user_profile", "decisions", "open_questions", "retrieval_hints"):
        items = getattr(capped, name)
        assert len(items) <= 3 and all(len(i) <= 12 for i in items)
    assert len(capped.timeline) <= 4 and len(capped.in_progress_tasks) <= 3
    assert len(capped.identifiers) <= 5 and all(
        i in payload.identifiers for i in capped.identifiers
    )
    assert len(capped.conversation_goal) <= 15 and len(capped.summary) <= 100
    assert capped.pinned_facts == payload.pinned_facts
    assert apply_caps(capped, caps) == capped


@st.composite
def sourced_payloads(draw: st.DrawFn) -> SummaryPayload:
    code = st.from_regex(r"[A-Z]{2}[0-9]{3}", fullmatch=True)
    identifiers = draw(st.lists(code, max_size=45))
    pool = st.sampled_from(identifiers) if identifiers else code
    sources = draw(
        st.dictionaries(
            st.sampled_from(["user", "argument", "assistant", "tool"]),
            st.lists(st.one_of(pool, code), max_size=20),
        )
    )
    return SummaryPayload(
        summary=draw(st.text(max_size=200)), identifiers=identifiers, identifier_sources=sources
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=sourced_payloads(), budget=st.integers(min_value=0, max_value=200))
def test_sources_only_ever_name_kept_identifiers(payload: SummaryPayload, budget: int) -> None:
    capped = apply_caps(payload, PayloadCaps(identifiers=7))
    fitted = fit_to_budget(capped, budget, by_thirds)
    for result in (capped, fitted):
        named = [i for ids in result.identifier_sources.values() for i in ids]
        assert len(named) == len(set(named)) and set(named) <= set(result.identifiers)
    # What the user typed or a tool call used is dropped last.
    typed = set(payload.identifier_sources.get("user", [])) | set(
        payload.identifier_sources.get("argument", [])
    )
    if any(i in typed for i in payload.identifiers):
        assert capped.identifiers[-1] in typed
        assert set(capped.identifiers) <= typed or typed & set(payload.identifiers) <= set(
            capped.identifiers
        )
    assert apply_caps(capped, PayloadCaps(identifiers=7)) == capped


def test_an_identifier_inside_a_longer_code_of_the_text_is_still_listed() -> None:
    from plugin_memory_summary.record.fitting import says, unsaid_identifiers

    said = "Booked flight HAT136 with certificate_7504069; ref K7XQ2M."
    assert unsaid_identifiers(["HAT13", "HAT136", "7504069", "K7XQ2M", "XQ2"], said) == [
        "HAT13",
        "XQ2",
    ]
    assert says("(LH 716)", "LH 716") and not says("LH 7160", "LH 716")
    assert says("see ~/code/tripplanner.", "~/code/tripplanner")
