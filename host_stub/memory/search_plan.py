"""Search terms and ranking every memory backend shares (pure functions, no I/O).

One tokenizer for all four backends, so a query finds the same messages on each:

- Text is NFKC-normalised and case-folded, then cut into runs of letters, marks and digits.
- Runs in scripts written without spaces (Han, Hiragana, Katakana, Hangul, Thai, Lao, Khmer,
  Myanmar) become overlapping character pairs, plus single characters in the index, so any
  two-character piece of a Chinese sentence finds it (a one-character query finds the character).
- Other runs are words: common English function words are dropped, and a light English stemmer
  (plural and ``-ed``/``-ing`` endings, Porter's step 1) maps ``booked``/``booking``/``books`` to
  one term. Words of one letter are dropped (numbers are kept), and so are words of over
  :data:`MAX_TERM_BYTES` bytes.

A message is indexed under its own terms and, at half weight, those of the message before it
(at most :data:`MAX_CONTEXT_TERMS` of them, and only when that message is searchable and at most
:data:`CONTEXT_SPAN` seqs back): a reply such as "Lima." is found by the words of the question
it answers. Queries match ANY of their terms (OR).

Ranking is the same on every backend (:func:`rank`, pure Python, given what each candidate
holds). The candidates are ordered by, in turn:

1. the summed idf of the query's distinct terms the message is found by, its own or lent ones
   (coordination, weighted by rarity): a message holding all of the terms another holds, and
   more, ranks above it (all the words above one of them), and the rarer words count more than
   the common ones;
2. the summed idf of those it holds in its OWN text, times :data:`TOOL_WEIGHT` for a tool's
   traffic (a tool result, an assistant message carrying tool calls: :func:`tool_message`): of
   two messages found by the same terms, the one that says them ranks above the one they were
   only lent to, and a user's or assistant's own sentence above a call's arguments or a tool's
   result that merely mention them;
3. how many consecutive pairs of the query's terms stand next to each other, in the query's
   order, in its own terms (the phrase; function words and one-letter words are not terms, so
   "peanut allergy" also matches "peanut, the allergy"): the phrase ranks above the same words
   scattered;
4. BM25 (:func:`score`): FTS5's ``bm25`` formula (k1 1.2, b 0.75, the idf ``log((N - df + 0.5)
   / (df + 0.5))``, at least 1e-6), with the lent terms counting :data:`CONTEXT_WEIGHT` in a
   message's term frequencies and length (BM25F's weighted fields), and N, df and the average
   length taken from the searched session alone; times :data:`TOOL_WEIGHT` for a tool's
   traffic;
5. the newer message.

A hit's score is its first key (the summed idf of the terms it is found by): higher is better,
equal scores are ordered by the other keys, comparable within one answer only. Every sum of
idfs goes in the order of the query's terms, so equal sets of terms give equal sums on every
backend.

Bounded work, however large the session (:func:`plan_search`, :func:`choose`). A search reads
about :data:`MAX_POSTINGS` postings at most: the query's terms go rarest first, each one's
whole posting list while the lists read so far fit; then, of the terms too common to read
whole, the messages holding two or more of them together (indexed intersections, the most
selective first, the newest of each), and the newest messages holding the rarest of them. Those
messages are the candidates: a message holding only common query words ranks low anyway (the
MaxScore idea), one holding several of them does not. The terms not read whole are then probed
among the candidates (which of them hold it; an indexed intersection, cheap), each candidate is
estimated by the summed idf of the query terms it holds (the ranking's first key, as far as the
terms read and probed tell), and only the :data:`RESCORE` best by that estimate are ranked in
full (term frequencies, lengths, own terms in order and whether it is a tool's traffic read: at
most :data:`MAX_INDEX_TERMS` own terms each), with, when the last of them ties with candidates
left out, all of those if they fit in :data:`RESCORE` more (ranked in full at most twice
:data:`RESCORE`; a larger tie goes to the newer). In a session of at most :data:`MAX_POSTINGS`
messages every list is read whole, so the candidates are all the matches; the estimate then
only decides which of them are ranked.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
import unicodedata
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..messages import Message, text_of

__all__ = [
    "word_runs",
    "word_runs_per_char",
    "MAX_INDEX_TERMS",
    "MAX_POSTINGS",
    "RESCORE",
    "TOOL_WEIGHT",
    "Candidate",
    "Plan",
    "Read",
    "choose",
    "idf",
    "index_terms",
    "own_matches",
    "plan_search",
    "query_terms",
    "rank",
    "score",
    "search_text",
    "tool_message",
]

#: Terms indexed per message at most (a huge tool result is indexed by its first terms).
MAX_INDEX_TERMS = 4000
#: Characters of a message read for indexing at most.
MAX_INDEX_CHARS = 40_000
#: Terms of a query used at most.
MAX_QUERY_TERMS = 64
#: A longer word (in UTF-8 bytes) is neither indexed nor searched for: no one types it, and
#: PostgreSQL refuses lexemes of over 2,047 bytes.
MAX_TERM_BYTES = 1000
#: Terms of the previous message a message is also indexed under, at most.
MAX_CONTEXT_TERMS = 400
#: The previous message lends its terms only if it is at most this many seqs back.
CONTEXT_SPAN = 50
#: Postings a search reads at most (its candidates), however large the session: see
#: :func:`plan_search`.
MAX_POSTINGS = 1000
#: Newest postings read at most of the rarest term that does not fit whole (see
#: :func:`plan_search`).
MAX_PARTIAL = 100
#: Of the terms that do not fit whole, the rarest this many are read in conjunctions ...
CONJOINED = 3
#: ... of which this many at most (the most selective).
MAX_CONJUNCTIONS = 4
#: Candidates scored in full at most (more when a search asks for more results): see
#: :func:`choose`.
RESCORE = 50
#: Query terms not read whole that are probed among the candidates at most.
MAX_PROBES = 8
#: BM25's parameters (FTS5's).
K1 = 1.2
B = 0.75
#: A lent term counts this much against one of the message's own (in BM25's term frequency and
#: length).
CONTEXT_WEIGHT = 0.5
#: A tool's traffic (a tool result, an assistant message carrying tool calls) says its own terms
#: this much, against a user's or assistant's sentence (in the ranking's second key and its BM25:
#: see :func:`rank`): a call's arguments or a result that mention the words rank below what
#: someone said with them.
TOOL_WEIGHT = 0.5

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


#: In ASCII text the word characters are exactly these (no marks, nothing unsegmented).
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+")


def word_runs(text: str) -> Iterable[tuple[str, bool]]:
    """``(run, unsegmented)`` for each maximal run of word characters of one kind (ASCII text,
    most of it, in one regular-expression scan instead of a test per character)."""
    if text.isascii():
        return ((found.group(), False) for found in _ASCII_WORD.finditer(text))
    return word_runs_per_char(text)


def word_runs_per_char(text: str) -> Iterable[tuple[str, bool]]:
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
    for run, unsegmented in word_runs(folded):
        if unsegmented:
            if len(run) == 1:
                out.append(run)
                continue
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
            if unigrams:
                out.extend(run)
        elif len(run) * 4 > MAX_TERM_BYTES and len(run.encode()) > MAX_TERM_BYTES:
            continue
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


def lend_context(
    docs: Sequence[tuple[int, list[str] | None]], previous: tuple[int, list[str]] | None
) -> list[Indexed | None]:
    """:func:`with_context` for messages indexed after they were stored, any number of appends
    at once: ``docs`` are ``(seq, own terms)`` in seq order, ``previous`` the ``(seq, own
    terms)`` of the searchable message before them, if any. A message borrows from the
    searchable one before it only within :data:`CONTEXT_SPAN` seqs, so the entries are the same
    however the messages were grouped into appends and catch-ups."""
    out: list[Indexed | None] = []
    for seq, own in docs:
        if own is None:
            out.append(None)
            continue
        lent = previous is not None and previous[0] >= seq - CONTEXT_SPAN
        out.append((own, context_of(previous[1]) if lent and previous is not None else []))
        previous = (seq, own)
    return out


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


def tool_message(message: Message) -> bool:
    """Whether a message is a tool's traffic: a tool result, or an assistant message carrying
    tool calls (its searchable text is then mostly their names and arguments)."""
    return message.role == "tool" or (message.role == "assistant" and bool(message.tool_calls))


def indexable(message: Message) -> bool:
    """Event markers are the host's bookkeeping: never indexed, never found."""
    return not message.is_marker


