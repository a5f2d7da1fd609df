"""The private copies every read hands out: a message cloned without pydantic's generic copy,
the same as ``model_copy``; a large metadata value parsed once and copied from then on, a new
object at every read, the remembered texts bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, PrivateAttr

from host_stub.memory import common
from host_stub.memory.common import copy_message, load_value
from host_stub.memory.inmemory import InMemoryMemory
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message, ToolCall, ToolCallFunction, clone_model

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
calls = st.builds(
    lambda i, name, extra: ToolCall(
        id=f"c{i}", function=ToolCallFunction(name=name, arguments="{}"), **extra
    ),
    st.integers(0, 9),
    st.text(min_size=1, max_size=6),
    st.dictionaries(st.sampled_from(["index", "tags"]), values, max_size=2),
)
messages = st.builds(
    Message,
    role=st.sampled_from(["user", "assistant", "tool"]),
    content=st.one_of(
        st.none(),
        st.text(max_size=20),
        st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text()}), max_size=2),
    ),
    tool_calls=st.one_of(st.none(), st.lists(calls, min_size=1, max_size=3)),
    metadata=st.dictionaries(st.text(max_size=4), values, max_size=3),
    seq=st.one_of(st.none(), st.integers(1, 99)),
)


def state(model: BaseModel) -> tuple[Any, ...]:
    return (
        type(model),
        model.__dict__,
        model.__pydantic_fields_set__,
        model.__pydantic_extra__,
        model.__pydantic_private__,
    )


@given(messages, st.dictionaries(st.sampled_from(["seq", "tokens", "metadata"]), scalars))
def test_a_clone_is_what_model_copy_gives(message: Message, update: dict[str, Any]) -> None:
    clone = clone_model(message, update)
    assert state(clone) == state(message.model_copy(update=update))
    assert clone.__dict__ is not message.__dict__
    assert clone.__pydantic_fields_set__ is not message.__pydantic_fields_set__


@given(messages)
def test_a_copied_message_shares_nothing_a_caller_can_change(message: Message) -> None:
    before = message.model_dump()
    copy = copy_message(message)
    assert copy == message and copy.model_dump() == before
    copy.metadata["new"] = 1
    if isinstance(copy.content, list) and copy.content:
        copy.content[0]["text"] = "changed"
    for call in copy.tool_calls or []:
        call.function.name = "changed"
        for extra in (call.model_extra or {}).values():
            if isinstance(extra, list):
                extra.append("changed")
    copy.seq = -1
    assert message.model_dump() == before


def test_a_clone_copies_private_attributes() -> None:
    class Noted(BaseModel):
        x: int
        _note: list[int] = PrivateAttr(default_factory=list)

    one = Noted(x=1)
    one._note.append(1)
    two = clone_model(one, {"x": 2})
    assert (two.x, two._note) == (2, [1]) and state(two) == state(one.model_copy(update={"x": 2}))
    two._note = [5]
    assert one._note == [1]


def big_record(n: int = 300) -> dict[str, Any]:
    return {
        "summary": "Goal: rebook",
        "facts": [{"id": f"RES-{i}", "text": "x" * 5} for i in range(n)],
    }


def test_a_large_value_is_parsed_once_and_a_new_object_at_every_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(common, "_parsed", common.OrderedDict())  # nothing remembered yet
    monkeypatch.setattr(common, "_parsed_chars", 0)
    text = json.dumps(big_record())
    assert len(text) >= common.PARSED_MIN_CHARS
    parses: list[int] = []
    real = common.json.loads
    monkeypatch.setattr(common.json, "loads", lambda s: parses.append(len(s)) or real(s))
    first = load_value(text)
    second, third = load_value(text), load_value(str(text))  # equal text, another object
    assert parses == [len(text)]
    assert first == second == third == big_record()
    assert first is not second and first["facts"] is not second["facts"]  # type: ignore[index]
    second["facts"][0]["id"] = "changed"  # type: ignore[index]
    assert load_value(text) == big_record()
    small = json.dumps({"a": [1]})
    load_value(small), load_value(small)
    assert parses[1:] == [len(small), len(small)]  # small texts are parsed each time


def test_the_remembered_texts_stay_under_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "PARSED_MAX_CHARS", 3 * common.PARSED_MIN_CHARS)
    monkeypatch.setattr(common, "_parsed", common.OrderedDict())
    monkeypatch.setattr(common, "_parsed_chars", 0)
    texts = [json.dumps({"n": i, "pad": "y" * common.PARSED_MIN_CHARS}) for i in range(10)]
    for text in texts:
        assert load_value(text) == json.loads(text)
    assert 0 < common._parsed_chars <= common.PARSED_MAX_CHARS
    assert list(common._parsed) == texts[-2:]  # the most recently read
    assert common._parsed_chars == sum(len(t) for t in texts[-2:])


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_large_record_read_at_every_call_is_parsed_once(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary record is read with every snapshot: parsed at the first read, each later
    read a copy a caller may change without touching the store."""
    memory: Any = (
        InMemoryMemory(token_counter=lambda m: 1)
        if backend == "memory"
        else SQLiteMemory(tmp_path / "m.db", token_counter=lambda m: 1)
    )
    try:
        record = big_record()
        await memory.append("s", [Message(role="user", content="hi")])
        await memory.save_metadata("summary", "s", record)
        parses: list[int] = []
        real = common.json.loads
        monkeypatch.setattr(common.json, "loads", lambda s: parses.append(len(s)) or real(s))
        reads = [(await memory.snapshot("s")).record for _ in range(3)]
        assert len([n for n in parses if n >= common.PARSED_MIN_CHARS]) <= 1
        assert all(r is not None and r.value == record for r in reads)
        reads[0].value["facts"].clear()  # type: ignore[union-attr]
        again = (await memory.snapshot("s")).record
        assert again is not None and again.value == record
        await memory.save_metadata("summary", "s", {**record, "summary": "Goal: refund"})
        changed = (await memory.snapshot("s")).record
        assert changed is not None and changed.value["summary"] == "Goal: refund"  # type: ignore[index]
    finally:
        await memory.close()
