"""The search index: terms, blocks of postings, the statements of a search, and the reading of the
legacy tsvector entries the migrations convert."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..search_plan import (
    Indexed,
    Plan,
    distinct_terms,
)

#: A lexeme in a tsvector's text form: ``'<lexeme>':<positions>``.
_LEXEME = re.compile(r"'((?:[^']|'')*)'(?::([0-9A-D,]+))?")
#: Seqs per block of postings: a block's postings are the bits of one ``bigint``.
_BLOCK_BITS = 6
_BLOCK_MASK = (1 << _BLOCK_BITS) - 1
_WORD = (1 << 64) - 1

#: A search's first statement: the session's key, its number and total length of indexed
#: messages, and the document frequency and id of each term asked for (0 and 0: not indexed).
_SEARCH_STATS = """
SELECT s.search_key, s.search_docs, s.search_length, q.dfs, q.ids
FROM {p}sessions s, LATERAL (
    SELECT array_agg(coalesce(t.df, 0) ORDER BY q.i) AS dfs,
        array_agg(coalesce(t.id, 0) ORDER BY q.i) AS ids
    FROM unnest($2::text[]) WITH ORDINALITY AS q(term, i)
    LEFT JOIN {p}search_terms t ON t.search_key = s.search_key AND t.term = q.term) q
