"""The rules engine: deterministic, idempotent, extractive, within budget, identifiers verbatim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host_stub.messages import Message, ToolCall, ToolCallFunction
from plugin_memory_summary.base.config import PayloadCaps
from plugin_memory_summary.record.fitting import render_payload
from plugin_memory_summary.record.summary_model import (
    IDENTIFIER_SOURCES,
    LedgerEntry,
    SummaryPayload,
)
from plugin_memory_summary.summarizer.rules import rules_merge

ROOT = Path(__file__).resolve().parent.parent
CAPS = PayloadCaps()


def by_thirds(text: str) -> int:
    return len(text) // 3 + 1


def call(call_id: str, name: str, **arguments: object) -> Message:
    return Message(
        role="assistant",
        content=None,
        tool_calls=[
            ToolCall(
                id=call_id, function=ToolCallFunction(name=name, arguments=json.dumps(arguments))
            )
        ],
    )


def result(call_id: str, name: str, body: object) -> Message:
    text = body if isinstance(body, str) else json.dumps(body)
    return Message(role="tool", tool_call_id=call_id, name=name, content=text)


def airline_chat() -> list[Message]:
    flights = [
        {
            "flight_number": f"HAT{n:03d}",
            "origin": "JFK",
            "destination": "SEA",
            "date": "2024-05-20",
        }
        for n in range(100, 130)
    ]
    return [
        Message(role="system", content="You are an airline agent. SECRETCODE SYS99999"),
        Message(
            role="user",
            content="Hi! I'd like to book a flight from New York to Seattle on May 20th.",
        ),
        Message(role="assistant", content="Sure. Could you please provide your user ID?"),
        Message(role="user", content="Sure, my user ID is mia_li_3668. I prefer aisle seats."),
        call("c1", "get_user_details", user_id="mia_li_3668"),
        result(
            "c1",
            "get_user_details",
            {
                "email": "mia@example.com",
                "payment_methods": {"certificate_7504069": {"amount": 250}},
            },
        ),
        call("c2", "search_direct_flight", origin="JFK", destination="SEA", date="2024-05-20"),
        result("c2", "search_direct_flight", flights),
        Message(role="assistant", content="I found flight HAT136 departing at 11:00 AM for $121."),
        Message(role="user", content="Is there a lounge at JFK? Also, does HAT136 serve meals?"),
        Message(role="assistant", content="HAT136 serves meals on board."),
        Message(role="user", content="Yes, please book HAT136 with certificate_7504069."),
        call(
            "c3",
            "book_reservation",
            user_id="mia_li_3668",
            flight="HAT136",
            payment_id="certificate_7504069",
        ),
        result("c3", "book_reservation", {"reservation_id": "ZFA04Y", "status": "ok"}),
        Message(role="assistant", content="Your reservation ZFA04Y has been booked successfully."),
        Message(role="assistant", content="marker", kind="event-marker"),
    ]


def merge(
    previous: SummaryPayload | None, messages: list[Message], **kwargs: object
) -> SummaryPayload:
    options: dict = {"budget_tokens": 2000, "count_tokens": by_thirds, "caps": CAPS, "lang": "en"}
    options.update(kwargs)
    return rules_merge(previous, messages, **options)


# --- what the engine extracts -----------------------------------------------------------------


def test_airline_chat_fields() -> None:
    payload = merge(None, airline_chat())
    # "Yes, please book ..." answers the assistant; the goal stays the user's own request.
    assert (
        payload.conversation_goal
        == "I'd like to book a flight from New York to Seattle on May 20th."
    )
    assert payload.open_questions == ["Is there a lounge at JFK?"]
    # The task in progress is what the goal still waits for; what was done is in the ledger.
    [task] = payload.in_progress_tasks
    assert task.goal == payload.conversation_goal and task.done == []
    assert task.todo == ["Is there a lounge at JFK?"]
    [booked] = payload.ledger
    assert (booked.tool, booked.kind, booked.entity) == (
        "book_reservation",
        "reservation",
        "ZFA04Y",
    )
    assert booked.owner == "user mia_li_3668" and booked.ok
    assert booked.details == ["flight=HAT136", "payment_id=certificate_7504069"]
    # What the profile look-up found, under the keys it stood under; the search, which found
    # nothing a later step used, says what it looked for.
    by_tool = {e.tool: e for e in payload.lookups}
    looked, searched = by_tool["get_user_details"], by_tool["search_direct_flight"]
    assert len(payload.lookups) == 2
    assert looked.result == ["email mia@example.com", "payment_methods certificate_7504069"]
    assert searched.result == []
    assert searched.details == ["origin=JFK", "destination=SEA", "date=2024-05-20"]
    # The record: whole sentences of both speakers, the assistant's confirmations included.
    said = {(e.speaker, e.text) for e in payload.excerpts}
    assert ("User", "I prefer aisle seats.") in said
    assert ("Assistant", "Your reservation ZFA04Y has been booked successfully.") in said
    assert ("Assistant", "I found flight HAT136 departing at 11:00 AM for $121.") in said
    assert "Record (said in the conversation; #n = message number):" in render_payload(payload)


def test_system_messages_and_markers_are_ignored() -> None:
    text = render_payload(merge(None, airline_chat()))
    assert "SECRETCODE" not in text and "SYS99999" not in text and "airline agent" not in text
    assert "marker" not in text


def test_identifiers_are_the_ones_an_item_says() -> None:
    payload = merge(None, airline_chat())
    text = render_payload(payload)
    for ident in ("mia_li_3668", "certificate_7504069", "HAT136", "ZFA04Y", "mia@example.com"):
        assert ident in payload.identifiers and ident in text
    # Only in a search's listing that no later step used: not carried.
    assert "HAT101" not in payload.identifiers and "HAT101" not in text
    assert "Identifiers" not in text


def test_a_listing_no_later_step_used_adds_nothing() -> None:
    listing = [
        call("c9", "search_onestop_flight", origin="SEA", destination="BOS"),
        result(
            "c9", "search_onestop_flight", [{"flight_number": f"HAT{n}"} for n in range(200, 260)]
        ),
    ]
    before = merge(None, airline_chat())
    later = merge(before, listing)
    assert later.lookups == before.lookups and later.ledger == before.ledger
    assert "HAT2" not in render_payload(later)
    # One a later message used is kept, under its key.
    used = [*listing, Message(role="assistant", content="HAT231 leaves at noon.")]
    [*_, found] = merge(before, used).lookups
    assert found.tool == "search_onestop_flight" and found.result == ["flight_number HAT231"]


def test_identifier_sources_record_where_each_identifier_came_from() -> None:
    payload = merge(None, airline_chat())
    sources = payload.identifier_sources
    assert {"mia_li_3668", "HAT136", "certificate_7504069"} <= set(sources["user"])
    assert "ZFA04Y" in sources["assistant"]  # a tool result, then the assistant's text
    named = [i for ids in sources.values() for i in ids]
    assert sorted(named) == sorted(payload.identifiers)
    # Bookkeeping only: the rendering is what it was without it.
    bare = payload.model_copy(update={"identifier_sources": {}})
    assert render_payload(payload) == render_payload(bare)


def test_an_identifier_no_item_says_is_not_carried_bare() -> None:
    # Nothing of the previous payload's text names K7XQ2M or OLD777 any more (a model-written
    # payload listed them): an identifier is kept only inside an item that says what it is.
    previous = SummaryPayload(
        summary="Restaurants in Kyoto.",
        identifiers=["OLD777", "K7XQ2M"],
        identifier_sources={"user": ["K7XQ2M"]},
    )
    listing = [
        call("c2", "cancel_reservation", reservation_id="RES-50001"),
        result("c2", "cancel_reservation", {"reservation_id": "RES-50001", "status": "cancelled"}),
    ]
    later = merge(previous, listing)
    assert later.identifiers == ["RES-50001"]
    assert later.identifier_sources == {"argument": ["RES-50001"]}
    assert "reservation RES-50001: cancelled #0: status=cancelled" in render_payload(later)


EARLY_IDENTIFIERS = [
    "LH 716",
    "2025-04-03",
    "K7XQ2M",
    "HG-583920",
    "RY-20417",
    "JRP-7741-0932",
    "~/code/tripplanner",
    "tripplanner/budget.py",
]


def long_trip_chat(days: int = 90) -> list[Message]:
    """A user states eight identifiers on the first day; then ``days`` rounds of restaurant
    searches (tool results listing six ids each), bookings (a restaurant id as a call argument,
    a new reservation id the assistant repeats, a fact naming the restaurant), temperature
    ranges, amounts and a constant in upper case."""
    messages = [
        Message(
            role="user",
            content="Flights are booked: LH 716 Frankfurt to Tokyo on 2025-04-03, booking "
            "reference K7XQ2M. I have a severe peanut allergy.",
        ),
        Message(role="assistant", content="Noted: LH 716 on 2025-04-03, reference K7XQ2M."),
        Message(
            role="user",
            content="Hotel confirmation HG-583920, then the ryokan, booking RY-20417. We "
            "ordered a 7-day JR Pass, order number JRP-7741-0932.",
        ),
        Message(role="assistant", content="Got it: HG-583920, RY-20417 and JRP-7741-0932."),
        Message(
            role="user",
            content="The code lives in ~/code/tripplanner; the budget logic is in "
            "tripplanner/budget.py.",
        ),
        Message(role="assistant", content="Understood, I will keep that in mind."),
    ]
    for day in range(days):
        found = [{"id": f"RST-{day:03d}{k}", "rating": 4.2} for k in range(6)]
        reservation = f"RES-{50000 + 7 * day}"
        messages += [
            Message(role="user", content=f"Find us a ramen place for evening {day} please."),
            call(f"s{day}", "search_restaurants", city="Kyoto", cuisine="ramen"),
            result(f"s{day}", "search_restaurants", {"results": found}),
            Message(role="user", content="Book the first one, 12000 yen budget."),
            call(f"b{day}", "book_restaurant", restaurant_id=found[0]["id"], time="19:00"),
            result(
                f"b{day}",
                "book_restaurant",
                {"status": "confirmed", "reservation_id": reservation, "price": 12000},
            ),
            Message(
                role="assistant",
                content=f"Booked: reservation {reservation}. {found[0]['id']} is a short walk "
                "from the station. Expect 10-22 °C; amounts use RATES.",
            ),
        ]
    return messages


def test_user_identifiers_survive_a_long_conversation_of_tool_results() -> None:
    def count(text: str) -> int:
        return len(text) // 4 + 1

    chat = long_trip_chat()
    payload: SummaryPayload | None = None
    for start in range(0, len(chat), 14):
        payload = rules_merge(
            payload, chat[start : start + 14], budget_tokens=500, count_tokens=count, caps=CAPS
        )
        text = render_payload(payload)
        assert count(text) <= 500
        if start >= 6:
            assert [i for i in EARLY_IDENTIFIERS if i not in text] == []
    assert payload is not None
    # The ids of the later turns: far more than the cap holds (90 listings of six, 90 call
    # arguments, 90 reservations the assistant repeated).
    later = {i for m in chat[6:] for i in regex.findall(r"RST-\d+|RES-\d+", m.content or "")}
    later |= {
        i
        for m in chat[6:]
        for c in m.tool_calls or []
        for i in regex.findall(r"RST-\d+", c.function.arguments)
    }
    assert payload.identifier_sources["user"] == EARLY_IDENTIFIERS
    # Amounts, temperature ranges and constants are not identifiers.
    assert not {"12000", "10-22", "RATES", "7-day"} & set(payload.identifiers)
    text = render_payload(payload)
    # The first day's ids are said in the record (the user's sentences, the assistant's echo),
    # not on a line of bare ids; every booking is still in the ledger.
    assert "Identifiers" not in text
    assert [line for line in text.split("\n") if "K7XQ2M" in line][0].startswith("- [#")
    assert all(f"RST-{day:03d}0" in text for day in range(90))


def test_failed_tool_calls_are_not_done() -> None:
    messages = [
        Message(role="user", content="Please cancel reservation ABC123 now."),
        call("c1", "cancel_reservation", reservation_id="ABC123"),
        result("c1", "cancel_reservation", "Error: reservation not found"),
    ]
    payload = merge(None, messages)
    assert all(
        not d.startswith("cancel_reservation") for t in payload.in_progress_tasks for d in t.done
    )
    assert "ABC123" in payload.identifiers


def test_questions_answered_later_are_not_open_and_previous_ones_carry() -> None:
    first = merge(
        None, [Message(role="user", content="What is the baggage allowance for economy?")]
    )
    assert first.open_questions == ["What is the baggage allowance for economy?"]
    unrelated = merge(first, [Message(role="assistant", content="Your seat is 12A.")])
    assert unrelated.open_questions == first.open_questions
    answered = merge(
        unrelated, [Message(role="assistant", content="The economy baggage allowance is one bag.")]
    )
    assert answered.open_questions == []
    assert all(not t.todo for t in answered.in_progress_tasks)


def test_goal_falls_back_to_the_previous_one() -> None:
    first = merge(None, [Message(role="user", content="I want to change my flight to Boston.")])
    assert first.conversation_goal == "I want to change my flight to Boston."
    second = merge(
        first, [Message(role="user", content="Yes."), Message(role="assistant", content="Done.")]
    )
    assert second.conversation_goal == first.conversation_goal


def test_pinned_facts_are_kept_whatever_the_budget_allows() -> None:
    previous = SummaryPayload(pinned_facts=["Never book red-eye flights."])
    payload = merge(previous, airline_chat(), budget_tokens=200)
    assert payload.pinned_facts == ["Never book red-eye flights."]
    assert by_thirds(render_payload(payload)) <= 200


def test_a_model_written_payloads_lists_stay_and_the_new_fact_goes_to_the_record() -> None:
    caps = PayloadCaps(list_items=3)
    payload = SummaryPayload(
        summary="Mia flies to Seattle.",
        stable_facts=["old fact 1", "old fact 2", "old fact 3", "old fact 4"],
    )
    messages = [Message(role="assistant", content="Flight HAT136 leaves from terminal four today.")]
    merged = merge(payload, messages, caps=caps)
    assert merged.stable_facts == ["old fact 2", "old fact 3", "old fact 4"]
    assert [e.text for e in merged.excerpts] == ["Flight HAT136 leaves from terminal four today."]
    # The model's prose is merged, not replaced: the overview line comes after it.
    assert merged.summary.split("\n")[0] == "Mia flies to Seattle."


def test_locomo_dates_and_speakers() -> None:
    messages = [
        Message(
            seq=1,
            role="user",
            content="[1:56 pm on 8 May, 2023] Caroline: I went to a support group yesterday. "
            "It was great.",
        ),
        Message(
            seq=2,
            role="assistant",
            content="[1:56 pm on 8 May, 2023] Melanie: That sounds wonderful, what did you learn?",
        ),
        Message(
            seq=3,
            role="user",
            content="[2:10 pm on 9 May, 2023] Caroline: My name is Caroline and I live in Boston. "
            "We moved there in 2020.",
        ),
    ]
    payload = merge(None, messages)
    assert {(e.seq, e.speaker, e.when, e.text) for e in payload.excerpts} == {
        (1, "Caroline", "8 May, 2023", "I went to a support group yesterday."),
        # "That sounds wonderful, what did you learn?": a question of small talk, no fact.
        (3, "Caroline", "9 May, 2023", "My name is Caroline and I live in Boston."),
        (3, "Caroline", "9 May, 2023", "We moved there in 2020."),
    }
    text = render_payload(payload)
    assert "[8 May, 2023 #1" in text and "[9 May, 2023 #3] Caroline: My name is Caroline" in text
    assert payload.summary == (
        "Messages #1-#3 summarized between Caroline, Melanie from 8 May, 2023 to 9 May, 2023."
    )


def test_chinese_conversation() -> None:
    messages = [
        Message(
            role="user", content="你好，我叫李明，我喜欢靠窗的座位。我想预订5月20日去上海的机票。"
        ),
        Message(role="user", content="行李额度是多少？"),
        Message(role="assistant", content="已为您预订航班MU5101，订单号A12345。"),
    ]
    payload = merge(None, messages, lang="zh")
    assert payload.conversation_goal == "我想预订5月20日去上海的机票。"
    assert payload.open_questions == ["行李额度是多少？"]
    assert {"MU5101", "A12345"} <= set(payload.identifiers)
    said = {(e.speaker, e.text) for e in payload.excerpts}
    assert ("助手", "已为您预订航班MU5101，订单号A12345。") in said
    assert any(speaker == "用户" and "我叫李明" in text for speaker, text in said)
    text = render_payload(payload, "zh")
    assert "目标：" in text and "对话记录" in text and payload.summary.startswith("已摘要")


def test_empty_batch_keeps_the_previous_payload() -> None:
    previous = merge(None, airline_chat())
    assert merge(previous, []) == previous
    assert merge(None, []) == SummaryPayload()


# --- properties -------------------------------------------------------------------------------


def test_deterministic_in_process() -> None:
    assert merge(None, airline_chat()) == merge(None, airline_chat())


def test_deterministic_across_hash_seeds() -> None:
    script = textwrap.dedent(
        """
        import json, sys
        sys.path.insert(0, sys.argv[1])
        from test_rules import airline_chat, by_thirds
        from plugin_memory_summary.base.config import PayloadCaps
        from plugin_memory_summary.summarizer.rules import rules_merge
        payload = None
        chat = airline_chat()
        for start in range(0, len(chat), 5):
            payload = rules_merge(payload, chat[start:start + 5], budget_tokens=300,
                                  count_tokens=by_thirds, caps=PayloadCaps(identifiers=6))
        print(payload.model_dump_json())
        """
    )
    outputs = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", script, str(ROOT / "tests")],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
            check=True,
        )
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0])["identifiers"]


def test_idempotent_on_the_same_batch() -> None:
    chat = airline_chat()
    once = merge(None, chat)
    assert merge(once, chat) == once
    small = merge(None, chat, budget_tokens=250)
    again = merge(small, chat, budget_tokens=250)
    assert by_thirds(render_payload(again)) <= 250
    assert len(render_payload(again)) <= len(render_payload(small)) + 3 * 1
    assert merge(again, chat, budget_tokens=250) == again


def test_extractive() -> None:
    """Every word of the result is a word of the messages or of the engine's own labels."""
    chat = airline_chat()
    source = " ".join(
        [m.content or "" for m in chat if isinstance(m.content, str) and m.role != "system"]
        + [c.function.name + " " + c.function.arguments for m in chat for c in m.tool_calls or []]
    )
    # The engine's own words: the overview line and the speakers' role names.
    allowed = set(regex.findall(r"\w+", source)) | {"Messages", "summarized", "between", "from"}
    allowed |= {"to", "on", "User", "Assistant", "part"}
    payload = merge(None, chat)
    allowed |= {"1", *(str(n) for e in payload.excerpts for n in (e.seq, e.to_seq, e.part))}
    dumped = payload.model_dump_json(exclude={"identifiers"})
    produced = set(regex.findall(r"\w+", dumped))
    # A word cut short by a character cap (followed by "…") need only start an allowed word.
    cut_short = {
        w for w in regex.findall(r"(\w+)…", dumped) if any(a.startswith(w) for a in allowed)
    }
    keys = set(SummaryPayload.model_fields) | {"goal", "done", "todo", "when", "event"}
    keys |= {"seq", "to_seq", "speaker", "text"}  # the keys of an excerpt
    keys |= set(IDENTIFIER_SOURCES)  # the keys of the identifier_sources bookkeeping field
    keys |= set(LedgerEntry.model_fields) | {"true", "false"}  # the keys of a ledger entry
    assert produced - allowed - keys - cut_short == set()


