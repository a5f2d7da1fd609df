"""The action ledger: every state-changing tool call of a summarized part is one entry that says
what was done, to what, for whom, with what outcome; entries fold per entity and say less as they
age, but no action is lost; a model's answer never drops one; read-only tools leave only the
values worth keeping."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host_stub.messages import Message, ToolCall, ToolCallFunction
from host_stub.testing import FakeLLM, simple_count
from plugin_memory_summary.base.config import MemorySummaryConfig, PayloadCaps
from plugin_memory_summary.record.fitting import fit_to_budget, render_payload
from plugin_memory_summary.record.ledger_text import action_phrase, ledger_lines
from plugin_memory_summary.record.summary_model import LedgerEntry, SummaryPayload
from plugin_memory_summary.safety.redact import Redactor
from plugin_memory_summary.summarizer.ledger import is_read_only, ledger_entries
from plugin_memory_summary.summarizer.rules import rules_merge
from plugin_memory_summary.summarizer.summarize import summarize_batches


def call(call_id: str, name: str, **arguments: object) -> Message:
    function = ToolCallFunction(name=name, arguments=json.dumps(arguments))
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, function=function)])


def result(call_id: str, body: object) -> Message:
    text = body if isinstance(body, str) else json.dumps(body)
    return Message(role="tool", tool_call_id=call_id, content=text)


def numbered(messages: list[Message]) -> list[Message]:
    return [m.model_copy(update={"seq": n}) for n, m in enumerate(messages, start=1)]


def airline() -> list[Message]:
    reservation = {"reservation_id": "EUJUY6", "user_id": "lucas_brown_4047", "status": "ok"}
    return numbered(
        [
            Message(role="user", content="I'm lucas_brown_4047 and I want to fly to Boston."),
            call("g", "get_user_details", user_id="lucas_brown_4047"),
            result("g", {"payment_methods": {"credit_card_4959530": {"brand": "visa"}}}),
            call(
                "b",
                "book_reservation",
                user_id="lucas_brown_4047",
                flights=[{"flight_number": "HAT083", "date": "2024-05-17"}],
                payment_methods=[{"payment_id": "credit_card_4959530", "amount": 120}],
            ),
            result("b", reservation),
            call(
                "u",
                "update_reservation_flights",
                reservation_id="EUJUY6",
                flights=[{"flight_number": "HAT150", "date": "2024-05-18"}],
            ),
            result("u", {**reservation, "status": "ok"}),
            call("c", "cancel_reservation", reservation_id="EUJUY6"),
            result("c", {**reservation, "status": "cancelled"}),
            call("t", "transfer_to_human_agents", summary="refund question"),
            result("t", "Transfer successful"),
            call("x", "cancel_reservation", reservation_id="ZZZ999"),
            result("x", "Error: reservation ZZZ999 not found"),
        ]
    )


def test_one_entry_per_state_changing_call_with_what_for_whom_and_outcome() -> None:
    entries = [e for e in ledger_entries(airline()) if not e.read_only]
    assert [(e.seq, e.tool, e.kind, e.entity, e.ok) for e in entries] == [
        (4, "book_reservation", "reservation", "EUJUY6", True),
        (6, "update_reservation_flights", "reservation", "EUJUY6", True),
        (8, "cancel_reservation", "reservation", "EUJUY6", True),
        (10, "transfer_to_human_agents", "", "", True),
        (12, "cancel_reservation", "reservation", "ZZZ999", False),
    ]
    booked, _, cancelled, _, failed = entries
    # The booking's reservation id came from its result; whom it was for from its arguments.
    assert booked.owner == "user lucas_brown_4047"
    assert booked.details == [
        "flights=HAT083 2024-05-17",
        "payment_methods=credit_card_4959530 120",
    ]
    assert cancelled.result == ["status=cancelled"]
    assert failed.result == ["Error: reservation ZZZ999 not found"] and failed.details == []


def test_the_ledger_folds_per_entity_in_words() -> None:
    lines = ledger_lines([e for e in ledger_entries(airline()) if not e.read_only])
    assert lines == [
        "reservation EUJUY6 (user lucas_brown_4047): booked #4 (flights=HAT083 2024-05-17, "
        "payment_methods=credit_card_4959530 120): status=ok; updated flights #6 "
        "(flights=HAT150 2024-05-18): status=ok; cancelled #8: status=cancelled",
        # It names nobody: it was made for whom the conversation was serving.
        "user lucas_brown_4047: transferred to human agents #10 (summary=refund question): "
        "Transfer successful",
        "reservation ZZZ999: tried cancel_reservation #12, failed: Error: reservation ZZZ999 "
        "not found",
    ]


def test_action_phrases_come_from_the_tool_name() -> None:
    assert action_phrase("cancel_reservation", "reservation") == "cancelled"
    assert action_phrase("updateReservationFlights", "reservation") == "updated flights"
    assert action_phrase("send_certificate", "user") == "sent certificate"
    assert action_phrase("apply_discount") == "applied discount"
    # A name that does not start with a verb is said as it is.
    assert action_phrase("reservation_cancel") == "reservation_cancel"


def test_read_only_tools_are_configurable() -> None:
    assert is_read_only("get_user_details", ["get"])
    assert is_read_only("searchFlights", ["search"])
    assert not is_read_only("cancel_reservation", ["get"])
    assert is_read_only("cancel_reservation", ["get", "cancel_reservation"])
    chat = airline()
    config = MemorySummaryConfig(read_only_tools=["get", "transfer_to_human_agents"])
    payload = rules_merge(
        None,
        chat,
        budget_tokens=2000,
        count_tokens=simple_count,
        caps=PayloadCaps(),
        read_only_tools=config.read_only_tools,
    )
    assert "transfer_to_human_agents" not in {e.tool for e in payload.ledger}


def test_a_lookup_keeps_what_a_record_holds_and_what_a_later_step_used() -> None:
    lookups = [e for e in ledger_entries(airline()) if e.read_only]
    [profile] = lookups
    assert profile.result == ["payment_methods credit_card_4959530"]
    # A listing keeps only the values a later step used.
    listing = numbered(
        [
            call("s", "search_flights", origin="JFK", date="2024-05-20"),
            result("s", [{"flight_number": f"HAT{n}"} for n in range(100, 140)]),
            Message(role="user", content="HAT123 please."),
        ]
    )
    [found] = ledger_entries(listing)
    assert found.result == ["flight_number HAT123"]
    assert found.details == ["origin=JFK", "date=2024-05-20"]


def test_old_actions_say_less_and_are_never_lost_to_the_budget() -> None:
    entries = [
        LedgerEntry(
            seq=n,
            tool="cancel_order",
            kind="order",
            entity=f"ORD{n:04d}X",
            owner=f"customer cust_{n:05d}",
            details=[f"reason=duplicate order placed by mistake number {n}"],
            brief=[],
            result=["status=cancelled"],
        )
        for n in range(1, 41)
    ]
    payload = SummaryPayload(summary="Orders.", ledger=entries)
    full = simple_count(render_payload(payload))
    for budget in (full // 2, full // 3, full // 5):
        fitted = fit_to_budget(payload, budget, simple_count)
        text = render_payload(fitted)
        assert simple_count(text) <= budget
        assert all(f"ORD{n:04d}X" in text for n in range(1, 41)), budget
        levels = [e.level for e in fitted.ledger]
        assert levels == sorted(levels, reverse=True)  # the oldest say least
        # The entries keep their details: a later merge with room says them again.
        assert all(e.details for e in fitted.ledger)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    actions=st.lists(
        st.tuples(
            st.sampled_from(["cancel_order", "refund_order", "update_order_address"]),
            st.integers(0, 30),
            st.booleans(),
        ),
        min_size=1,
        max_size=30,
    ),
    pairs=st.integers(1, 6),
)
def test_folding_batches_never_drops_or_repeats_an_action(
    actions: list[tuple[str, int, bool]], pairs: int
) -> None:
    messages: list[Message] = []
    for n, (tool, order, ok) in enumerate(actions):
        messages.append(call(f"c{n}", tool, order_id=f"ORD{order:03d}X"))
        messages.append(result(f"c{n}", {"status": "done"} if ok else "Error: not allowed"))
    messages = numbered(messages)
    payload: SummaryPayload | None = None
    # Parts cut as the pipeline cuts: a call and its result on one side.
    for start in range(0, len(messages), 2 * pairs):
        part = messages[start : start + 2 * pairs]
        payload = rules_merge(
            payload, part, budget_tokens=4000, count_tokens=simple_count, caps=PayloadCaps()
        )
        # The same part merged again adds nothing.
        assert (
            rules_merge(
                payload, part, budget_tokens=4000, count_tokens=simple_count, caps=PayloadCaps()
            ).ledger
            == payload.ledger
        )
    assert payload is not None
    said = [(e.seq, e.tool, e.entity) for e in payload.ledger]
    calls = [m for m in messages if m.tool_calls]
    # Every call is an entry, once, in order.
    expected = [
        (
            m.seq,
            m.tool_calls[0].function.name,
            json.loads(m.tool_calls[0].function.arguments)["order_id"],
        )
        for m in calls
    ]
    assert said == expected


def with_whole_records(messages: list[Message]) -> list[Message]:
    """``messages`` with every JSON tool result as large as a real API's (a whole record)."""
    out = []
    for m in messages:
        if m.role == "tool" and str(m.content).startswith("{"):
            body = json.loads(str(m.content))
            body["history"] = [{"event": f"update {n}", "by": "agent"} for n in range(30)]
            m = m.model_copy(update={"content": json.dumps(body)})
        out.append(m)
    return out


async def test_a_model_answer_that_drops_the_ledger_gets_it_back() -> None:
    # The model writes prose and forgets every action; the code keeps the ledger.
    answer = json.dumps({"summary": "The user wants to fly to Boston."})
    outcome = await summarize_batches(
        None,
        [with_whole_records(airline())],
        llm=FakeLLM(answer),
        model="fake/summarizer",
        config=MemorySummaryConfig(),
        budget=2000,
        lang="en",
        redactor=Redactor(),
        count_tokens=simple_count,
    )
    assert outcome.model_batches == 1
    text = render_payload(outcome.payload)
    assert "The user wants to fly to Boston" in text
    assert "reservation EUJUY6 (user lucas_brown_4047): booked #4" in text
    assert "cancelled #8: status=cancelled" in text
