"""Identifiers kept through a long tool chat (generated: customers served back to back, each
looked up, one order refunded): which ones the summary keeps when they do not all fit, and that
the budget, not a fixed count, decides how many."""

from __future__ import annotations

import json
import random

import pytest
import rules_fold

from host_stub.messages import Message, ToolCall, ToolCallFunction
from plugin_memory_summary.fitting import render_payload
from plugin_memory_summary.identifiers import extract_identifiers, reads_as_number
from plugin_memory_summary.summary_model import SummaryPayload, identifier_rank

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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_codes_a_tool_returned_outlast_its_dates_and_time_stamps(seed: int) -> None:
    # 25 customers: more identifiers than an 800-token summary holds, but not more codes.
    messages, returned, acted = tool_chat(seed, customers=25)
    text = render_payload(fold(messages, 800))
    assert [i for i in acted if i not in text] == []
    # The orders and cards only a lookup returned, of the first customer as of the last, stay:
    # birth dates, postal codes and time stamps, which lost their labels, give way first.
    assert [i for i in returned if i not in text] == []


@pytest.mark.parametrize("seed", [1, 2])
def test_no_number_a_tool_returned_is_kept_while_a_code_is_dropped(seed: int) -> None:
    # 40 customers in 500 tokens: the codes do not all fit either.
    messages, returned, acted = tool_chat(seed, customers=40)
    payload = fold(messages, 500)
    text = render_payload(payload)
    assert [i for i in acted if i not in text] == []
    assert [i for i in returned if i not in text]  # the budget forced a choice
    numbers = [i for i in payload.identifier_sources.get("tool", []) if reads_as_number(i)]
    assert numbers == []


def test_the_budget_not_a_count_decides_how_many_identifiers_stay() -> None:
    messages, _, _ = tool_chat(4, customers=25)
    everything = {i for m in messages for i in extract_identifiers(render_text(m))}
    assert len(everything) > 300
    payload = fold(messages, 4000)  # room for them all
    assert set(payload.identifiers) >= everything


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
