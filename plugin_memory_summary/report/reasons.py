"""Why compressions fell back, grouped by kind: a reason names identifiers, counts and quotes that
differ every time, its kind does not (``answer rejected: lost identifiers: K7XQ2M, ...`` and
``answer rejected: lost identifiers: HG-583920`` are one kind)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from ..text import cut_middle

__all__ = ["EXAMPLE_CHARS", "fallback_kinds", "reason_kind", "reason_parts"]

#: The longest example of a kind shown next to it (cut in the middle: an error's numbers last).
EXAMPLE_CHARS = 160

#: Parts of a run's reason that say what was kept, not why the model's answer was not used.
_NOTES = (
    "answer cut off at the length limit: its complete items were kept",
    "item(s) left out",
)
_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Timeout)\w*)\b")
_PREFIXES = (
    ("answer cut off (finish_reason=length) and answer rejected: ", "cut off, then rejected: "),
    ("answer rejected: ", "rejected: "),
)
_CUT = re.compile(r"\s*(?:[:(\[{'\"]|\s-\s|\d).*$")


def reason_parts(reason: str) -> list[str]:
    """The separate reasons of a run (joined with ``"; "``), notes on what was kept left out."""
    parts = [p.strip() for p in reason.split("; ") if p.strip()]
    return [p for p in parts if not any(note in p for note in _NOTES)]


def reason_kind(part: str) -> str:
    """The kind of one reason: its words before the first detail (a colon, a bracket, a quote,
    a number); an exception's class name for a provider error."""
    text = " ".join(part.split())
    error = _ERROR.match(text)
    if error:
        return f"error: {error.group(1)}"
    if text.startswith("timed out"):
        return "timed out"
    for prefix, label in _PREFIXES:
        if text.startswith(prefix):
            return label + (_CUT.sub("", text[len(prefix) :]) or "?")
    return _CUT.sub("", text) or text[:40]


def fallback_kinds(reasons: Iterable[str]) -> list[tuple[str, int, str]]:
    """``(kind, compressions, example)`` per kind of the given runs' reasons, most frequent
    first; a run counts once per kind, the example is the kind's first reason (one line, cut in
    the middle)."""
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for reason in reasons:
        kinds: dict[str, str] = {}
        for part in reason_parts(reason):
            kinds.setdefault(reason_kind(part), part)
        for kind, part in kinds.items():
            counts[kind] += 1
            examples.setdefault(kind, cut_middle(part, EXAMPLE_CHARS))
    return [(kind, n, examples[kind]) for kind, n in counts.most_common()]
