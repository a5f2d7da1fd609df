"""What a compression reads again is not computed again: secret scrubbing, identifiers and
content keys of a text are remembered (short texts, bounded), answers are the same as computed
anew and a caller's change to one never reaches the next; a payload copy shares nothing a
caller could change."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugin_memory_summary.base import identifiers
from plugin_memory_summary.base.memo import MAX_CHARS, remembered
from plugin_memory_summary.record.summary_model import (
    Excerpt,
    InProgressTask,
    SummaryPayload,
    TimelineEvent,
    copy_payload,
)
from plugin_memory_summary.safety.redact import Redactor
from plugin_memory_summary.summarizer import excerpts


def test_a_short_text_is_computed_once_a_long_one_every_time() -> None:
    calls: list[str] = []

    def upper(text: str) -> str:
        calls.append(text)
        return text.upper()

    fn = remembered(upper, maxsize=2)
    assert [fn("ab"), fn("ab"), fn("cd")] == ["AB", "AB", "CD"]
    assert calls == ["ab", "cd"]
    long = "x" * (MAX_CHARS + 1)
    fn(long)
    fn(long)
    assert calls[2:] == [long, long]  # never kept: the memory stays bounded
    fn("ef")
    fn("gh")
    fn("ab")  # pushed out by two newer texts: computed again
    assert calls[-1] == "ab"


def test_an_exception_is_not_remembered() -> None:
    calls: list[str] = []

    def fails_once(text: str) -> str:
        calls.append(text)
        if len(calls) == 1:
            raise TimeoutError(text)
        return text

    fn = remembered(fails_once)
    try:
        fn("t")
    except TimeoutError:
        pass
    assert fn("t") == "t" and calls == ["t", "t"]


def test_remembered_answers_are_the_callers_to_change() -> None:
    text = "Booking RES-47133 for flight HAT136 on 2024-05-20, Mia Li in Tromso."
    first = identifiers.extract_identifiers(text)
    first.append("changed")
    assert identifiers.extract_identifiers(text) == first[:-1]
    keys = excerpts.content_keys(text)
    keys["changed"] = 9.0
    assert "changed" not in excerpts.content_keys(text)


def test_each_redactor_remembers_its_own_answers() -> None:
    text = "ticket T-1234-ABCD and key sk-abcdefghijklmnopqrstuvwxyz123456"
    plain, custom = Redactor(), Redactor([r"T-\d{4}-[A-Z]{4}"])
    assert "T-1234-ABCD" in plain.redact(text)
    assert "T-1234-ABCD" not in custom.redact(text)
    assert "T-1234-ABCD" in plain.redact(text)  # the other instance's answer is not shared


_texts = st.text(max_size=80) | st.text(alphabet="ab01-_ ", max_size=30)


@given(text=_texts)
def test_a_remembered_answer_is_the_one_computed_anew(text: str) -> None:
    once = identifiers.extract_identifiers(text)
    assert identifiers.extract_identifiers(text) == once
    assert identifiers.extract_identifiers(text + " " + "x" * MAX_CHARS)[: len(once)] == once
    redactor = Redactor()
    assert redactor.redact(text) == redactor.redact(text) == Redactor().redact(text)


def test_a_payload_copy_shares_nothing_a_caller_can_change() -> None:
    payload = SummaryPayload(
        summary="s",
        stable_facts=["a"],
        in_progress_tasks=[InProgressTask(goal="g", done=["d"], todo=["t"])],
        timeline=[TimelineEvent(when="w", event="e")],
        excerpts=[Excerpt(seq=1, text="x")],
        identifiers=["RES-1"],
        identifier_sources={"user": ["RES-1"]},
    )
    before = payload.model_dump()
    copy = copy_payload(payload)
    assert copy == payload
    copy.stable_facts.append("b")
    copy.in_progress_tasks[0].done.append("e")
    copy.in_progress_tasks[0].goal = "other"
    copy.timeline[0].event = "other"
    copy.excerpts[0].text = "other"
    copy.identifier_sources["user"].append("RES-2")
    copy.identifier_sources["tool"] = []
    assert payload.model_dump() == before


def test_a_text_seen_again_is_not_scanned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scrubbing, identifiers and content keys of a short text each run once: the second
    compression that reads the text gets the answers without running the patterns again."""
    from plugin_memory_summary.safety import redact

    text = "Booking RES-90210 confirmed for flight ZX481 on 2031-04-02, seat 14C."
    scans: list[str] = []
    real_scan = identifiers._scan  # noqa: SLF001
    monkeypatch.setattr(identifiers, "_scan", lambda t, *a: scans.append(t) or real_scan(t, *a))
    assert identifiers.extract_identifiers(text) == identifiers.extract_identifiers(text)
    assert scans == [text]

    looked: list[str] = []
    real_ids = excerpts.extract_identifiers
    monkeypatch.setattr(excerpts, "extract_identifiers", lambda t: looked.append(t) or real_ids(t))
    assert excerpts.content_keys(text + " again") == excerpts.content_keys(text + " again")
    assert looked == [text + " again"]

    hints: list[str] = []
    real_hint = redact.may_match
    monkeypatch.setattr(redact, "may_match", lambda n, t, f: hints.append(n) or real_hint(n, t, f))
    redactor = Redactor()
    assert redactor.redact(text) == redactor.redact(text)
    checked = len(hints)
    assert checked > 0
    redactor.redact(text)
    assert len(hints) == checked