def doc_length(indexed: Indexed) -> float:
    """An entry's length for BM25: its own terms, plus the lent ones at :data:`CONTEXT_WEIGHT`
    (the sum of :func:`weighted_counts`)."""
    own, context = indexed
    return len(own) + CONTEXT_WEIGHT * len(context)


def distinct_terms(indexed: Indexed) -> set[str]:
    """The terms an entry is found by (each counts once in a term's document frequency)."""
    own, context = indexed
    return set(own) | set(context)


def stored_counts(index: Mapping[str, int], own: str, context: str) -> tuple[list[float], float]:
    """Weighted frequencies of the query terms (``index``: term -> its place in the query) in an
    entry stored as two space-joined strings (its own terms, the lent ones), and its length."""
    tfs = [0.0] * len(index)
    o, c = own.split(), context.split()
    for word in o:
        i = index.get(word)
        if i is not None:
            tfs[i] += 1.0
    for word in c:
        i = index.get(word)
        if i is not None:
            tfs[i] += CONTEXT_WEIGHT
    return tfs, len(o) + CONTEXT_WEIGHT * len(c)


def idf(n_docs: int, df: int) -> float:
    """FTS5's BM25 idf: ``log((N - df + 0.5) / (df + 0.5))``, at least 1e-6 (a term in more than
    half of the session's messages adds next to nothing)."""
    value = math.log((n_docs - df + 0.5) / (df + 0.5)) if n_docs > 0 else 0.0
    return value if value > 0 else 1e-6


