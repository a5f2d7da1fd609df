"""Why compressions fell back, grouped by kind: a reason names identifiers, counts and quotes that
differ every time, its kind does not (``answer rejected: lost identifiers: K7XQ2M, ...`` and
``answer rejected: lost identifiers: HG-583920`` are one kind).

Items of a model's answer left out because the conversation does not support them are a reason
of their own even when the rest of the answer was used (``ungrounded: 2 item(s) of the answer
left out, ...``, kind ``ungrounded``); an answer with nothing grounded, one that only says there
is nothing to say, and one that turns an instruction into a standing preference of the user's
are rejected (kinds ``rejected: ungrounded``, ``rejected: says nothing``, ``rejected:
instruction made a preference``). :func:`dropped_items` counts the items left out of a run's
answers by kind, :func:`ungrounded_samples` quotes them."""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable

from ...base import cut_middle

__all__ = [
    "EXAMPLE_CHARS",
    "dropped_items",
    "fallback_kinds",
    "reason_kind",
    "reason_parts",
    "ungrounded_samples",
]

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


_LEFT_OUT = re.compile(r"\b(\d+) item\(s\) left out: ([^;]*)")
_LEFT_OUT_KIND = re.compile(r"([^,()]+?) \((\d+)\)")
_UNGROUNDED = re.compile(
    r"(?:^|; )(?:answer rejected: )?ungrounded: (?:(\d+) item\(s\) of the answer left out"
    r"|no item of the answer was found in the conversation \((\d+) dropped)"
)
_SAMPLE = re.compile(r"ungrounded: [^;]*?\(.*?e\.g\. ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"): ")


def dropped_items(reason: str) -> Counter[str]:
    """How many items of the model's answers a run left out, by kind (``ungrounded``,
    ``meta-talk``, ``says nothing``, ...), from its notes and reasons."""
    counts: Counter[str] = Counter()
    for match in _UNGROUNDED.finditer(reason):
        counts["ungrounded"] += int(match.group(1) or match.group(2))
    for match in _LEFT_OUT.finditer(reason):
        for kind, n in _LEFT_OUT_KIND.findall(match.group(2)):
            counts[kind.strip()] += int(n)
    return counts


def ungrounded_samples(reason: str) -> list[str]:
    """The items quoted as examples of what was left out as ungrounded (one per answer)."""
    out = []
    for match in _SAMPLE.finditer(reason):
        try:
            out.append(str(ast.literal_eval(match.group(1))))
        except (ValueError, SyntaxError):
            out.append(match.group(1)[1:-1])
    return out
