"""Search ranking (issue 33, point 17), on every backend: a message's own terms rank above those
lent to it by the message before; all the query's terms, or its phrase, above one of them; what
a user said above a tool's arguments or results that mention the words. The conversations are
built here, short and realistic; ``host_stub.memory.search_plan.rank`` decides the order on
every store, so each gives the same answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_memory_contract import (
    BACKENDS,
    CLEANUP,
    REDIS_URL,
    count_tokens,
    redis_drop_now,
    redis_url,
)

from host_stub.memory import InMemoryMemory, open_memory, search_plan
from host_stub.messages import Message, ToolCall, ToolCallFunction
from host_stub.services import MemoryService


@pytest.fixture(params=sorted(BACKENDS))
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryService]:
    url = BACKENDS[request.param](tmp_path)
    store = open_memory(url, count_tokens)
    try:
        yield store
    finally:
        await store.close()
        if request.param in CLEANUP:
            await CLEANUP[request.param](url)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


def call(call_id: str, name: str, **arguments: object) -> Message:
    function = ToolCallFunction(name=name, arguments=json.dumps(arguments))
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, function=function)])


def result(call_id: str, name: str, value: object) -> Message:
    return Message(role="tool", tool_call_id=call_id, name=name, content=json.dumps(value))


#: A trip-planning chat: the user states an allergy once; the assistant and the tools repeat its
#: words many times after (the restaurant search avoids peanuts, a booking carries a note).
ALLERGY = (
    "Hi! Tom and I are in Osaka from Friday to Monday and I'd like your help with the food. "
    "Important: I have a severe peanut allergy, so every place you suggest must be safe for it, "
    "and Tom does not eat fish."
)
TRIP = [
    user(ALLERGY),  # 1
    assistant("Noted: no peanuts, no fish for Tom. Where would you like to start?"),  # 2
    user("Find us a ramen place near Namba for Friday night."),  # 3
    call("c1", "search_restaurants", city="Osaka", cuisine="ramen", avoid=["peanuts"]),  # 4
    result(  # 5
        "c1",
        "search_restaurants",
        {"results": [{"name": "Kaze Ya", "allergen_info": "peanut-free kitchen"}]},
    ),
    assistant(  # 6
        "Kaze Ya looks best: a peanut-free kitchen that takes a peanut allergy seriously, and "
        "vegetarian broth for Tom. Show them your peanut allergy card anyway."
    ),
    user("Nice, thanks!"),  # 7
    user("Book it for two at seven, and tell them."),  # 8
    call(  # 9
        "c2",
        "book_restaurant",
        restaurant="Kaze Ya",
        time="19:00",
        party_size=2,
        note="peanut allergy",
    ),
    result("c2", "book_restaurant", {"reference": "RES-5521", "status": "booked"}),  # 10
    assistant("Booked: Kaze Ya at seven for two, reference RES-5521."),  # 11
]
STATEMENT, NICE, SEARCH_CALL, SEARCH_RESULT, BOOKING_CALL = 1, 7, 4, 5, 9


async def seqs(memory: MemoryService, query: str, **kwargs: object) -> list[int]:
    return [h.message.seq or 0 for h in await memory.search("s", query, **kwargs)]  # type: ignore[arg-type]


async def test_own_terms_rank_above_borrowed(memory: MemoryService) -> None:
    """'Nice, thanks!' is indexed under the words of the message before it (a peanut-free
    kitchen, a peanut allergy card): it is found, but below the message that says them."""
    await memory.append("s", TRIP)
    found = await seqs(memory, "peanut allergy", role="user")
    assert found[0] == STATEMENT
    assert found.index(STATEMENT) < found.index(NICE)


async def test_own_terms_rank_above_borrowed_beyond_the_rescore_cut(
    memory: MemoryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More messages borrow the words than are ranked in full: they all hold the same terms, so
    the estimate that picks whom to rank cannot tell them apart; the whole tie is ranked when
    it fits in RESCORE more, and the oldest message, the one that says the words, comes first."""
    monkeypatch.setattr(search_plan, "RESCORE", 4)
    chat = [user(ALLERGY)]
    for n in range(6):
        chat += [
            assistant(f"Option {n}: a peanut-free kitchen, safe for a peanut allergy."),
            user(["Nice, thanks!", "Great.", "Perfect.", "OK.", "Thanks!", "Sounds good."][n]),
        ]
    await memory.append("s", chat)
    assert (await seqs(memory, "peanut allergy", role="user", limit=3))[0] == 1


async def test_all_terms_rank_above_one(memory: MemoryService) -> None:
    """'locker code': the one message holding both words first, above the short ones that
    only say 'code' (or 'locker')."""
    await memory.append(
        "s",
        [
            user(
                "Before I forget, a few things for the week: the plants need water on "
                "Wednesday, my locker code at the climbing gym is 4417-ZEBRA, and the car is "
                "due for its inspection on the 14th."
            ),
            assistant("Noted all three."),
            user("The promo code worked!"),
            assistant("Great, that code saved you 10%."),
            user("Which code?"),
            assistant("The code SPRING10."),
            user("The gym changed the locker rooms."),
        ],
    )
    found = await seqs(memory, "locker code")
    assert found[0] == 1
    assert found.index(1) < min(found.index(seq) for seq in (3, 4, 5, 6, 7))