@dataclass(frozen=True)
class Read:
    """One read of a search: the messages holding every one of ``terms`` (query term indexes),
    all of them (``limit`` ``None``) or the ``limit`` newest."""

    terms: tuple[int, ...]
    limit: int | None


@dataclass(frozen=True)
class Plan:
    """What one search reads, for a query's ``terms`` with document frequencies ``dfs`` in a
    session of ``n_docs`` indexed messages whose average length is ``avg_len``.

    ``reads``: what is read; the messages found are the candidates. ``probes``: the terms not
    read whole that are looked up among the candidates (which of them hold it)."""

    terms: list[str]
    dfs: list[int]
    n_docs: int
    avg_len: float
    reads: list[Read]
    probes: list[int]

    @property
    def idfs(self) -> list[float]:
        return [idf(self.n_docs, df) if df > 0 else 0.0 for df in self.dfs]

    @property
    def whole(self) -> list[int]:
        """The terms whose whole posting list is read."""
        return [r.terms[0] for r in self.reads if r.limit is None]

    @property
    def bounded(self) -> list[Read]:
        """The reads of the newest messages only (conjunctions, the newest of one term)."""
        return [r for r in self.reads if r.limit is not None]


def plan_search(
    terms: Sequence[str],
    dfs: Sequence[int],
    n_docs: int,
    total_len: float,
    *,
    limit: int = 0,
    budget: int | None = None,
    max_probes: int | None = None,
) -> Plan:
    """The :class:`Plan` for a search (``total_len``: the session's indexed messages' summed
    length) that asks for ``limit`` results (the budget is never below it).

    A session of at most ``budget`` messages: every posting list is read whole. Otherwise, with
    the terms rarest first (ties: query order):

    1. each term's whole list while the lists read so far hold at most ``budget`` postings;
    2. of the rest (the rarest :data:`CONJOINED` of them), the messages holding two or more of
       them together: each combination, most selective first (its size estimated with the terms
       taken as independent), its newest messages up to twice that estimate (at least 16),
       while the estimate fits in what is left of the budget, :data:`MAX_CONJUNCTIONS` at most:
       a message holding several query words outranks one holding a single common word;
    3. what is left of the budget (at most :data:`MAX_PARTIAL`): the newest messages holding
       the rarest of the rest.

    The terms not read whole (the rarest ``max_probes`` of them) are probed among the
    candidates."""
    budget = max(MAX_POSTINGS if budget is None else budget, limit)
    partial = max(MAX_PARTIAL, limit)
    max_probes = MAX_PROBES if max_probes is None else max_probes
    order = sorted((i for i in range(len(dfs)) if dfs[i] > 0), key=lambda i: (dfs[i], i))
    reads: list[Read] = []
    if n_docs <= budget:
        reads = [Read((i,), None) for i in order]
    else:
        left = budget
        for i in order:
            if dfs[i] > left:
                break
            reads.append(Read((i,), None))
            left -= dfs[i]
        rest = order[len(reads) :]
        head = rest[:CONJOINED]
        combos = [c for size in range(2, len(head) + 1) for c in itertools.combinations(head, size)]

        def estimate(combo: tuple[int, ...]) -> float:
            return math.prod(dfs[i] for i in combo) / n_docs ** (len(combo) - 1)

        for combo in sorted(combos, key=lambda c: (estimate(c), c))[:MAX_CONJUNCTIONS]:
            if estimate(combo) > left:
                break  # not selective: its messages would not fit
            cap = min(left, 2 * math.ceil(estimate(combo)) + 16)
            reads.append(Read(combo, cap))
            left -= cap
        if left > 0 and rest:
            reads.append(Read((rest[0],), min(left, partial)))
    whole = {r.terms[0] for r in reads if r.limit is None}
    probes = [i for i in order if i not in whole][:max_probes]
    return Plan(
        terms=list(terms),
        dfs=list(dfs),
        n_docs=n_docs,
        avg_len=total_len / n_docs if n_docs > 0 else 0.0,
        reads=reads,
        probes=probes,
    )


