"""Which sentences of a conversation the rules engine keeps verbatim, and how they read.

A summary that has to be extractive should carry as many distinct facts as its budget holds:
names, dates, numbers, places and identifiers above small talk, both speakers, the whole
conversation rather than its last day. The selection is a greedy cover: each step keeps the
sentence that adds the most not-yet-covered content per token (content weighted: identifiers,
numbers and names count more), so a repeated fact adds nothing and is never kept twice. A first
pass keeps the best sentence of every period (dates when the text carries them, else stretches
of messages), so the record spans the conversation however long it grows; the periods merge as
they outnumber what the budget holds.

Everything here is pure: plain data in, plain data out, deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..base import collapse_whitespace, extract_identifiers, lazy_regex, remembered
from ..record import Excerpt

__all__ = [
    "content_keys",
    "select_excerpts",
    "split_long",
]

_LATIN = lazy_regex(r"[A-Za-z][A-Za-z'\-]{2,}")
_NUMBER = lazy_regex(r"\d+(?:[.,:/\-]\d+)*")
_HAN = lazy_regex(r"\p{Han}+")
_CLAUSE = lazy_regex(r"(?<=[,;:，；：])\s*")

_STOPWORDS = frozenset(
    """the and for are but not you your yours with this that these those from have has had was
    were been being will would could should can may might must shall what which who whom whose
    when where why how all any both each few more most other some such only own same than too
    very just also into onto over under again then once here there about above below after
    before between through during out off our ours they them their theirs she her hers him his
    its it's i'm i'd i'll i've you're you'd you'll we're we'd let let's please thanks thank
    hello yes okay sure like want need get got make made know see one two three there's here's
    that's what's don't doesn't didn't can't won't isn't aren't wasn't weren't well much many
    still even now does did done doing able via per really think thing things going gonna yeah
    wow hey great good nice cool awesome amazing glad lot lots way maybe something anything
    everything totally definitely always never ever haha hahaha lol omg wow oh ooh ah aw aww
    awww yay hmm huh indeed lovely""".split()
)

#: Weights of what a sentence can add: an identifier over a number over a name over a word,
#: and a pair of neighbouring content words (a fact is a combination: "Ava took the kayak to
#: Tromso" and "Ava took the bonsai to Kyoto" share their words, not their pairs).
_W_IDENTIFIER, _W_NUMBER, _W_NAME, _W_WORD, _W_HAN, _W_PAIR = 3.0, 1.5, 2.0, 1.0, 0.5, 0.3
#: A question carries less fact than its answer.
_QUESTION_FACTOR = 0.6
#: A sentence that names no one and nothing, with no number or date, carries less fact.
_SMALL_TALK_FACTOR = 0.6
#: A sentence must add at least this much to be kept.
_MIN_GAIN = 2.0


def content_keys(text: str) -> dict[str, float]:
    """What a sentence says, as weighted keys: content words (lower-cased; a capitalised word
    inside the sentence counts as a name), numbers, identifiers, pairs of neighbouring content
    words (``"kayak|tromso"``), Chinese character pairs."""
    return dict(_keys(text))


def _content_keys(text: str) -> tuple[tuple[str, float], ...]:
    keys: dict[str, float] = {}
    order: list[tuple[int, str]] = []
    for match in _LATIN().finditer(text):
        word = match.group().lower().strip("'-")
        if len(word) < 3 or word in _STOPWORDS:
            continue
        inside = match.start() > 0 and text[: match.start()].rstrip()[-1:] not in ".!?\"'"
        weight = _W_NAME if inside and match.group()[0].isupper() else _W_WORD
        keys[word] = max(keys.get(word, 0.0), weight)
        order.append((match.start(), word))
    for match in _NUMBER().finditer(text):
        keys.setdefault(match.group(), _W_NUMBER)
        order.append((match.start(), match.group()))
    order.sort()
    for (_, first), (_, second) in zip(order, order[1:], strict=False):
        if first != second:
            keys.setdefault(f"{first}|{second}", _W_PAIR)
    for ident in extract_identifiers(text):
        keys[ident.lower() if ident.isalpha() else ident] = _W_IDENTIFIER
    for run in _HAN().findall(text):
        for i in range(max(1, len(run) - 1)):
            keys.setdefault(run[i : i + 2], _W_HAN)
    return tuple(keys.items())


_keys = remembered(_content_keys)


def split_long(sentence: str, max_chars: int) -> list[str]:
    """A sentence longer than ``max_chars`` as consecutive pieces of whole clauses (whole words
    when one clause is still too long); never a piece cut inside a word."""
    sentence = collapse_whitespace(sentence)
    if len(sentence) <= max_chars:
        return [sentence] if sentence else []
    pieces: list[str] = []
    current = ""
    for clause in _CLAUSE().split(sentence):
        words = clause.split(" ") if len(clause) > max_chars else [clause]
        for word in words:
            if not word:
                continue
            joined = f"{current} {word}" if current else word
            if len(joined) <= max_chars:
                current = joined
            else:
                if current:
                    pieces.append(current)
                current = word[:max_chars]
    if current:
        pieces.append(current)
    return pieces


@dataclass(frozen=True)
class _Candidate:
    excerpt: Excerpt
    keys: dict[str, float]
    cost: int
    factor: float
    bonus: float
    bucket: int

    def gain(self, covered: set[str]) -> float:
        new = sum(w for k, w in self.keys.items() if k not in covered)
        return new * self.factor + (self.bonus if new else 0.0)


def _buckets(pool: Sequence[Excerpt], limit: int) -> list[int]:
    """A period index per excerpt (``pool`` in conversation order): consecutive dates, or
    stretches of 20 messages where no date is known, merged into at most ``limit`` periods."""
    marks: list[str] = []
    for e in pool:
        marks.append(e.when.strip() or f"#{e.seq // 20}")
    periods = list(dict.fromkeys(marks))
    index = {p: i for i, p in enumerate(periods)}
    size = max(1, -(-len(periods) // max(1, limit)))
    return [index[m] // size for m in marks]


def _factor(text: str) -> float:
    """How much of a sentence's words count as fact: a question's less (its answer carries the
    fact), and a sentence with no name, number or identifier (small talk: "it's like hitting
    the reset button") less than one that says who, what or when."""
    factor = _QUESTION_FACTOR if text.rstrip().endswith(("?", "？")) else 1.0
    if not any(w >= _W_NUMBER for w in content_keys(text).values()):
        factor *= _SMALL_TALK_FACTOR
    return factor


def select_excerpts(
    previous: Sequence[Excerpt],
    new: Sequence[Excerpt],
    *,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    covered: Iterable[str] = (),
    bonus: Callable[[Excerpt], float] = lambda e: 0.0,
    tokens_per_period: int = 80,
) -> list[Excerpt]:
    """The excerpts to keep, least important first (the ordering convention of every payload
    list), within ``budget_tokens`` as estimated per excerpt (text, speaker, separators; the
    caller checks the rendering). ``covered``: keys already said elsewhere in the summary;
    ``bonus``: extra value for a kind of sentence (a stated preference, a confirmed booking)."""
    seen: set[str] = set()
    pool: list[Excerpt] = []
    for e in [*previous, *new]:
        key = collapse_whitespace(e.text).lower()
        if key and key not in seen:
            seen.add(key)
            pool.append(e)
    pool.sort(key=lambda e: (e.seq, e.part, e.text))  # the same pool, whatever order it came in
    buckets = _buckets(pool, max(1, budget_tokens // tokens_per_period))
    candidates = [
        _Candidate(
            excerpt=e,
            keys=content_keys(e.text),
            cost=count_tokens(e.text) + (count_tokens(e.speaker) if e.speaker else 0) + 2,
            factor=_factor(e.text),
            bonus=bonus(e),
            bucket=b,
        )
        for e, b in zip(pool, buckets, strict=True)
    ]
    covered_keys = set(covered)
    chosen: list[_Candidate] = []
    taken: set[int] = set()
    left = budget_tokens

    def value(i: int) -> float:
        c = candidates[i]
        return c.gain(covered_keys) / c.cost

    def take(i: int) -> None:
        nonlocal left
        taken.add(i)
        chosen.append(candidates[i])
        covered_keys.update(candidates[i].keys)
        left -= candidates[i].cost

    # First pass: the best sentence of every period, oldest period first.
    by_bucket: dict[int, list[int]] = {}
    for i, c in enumerate(candidates):
        by_bucket.setdefault(c.bucket, []).append(i)
    for bucket in sorted(by_bucket):
        fitting = [
            i
            for i in by_bucket[bucket]
            if candidates[i].cost <= left and candidates[i].gain(covered_keys) >= _MIN_GAIN
        ]
        if fitting:
            take(max(fitting, key=lambda i: (value(i), -i)))
    # Then the greedy cover (lazy: a sentence's value only falls as more is covered).
    heap = [(-value(i), i) for i in range(len(candidates)) if i not in taken]
    heapq.heapify(heap)
    while heap and left > 0:
        _, i = heapq.heappop(heap)
        c = candidates[i]
        if c.cost > left:
            continue
        gain = c.gain(covered_keys)
        if gain < _MIN_GAIN:
            continue
        fresh = gain / c.cost
        if heap and fresh < -heap[0][0] - 1e-12:
            heapq.heappush(heap, (-fresh, i))
            continue
        take(i)
    return [c.excerpt for c in reversed(chosen)]