async def test_phrase_ranks_above_scattered(memory: MemoryService) -> None:
    """Two messages hold both words themselves: the one where they stand together, in the
    query's order, first, though the other is shorter and says 'code' twice."""
    await memory.append(
        "s",
        [
            user(
                "Remember for later: my locker code at the climbing gym is 4417-ZEBRA, and the "
                "gym opens at seven on weekdays."
            ),
            assistant("Noted."),
            user("Code 8812 opens the bike shed; locker 12 needs a code too."),
            assistant("Noted as well."),
        ],
    )
    assert (await seqs(memory, "locker code"))[:2] == [1, 3]
    # One word alone in the query: no phrase, and the shorter message holding it twice wins.
    assert (await seqs(memory, "code"))[0] == 3


async def test_user_sentence_ranks_above_tool_arguments(memory: MemoryService) -> None:
    """The booking call's note says 'peanut allergy' too, in a shorter text: a tool's arguments
    that mention the words rank below the user's own sentence holding them; the search call,
    whose arguments mention only 'peanuts', and its result rank below both."""
    await memory.append("s", TRIP)
    found = await seqs(memory, "peanut allergy", limit=20)
    assert found.index(STATEMENT) < found.index(BOOKING_CALL)
    assert found.index(BOOKING_CALL) < found.index(SEARCH_CALL)
    assert found.index(STATEMENT) < found.index(SEARCH_RESULT)
    # The assistant's own sentence with the words is a sentence too: above the tool traffic.
    assert found.index(6) < found.index(BOOKING_CALL)


def test_rank_orders_by_terms_found_own_terms_phrase_then_bm25() -> None:
    """The keys of ``search_plan.rank`` one by one, on candidates that differ in one key and
    whose BM25 alone would order them the other way."""
    from host_stub.memory.search_plan import Candidate, idf, own_matches, plan_search, rank

    plan = plan_search(["locker", "code"], [3, 9], n_docs=40, total_len=400.0)

    def order(*candidates: Candidate) -> list[int]:
        return [seq for seq, _ in rank(plan, candidates, 10)]

    # Both terms (one lent) above one term said twice in a short message.
    assert order(
        Candidate(1, [0.0, 2.0], 3.0, "code x code", False),
        Candidate(2, [1.0, 0.5], 30.0, "locker " + "x " * 28, False),
    ) == [2, 1]
    # The same terms found: the message that says both above the one they were lent to.
    assert order(
        Candidate(3, [1.0, 1.0], 2.0, "", False),
        Candidate(4, [1.0, 1.0], 30.0, "locker " + "x " * 27 + "code", False),
    ) == [4, 3]
    # The same own terms: the phrase above the words apart.
    assert order(
        Candidate(5, [2.0, 2.0], 5.0, "code locker x code locker", False),
        Candidate(6, [1.0, 1.0], 30.0, "x " * 20 + "locker code", False),
    ) == [6, 5]
    # The same again: a tool's traffic below a sentence.
    assert order(
        Candidate(7, [1.0, 1.0], 2.0, "locker code", True),
        Candidate(8, [1.0, 1.0], 20.0, "x " * 18 + "locker code", False),
    ) == [8, 7]
    # All else equal, BM25 and then the newer; the score is the summed idf of the terms found.
    got = rank(
        plan,
        [
            Candidate(9, [1.0, 1.0], 9.0, "locker code", False),
            Candidate(10, [1.0, 1.0], 9.0, "locker code", False),
            Candidate(11, [1.0, 2.0], 9.0, "locker code code", False),
            Candidate(12, [0.0, 0.0], 9.0, "", False),  # holds none: left out
        ],
        10,
    )
    assert [seq for seq, _ in got] == [11, 10, 9]
    assert [score for _, score in got] == [pytest.approx(idf(40, 3) + idf(40, 9))] * 3
    assert own_matches(["peanut", "allergi"], "sever peanut allergi") == ([0, 1], 1)
    assert own_matches(["peanut", "allergi"], "allergi peanut") == ([0, 1], 0)
    assert own_matches(["code"], "barcode codes") == ([], 0)  # whole terms only


async def test_every_store_ranks_as_the_in_memory_one(memory: MemoryService) -> None:
    """The same order and scores on every store (one ranking, in Python)."""
    reference = InMemoryMemory(count_tokens)
    for store in (memory, reference):
        await store.append("s", TRIP)
    for query in ("peanut allergy", "allergy card", "peanut", "Kaze Ya booked", "RES-5521"):
        for role in (None, "user", "assistant", "tool"):
            got = await memory.search("s", query, role=role, limit=20)
            want = await reference.search("s", query, role=role, limit=20)
            assert [h.message.seq for h in got] == [h.message.seq for h in want], (query, role)
            assert [h.score for h in got] == pytest.approx([h.score for h in want]), query
            assert all(a.score >= b.score for a, b in zip(got, got[1:], strict=False))


async def test_redis_entries_without_own_terms_are_ranked_from_their_message() -> None:
    """A Redis index written before the own terms were kept (no ``o<seq>`` fields) ranks as a
    fresh one: the search reads those messages instead."""
    import redis.asyncio as aioredis

    url = redis_url()
    prefix = url.rsplit("prefix=", 1)[1]
    store = open_memory(url, count_tokens)
    admin = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        await store.append("s", TRIP)
        want = [(h.message.seq, h.score) for h in await store.search("s", "peanut allergy")]
        kept = [f for f in await admin.hkeys(f"{prefix}xo:s") if f.startswith("o")]
        assert len(kept) == len(TRIP)
        await admin.hdel(f"{prefix}xo:s", *kept)
        got = [(h.message.seq, h.score) for h in await store.search("s", "peanut allergy")]
        assert got == want
    finally:
        await store.close()
        await admin.aclose()
        redis_drop_now(url)
