"""A long tool chat (generated: customers served back to back, each looked up, one order
refunded): every action the summary keeps says what was done to what, old ones say less before
any is dropped, and with room each keeps its details."""

from __future__ import annotations

import json
import random

import pytest
import rules_fold

from host_stub.messages import Message, ToolCall, ToolCallFunction
from plugin_memory_summary.base.identifiers import reads_as_number
from plugin_memory_summary.record.fitting import render_payload
from plugin_memory_summary.record.summary_model import SummaryPayload, identifier_rank

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"


count = rules_fold.count


def code(rng: random.Random, size: int = 6) -> str:
    while True:
        text = "".join(rng.choice(ALPHABET) for _ in range(size))
        if any(c.isdigit() for c in text) and any(c.isalpha() for c in text):
            return text


def day(rng: random.Random) -> str:
    return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def stamp(rng: random.Random) -> str:
    return f"{day(rng)}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"


def call(call_id: str, name: str, **arguments: object) -> Message:
    function = ToolCallFunction(name=name, arguments=json.dumps(arguments))
    return Message(
        role="assistant", content=None, tool_calls=[ToolCall(id=call_id, function=function)]
    )


def result(call_id: str, name: str, body: object) -> Message:
    return Message(role="tool", tool_call_id=call_id, name=name, content=json.dumps(body))


def tool_chat(seed: int, customers: int) -> tuple[list[Message], list[str], list[str]]:
    """``customers`` served one after the other: the user gives an id, the agent looks the
    customer up (orders and cards as codes; a birth date, a postal code and a time stamp), opens
    one order (its items, a time stamp, a ship date) and refunds it to the first card. Returns
    the chat, the codes only a tool returned (the other orders and cards) and the identifiers
    the conversation acted on (typed by the user or used in a call)."""
    rng = random.Random(seed)
    messages: list[Message] = []
    returned: list[str] = []
    acted: list[str] = []
    for c in range(customers):
        user = f"user_{rng.randint(1_000_000, 9_999_999)}"
        orders = [code(rng) for _ in range(rng.randint(3, 5))]
        cards = [f"card_{rng.randint(1_000_000, 9_999_999)}" for _ in range(rng.randint(1, 3))]
        order = orders[0]
        profile = {
            "user_id": user,
            "dob": day(rng),
            "created_at": stamp(rng),
            "zip": str(rng.randint(10_000, 99_999)),
            "payment_methods": {card: {"id": card, "kind": "card"} for card in cards},
            "orders": orders,
        }
        details = {
            "order_id": order,
            "placed_at": stamp(rng),
            "ship_date": day(rng),
            "items": [{"sku": code(rng, 8), "price": rng.randint(5, 500)} for _ in range(2)],
        }
        messages += [
            Message(
                role="user", content=f"Hello, my user id is {user}. I need help with an order."
            ),
            call(f"u{c}", "get_user", user_id=user),
            result(f"u{c}", "get_user", profile),
            call(f"o{c}", "get_order", order_id=order),
            result(f"o{c}", "get_order", details),
            Message(role="assistant", content=f"Your order {order} is on its way."),
            Message(role="user", content="Please refund it to my card."),
            call(f"r{c}", "refund", order_id=order, payment_id=cards[0]),
            result(f"r{c}", "refund", {"refund_id": code(rng, 8), "processed_at": stamp(rng)}),
            Message(role="assistant", content="The refund has been issued. Anything else?"),
            Message(role="user", content="No, thank you!"),
        ]
        returned += orders[1:] + cards[1:]
        acted += [user, order, cards[0]]
    for seq, message in enumerate(messages, start=1):
        message.seq = seq
    return messages, returned, acted


def render_text(message: Message) -> str:
    calls = [c.function.arguments for c in message.tool_calls or []]
    return "\n".join([str(message.content or ""), *calls])


def fold(messages: list[Message], budget: int, batch: int = 11) -> SummaryPayload:
    return rules_fold.fold(messages, budget, batch)


def refunds(messages: list[Message]) -> list[tuple[int, str]]:
    return [
        (m.seq or 0, json.loads(c.function.arguments)["order_id"])
        for m in messages
        for c in m.tool_calls or []
        if c.function.name == "refund"
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_refund_is_one_line_that_names_its_order_and_seq(seed: int) -> None:
    # 25 customers in 800 tokens: more than the summary holds whole; every action stays.
    messages, _, _ = tool_chat(seed, customers=25)
    text = render_payload(fold(messages, 800))
    lines = text.split("\n")
    for seq, order in refunds(messages):
        assert any(order in line and "refunded" in line and f"#{seq}" in line for line in lines)
    assert "Identifiers" not in text


@pytest.mark.parametrize("seed", [1, 2])
def test_old_actions_say_less_before_any_is_dropped(seed: int) -> None:
    # 40 customers in 500 tokens: the newest refunds keep their details, the oldest are folded
    # to what was done to what, none is lost.
    messages, _, _ = tool_chat(seed, customers=40)
    payload = fold(messages, 500)
    text = render_payload(payload)
    assert count(text) <= 500
    done = refunds(messages)
    assert all(order in text for _, order in done)
    assert [e.entity for e in payload.ledger] == [order for _, order in done]
    levels = [e.level for e in payload.ledger]
    assert levels == sorted(levels, reverse=True) and levels[0] > levels[-1]


def test_with_room_every_action_keeps_its_details_and_ids() -> None:
    messages, _, acted = tool_chat(4, customers=25)
    payload = fold(messages, 4000)
    text = render_payload(payload)
    assert {e.level for e in payload.ledger} == {0}
    # The orders refunded and the cards refunded to: each inside its action's line.
    cards = {
        json.loads(c.function.arguments)["payment_id"]
        for m in messages
        for c in m.tool_calls or []
        if c.function.name == "refund"
    }
    for line in text.split("\n"):
        if "refunded" in line:
            assert any(card in line for card in cards)
    assert all(i in text for i in acted if not i.startswith("user_"))


@pytest.mark.parametrize(
    ("identifier", "number"),
    [
        ("2024-05-20", True),
        ("05/20/2024", True),
        ("2024-05-04T06:04:48", True),
        ("2024-05-04T06:04:48Z", True),
        ("58392011", True),
        ("555-123-4567", True),
        ("HXDUBJ", False),
        ("HAT136", False),
        ("credit_card_9525117", False),
        ("RES-47133", False),
        ("v1.2.3", False),
    ],
)
def test_numbers_are_told_from_codes(identifier: str, number: bool) -> None:
    assert reads_as_number(identifier) is number


def test_a_number_only_mentioned_ranks_below_every_code() -> None:
    ranks = {
        (ident, source): identifier_rank(ident, source)
        for ident in ("2024-05-20", "HXDUBJ")
        for source in ("tool", "assistant", "argument", "user")
    }
    mentioned_numbers = [ranks["2024-05-20", s] for s in ("tool", "assistant")]
    codes = [ranks["HXDUBJ", s] for s in ("tool", "assistant", "argument", "user")]
    assert max(mentioned_numbers) < min(codes)
    # What the conversation acted on ranks by its source whatever its shape.
    assert ranks["2024-05-20", "argument"] == ranks["HXDUBJ", "argument"]
    assert ranks["2024-05-20", "user"] == ranks["HXDUBJ", "user"]