def choose(plan: Plan, holders: Mapping[int, Collection[int]], limit: int = 0) -> list[int]:
    """The candidates worth ranking in full: the ``count`` best by the summed idf of the query
    terms they are known to hold (``holders``: term -> the candidates holding it; the terms read
    and the probed ones), ties to the newer; all of them when there are at most ``count``.
    ``count`` is :data:`RESCORE`, or the ``limit`` of results asked for if that is more. When
    candidates left out tie with the last one taken, and all of them fit in :data:`RESCORE`
    more, they are taken too: the estimate cannot order a tie, so their ranking does."""
    count = max(RESCORE, limit)
    room = count + RESCORE
    idfs = plan.idfs
    # In the order of the query's terms, as every store sums (equal sets, equal sums).
    sets = [(idfs[i], set(seqs)) for i, seqs in sorted(holders.items()) if seqs]
    # Most candidates hold one known term: only those holding several are summed one by one
    # (set operations do the rest), and of each one-term group only its newest ``room + 1``
    # can be among the best.
    several: set[int] = set()
    for a in range(len(sets)):
        for b in range(a + 1, len(sets)):
            several |= sets[a][1] & sets[b][1]
    summed = dict.fromkeys(several, 0.0)
    for weight, seqs in sets:
        for seq in seqs & several:
            summed[seq] += weight
    ranked = [(value, seq) for seq, value in summed.items()]
    for weight, seqs in sets:
        ranked.extend((weight, seq) for seq in sorted(seqs - several)[-(room + 1) :])
    if len(ranked) <= count:
        return sorted(seq for _, seq in ranked)
    best = heapq.nlargest(room + 1, ranked)
    end = count
    while end < len(best) and best[end][0] == best[count - 1][0]:
        end += 1
    return [seq for _, seq in best[: end if end <= room else count]]


