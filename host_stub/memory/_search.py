"""Search terms and ranking every memory backend shares (pure functions, no I/O).

One tokenizer for all four backends, so a query finds the same messages on each:

- Text is NFKC-normalised and case-folded, then cut into runs of letters, marks and digits.
- Runs in scripts written without spaces (Han, Hiragana, Katakana, Hangul, Thai, Lao, Khmer,
  Myanmar) become overlapping character pairs, plus single characters in the index, so any
  two-character piece of a Chinese sentence finds it (a one-character query finds the character).
- Other runs are words: common English function words are dropped, and a light English stemmer
  (plural and ``-ed``/``-ing`` endings, Porter's step 1) maps ``booked``/``booking``/``books`` to
  one term. Words of one letter are dropped; numbers of any length are kept.

A message is indexed under its own terms and, at half weight, those of the message before it
(at most :data:`MAX_CONTEXT_TERMS` of them, and only when that message is searchable and at most
:data:`CONTEXT_SPAN` seqs back): a reply such as "Lima." is found by the words of the question
it answers. Queries match ANY of their terms (OR); ranking is BM25 (SQLite's FTS5 ``bm25``; the
in-memory and Redis backends compute it with :func:`bm25`; PostgreSQL ranks with ``ts_rank``
weighted by the terms' rarity), so messages holding more of the rarer query terms come first.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..messages import Message, text_of

__all__ = [
    "MAX_INDEX_TERMS",
    "bm25",
    "index_terms",
    "query_terms",
    "search_text",
]

#: Terms indexed per message at most (a huge tool result is indexed by its first terms).
MAX_INDEX_TERMS = 4000
#: Characters of a message read for indexing at most.
MAX_INDEX_CHARS = 40_000
#: Terms of a query used at most.
MAX_QUERY_TERMS = 64
#: Terms of the previous message a message is also indexed under, at most.
MAX_CONTEXT_TERMS = 400
#: The previous message lends its terms only if it is at most this many seqs back.
CONTEXT_SPAN = 50
#: A lent term counts this much against one of the message's own (BM25 term frequency, FTS5
#: column weight, PostgreSQL ``ts_rank`` weight of class B).
CONTEXT_WEIGHT = 0.5

_STOP = frozenset(
    """a an and are as at be been being but by can could did do does doing done for from had has
    have having he her here hers him his how i if in into is it its itself just me my no nor not
    of off on once only or our ours out over own same she should so some such than that the their
    theirs them then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself""".split()
)

_UNSEGMENTED = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x312F),  # Bopomofo
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xAC00, 0xD7AF),  # Hangul syllables
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0x20000, 0x3134F),  # CJK extensions B-G
)


def _unsegmented(ch: str) -> bool:
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _UNSEGMENTED)


def _word_char(ch: str) -> bool:
    return ch.isalnum() or unicodedata.category(ch)[0] == "M"


def _runs(text: str) -> Iterable[tuple[str, bool]]:
    """``(run, unsegmented)`` for each maximal run of word characters of one kind."""
    start = None
    kind = False
    for i, ch in enumerate(text):
        if _word_char(ch):
            cjk = _unsegmented(ch)
            if start is None:
                start, kind = i, cjk
            elif cjk != kind:
                yield text[start:i], kind
                start, kind = i, cjk
        elif start is not None:
            yield text[start:i], kind
            start = None
    if start is not None:
        yield text[start:], kind


# -- a light English stemmer: Porter's step 1 (plurals, -ed, -ing, final y) --------------------

_VOWELS = frozenset("aeiou")


def _cons(word: str, i: int) -> bool:
    ch = word[i]
    if ch in _VOWELS:
        return False
    if ch == "y":
        return i == 0 or not _cons(word, i - 1)
    return True


def _measure(stem: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in ``stem``."""
    m, prev_vowel = 0, False
    for i in range(len(stem)):
        vowel = not _cons(stem, i)
        if prev_vowel and not vowel:
            m += 1
        prev_vowel = vowel
    return m


def _has_vowel(stem: str) -> bool:
    return any(not _cons(stem, i) for i in range(len(stem)))


def _cvc(word: str) -> bool:
    n = len(word)
    return (
        n >= 3
        and _cons(word, n - 1)
        and not _cons(word, n - 2)
        and _cons(word, n - 3)
        and word[-1] not in "wxy"
    )


def stem(word: str) -> str:
    """Porter's step 1 on an ASCII lower-case word (others come back unchanged)."""
    if len(word) <= 3 or not word.isascii() or not word.isalpha():
        return word
    if word.endswith("sses"):
        word = word[:-2]
    elif word.endswith("ies"):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss") and not word.endswith("us"):
        word = word[:-1]
    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    else:
        for suffix in ("ed", "ing"):
            if word.endswith(suffix) and _has_vowel(word[: -len(suffix)]):
                word = word[: -len(suffix)]
                if word.endswith(("at", "bl", "iz")):
                    word += "e"
                elif len(word) > 1 and word[-1] == word[-2] and word[-1] not in "lsz":
                    word = word[:-1]
                elif _measure(word) == 1 and _cvc(word):
                    word += "e"
                break
    if word.endswith("y") and len(word) > 2 and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    return word