WHERE s.session_id = $1
"""

#: Transaction time (one value for every write of a transaction) and wall time, as unix seconds,


def _role_term(role: str) -> str:
    """The term every indexed message of ``role`` is filed under: a role filter is one more
    term of a read. It holds a space, so no query term is ever equal to it."""
    return f" role:{role}"


def _doc_terms(role: str, indexed: Indexed) -> set[str]:
    """The terms a message's postings are filed under: those it is found by, and its role's."""
    return distinct_terms(indexed) | {_role_term(role)}


def _document_frequencies(docs: Sequence[tuple[int, str, Indexed]]) -> dict[str, int]:
    """How many of ``(seq, role, entry)`` each term (roles' included) is filed under."""
    dfs: dict[str, int] = {}
    for _, role, indexed in docs:
        for term in _doc_terms(role, indexed):
            dfs[term] = dfs.get(term, 0) + 1
    return dfs


def _blocks(postings: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """``(term, seq)`` postings as blocks: ``(term, seq >> 6)`` -> the seqs' bits (bit
    ``seq & 63``)."""
    blocks: dict[tuple[str, int], int] = {}
    for term, seq in postings:
        at = (term, seq >> _BLOCK_BITS)
        blocks[at] = blocks.get(at, 0) | 1 << (seq & _BLOCK_MASK)
    return blocks


def _block_arrays(seqs: Iterable[int]) -> tuple[list[int], list[int]]:
    """Seqs as two arrays for a statement: their blocks, in order, and each block's bits."""
    blocks = sorted((block, bits) for (_, block), bits in _blocks(("", s) for s in seqs).items())
    return [block for block, _ in blocks], [_signed(bits) for _, bits in blocks]


def _signed(bits: int) -> int:
    """64 bits as the ``bigint`` that holds them."""
    return bits - (1 << 64) if bits >> 63 else bits


def _seqs(blocks: Sequence[int] | None, bits: Sequence[int] | None) -> set[int]:
    """The seqs of blocks of postings (``None``: no block)."""
    seqs: set[int] = set()
    for block, word in zip(blocks or (), bits or (), strict=True):
        base, word = block << _BLOCK_BITS, word & _WORD
        while word:
            low = word & -word
            seqs.add(base + low.bit_length() - 1)
            word ^= low
    return seqs


def _newest(seqs: set[int], limit: int | None) -> set[int]:
    """The ``limit`` newest of ``seqs`` (``None``: all of them): a read of the newest gets
    whole blocks, some of them older than what it asked for."""
    if limit is None or len(seqs) <= limit:
        return seqs
    return set(sorted(seqs)[-limit:])


def _gathered(
    plan: Plan, got: Sequence[set[int]]
) -> tuple[dict[int, set[int]], set[int], set[int]]:
    """From what each read of ``plan`` found: which candidates hold each term, all the
    candidates, and those the probes look among. Those are the candidates found by a read of
    one term (read whole, or the newest): a candidate of a conjunction holding a term read whole
    is found by that term's read, one holding the term read newest first and not older than its
    oldest read is found by that read, and one holding neither is not probed (as on every
    store: a conjunction's terms are known)."""
    holders: dict[int, set[int]] = {}
    found: set[int] = set()
    probed: set[int] = set()
    for read, seqs in zip(plan.reads, got, strict=True):
        found |= seqs
        if len(read.terms) == 1:
            probed |= seqs
        for i in read.terms:
            holders.setdefault(i, set()).update(seqs)
    return holders, found, probed


def _reads_sql(plan: Plan, ids: Sequence[int], role_id: int | None) -> tuple[str, list[Any]]:
    """The statement that reads a plan's postings (``""`` when there is nothing to read) and
    its arguments: rows ``(n, blocks, bits)``, the blocks read n found, each the postings
    (``bits``) that hold every term of the read, and the role (``role_id``: the role's term)
    if one is asked for. A read of the newest reads as many blocks, newest first, as postings
    asked for (each block holds at least one). ``ids``: the query terms' ids.

    A conjunction is a query of its own (a ``WITH`` query): its rarest two terms' blocks joined
    (and the role's), each further term's looked up in the blocks found so far. A conjunction
    of three terms is the one of its rarest two (the plan's conjunctions share their terms)
    with the third: the rarest two's lists are read once for both."""
    args: list[Any] = []

    def param(value: int) -> str:
        args.append(value)
        return f"${len(args)}"

    def joined(tables: Sequence[tuple[str, int]]) -> tuple[str, str]:
        """``FROM`` the first table's blocks, each other's joined by block; and their bits."""
        (first, first_id), rest = tables[0], tables[1:]
        joins = "".join(
            f" JOIN {{p}}search_postings {t} ON {t}.term_id = {param(term_id)}"
            f" AND {t}.block = {first}.block"
            for t, term_id in rest
        )
        bits = " & ".join(f"{t}.bits" for t, _ in tables)
        where = f"{first}.term_id = {param(first_id)}" + (f" AND ({bits}) <> 0" if rest else "")
        return f"{{p}}search_postings {first}{joins} WHERE {where}", bits

    role = [("r", role_id)] if role_id is not None else []
    queries: dict[tuple[int, ...], str] = {}  # the terms of a conjunction -> its WITH query
    defined: list[str] = []

    def conjunction(terms: tuple[int, ...]) -> str:
        if terms not in queries:
            if len(terms) == 2:
                source, bits = joined([("a", ids[terms[0]]), ("b", ids[terms[1]]), *role])
                body = f"SELECT a.block, {bits} AS bits FROM {source}"
            else:
                found = conjunction(terms[:-1])
                body = (
                    f"SELECT c.block, c.bits & x.bits AS bits FROM {found} c"
                    f" JOIN {{p}}search_postings x ON x.term_id = {param(ids[terms[-1]])}"
                    " AND x.block = c.block WHERE (c.bits & x.bits) <> 0"
                )
            queries[terms] = f"c{len(queries)}"
            defined.append(f"{queries[terms]} AS ({body})")
        return queries[terms]

    parts: list[str] = []
    for n, read in enumerate(plan.reads):
        terms = tuple(sorted(read.terms, key=lambda i: (plan.dfs[i], i)))
        if len(terms) == 1:
            source, bits = joined([("t", ids[terms[0]]), *role])
            rows = f"SELECT t.block, {bits} AS bits FROM {source}"
            order = "t.block"
        else:
            rows, order = f"SELECT block, bits FROM {conjunction(terms)}", "block"
        if read.limit is not None:
            rows += f" ORDER BY {order} DESC LIMIT {param(read.limit)}"
        parts.append(
            f"SELECT {n} AS n, array_agg(x.block) AS blocks, array_agg(x.bits) AS bits"
            f" FROM ({rows}) x"
        )
    if not parts:
        return "", []
    head = f"WITH {', '.join(defined)} " if defined else ""
    return head + " UNION ALL ".join(parts), args


def _probes_sql(plan: Plan, ids: Sequence[int], among: Iterable[int]) -> tuple[str, list[Any]]:
    """The statement that probes a plan's probe terms among the seqs ``among`` (``""``: nothing
    to probe) and its arguments: rows ``(i, blocks, bits)``, the blocks of ``among`` holding
    query term i and which of their seqs do. ``ids``: the query terms' ids."""
    blocks, bits = _block_arrays(among)
    if not blocks or not plan.probes:
        return "", []
    args: list[Any] = [blocks, bits]
    parts = []
    for i in plan.probes:
        args.append(ids[i])
        parts.append(
            f"SELECT {i} AS i, array_agg(c.block) AS blocks, array_agg(p.bits & c.bits) AS bits"
            " FROM unnest($1::bigint[], $2::bigint[]) AS c(block, bits)"
            f" JOIN {{p}}search_postings p ON p.term_id = ${len(args)} AND p.block = c.block"
            " WHERE p.bits & c.bits <> 0"
        )
    return " UNION ALL ".join(parts), args


def _entry_of_text(terms: str, context: str) -> Indexed:
    """An entry as ``search_entries`` stores it: its own terms and the lent ones, each
    space-joined."""
    return terms.split(), context.split()


# -- schemas 2-4's tsvectors (read by the migration to schema 5) ---------------------------------


def _unquote(text: str) -> str:
    """A lexeme as PostgreSQL's output quotes it, without the quotes."""
    return re.sub(r"''|\\(.)", lambda m: m.group(1) or "'", text)


def entry_of(vector: str, key: int) -> Indexed:
    """An entry's terms (own, lent, repeats kept, each in the order of their positions: the
    ranking reads the own terms' order) from its schema 4 tsvector's text form (each lexeme
    ``<key>_<term>``)."""
    prefix = f"{key}_"
    return _positioned(
        (lexeme[len(prefix) :] if lexeme.startswith(prefix) else lexeme, positions)
        for lexeme, positions in _lexemes(vector)
    )


def _legacy_entry(vector: str) -> Indexed:
    """:func:`entry_of` for a schema 2-3 tsvector (no session key; own terms weight A)."""
    return _positioned(_lexemes(vector))


def _lexemes(vector: str) -> Iterator[tuple[str, str]]:
    """``(lexeme, positions)`` of a tsvector's text form (positions ``"1"`` when it has none)."""
    for match in _LEXEME.finditer(vector):
        yield _unquote(match.group(1)), match.group(2) or "1"


def _positioned(lexemes: Iterable[tuple[str, str]]) -> Indexed:
    """Own (weight A) and lent terms, each in the order of their positions."""
    placed: list[tuple[int, bool, str]] = []
    for term, positions in lexemes:
        for position in positions.split(","):
            placed.append((int(position.rstrip("ABCD")), position.endswith("A"), term))
    placed.sort(key=lambda item: item[0])  # stable: a lexeme's own order on equal positions
    own = [term for _, is_own, term in placed if is_own]
    lent = [term for _, is_own, term in placed if not is_own]
    return own, lent
