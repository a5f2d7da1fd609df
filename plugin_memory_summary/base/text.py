"""Cutting text to a length, and squeezing it onto one line.

One cutter serves the transcript (what the summarizer reads) and the payload (what a cap bounds).
Both count code points, end on a grapheme-cluster boundary (never half an emoji, a base letter
without its accent, or a flag split in two) and replace lone surrogates first, so a result is
always encodable as UTF-8. They differ only in how the marker that flags a cut is accounted for.
"""

from __future__ import annotations

from host_stub.messages import scrub_surrogates

from .patterns import lazy_regex

__all__ = ["ELLIPSIS", "collapse_whitespace", "cut_middle", "cut_text", "sentences"]

#: The marker appended to cut text.
ELLIPSIS = "…"

_GRAPHEME = lazy_regex(r"\X")


def collapse_whitespace(text: str) -> str:
    """``text`` on one line: every run of whitespace (line breaks included) becomes one space,
    none at either end."""
    return " ".join(text.split())


def cut_text(text: str, limit: int, marker: str = ELLIPSIS, *, marker_counts: bool = False) -> str:
    """``text`` cut to ``limit`` code points, ending on a grapheme-cluster boundary; ``marker`` is
    appended only when something was cut. A grapheme cluster that does not fit is dropped whole
    rather than split. Lone surrogates are replaced with U+FFFD first (a pair written as two code
    points is joined), so the result is always encodable as UTF-8.

    ``marker_counts=False`` (the transcript): the marker is *not* counted in ``limit``, so the
    result holds at most ``limit + len(marker)`` code points; a negative ``limit`` is an error.

    ``marker_counts=True`` (payload fields, which a cap bounds): the whole result, marker included,
    holds at most ``limit`` code points; whitespace left before the marker is dropped; a marker
    that would leave no room (``limit <= len(marker)``) is left out; ``limit <= 0`` gives ``""``;
    and the cut falls between words where it can (a word cut in half, "Bosto…", reads as a
    different word): back to the last space when that keeps at least 60% of the room.
    """
    if marker_counts:
        if limit <= 0:
            return ""
    elif limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    # Only a head is looked at, so cutting a 10 MB tool result costs what cutting 200 chars does.
    # Scrubbing joins at most every other code point, so the head still holds more than ``limit``
    # code points afterwards; a pair split by the slice lands past the cut.
    text = scrub_surrogates(text[: 2 * limit + 2])
    if len(text) <= limit:
        return text
    room = limit
    if marker_counts:
        if limit <= len(marker):
            marker = ""
        room = limit - len(marker)
    end = _cluster_end(text, room)
    if not marker_counts:
        return text[:end] + marker
    head = text[:end]
    if end < len(text) and head[-1:].isalnum() and text[end].isalnum():
        space = head.rfind(" ")
        if space >= 0.6 * room:
            head = head[:space]
    return head.rstrip() + marker


def _cluster_end(text: str, room: int) -> int:
    """The end of the last grapheme cluster of ``text`` that ends within ``room`` code points."""
    if room <= 0:
        return 0
    if text[: room + 1].isascii():
        # In ASCII every code point is a cluster of its own, but for CR LF (one cluster).
        return room - 1 if text[room - 1 : room + 1] == "\r\n" else room
    end = 0
    # finditer is lazy: only the first ``room`` code points (and one cluster more) are scanned.
    for cluster in _GRAPHEME().finditer(text):
        if cluster.end() > room:
            break
        end = cluster.end()
    return end


_BULLET = lazy_regex(r"^\s*(?:[-*•>]+|\d{1,3}[.)])\s+")
_SENTENCE_END = lazy_regex(r"(?<=[.!?])\s+(?=\S)|(?<=[。！？])")


def _clean_sentence(text: str) -> str:
    return collapse_whitespace(text.replace("**", "").replace("__", "").replace("`", ""))


def sentences(text: str) -> list[str]:
    """``text``'s sentences, line by line, list bullets and markdown emphasis left out."""
    out: list[str] = []
    for line in text.split("\n"):
        line = _BULLET().sub("", line.strip())
        for part in _SENTENCE_END().split(line):
            sentence = _clean_sentence(part)
            if sentence:
                out.append(sentence)
    return out


def cut_middle(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters: when longer, its start and its end
    with ``…`` between them (an error message says what failed first and its numbers last)."""
    line = collapse_whitespace(text)
    if len(line) <= limit:
        return line
    head = (limit - 1) * 2 // 5
    tail = limit - 1 - head
    return line[:head].rstrip() + ELLIPSIS + line[len(line) - tail :].lstrip()