# -- terms ---------------------------------------------------------------------------------------


def _terms(text: str, *, unigrams: bool) -> list[str]:
    out: list[str] = []
    folded = unicodedata.normalize("NFKC", text[:MAX_INDEX_CHARS]).casefold()
    for run, unsegmented in _runs(folded):
        if unsegmented:
            if len(run) == 1:
                out.append(run)
                continue
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
            if unigrams:
                out.extend(run)
        elif run.isdigit():
            out.append(run)
        elif len(run) > 1 and run not in _STOP:
            out.append(stem(run))
    return out


def index_terms(text: str) -> list[str]:
    """The terms a message's text is indexed under, repeats kept (they are term frequencies),
    at most :data:`MAX_INDEX_TERMS`."""
    return _terms(text, unigrams=True)[:MAX_INDEX_TERMS]


def query_terms(query: str) -> list[str]:
    """A query's distinct terms, in order, at most :data:`MAX_QUERY_TERMS` (empty: the query
    has nothing to look for, e.g. only punctuation or function words)."""
    return list(dict.fromkeys(_terms(query, unigrams=False)))[:MAX_QUERY_TERMS]


def own_terms(message: Message) -> list[str] | None:
    """A message's own index terms (``None``: it is not indexed at all)."""
    return index_terms(search_text(message)) if indexable(message) else None


def context_of(own: Sequence[str]) -> list[str]:
    """What a message lends the next one: its first :data:`MAX_CONTEXT_TERMS` terms."""
    return list(own[:MAX_CONTEXT_TERMS])


Indexed = tuple[list[str], list[str]]


def with_context(
    owns: Sequence[list[str] | None], previous: Sequence[str] | None
) -> list[Indexed | None]:
    """What messages appended together are indexed under, oldest first, given their own terms
    (``None``: not indexed): ``(own terms, terms the searchable message before lends)``
    (``previous``: the own terms of the searchable message stored before the batch, if any)."""
    out: list[Indexed | None] = []
    for own in owns:
        if own is None:
            out.append(None)
            continue
        out.append((own, context_of(previous) if previous else []))
        previous = own
    return out


def batch_terms(
    messages: Sequence[Message], previous: Sequence[str] | None
) -> list[Indexed | None]:
    """:func:`with_context` for messages."""
    return with_context([own_terms(m) for m in messages], previous)


def weighted_counts(indexed: Indexed) -> dict[str, float]:
    """Term frequencies of an entry: own terms count 1, lent ones :data:`CONTEXT_WEIGHT`."""
    counts: dict[str, float] = {}
    own, context = indexed
    for term in own:
        counts[term] = counts.get(term, 0.0) + 1.0
    for term in context:
        counts[term] = counts.get(term, 0.0) + CONTEXT_WEIGHT
    return counts


def search_text(message: Message) -> str:
    """What of a message is searchable: its text, and for an assistant's tool calls each call's
    name and arguments."""
    parts = [text_of(message.content)]
    for call in message.tool_calls or []:
        parts.append(f"{call.function.name} {call.function.arguments}")
    if message.name:
        parts.append(message.name)
    return "\n".join(p for p in parts if p)


def indexable(message: Message) -> bool:
    """Event markers are the host's bookkeeping: never indexed, never found."""
    return not message.is_marker


def bm25(
    query: list[str],
    postings: Mapping[str, Mapping[int, float]],
    length: Callable[[int], float],
    n_docs: int,
    avg_len: float,
    *,
    k1: float = 1.2,
    b: float = 0.75,
) -> dict[int, float]:
    """BM25 score of each document that holds any query term. ``postings``: term -> {doc: tf};
    ``length(doc)``: its number of terms."""
    scores: dict[int, float] = {}
    avg = avg_len or 1.0
    for term in query:
        docs = postings.get(term)
        if not docs:
            continue
        df = len(docs)
        idf = math.log(1 + (n_docs - df + 0.5) / (df + 0.5))
        for doc, tf in docs.items():
            norm = tf + k1 * (1 - b + b * length(doc) / avg)
            scores[doc] = scores.get(doc, 0.0) + idf * tf * (k1 + 1) / norm
    return scores


def top(scores: dict[int, float], limit: int) -> list[tuple[int, float]]:
    """The ``limit`` best ``(doc, score)``, best first; ties go to the newer (higher) seq."""
    return sorted(scores.items(), key=lambda item: (-item[1], -item[0]))[:limit]