def score(plan: Plan, docs: Iterable[tuple[int, Sequence[float], float]]) -> dict[int, float]:
    """BM25 score of each candidate, given as ``(seq, the weighted frequency of each query term,
    its length)``; one that holds none of the terms scores 0 and is left out."""
    avg = plan.avg_len if plan.avg_len > 0 else 1.0
    weights = [(i, w) for i, w in enumerate(plan.idfs) if w > 0]
    scores: dict[int, float] = {}
    for seq, tfs, length in docs:
        total = _bm25(weights, tfs, length, avg)
        if total > 0:
            scores[seq] = total
    return scores


def _bm25(
    weights: Sequence[tuple[int, float]], tfs: Sequence[float], length: float, avg: float
) -> float:
    norm = K1 * (1 - B + B * length / avg)
    total = 0.0
    for i, weight in weights:
        tf = tfs[i]
        if tf:
            total += weight * tf * (K1 + 1) / (tf + norm)
    return total


class Candidate(NamedTuple):
    """What :func:`rank` needs of one candidate."""

    #: The message's seq.
    seq: int
    #: The weighted frequency of each query term (own 1, lent :data:`CONTEXT_WEIGHT`).
    tfs: Sequence[float]
    #: Its weighted length (:func:`doc_length`).
    length: float
    #: Its own terms, in order, space-joined (as indexed: at most :data:`MAX_INDEX_TERMS`).
    own: str
    #: Whether it is a tool's traffic (:func:`tool_message`).
    tool: bool


def own_matches(terms: Sequence[str], own: str) -> tuple[list[int], int]:
    """``(held, pairs)``: which of the query's distinct ``terms`` (their indexes, in order) stand
    in ``own`` (a message's own terms in order, space-joined, as the stores keep them), and for
    how many ``i`` the terms ``i`` and ``i + 1`` stand next to each other there, in that order
    (the phrase, pair by pair)."""
    return _matcher(terms)(own)


def _matcher(terms: Sequence[str]) -> Callable[[str], tuple[list[int], int]]:
    """:func:`own_matches` for one query, its needles made once."""
    singles = [(i, f" {t} ") for i, t in enumerate(terms)]
    pairs = [f" {a} {b} " for a, b in itertools.pairwise(terms)]

    def match(own: str) -> tuple[list[int], int]:
        padded = f" {own} "
        held = [i for i, needle in singles if needle in padded]
        if len(held) < 2:
            return held, 0
        return held, sum(1 for needle in pairs if needle in padded)

    return match


def rank(plan: Plan, candidates: Iterable[Candidate], limit: int) -> list[tuple[int, float]]:
    """The ``limit`` best candidates, best first, as ``(seq, score)``, in the order the module's
    docstring gives: the summed idf of the terms found (own or lent), of the own ones, the
    phrase's pairs, BM25 (a tool's traffic at :data:`TOOL_WEIGHT` in the second and fourth),
    the newer. The score is the first of them. A candidate holding none of the terms is left
    out."""
    if limit <= 0:
        return []
    idfs = plan.idfs
    weights = [(i, w) for i, w in enumerate(idfs) if w > 0]
    # The first key alone (summed in the terms' order); only candidates that can be among the
    # best by it go on to the others.
    firsts: list[tuple[float, Candidate]] = []
    for c in candidates:
        found = 0.0
        for i, w in weights:
            if c.tfs[i] > 0:
                found += w
        if found > 0:
            firsts.append((found, c))
    if len(firsts) > limit:
        cut = heapq.nlargest(limit, (found for found, _ in firsts))[-1]
        firsts = [item for item in firsts if item[0] >= cut]
    avg = plan.avg_len if plan.avg_len > 0 else 1.0
    match = _matcher(plan.terms)
    keyed: list[tuple[float, float, int, float, int]] = []
    for found, c in firsts:
        held, pairs = match(c.own)
        own = 0.0
        for i in held:
            own += idfs[i]
        bm25 = _bm25(weights, c.tfs, c.length, avg)
        if c.tool:
            own, bm25 = own * TOOL_WEIGHT, bm25 * TOOL_WEIGHT
        keyed.append((found, own, pairs, bm25, c.seq))
    return [(key[-1], key[0]) for key in heapq.nlargest(limit, keyed)]
