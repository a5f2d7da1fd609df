"""The rules engine: seed 002's ``fallbackMerge``, improved. It folds a batch of messages into the
previous payload without any model: deterministic (no clock, no randomness, no set iteration),
extractive (every item is text of the previous payload or of the messages, cut at most),
idempotent (the same batch merged twice into its own result adds nothing) and always within the
token budget. Identifiers are carried verbatim; when the cap forces a choice, the ones a user typed
outrank the ones a tool call used, which outrank the ones an assistant mentioned, which outrank
the ones that only appeared in a tool result, across merges (the payload records each
identifier's source); a date or other plain number that was only mentioned ranks below them all
(``summary_model.identifier_rank``); within a rank newer outranks older.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from host_stub.messages import Message

from .config import PayloadCaps
from .excerpts import content_keys, select_excerpts, split_long
from .fitting import apply_caps, fit_lines, fit_to_budget, identifier_parts, render_payload
from .identifiers import extract_identifiers
from .patterns import lazy_regex
from .summary_model import (
    Excerpt,
    InProgressTask,
    SummaryPayload,
    copy_payload,
    group_sources,
    identifier_rank,
    source_tier,
    sources_of,
    stronger_source,
)
from .text import collapse_whitespace, cut_text
from .turns import (
    _CONFIRMATION,
    _DATE,
    _DECISION,
    _PROFILE,
    _REQUEST,
    _TOOL_FAILURE,
    _answered,
    _digest,
    _format_call,
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

    Ranked by ``summary_model.identifier_rank``: the source's tier, lowest first: identifiers
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

#: Share of the budget the identifier list may take (the rest of the summary keeps at least a
#: tenth): in a tool chat they are the facts the rest of the conversation turns on (booking
#: references, order and user ids); which ones go first when they do not all fit is their rank.
_IDENTIFIER_SHARE = 0.9

#: Times the record is chosen again with the room its estimate left unused, and the least room
#: worth it (tokens).
_REFILLS = 2
_REFILL_MIN = 24

#: Open questions and in-progress tasks kept: the newest few (the record carries the rest).
_OPEN_QUESTIONS = 3
_TASKS = 2


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
    - in-progress task: the goal, done = successful tool calls, to do = the open questions;
    - identifiers: see ``_rank_identifiers``; where each came from is kept in
      ``identifier_sources`` (not rendered); pinned facts: the previous ones, always;
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

    # The task in progress: what the tools did.
    done = [
        item(_format_call(c))
        for t in assistant_turns
        for c in t.calls
        if c.result is not None and not _TOOL_FAILURE().search(c.result[:200])
    ]
    tasks = [
        task.model_copy(update={"todo": [q for q in task.todo if q in open_questions]})
        for task in prev.in_progress_tasks
    ]
    task_goal = item(goal)
    if tasks and tasks[-1].goal == task_goal:
        last = tasks.pop()
        tasks.append(
            InProgressTask(goal=task_goal, done=_merge_items(last.done, done), todo=open_questions)
        )
    elif done:
        tasks.append(InProgressTask(goal=task_goal, done=done, todo=open_questions))
    tasks = tasks[-_TASKS:]

    new = [*_new_excerpts(turns, caps, lang), *digest]
    # Everything but the identifiers and the record, as it will be rendered.
    sections = apply_caps(
        SummaryPayload(
            summary=_summary_text(prev, _overview(turns, [*prev.excerpts, *new], lang), caps),
            conversation_goal=goal,
            open_questions=open_questions,
            in_progress_tasks=tasks,
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
    identifiers = _within_share(
        identifiers,
        budget_tokens * _IDENTIFIER_SHARE,
        count_tokens,
        said=render_payload(sections, lang),
    )
    base = apply_caps(
        sections.model_copy(
            update={
                "identifiers": identifiers,
                "identifier_sources": group_sources(identifiers, identifier_sources),
            }
        ),
        caps,
    )
    base = fit_to_budget(base, budget_tokens, count_tokens, lang)
    rendered = render_payload(base, lang)
    heading = count_tokens("Record (said in the conversation; #n = message number):\n")
    room = budget_tokens - count_tokens(rendered) - heading
    covered = content_keys(rendered)

    def record(room: int) -> SummaryPayload:
        excerpts = select_excerpts(
            prev.excerpts,
            new,
            budget_tokens=max(0, room),
            count_tokens=count_tokens,
            covered=covered,
            bonus=_excerpt_bonus,
        )
        return apply_caps(base.model_copy(update={"excerpts": excerpts}), caps)

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
    return fit_to_budget(merged, budget_tokens, count_tokens, lang)


def _within_share(
    identifiers: list[str], tokens: float, count: Callable[[str], int], *, said: str = ""
) -> list[str]:
    """The most important identifiers (the list's tail) whose list takes at most ``tokens``.
    One the rest of the summary already says (``said``) or that a more important one holds
    whole (``7504069`` in ``certificate_7504069``) is kept at no cost: the rendering does not
    list it again (``fitting.unsaid_identifiers``)."""
    kept: list[str] = []
    held: set[str] = set()
    used = 0
    for ident in reversed(identifiers):
        if ident not in said and ident not in held:
            used += count(f" {ident}")
            if used > tokens:
                break
            held.update(identifier_parts(ident))
        kept.append(ident)
    return list(reversed(kept))


def _excerpt_bonus(excerpt: Excerpt) -> float:
    """A stated preference or fact about oneself, a confirmed action, or a summarizer's digest
    sentence is worth more than its words alone."""
    if excerpt.to_seq:
        # A summarizer's digest sentence speaks for a range of messages; its opening sentence
        # is what the model made of the range, kept before anything it only repeats.
        return 10.0 if excerpt.part == 0 else 4.0
    if _PROFILE().search(excerpt.text) or _DECISION().search(excerpt.text):
        return 1.5
    return 0.0
