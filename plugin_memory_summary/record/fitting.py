"""Bounding a payload: caps on every field, the compact rendering that is injected and counted,
and the reduction that makes that rendering fit a token budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..base import ELLIPSIS, PayloadCaps, collapse_whitespace, cut_text
from .ledger_text import ledger_lines, lookup_lines
from .summary_model import (
    Excerpt,
    InProgressTask,
    LedgerEntry,
    SummaryPayload,
    TimelineEvent,
    copy_payload,
    group_sources,
    identifier_rank,
    sources_of,
)

__all__ = [
    "apply_caps",
    "excerpt_lines",
    "fit_lines",
    "fit_to_budget",
    "identifier_parts",
    "PayloadFitter",
    "render_payload",
    "unique_entries",
    "unsaid_identifiers",
]

_LIST_FIELDS = ("stable_facts", "user_profile", "decisions", "open_questions", "retrieval_hints")


def fit_lines(text: str, limit: int) -> str:
    """A multi-line rolling text (the summary) shortened to ``limit`` code points: the oldest
    (first) lines go first; a line that only needs trimming is cut instead of dropped; a single
    remaining line is cut at its end."""
    text = text.strip()
    if len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    lines = [line for line in text.split("\n") if line.strip()]
    while len(lines) > 1:
        total = sum(len(line) for line in lines) + len(lines) - 1
        excess = total - limit
        if excess <= 0:
            break
        oldest = lines[0]
        if len(oldest) - excess >= 40:
            lines[0] = cut_text(oldest, len(oldest) - excess, marker_counts=True)
            break
        lines.pop(0)
    return cut_text("\n".join(lines), limit, marker_counts=True)


# --- caps -------------------------------------------------------------------------------------


def _cap_items(items: list[str], count: int, chars: int) -> list[str]:
    """The newest ``count`` distinct non-empty items, each cut to ``chars``; a repeated item keeps
    its newest position."""
    cut = [cut_text(collapse_whitespace(i), chars, marker_counts=True) for i in items]
    cut = [i for i in cut if i]
    newest_first = list(dict.fromkeys(reversed(cut)))
    return list(reversed(newest_first[:count])) if count > 0 else []


def apply_caps(payload: SummaryPayload, caps: PayloadCaps) -> SummaryPayload:
    """``payload`` within ``caps``: every list keeps its newest ``list_items`` items (the timeline
    ``timeline_items``, identifiers the last ``identifiers``: see the ordering convention in
    ``summary_model``), duplicates removed, each item cut to ``item_chars`` without splitting a
    grapheme; the goal is cut to ``goal_chars`` and the summary to ``summary_chars`` (oldest
    lines first). Identifiers
    are never cut (a cut identifier is a wrong one): one longer than ``item_chars`` is dropped.
    When the payload records where its identifiers came from (``identifier_sources``), they are
    first ordered by ``summary_model.identifier_rank``, stably: dates only mentioned, then codes
    a tool returned, then assistant (and unrecorded) ones, then the ones a tool call used, then
    the ones the user typed, so the cap drops the least worth keeping first.
    Pinned facts are kept whole and never dropped."""
    n, chars = caps.list_items, caps.item_chars
    fields: dict[str, Any] = {
        name: _cap_items(getattr(payload, name), n, chars) for name in _LIST_FIELDS
    }
    tasks = [
        InProgressTask(
            goal=cut_text(collapse_whitespace(t.goal), chars, marker_counts=True),
            done=_cap_items(t.done, n, chars),
            todo=_cap_items(t.todo, n, chars),
        )
        for t in payload.in_progress_tasks
    ]
    tasks = [t for t in tasks if t.goal or t.done or t.todo]
    timeline: list[TimelineEvent] = []
    seen: set[tuple[str, str]] = set()
    for event in reversed(payload.timeline):
        item = TimelineEvent(
            when=cut_text(collapse_whitespace(event.when), chars, marker_counts=True),
            event=cut_text(collapse_whitespace(event.event), chars, marker_counts=True),
        )
        key = (item.when, item.event)
        if (item.when or item.event) and key not in seen:
            seen.add(key)
            timeline.append(item)
    identifiers = [i.strip() for i in payload.identifiers]
    identifiers = [i for i in identifiers if i and len(i) <= chars]
    identifiers = list(reversed(list(dict.fromkeys(reversed(identifiers)))))
    sources = sources_of(payload)
    if sources:
        # Stable: within a tier the list's own order (oldest first) stays.
        identifiers.sort(key=lambda i: identifier_rank(i, sources.get(i)))
    kept = identifiers[max(0, len(identifiers) - caps.identifiers) :] if caps.identifiers else []
    excerpts: list[Excerpt] = []
    said: set[str] = set()
    for excerpt in reversed(payload.excerpts):  # the most important (last) wins a duplicate
        text = cut_text(collapse_whitespace(excerpt.text), caps.excerpt_chars, marker_counts=True)
        if text and text.lower() not in said:
            said.add(text.lower())
            excerpts.append(excerpt.model_copy(update={"text": text}))
    return SummaryPayload(
        summary=fit_lines(payload.summary, caps.summary_chars),
        conversation_goal=cut_text(
            collapse_whitespace(payload.conversation_goal), caps.goal_chars, marker_counts=True
        ),
        ledger=unique_entries(payload.ledger),
        lookups=unique_entries(payload.lookups),
        in_progress_tasks=tasks[-n:],
        timeline=list(reversed(timeline[: caps.timeline_items])),
        identifiers=kept,
        excerpts=list(reversed(excerpts)),
        pinned_facts=list(payload.pinned_facts),
        identifier_sources=group_sources(kept, sources),
        **fields,
    )


def unique_entries(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """Ledger entries in seq order, each call once, as first recorded (the same call merged
    twice is one)."""
    seen: dict[tuple[int, str, str], LedgerEntry] = {}
    for entry in entries:
        seen.setdefault((entry.seq, entry.tool, entry.entity), entry)
    return sorted(seen.values(), key=lambda e: e.seq)


# --- rendering --------------------------------------------------------------------------------

_HEADINGS = {
    "en": {
        "sep": ": ",
        "item_sep": "; ",
        "conversation_goal": "Goal",
        "summary": "Summary",
        "pinned_facts": "Pinned facts",
        "user_profile": "User profile",
        "stable_facts": "Facts",
        "decisions": "Decisions",
        "in_progress_tasks": "In progress",
        "open_questions": "Open questions",
        "timeline": "Timeline",
        "identifiers": "Identifiers",
        "ledger": "Actions (what the tools did, by what they acted on; #n = message number)",
        "lookups": "Looked up (values later steps used)",
        "excerpts": "Record (said in the conversation; #n = message number)",
        "retrieval_hints": "Keywords",
        "done": "done",
        "todo": "to do",
    },
    "zh": {
        "sep": "：",
        "item_sep": "；",
        "conversation_goal": "目标",
        "summary": "摘要",
        "pinned_facts": "置顶事实",
        "user_profile": "用户信息",
        "stable_facts": "已确认事实",
        "decisions": "已有结论",
        "in_progress_tasks": "进行中任务",
        "open_questions": "待解决问题",
        "timeline": "时间线",
        "identifiers": "标识符",
        "ledger": "工具操作（按对象归并；#n 为消息编号）",
        "lookups": "查询结果（后续步骤用到的值）",
        "excerpts": "对话记录（原话；#n 为消息编号）",
        "retrieval_hints": "检索关键词",
        "done": "已完成",
        "todo": "待办",
    },
}


def render_payload(payload: SummaryPayload, lang: str = "en") -> str:
    """The payload as compact text (this is what is injected and counted): one heading per
    non-empty section, in English or Chinese (``lang`` starting with ``zh``); identifiers and
    keywords on one line each. An empty payload renders as ``""``."""
    h = _HEADINGS["zh" if lang.lower().startswith("zh") else "en"]
    sep, item_sep = h["sep"], h["item_sep"]
    out: list[str] = []

    def bullets(name: str, items: list[str]) -> None:
        lines = [f"- {collapse_whitespace(i)}" for i in items if i.strip()]
        if lines:
            out.append(f"{h[name]}{sep.rstrip()}")
            out.extend(lines)

    goal = collapse_whitespace(payload.conversation_goal)
    if goal:
        out.append(f"{h['conversation_goal']}{sep}{goal}")
    summary = payload.summary.strip()
    if summary:
        out.append(
            f"{h['summary']}{sep}{summary}"
            if "\n" not in summary
            else f"{h['summary']}{sep.rstrip()}\n{summary}"
        )
    bullets("pinned_facts", payload.pinned_facts)
    bullets("ledger", ledger_lines(payload.ledger))
    bullets("lookups", lookup_lines(payload.lookups))
    bullets("user_profile", payload.user_profile)
    bullets("stable_facts", payload.stable_facts)
    bullets("decisions", payload.decisions)
    # A task's goal that is the conversation's goal, and a to-do item listed under the open
    # questions, are not said twice.
    questions = {collapse_whitespace(q) for q in payload.open_questions}
    tasks = []
    for task in payload.in_progress_tasks:
        head = collapse_whitespace(task.goal)
        head = "" if _says_again(head, goal) else head
        done = item_sep.join(collapse_whitespace(d) for d in task.done if d.strip())
        todo = item_sep.join(
            collapse_whitespace(t)
            for t in task.todo
            if t.strip() and collapse_whitespace(t) not in questions
        )
        parts = [head] if head else []
        for key, listed in (("done", done), ("todo", todo)):
            if listed:
                parts.append(f"({h[key]}{sep}{listed})" if parts else f"{h[key]}{sep}{listed}")
        if parts:
            tasks.append(" ".join(parts))
    bullets("in_progress_tasks", tasks)
    bullets("open_questions", payload.open_questions)
    events = [
        (f"[{collapse_whitespace(e.when)}] " if e.when.strip() else "")
        + collapse_whitespace(e.event)
        for e in payload.timeline
    ]
    bullets("timeline", events)
    bullets("excerpts", excerpt_lines(payload.excerpts))
    # Identifiers are bookkeeping: each one the summary keeps stands in an item that says what
    # it is (an action, a look-up, a sentence); a line of bare ids says nothing of them.
    hints = [i.strip() for i in payload.retrieval_hints if i.strip()]
    if hints:
        out.append(f"{h['retrieval_hints']}{sep}{', '.join(hints)}")
    return "\n".join(out)


def _says_again(item: str, said: str) -> bool:
    """``item`` is ``said``, or ``said`` cut short (a task's goal is cut to an item's length)."""
    stem = item.removesuffix(ELLIPSIS)
    return item == said or (stem != item and len(stem) >= 3 and said.startswith(stem))


#: Where an identifier's parts meet: ``certificate_7504069``, ``2024-05-04T06:04:48``.
_PART_SEPARATORS = frozenset("_-./:")


def identifier_parts(identifier: str) -> list[str]:
    """What ``identifier`` holds whole before or after one of its separators (``_ - . / :``,
    and the ``T`` between a date and a time): ``certificate`` and ``7504069`` in
    ``certificate_7504069``, ``2024-05-04`` in ``2024-05-04T06:04:48``; not ``HAT13`` in
    ``HAT136``, which is another flight."""
    parts: list[str] = []
    last = len(identifier) - 1
    for i, c in enumerate(identifier):
        if c in _PART_SEPARATORS or (
            c == "T"
            and 0 < i < last
            and identifier[i - 1].isdigit()
            and identifier[i + 1].isdigit()
        ):
            parts += (identifier[:i], identifier[i + 1 :])
    return parts


def says(text: str, identifier: str) -> bool:
    """``text`` holds ``identifier`` as a token of its own: not inside a longer word or code
    (``HAT13`` is not said by "flight HAT136"; ``7504069`` is by "certificate_7504069", past a
    separator, as ``identifier_parts`` counts it)."""
    if not identifier:
        return False
    start = text.find(identifier)
    while start >= 0:
        end = start + len(identifier)
        # Only a Latin letter or digit glues: an id inside Chinese text ("航班MU5101，") is said.
        glued_before = start > 0 and _glues(text[start - 1]) and _glues(identifier[0])
        glued_after = end < len(text) and _glues(text[end]) and _glues(identifier[-1])
        if not (glued_before or glued_after):
            return True
        start = text.find(identifier, start + 1)
    return False


def _glues(char: str) -> bool:
    return char.isascii() and char.isalnum()


def unsaid_identifiers(identifiers: Sequence[str], said: str) -> list[str]:
    """The identifiers a rendering lists: those the text above (``said``) does not already
    hold as a token of its own (:func:`says`), each once, and none that a longer one on the
    list holds whole (``7504069`` when ``certificate_7504069`` is listed: ``identifier_parts``)."""
    items = [i for i in dict.fromkeys(identifiers) if not says(said, i)]
    held = {part for i in items for part in identifier_parts(i)}
    return [i for i in items if i not in held]


_TERMINAL = (".", "!", "?", "…", "。", "！", "？", '"', "”", ")", "）")


def excerpt_lines(excerpts: Sequence[Excerpt], *, per_line: int = 12) -> list[str]:
    """Excerpts in conversation order, one line per date (or stretch of nearby messages, at
    most ``per_line`` sentences): ``[8 May, 2023 #12-30] Caroline: … Melanie: …``; the speaker
    is named where it changes."""
    ordered = sorted(excerpts, key=lambda e: (e.seq, e.part))
    groups: list[list[Excerpt]] = []
    for e in ordered:
        last = groups[-1] if groups else None
        if (
            last is not None
            and len(last) < per_line
            and last[-1].when.strip() == e.when.strip()
            and (e.when.strip() or e.seq - last[-1].seq <= 12)
            # A summarizer's line keeps the range it digests (its provenance) to itself.
            and last[-1].to_seq == e.to_seq
        ):
            last.append(e)
        else:
            groups.append([e])
    lines = []
    for group in groups:
        first, final = group[0].seq, max(max(e.seq, e.to_seq) for e in group)
        seqs = f"#{first}" if first == final else f"#{first}-{final}"
        when = group[0].when.strip()
        parts: list[str] = []
        speaker = None
        for e in group:
            text = collapse_whitespace(e.text)
            if not text.endswith(_TERMINAL):
                text += "."  # items run on one line: each ends as a sentence
            if e.speaker and e.speaker != speaker:
                text = f"{e.speaker}: {text}"
                speaker = e.speaker
            parts.append(text)
        lines.append(f"[{when + ' ' if when else ''}{seqs}] " + " ".join(parts))
    return lines


# --- fitting a token budget -------------------------------------------------------------------

_ORDERED_LISTS = (
    "excerpts",
    "lookups",
    "timeline",
    "stable_facts",
    "decisions",
    "in_progress_tasks",
    "open_questions",
    "user_profile",
)


def _materialize(base: SummaryPayload, state: dict[str, int]) -> SummaryPayload:
    def tail(items: list[Any], keep: int) -> list[Any]:
        return list(items[len(items) - keep :]) if keep > 0 else []

    identifiers = tail(base.identifiers, state["identifiers"])

    return SummaryPayload(
        summary=fit_lines(base.summary, state["summary"]),
        conversation_goal=cut_text(
            base.conversation_goal.strip(), state["conversation_goal"], marker_counts=True
        ),
        stable_facts=tail(base.stable_facts, state["stable_facts"]),
        user_profile=tail(base.user_profile, state["user_profile"]),
        decisions=tail(base.decisions, state["decisions"]),
        open_questions=tail(base.open_questions, state["open_questions"]),
        in_progress_tasks=[
            t.model_copy(deep=True)
            for t in tail(base.in_progress_tasks, state["in_progress_tasks"])
        ],
        ledger=_aged_ledger(base.ledger, state),
        lookups=[e.model_copy() for e in tail(base.lookups, state["lookups"])],
        timeline=[e.model_copy() for e in tail(base.timeline, state["timeline"])],
        excerpts=[e.model_copy() for e in tail(base.excerpts, state["excerpts"])],
        retrieval_hints=tail(base.retrieval_hints, state["retrieval_hints"]),
        identifiers=identifiers,
        # Pinned facts are dropped from the newest end: only the last resort gets here.
        pinned_facts=list(base.pinned_facts[: state["pinned_facts"]]),
        identifier_sources=group_sources(identifiers, sources_of(base)),
    )


#: The reduction states' counts of aged ledger entries, by the level they say them at.
_LEDGER_LEVELS = (("ledger_brief", 1), ("ledger_bare", 2), ("ledger_folded", 3))


def _aged_ledger(ledger: list[LedgerEntry], state: dict[str, int]) -> list[LedgerEntry]:
    """The ledger as a reduction state says it: the oldest ``ledger_brief`` entries with only
    the ids of their details, the oldest ``ledger_bare`` with none, the oldest
    ``ledger_folded`` on one line per kind of action (their ``level``: the details stay in the
    entry); the newest ``ledger`` entries at all (the last resort, past the identifiers)."""
    kept = state["ledger"]
    out = []
    for index in range(len(ledger) - kept, len(ledger)) if kept else ():
        entry = ledger[index]
        level = max((lv for name, lv in _LEDGER_LEVELS if index < state[name]), default=0)
        out.append(entry.model_copy(update={"level": max(entry.level, level)}))
    return out


def _reduction_states(base: SummaryPayload) -> list[dict[str, int]]:
    """Ever smaller versions of ``base`` as keep-counts / character limits, in sacrifice order:
    keywords; old actions' details down to their ids (oldest first); then every list down to a
    few newest items and the summary to half; old actions down to what was done to what, then
    folded per kind of action; then the lists entirely; the summary; the goal; identifiers
    (lowest priority first); actions (oldest first); pinned facts last."""
    state = {
        name: len(getattr(base, name))
        for name in (*_ORDERED_LISTS, "retrieval_hints", "identifiers", "pinned_facts", "ledger")
    }
    for name, _ in _LEDGER_LEVELS:
        state[name] = 0
    state["summary"] = len(base.summary.strip())
    state["conversation_goal"] = len(base.conversation_goal.strip())
    states = [dict(state)]

    def shrink_list(name: str, floor: int) -> None:
        while state[name] > floor:
            state[name] -= 1
            states.append(dict(state))

    def shrink_text(name: str, floor: int) -> None:
        length = state[name]
        step = max(8, -(-length // 48))
        while length > floor:
            length = max(floor, length - step)
            state[name] = length
            states.append(dict(state))

    def age_ledger(name: str) -> None:
        while state[name] < state["ledger"]:
            state[name] += 1
            states.append(dict(state))

    shrink_list("retrieval_hints", 0)
    # Old actions say less, oldest first: only their ids, before the lists shrink; what was
    # done to what, then folded per kind of action, before the last few items of every list go.
    age_ledger("ledger_brief")
    for name in _ORDERED_LISTS:
        shrink_list(name, 1 if name == "in_progress_tasks" else 3)
    shrink_text("summary", state["summary"] // 2)
    age_ledger("ledger_bare")
    age_ledger("ledger_folded")
    for name in _ORDERED_LISTS:
        shrink_list(name, 0)
    shrink_text("summary", 0)
    shrink_text("conversation_goal", 0)
    shrink_list("identifiers", 0)
    shrink_list("ledger", 0)
    shrink_list("pinned_facts", 0)
    return states


def fit_to_budget(
    payload: SummaryPayload,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    lang: str = "en",
) -> SummaryPayload:
    """``payload`` reduced until ``count_tokens(render_payload(p, lang)) <= budget_tokens``.

    Sacrifice order (see ``_reduction_states``): retrieval keywords, the oldest timeline events,
    facts, decisions, tasks, open questions and profile entries (first down to a few, with the
    summary halved, then entirely), then the summary (oldest lines first), the goal, identifiers
    (from the head of the list: oldest / lowest priority), and as the very last resort pinned
    facts, dropped whole from the newest end. The candidates form one shrinking sequence; a
    binary search over it takes about log2(length) counts. The result always fits, except when
    even the empty rendering does not (``count_tokens("") > budget_tokens``): then the empty
    payload is returned. Always terminates."""
    return PayloadFitter(payload, count_tokens, lang).fit(budget_tokens)[0]


class PayloadFitter:
    """:func:`fit_to_budget` for one payload at any number of budgets: the candidates already
    rendered and counted are kept, and a later budget's search starts between the nearest of
    them (a prompt that shrinks a little each call renders one or two candidates, not a whole
    binary search). The payload is copied once; nothing of the caller's is kept."""

    def __init__(
        self, payload: SummaryPayload, count_tokens: Callable[[str], int], lang: str = "en"
    ) -> None:
        self._base = copy_payload(payload)
        self._count = count_tokens
        self._lang = lang
        self._states: list[dict[str, int]] | None = None
        #: Candidate index -> (payload, its rendering, its tokens); 0 is the payload itself.
        self._known: dict[int, tuple[SummaryPayload, str, int]] = {}

    def _candidate(self, index: int) -> tuple[SummaryPayload, str, int]:
        known = self._known.get(index)
        if known is None:
            if index == 0:
                candidate = self._base
            else:
                assert self._states is not None
                candidate = _materialize(self._base, self._states[index])
            text = render_payload(candidate, self._lang)
            known = self._known[index] = (candidate, text, self._count(text))
        return known

    def rendering(self) -> str:
        """The whole payload rendered (``render_payload``), made once."""
        return self._candidate(0)[1]

    def fit(self, budget_tokens: int) -> tuple[SummaryPayload, str]:
        """The largest candidate whose rendering fits ``budget_tokens``, and that rendering (the
        empty payload and ``""`` when none does). The payload returned is the fitter's: copy it
        before changing it."""
        whole = self._candidate(0)
        if whole[2] <= budget_tokens:
            return whole[0], whole[1]
        if self._states is None:
            self._states = _reduction_states(self._base)
        last = len(self._states) - 1
        if last < 1 or self._candidate(last)[2] > budget_tokens:
            return SummaryPayload(), ""
        # The search's bounds from what is known: ``high`` fits, everything known below ``low``
        # does not (the candidates shrink in one order, so the answer is between them).
        high = min(i for i, c in self._known.items() if c[2] <= budget_tokens)
        low = 1 + max((i for i, c in self._known.items() if i < high and c[2] > budget_tokens))
        while low < high:
            middle = (low + high) // 2
            if self._candidate(middle)[2] <= budget_tokens:
                high = middle
            else:
                low = middle + 1
        candidate, text, _ = self._candidate(high)
        return candidate, text
