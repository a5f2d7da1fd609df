"""The host's token counts (``host_stub.counting``): what comes back at every model call is
counted once while it is among the last few seen, keyed by all that the count reads; markers
are never counted."""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any

from host_stub.counting import SHOWN_COUNTS, PromptCounts, remembered
from host_stub.messages import Message
from host_stub.prompt import wire_key


class Recorder:
    """A counter that records what it was asked to count: one token per character."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, value: Any) -> int:
        self.calls.append(value)
        if isinstance(value, str):
            return len(value)
        return sum(len(str(m["content"] if isinstance(m, dict) else m.content)) for m in value)


def tool_result(seq: int, text: str) -> Message:
    return Message(role="tool", content=text, tool_call_id=f"call-{seq}", seq=seq)


def test_remembered_counts_once_and_drops_the_least_recently_used() -> None:
    cache: OrderedDict[Any, int] = OrderedDict()
    asked: list[str] = []

    def count(key: str) -> int:
        asked.append(key)
        return len(key)

    for key in ["a", "bb", "a", "ccc"]:  # "a" used again: "bb" is the oldest when "ccc" comes
        remembered(cache, key, 2, partial(count, key))
    assert asked == ["a", "bb", "ccc"]
    assert list(cache) == ["a", "ccc"]
    remembered(cache, "bb", 2, lambda: count("bb"))
    assert asked[-1] == "bb"  # forgotten: counted again


def test_a_marker_is_never_counted() -> None:
    recorder = Recorder()
    counts = PromptCounts(recorder)
    marker = Message(role="system", content="compressed", kind="event-marker")
    assert counts.message(marker) == 0
    assert recorder.calls == []


def test_a_shown_replacement_is_counted_once_per_session_and_text() -> None:
    recorder = Recorder()
    counts = PromptCounts(recorder)
    shown = tool_result(7, "[tool result #7, pruned]")
    assert counts.shown("s1", shown) == len("[tool result #7, pruned]")
    assert counts.shown("s1", shown.model_copy()) == len("[tool result #7, pruned]")
    assert len(recorder.calls) == 1
    # Another session's message 7 (or this one's, forgotten and started again) is another
    # message; another text of the same message is another count.
    counts.shown("s2", shown)
    counts.shown("s1", tool_result(7, "[tool result #7, cut]"))
    assert len(recorder.calls) == 3


def test_shown_counts_stay_under_their_bound() -> None:
    counts = PromptCounts(Recorder())
    for seq in range(SHOWN_COUNTS + 10):
        counts.shown("s", tool_result(seq, "x"))
    assert len(counts._shown) == SHOWN_COUNTS


def test_a_contribution_text_is_counted_once() -> None:
    recorder = Recorder()
    counts = PromptCounts(recorder)
    for _ in range(3):
        assert counts.contribution("<summary>facts</summary>") == len("<summary>facts</summary>")
    assert recorder.calls == ["<summary>facts</summary>"]


def test_a_message_the_last_prompt_sent_keeps_its_count() -> None:
    recorder = Recorder()
    counts = PromptCounts(recorder)
    system = {"role": "system", "content": "be brief"}
    assert counts.wire_remembered(system) == len("be brief")
    assert counts.wire_remembered(dict(system)) == len("be brief")
    assert len(recorder.calls) == 1  # the same plain message: remembered
    moved = {"role": "user", "content": "hello"}
    assert counts.known_or_count(moved, {wire_key(moved): 41}) == 41
    assert len(recorder.calls) == 1  # known from the last prompt: not counted
    assert counts.known_or_count(moved, {}) == len("hello")
    assert len(recorder.calls) == 2
