"""The one text cutter, in both of its marker modes: the transcript's (marker past the limit) and
the payload's (marker within the limit). The transcript mode's own cases are in test_render.py."""

from __future__ import annotations

import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st

from plugin_memory_summary.base.config import PayloadCaps
from plugin_memory_summary.base.text import collapse_whitespace, cut_text
from plugin_memory_summary.record.fitting import apply_caps, render_payload
from plugin_memory_summary.record.summary_model import InProgressTask, SummaryPayload, TimelineEvent

LONE = "lone high \ud800 in the middle"


def test_payload_mode_counts_the_marker_within_the_limit() -> None:
    assert cut_text("abcdefgh", 5, marker_counts=True) == "abcd…"
    assert cut_text("abcdefgh", 5, "[cut]", marker_counts=True) == "abcde"  # no room: no marker
    assert cut_text("abcdefgh", 8, marker_counts=True) == "abcdefgh"
    assert cut_text("中文字符测试", 4, marker_counts=True) == "中文字…"


def test_payload_mode_drops_whitespace_before_the_marker() -> None:
    assert cut_text("hello world again", 7, marker_counts=True) == "hello…"
    assert cut_text("hello world again", 7) == "hello w…"


def test_payload_mode_gives_empty_text_for_no_room_and_transcript_mode_refuses_a_negative() -> None:
    assert cut_text("abc", 0, marker_counts=True) == ""
    assert cut_text("abc", -3, marker_counts=True) == ""
    assert cut_text("abc", 0) == "…"
    try:
        cut_text("abc", -1)
    except ValueError as error:
        assert "limit must be >= 0" in str(error)
    else:
        raise AssertionError("a negative limit must raise in transcript mode")


def test_payload_mode_keeps_grapheme_clusters_whole() -> None:
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"
    assert cut_text("ab" + family + "cd", 7, marker_counts=True) == "ab…"
    assert cut_text("ab" + family + "cd", 8, marker_counts=True) == "ab" + family + "…"
    assert cut_text("cafe\u0301 ok", 5, marker_counts=True) == "caf…"


def test_payload_mode_replaces_lone_surrogates_even_when_nothing_is_cut() -> None:
    # The payload cutter used to return short text untouched and cut long text without
    # scrubbing, so a lone surrogate from a model's JSON ("\ud800") stayed unencodable.
    assert cut_text(LONE, 100, marker_counts=True) == LONE.replace("\ud800", "\ufffd")
    assert cut_text("x\ud83d\ude00", 10, marker_counts=True) == "x\U0001f600"
    for limit in range(len(LONE) + 2):
        cut_text(LONE, limit, marker_counts=True).encode("utf-8")


def test_caps_leave_no_lone_surrogate_in_a_capped_field() -> None:
    payload = SummaryPayload(
        conversation_goal="book \udc00 a flight",
        decisions=["refund \ud800 issued", "x" * 300 + "\ud800"],
        in_progress_tasks=[InProgressTask(goal="pay \ud800", done=["a\ud800"])],
        timeline=[TimelineEvent(when="May \ud800", event="booked \ud800")],
    )
    capped = apply_caps(payload, PayloadCaps())
    render_payload(capped).encode("utf-8")
    assert capped.decisions[0] == "refund \ufffd issued"


texts = st.text(alphabet=st.characters(blacklist_categories=()), max_size=60) | st.sampled_from(
    [LONE, "ab\U0001f468\u200d\U0001f469\u200d\U0001f467cd  e", "cafe\u0301 \u00e9t\u00e9"]
)


@given(text=texts, limit=st.integers(min_value=0, max_value=70), counts=st.booleans())
def test_a_cut_is_bounded_encodable_and_a_grapheme_prefix(
    text: str, limit: int, counts: bool
) -> None:
    cut = cut_text(text, limit, marker_counts=counts)
    cut.encode("utf-8")
    assert len(cut) <= (limit if counts else limit + 1)
    scrubbed = cut_text(text, len(text) * 2 + 2)  # nothing cut: only scrubbed
    if cut == scrubbed:
        return
    head = cut.removesuffix("…")
    assert scrubbed.startswith(head)
    # The cut ends on a cluster boundary of the scrubbed text: no cluster is split.
    clusters = regex.findall(r"\X", head)
    assert clusters == regex.findall(r"\X", scrubbed)[: len(clusters)]
    if counts:
        assert head == head.rstrip()


def test_collapse_whitespace_puts_text_on_one_line() -> None:
    assert collapse_whitespace("  a\n b\t\tc \u2028 d  ") == "a b c d"
    assert collapse_whitespace(" \n ") == ""


def _clusters_scanned(text: str, room: int) -> int:
    """The end of the last grapheme cluster within ``room``, found by scanning every cluster."""
    end = 0
    for cluster in regex.finditer(r"\X", text):
        if cluster.end() > room:
            break
        end = cluster.end()
    return end


@given(
    st.lists(st.sampled_from(["a", " ", "\r", "\n", "\r\n", "é", "e\u0301", "👍🏽"])).map("".join),
    st.integers(min_value=0, max_value=40),
)
def test_a_cut_ends_where_a_scan_of_every_cluster_ends(text: str, room: int) -> None:
    """ASCII is cut without scanning clusters one by one (a tool result of thousands of
    characters is cut in microseconds); the end is the same as the scan's, CR LF kept whole."""
    from plugin_memory_summary.base.text import _cluster_end

    if len(text) > room:
        assert _cluster_end(text, room) == _clusters_scanned(text, room)


def test_cutting_a_long_ascii_result_does_not_scan_it_cluster_by_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from plugin_memory_summary.base import text as text_module

    def no_scan() -> None:
        raise AssertionError("scanned cluster by cluster")

    monkeypatch.setattr(text_module, "_GRAPHEME", no_scan)
    cut = cut_text('{"flights": [' + '{"id": "HAT123", "price": 120}, ' * 500, 4000)
    assert len(cut) == 4001 and cut.endswith("…")
