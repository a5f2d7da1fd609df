"""The rules engine: seed 002's ``fallbackMerge``, improved. It folds a batch of messages into the
previous payload without any model: deterministic (no clock, no randomness, no set iteration),
extractive (every item is text of the previous payload or of the messages, cut at most),
idempotent (the same batch merged twice into its own result adds nothing) and always within the
token budget. Identifiers are carried verbatim; when the cap forces a choice, the ones a user typed
outrank the ones a tool call used, which outrank the ones an assistant mentioned, which outrank
the ones that only appeared in a tool result, across merges (the payload records each
identifier's source); a date or other plain number that was only mentioned ranks below them all
(``record.summary_model.identifier_rank``); within a rank newer outranks older.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from host_stub.messages import Message

from ..base import (
    DEFAULT_READ_ONLY_TOOLS,
    PayloadCaps,
    collapse_whitespace,
    cut_text,
    extract_identifiers,
    lazy_regex,
)
from ..record import (
    Excerpt,
    InProgressTask,
    LedgerEntry,
    SummaryPayload,
    apply_caps,
    copy_payload,
    fit_lines,
    fit_to_budget,
    group_sources,
    identifier_rank,
    ledger_lines,
    lookup_lines,
    render_payload,
    says,
    source_tier,
    sources_of,
    stronger_source,
    unique_entries,
)
from .excerpts import content_keys, select_excerpts, split_long
from .ledger import ledger_entries
from .turns import (
    _CONFIRMATION,
    _DATE,
    _DECISION,
    _PROFILE,
    _REQUEST,
    _answered,
    _digest,
    _is_ack,
    _is_question,
    _is_substantive,
    _merge_items,
    _overlap_keys,
    _Turn,
)

__all__ = ["rules_merge"]

# --- identifiers ------------------------------------------------------------------------------


def _rank_identifiers(
    previous: SummaryPayload, turns: list[_Turn]
) -> tuple[list[str], dict[str, str]]:
    """The merged identifier list, least important first (caps keep the tail), and where each
    one came from (``"user"``, ``"argument"``, ``"assistant"``, ``"tool"``).

    Ranked by ``record.summary_model.identifier_rank``: the source's tier, lowest first: identifiers
    only ever seen in tool results; those an assistant wrote (and previous ones of unrecorded
    source, as in a model-written payload); those a tool call used; those a user typed; below
    them all, the dates only mentioned (by a tool or an assistant). The source is sticky: the
    previous payload's ``identifier_sources`` says where each of its identifiers came from, and
    an identifier keeps the most trusted source it was ever seen with, so a booking reference
    the user gave on the first day outranks every later tool-result or tool-call id, however
    old it is and whether or not the summary's prose still names it. Within a rank the previous
    identifiers not seen again come first (older), then this batch's, keyed ``(specificity,
    position)``: among tool results, one that named few identifiers (a record fetched by id)
    above a long listing (a search) whose entries are mostly not what the conversation is
    about; newer above older."""
    best: dict[str, tuple[int, int, int, int]] = {}
    sources: dict[str, str] = {}

    def note(ids: list[str], source: str, index: int, specificity: int = 0) -> None:
        for k, ident in enumerate(ids):
            key = (source_tier(source), specificity, index, k)
            if ident not in best or key > best[ident]:
                best[ident] = key
            sources[ident] = stronger_source(sources.get(ident), source)

    for turn in turns:
        if turn.role == "user":
            note(extract_identifiers(turn.text), "user", turn.index)
        elif turn.role == "assistant":
            note(extract_identifiers(turn.text), "assistant", turn.index)
            for call in turn.calls:
                note(extract_identifiers(call.arguments), "argument", turn.index)
        elif turn.role == "tool":
            ids = extract_identifiers(turn.text)
            note(ids, "tool", turn.index, -len(ids))
    recorded = sources_of(previous)
    earlier = [i for i in dict.fromkeys(previous.identifiers) if i not in best]
    for ident in previous.identifiers:
        sources[ident] = stronger_source(sources.get(ident), recorded.get(ident, "assistant"))

    def rank(ident: str) -> int:
        return identifier_rank(ident, sources[ident])

    ranked: list[str] = []
    for level in sorted({rank(i) for i in [*earlier, *best]}):
        ranked += [i for i in earlier if rank(i) == level]
        batch = [i for i in best if rank(i) == level]
        ranked += sorted(batch, key=lambda i: best[i][1:])
    return _merge_items([], ranked), sources


# --- the merge --------------------------------------------------------------------------------

#: Times the record is chosen again with the room its estimate left unused, and the least room
#: worth it (tokens).
_REFILLS = 2
_REFILL_MIN = 24

#: How the record names an agent's user (``_speaker``).
_USER_LABELS = frozenset({"User", "用户"})

#: Share of the budget the record (the sentences kept verbatim) keeps while it has sentences.
_RECORD_SHARE = 0.25

#: Open questions kept: the newest few (the record carries the rest).
_OPEN_QUESTIONS = 3


def _speaker(turn: _Turn, lang: str) -> str:
    if turn.speaker:
        return turn.speaker
    names = {"user": ("User", "用户"), "assistant": ("Assistant", "助手")}[turn.role]
    return names[1 if lang.lower().startswith("zh") else 0]


def _date_of(turn: _Turn) -> str:
    date = _DATE().search(turn.when) if turn.when else None
    return date.group() if date else turn.when


def _new_excerpts(turns: list[_Turn], caps: PayloadCaps, lang: str) -> list[Excerpt]:
    """Every substantive sentence of both speakers, as whole clauses within ``excerpt_chars``."""
    out: list[Excerpt] = []
    for turn in turns:
        if turn.role not in ("user", "assistant"):
            continue
        part = 0
        for sentence in turn.sentences:
            if not _is_substantive(sentence):
                continue
            for piece in split_long(sentence, caps.excerpt_chars):
                part += 1
                out.append(
                    Excerpt(
                        seq=turn.seq,
                        part=part,
                        speaker=_speaker(turn, lang),
                        when=_date_of(turn),
                        text=piece,
                    )
                )
    return out


_OVERVIEW = lazy_regex(r"^(?:Messages #1-#\d|已摘要第 1-\d)")  # whole or cut short
#: The overview line's opening: a cut may have left any part of it ("Messages #1-#…").
_OVERVIEW_OPENINGS = ("Messages #1-#", "已摘要第 1-")


def _is_overview(line: str) -> bool:
    """A previous overview line, whole or cut short anywhere."""
    line = line.strip()
    if _OVERVIEW().match(line):
        return True
    stem = line.removesuffix("…")
    return stem != line and len(stem) >= 3 and any(o.startswith(stem) for o in _OVERVIEW_OPENINGS)


def _summary_text(previous: SummaryPayload, overview: str, caps: PayloadCaps) -> str:
    """The previous prose (a model may have written it: merged, not replaced) with its
    overview line replaced by the new one."""
    lines = [
        line
        for line in previous.summary.strip().split("\n")
        if line.strip() and not _is_overview(line)
    ]
    return fit_lines("\n".join([*lines, overview]), caps.summary_chars)


def _overview(turns: list[_Turn], excerpts: list[Excerpt], lang: str) -> str:
    """One line: the messages covered, who speaks, the dates spanned."""
    last = max([t.seq for t in turns] + [e.seq for e in excerpts], default=0)
    generic = {"User", "Assistant", "用户", "助手"}
    ordered = sorted(excerpts, key=lambda e: (e.seq, e.text))
    named = [e.speaker for e in ordered if e.speaker and not e.to_seq and e.speaker not in generic]
    speakers = list(dict.fromkeys(named))[:4]
    dates = [e.when for e in sorted(excerpts, key=lambda e: e.seq) if e.when and not e.to_seq]
    span = (dates[0], dates[-1]) if dates else None
    if lang.lower().startswith("zh"):
        parts = [f"已摘要第 1-{last} 条消息"]
        if speakers:
            parts.append("参与者：" + "、".join(speakers))
        if span:
            parts.append(f"日期：{span[0]}" + (f" 至 {span[1]}" if span[1] != span[0] else ""))
        return "；".join(parts) + "。"
    parts = [f"Messages #1-#{last} summarized"]
    if speakers:
        parts.append("between " + ", ".join(speakers))
    if span:
        parts.append(f"from {span[0]} to {span[1]}" if span[1] != span[0] else f"on {span[0]}")
    return " ".join(parts) + "."


def rules_merge(
    previous: SummaryPayload | None,
    messages: Sequence[Message],
    *,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    caps: PayloadCaps,
    lang: str = "en",
    digest: Sequence[Excerpt] = (),
    fill: bool = True,
    read_only_tools: Sequence[str] = DEFAULT_READ_ONLY_TOOLS,
) -> SummaryPayload:
    """``previous`` with ``messages`` folded in by rules (no model), within ``caps`` and
    ``budget_tokens`` (measured as ``count_tokens(render_payload(result, lang))``). ``digest``:
    a summarizer's sentences on these messages, candidates for the record next to theirs.
    ``fill``: the record is chosen again with the room its per-sentence estimate left unused
    (the estimate names a speaker on every sentence, the rendering once per run of them), so it
    takes ``budget_tokens`` to within ``_REFILL_MIN``.

    - summary: one overview line (messages covered, speakers, dates spanned);
    - goal: the newest user sentence that asks for something; else the previous goal;
    - open questions: the newest few user questions that no later assistant text answers (shares
      a content word), the previous ones still unanswered first;
    - in-progress task: the current goal and its open questions (finished work is in the
      ledger; a new goal closes the previous task);
    - ledger: every state-changing tool call (``ledger.ledger_entries``; tools named by
      ``read_only_tools`` only read), the previous ones always kept (an old one with fewer
      details when the budget binds), and the values of look-ups that a later step used;
    - identifiers: bookkeeping, never rendered as a list: the ones the rendering says (in an
      action, a look-up, a sentence), ranked by ``_rank_identifiers``; where each came from is
      kept in ``identifier_sources``; pinned facts: the previous ones, always;
    - excerpts, the record: the sentences of both speakers that carry the most facts per token,
      whole, with the message they came from and its date (``excerpts.select_excerpts``),
      chosen again from the previous record and this batch on every merge, so the budget is
      used and a repeated fact is kept once.
    System messages and event markers are ignored."""
    prev = copy_payload(previous) if previous is not None else SummaryPayload()
    turns = _digest(messages)
    if not turns:
        return fit_to_budget(apply_caps(prev, caps), budget_tokens, count_tokens, lang)
    user_turns = [t for t in turns if t.role == "user"]
    assistant_turns = [t for t in turns if t.role == "assistant"]

    def item(text: str) -> str:
        return cut_text(collapse_whitespace(text), caps.item_chars, marker_counts=True)

    # Goal.
    requests = []
    for turn in user_turns:
        wishes = [
            s
            for s in turn.sentences
            if _is_substantive(s) and _REQUEST().search(s) and not _CONFIRMATION().search(s)
        ]
        requests.extend(([s for s in wishes if not _is_question(s)] or wishes)[:1])
    # No request, no goal: a chat without one has none (its sentences are in the record).
    goal = requests[-1] if requests else prev.conversation_goal
    goal = cut_text(collapse_whitespace(goal), caps.goal_chars, marker_counts=True)

    # Open questions: previous ones still unanswered, then this batch's.
    reply_keys = [(t.index, _overlap_keys(t.text)) for t in assistant_turns if t.text.strip()]
    all_replies = [keys for _, keys in reply_keys]
    batch_questions: list[str] = []
    unanswered: list[str] = []
    for turn in user_turns:
        replies = [keys for index, keys in reply_keys if index > turn.index]
        for sentence in turn.sentences:
            if _is_question(sentence) and not _is_ack(sentence):
                batch_questions.append(item(sentence))
                if not _answered(sentence, replies):
                    unanswered.append(item(sentence))
    open_questions = _merge_items(
        [
            q
            for q in prev.open_questions
            if q not in batch_questions and not _answered(q, all_replies)
        ],
        unanswered,
    )[-_OPEN_QUESTIONS:]

    # The task in progress: the current goal and what it still waits for. Finished work is in
    # the ledger, so a new goal closes the previous task.
    task_goal = item(goal)
    tasks = [InProgressTask(goal=task_goal, todo=open_questions)] if open_questions else []
    actions = ledger_entries(messages, read_only_tools)
    # Every action is said again as fully as the budget now allows (``LedgerEntry.level``).
    ledger = unique_entries(
        [
            *(e.model_copy(update={"level": 0}) for e in prev.ledger),
            *(e for e in actions if not e.read_only),
        ]
    )
    lookups = unique_entries([*prev.lookups, *(e for e in actions if e.read_only)])

    new = [*_new_excerpts(turns, caps, lang), *digest]
    # Everything but the identifiers and the record, as it will be rendered.
    sections = apply_caps(
        SummaryPayload(
            summary=_summary_text(prev, _overview(turns, [*prev.excerpts, *new], lang), caps),
            conversation_goal=goal,
            open_questions=open_questions,
            in_progress_tasks=tasks,
            ledger=ledger,
            # What a look-up found goes before the record; what it only looked for, after it.
            lookups=[e for e in lookups if e.result],
            pinned_facts=list(prev.pinned_facts),
            # A model-written previous payload's lists are kept as they were.
            stable_facts=prev.stable_facts,
            user_profile=prev.user_profile,
            decisions=prev.decisions,
            timeline=prev.timeline,
        ),
        caps,
    )
    identifiers, identifier_sources = _rank_identifiers(prev, turns)
    base = apply_caps(
        sections.model_copy(
            update={
                "identifiers": identifiers,
                "identifier_sources": group_sources(identifiers, identifier_sources),
            }
        ),
        caps,
    )
    # The record keeps a share of the budget for what the user said of themselves and the ids
    # they gave that no action says (a booking reference, a path): in a tool chat the ledger
    # would otherwise take everything, the user's own words included.
    # An id the ledger already says (whose reservation, for which user) needs no sentence.
    acted = "\n".join([*ledger_lines(ledger), *lookup_lines(sections.lookups)])
    user_ids = frozenset(
        i for i in identifier_sources_by(identifier_sources, "user") if not says(acted, i)
    )
    givers = _id_givers([*prev.excerpts, *new], user_ids)
    bonus = functools.partial(_excerpt_bonus, givers=givers)
    precious = functools.partial(_precious, givers=givers)
    wanted = sum(count_tokens(e.text) + 4 for e in [*prev.excerpts, *new] if precious(e))
    # With a margin: the rendering's headers cost more than the estimate, and a share cut to
    # what the last record held would lose a sentence at every merge.
    reserve = min(int(budget_tokens * _RECORD_SHARE), wanted + wanted // 4 + 16) if wanted else 0
    if reserve and prev.pinned_facts:
        # Never at the cost of a pinned fact.
        pins = count_tokens(render_payload(SummaryPayload(pinned_facts=prev.pinned_facts), lang))
        reserve = max(0, min(reserve, budget_tokens - pins))
    base = fit_to_budget(base, budget_tokens - reserve, count_tokens, lang)
    rendered = render_payload(base, lang)
    heading = count_tokens("Record (said in the conversation; #n = message number):\n")
    room = budget_tokens - count_tokens(rendered) - heading
    covered = content_keys(rendered)

    def record(room: int) -> SummaryPayload:
        # What the user said of themselves and the ids they gave are chosen first, within the
        # record's share, and stand last (kept longest); the other sentences fill the rest.
        first = select_excerpts(
            [e for e in prev.excerpts if precious(e)],
            [e for e in new if precious(e)],
            budget_tokens=max(0, min(room, reserve)),
            count_tokens=count_tokens,
            covered=covered,
            bonus=bonus,
        )
        used = sum(count_tokens(e.text) + 4 for e in first)
        said = set(covered)
        for e in first:
            said.update(content_keys(e.text))
        rest = select_excerpts(
            [e for e in prev.excerpts if e not in first],
            [e for e in new if e not in first],
            budget_tokens=max(0, room - used),
            count_tokens=count_tokens,
            covered=said,
            bonus=bonus,
        )
        return apply_caps(base.model_copy(update={"excerpts": [*rest, *first]}), caps)

    merged = record(room)
    # The estimate counts a speaker's name on every sentence; the rendering names a speaker once
    # per run of their sentences, so a record estimated full can leave room: choose again with it.
    for _ in range(_REFILLS if fill else 0):
        slack = budget_tokens - count_tokens(render_payload(merged, lang))
        if slack < _REFILL_MIN or not merged.excerpts:
            break
        room += slack
        merged = record(room)
    # The estimate leaves out the lines' date and seq headers: drop the least important
    # excerpts until the rendering fits.
    while merged.excerpts:
        over = count_tokens(render_payload(merged, lang)) - budget_tokens
        if over <= 0:
            break
        drop, freed = 0, 0
        while drop < len(merged.excerpts) - 1 and freed < over:
            freed += count_tokens(merged.excerpts[drop].text) + 2
            drop += 1
        merged = merged.model_copy(update={"excerpts": merged.excerpts[max(1, drop) :]})
    merged = _with_lookups(merged, lookups, budget_tokens, count_tokens, lang)
    return _said_identifiers(fit_to_budget(merged, budget_tokens, count_tokens, lang), lang)


def _with_lookups(
    payload: SummaryPayload,
    lookups: list[LedgerEntry],
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    lang: str,
) -> SummaryPayload:
    """``payload`` with the newest look-ups that found nothing worth keeping (what they looked
    for) that still fit, beside the ones it has: they come last, after the actions and the
    record."""
    found = {(e.seq, e.tool) for e in payload.lookups}
    lookups = sorted(
        [*payload.lookups, *(e for e in lookups if not e.result and (e.seq, e.tool) not in found)],
        key=lambda e: (bool(e.result), e.seq),
    )
    low, high = len(payload.lookups), len(lookups)
    while low < high:  # the most look-ups (newest kept) that fit
        middle = (low + high + 1) // 2
        kept = payload.model_copy(update={"lookups": _by_seq(lookups[len(lookups) - middle :])})
        if count_tokens(render_payload(kept, lang)) <= budget_tokens:
            low = middle
        else:
            high = middle - 1
    if low == len(payload.lookups):
        return payload
    return payload.model_copy(update={"lookups": _by_seq(lookups[len(lookups) - low :])})


def _by_seq(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    return sorted(entries, key=lambda e: e.seq)


def _said_identifiers(payload: SummaryPayload, lang: str) -> SummaryPayload:
    """``payload`` with only the identifiers its rendering says: each stands in an item that
    says what it is, and one no item says any more is not carried on as a bare id."""
    rendered = render_payload(payload, lang)
    kept = [i for i in payload.identifiers if says(rendered, i)]
    if kept == payload.identifiers:
        return payload
    sources = sources_of(payload)
    return payload.model_copy(
        update={"identifiers": kept, "identifier_sources": group_sources(kept, sources)}
    )


def identifier_sources_by(sources: dict[str, str], source: str) -> list[str]:
    """The identifiers recorded with ``source``."""
    return [i for i, s in sources.items() if s == source]


def _excerpt_key(excerpt: Excerpt) -> tuple[int, int, str]:
    return (excerpt.seq, excerpt.part, excerpt.text)


def _id_givers(
    pool: Sequence[Excerpt], user_ids: frozenset[str]
) -> frozenset[tuple[int, int, str]]:
    """The sentences that first say an identifier the user gave (a booking reference, a
    path): one per identifier, the earliest, so a later sentence that only repeats it (an echo,
    a traceback line) is worth no more than its words."""
    first: dict[str, tuple[int, int, str]] = {}
    if user_ids:
        for excerpt in sorted(pool, key=_excerpt_key):
            for ident in extract_identifiers(excerpt.text):
                if ident in user_ids:
                    first.setdefault(ident, _excerpt_key(excerpt))
    return frozenset(first.values())


def _precious(excerpt: Excerpt, givers: frozenset[tuple[int, int, str]]) -> bool:
    """A sentence the record keeps a share for: the first to say an id the user gave that no
    action says, or what an agent's user said of themselves (``_PROFILE``) without an id. In a
    conversation between named people (both speakers named, as in LoCoMo) every speaker's
    sentences compete alike."""
    if _excerpt_key(excerpt) in givers:
        return True
    if excerpt.speaker not in _USER_LABELS:
        return False
    # "My user id is X" is a giver or said by the ledger; "I'm allergic to nuts" is a profile.
    return bool(_PROFILE().search(excerpt.text)) and not extract_identifiers(excerpt.text)


def _excerpt_bonus(
    excerpt: Excerpt, givers: frozenset[tuple[int, int, str]] = frozenset()
) -> float:
    """A stated preference or fact about oneself, a confirmed action, a sentence that holds
    an identifier the user gave (a booking reference: the record is the only place that says
    what it is), or a summarizer's digest sentence is worth more than its words alone."""
    if excerpt.to_seq:
        # A summarizer's digest sentence speaks for a range of messages; its opening sentence
        # is what the model made of the range, kept before anything it only repeats.
        return 10.0 if excerpt.part == 0 else 4.0
    bonus = 6.0 if _excerpt_key(excerpt) in givers else 0.0
    if _PROFILE().search(excerpt.text) or _DECISION().search(excerpt.text):
        bonus += 1.5
    return bonus