words = st.sampled_from(
    [
        "book",
        "flight",
        "HAT136",
        "mia_li_3668",
        "refund",
        "?",
        "yes",
        "please",
        "I want",
        "my name is",
        "booked",
        "confirmed",
        "2024-05-20",
        "我想",
        "已完成",
        "？",
        "\n",
        "certificate_7504069",
        "ZFA04Y",
    ]
)
texts = st.lists(words, min_size=0, max_size=30).map(" ".join)


@st.composite
def batches(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = []
    for i in range(draw(st.integers(min_value=0, max_value=12))):
        kind = draw(st.sampled_from(["user", "assistant", "tool-call", "system"]))
        if kind == "tool-call":
            messages.append(call(f"c{i}", "lookup", query=draw(texts)))
            messages.append(result(f"c{i}", "lookup", draw(texts)))
        else:
            messages.append(Message(role=kind, content=draw(texts)))
    return messages


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=batches(),
    second=batches(),
    budget=st.integers(min_value=1, max_value=500),
    pinned=st.lists(st.sampled_from(["keep me", "always economy"]), max_size=2, unique=True),
)
def test_budget_always_respected_and_identifiers_verbatim(
    first: list[Message], second: list[Message], budget: int, pinned: list[str]
) -> None:
    def counter(text: str) -> int:
        return len(text) // 3 + 1

    payload = rules_merge(
        SummaryPayload(pinned_facts=pinned),
        first,
        budget_tokens=budget,
        count_tokens=counter,
        caps=CAPS,
    )
    payload = rules_merge(payload, second, budget_tokens=budget, count_tokens=counter, caps=CAPS)
    assert counter(render_payload(payload)) <= budget
    source = " ".join(
        (m.content or "") + " ".join(c.function.arguments for c in m.tool_calls or [])
        for m in first + second
        if isinstance(m.content, str | None)
    )
    assert all(ident in source for ident in payload.identifiers)
    if counter(render_payload(SummaryPayload(pinned_facts=pinned))) <= budget:
        assert payload.pinned_facts == pinned


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(previous_batch=batches(), batch=batches())
def test_idempotent_for_any_batch(previous_batch: list[Message], batch: list[Message]) -> None:
    previous = merge(None, previous_batch, budget_tokens=100_000)
    once = merge(previous, batch, budget_tokens=100_000)
    assert merge(once, batch, budget_tokens=100_000) == once
