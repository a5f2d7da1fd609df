"""Pure decisions: when to compress, where to cut, what fits the budget.

Every function here takes plain data and returns plain data, so the pipeline's choices can be
tested without a loop, a store or a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from host_stub.messages import Message, tool_groups

__all__ = [
    "CompressionPlan",
    "after_compression",
    "Cut",
    "conversation_messages",
    "core_tokens",
    "cut_point",
    "fill_keep_tokens",
    "fixed_tokens",
    "tail_room_cap",
    "gain_estimate",
    "hard_triggered",
    "soft_triggered",
    "split_batches",
    "summary_budget",
    "summary_growth",
    "SUMMARY_GROWTH",
    "turn_triggered",
    "WatermarkPlan",
    "plan_compression",
    "plan_watermark",
]


def conversation_messages(messages: Sequence[Message]) -> list[Message]:
    """What can be summarized: real messages that are not system messages (core memory) and not
    event markers."""
    return [m for m in messages if m.kind == "message" and m.role != "system"]


def core_tokens(messages: Sequence[Message]) -> int:
    """Tokens of the history's core system messages (never summarized, never archived)."""
    return sum(m.tokens or 0 for m in messages if m.role == "system" and m.kind == "message")


def counters_after_run(
    messages: Sequence[Message], archived_through_seq: int, markers: int
) -> tuple[int, int]:
    """The per-turn counters ``(active, last_seq)`` of a session once a run read ``messages``
    and archived every conversation message up to ``archived_through_seq``.

    The turn-end handler adds ``seq`` steps past ``last_seq`` to ``active``, and the run's own
    ``markers`` (written after it, so not in ``messages``) will take seqs there too: they are
    taken off ``active`` now so each is counted out exactly once. Messages appended while the
    run went are past ``last_seq`` and counted by the next turn's handler."""
    conv = conversation_messages(messages)
    active = sum(1 for m in conv if (m.seq or 0) > archived_through_seq)
    last_seq = max((m.seq or 0 for m in messages), default=0)
    return active - markers, last_seq


def summary_budget(
    context_window: int, ratio: float, max_tokens: int, summarizer_max_output: int | None
) -> int:
    """max(512, window x ratio), capped by ``max_tokens`` (0 = no cap) and the summarizer's max
    output."""
    budget = max(512, int(context_window * ratio))
    if max_tokens > 0:
        budget = min(budget, max_tokens)
    if summarizer_max_output:
        budget = min(budget, summarizer_max_output)
    return budget


def fixed_tokens(breakdown: Mapping[str, int]) -> int:
    """What no compression can shrink, from a usage breakdown: the system prompt (and other
    plugins' contributions), tool definitions, the reply reserve."""
    return (
        breakdown.get("system", 0)
        + breakdown.get("tool_defs", 0)
        + breakdown.get("reserved_for_reply", 0)
    )


#: The summary takes at most this share of what the fill target leaves after the fixed parts,
#: so the verbatim tail keeps the rest even when a reply reserve takes much of a small window.
SUMMARY_SHARE_OF_ROOM = 0.9


def tail_room_cap(context_window: int, fill_target: float, fixed: int) -> int:
    """The most the summary may take so the kept tail still has room (at least 128 tokens)."""
    room = int(fill_target * context_window) - fixed
    return max(128, int(SUMMARY_SHARE_OF_ROOM * room))


def turn_triggered(
    outcome: str,
    active: int,
    threshold: int | None,
    turns_since_last: int | None,
    debounce_turns: int,
) -> bool:
    """After a turn: the message-count trigger is on (``threshold`` set), the turn was not
    aborted or failed, enough active messages, enough turns since the last compression
    (``None`` = never compressed)."""
    if threshold is None or outcome in ("aborted", "error"):
        return False
    if active < threshold:
        return False
    return turns_since_last is None or turns_since_last >= debounce_turns


def soft_triggered(ratio: float, soft: float, *, dry_run: bool, rebuilt: bool) -> bool:
    return soft > 0 and not dry_run and not rebuilt and ratio >= soft


def hard_triggered(ratio: float, hard: float, *, dry_run: bool) -> bool:
    return 0 < hard < 1 and not dry_run and ratio >= hard


@dataclass(frozen=True)
class Cut:
    """``covered_up_to_seq``: every conversation message at or below it gets summarized."""

    covered_up_to_seq: int
    messages: list[Message]
    kept: list[Message]


def cut_point(
    messages: Sequence[Message], keep_recent: int | None, keep_recent_tokens: int | None = None
) -> Cut | None:
    """Keep the newest ``keep_recent`` conversation messages (``None``: no count limit) and at
    most ``keep_recent_tokens`` of them, but always the newest one; then keep the newest user
    message too (some providers refuse a prompt without one), and move the cut earlier so an
    assistant tool-call message and all its results stay on one side. ``None`` when nothing
    would be summarized."""
    conv = conversation_messages(messages)
    start = 0 if keep_recent is None else max(0, len(conv) - max(1, keep_recent))
    if keep_recent_tokens is not None:
        total = 0
        first = len(conv)
        for i in range(len(conv) - 1, start - 1, -1):
            total += conv[i].tokens or 0
            if total > keep_recent_tokens and i < len(conv) - 1:
                break
            first = i
        start = first
    last_user = max((i for i, m in enumerate(conv) if m.role == "user"), default=None)
    if last_user is not None and last_user < start:
        start = last_user
    for g_start, g_end, _ in tool_groups(conv):
        if g_start < start < g_end:
            start = g_start
            break
    if start <= 0:
        return None
    return Cut(conv[start - 1].seq or 0, conv[:start], conv[start:])


def split_batches(messages: Sequence[Message], batch_tokens: int) -> list[list[Message]]:
    """Consecutive batches of at most ``batch_tokens`` (a single larger message or tool group is a
    batch of its own); a batch never ends inside a tool-call group."""
    items = list(messages)
    unit_starts = set(range(len(items)))
    for g_start, g_end, _ in tool_groups(items):
        unit_starts -= set(range(g_start + 1, g_end))
    batches: list[list[Message]] = []
    current: list[Message] = []
    tokens = 0
    i = 0
    while i < len(items):
        j = i + 1
        while j < len(items) and j not in unit_starts:
            j += 1
        unit = items[i:j]
        unit_tokens = sum(m.tokens or 0 for m in unit)
        if current and tokens + unit_tokens > batch_tokens:
            batches.append(current)
            current, tokens = [], 0
        current.extend(unit)
        tokens += unit_tokens
        i = j
    if current:
        batches.append(current)
    return batches


@dataclass(frozen=True)
class WatermarkPlan:
    """How a watermark compression should size the kept window, or why it cannot help."""

    keep_tokens: int | None
    blocked: str | None = None


def plan_watermark(
    *,
    context_window: int,
    mark: float,
    min_gain: float,
    fixed_tokens: int,
    summary_budget_tokens: int,
    newest_tokens: int,
    summary_tokens_now: int = 0,
    aim: float | None = None,
) -> WatermarkPlan:
    """Aim below the mark that fired by ``min_gain`` (so the next calls do not fire it again at
    once): the kept window may hold what is left of ``(mark - min_gain) x window`` after what
    cannot be compressed (system prompt, core system messages, tool definitions, reply reserve)
    and the summary at its full budget, and always holds the newest message. When even the
    floor (what cannot be compressed, the newest message and the summary as it is now) reaches
    the mark, no compression can help: ``blocked`` says why (the caller warns once and waits for
    the history to change instead of compressing on every call). ``aim`` (default: ``mark``) is
    the mark to aim under when a lower one fired at the same time (a blocking compression that
    also passed the soft mark aims under the soft one, so no background run follows it)."""
    floor = fixed_tokens + min(summary_tokens_now, summary_budget_tokens) + newest_tokens
    if floor >= mark * context_window:
        return WatermarkPlan(
            None,
            blocked=(
                f"what cannot be compressed ({floor} tokens: fixed {fixed_tokens}, summary "
                f"{summary_tokens_now}, newest message {newest_tokens}) reaches the watermark "
                f"({mark:.0%} of {context_window})"
            ),
        )
    target = int(max(0.0, (mark if aim is None else min(aim, mark)) - min_gain) * context_window)
    return WatermarkPlan(max(newest_tokens, target - fixed_tokens - summary_budget_tokens))


def fill_keep_tokens(
    *,
    context_window: int,
    fill_target: float,
    fixed_tokens: int,
    summary_budget_tokens: int,
    newest_tokens: int,
) -> int:
    """Tokens of verbatim history kept so that the prompt, with what cannot be compressed and
    the summary at its full budget, takes ``fill_target`` of the window (always the newest
    message): the window is filled, not a fixed message count."""
    room = int(fill_target * context_window) - fixed_tokens - summary_budget_tokens
    return max(newest_tokens, room)


#: A compression's summary grows by at most this share of what it archives (up to its budget),
#: so every compression frees at least the rest: an extractive merge would otherwise move the
#: archived text into a summary with room to spare and free nothing.
SUMMARY_GROWTH = 0.5


#: ... but a small compression may always add this much (a sentence or two).
SUMMARY_GROWTH_FLOOR = 64


def summary_growth(archived_tokens: int, summary_tokens_now: int, budget_tokens: int) -> int:
    """How many tokens the summary may grow by when ``archived_tokens`` are folded into it."""
    share = max(int(SUMMARY_GROWTH * archived_tokens), min(archived_tokens, SUMMARY_GROWTH_FLOOR))
    return min(max(0, budget_tokens - summary_tokens_now), share)


def gain_estimate(
    *,
    archived_tokens: int,
    summary_tokens_now: int,
    summary_budget_tokens: int,
    context_window: int,
) -> float:
    """Share of the window a compression frees at worst: what it archives, minus how much the
    summary may grow (``summary_growth``)."""
    growth = summary_growth(archived_tokens, summary_tokens_now, summary_budget_tokens)
    return (archived_tokens - growth) / max(1, context_window)


@dataclass(frozen=True)
class CompressionPlan:
    """What one compression would do with a history, decided before any I/O.

    ``skip`` says why nothing would run (``None`` = run). ``blocked`` is set when the watermark
    floor is the reason (the caller cools down on it); ``gain`` when the soft mark's ``min_gain``
    was checked."""

    skip: str | None = None
    blocked: str | None = None
    cut: Cut | None = None
    batches: list[list[Message]] = field(default_factory=list)
    archived_tokens: int = 0
    gain: float | None = None


def plan_compression(
    messages: Sequence[Message],
    *,
    reason: str,
    threshold: int | None,
    keep_recent: int | None,
    keep_recent_tokens: int | None,
    context_window: int,
    mark: float | None,
    min_gain: float,
    breakdown: Mapping[str, int],
    aim: float | None = None,
    fill_target: float | None = None,
    summary_budget_tokens: int,
    batch_tokens: int,
    max_batches: int,
) -> CompressionPlan:
    """The whole pre-flight of a compression, one function for every caller: the blocking
    request checks it on the prompt's own view (no store read when nothing could be done) and
    the run checks it again on its fresh snapshot.

    ``messages`` is the active history (system messages are core memory, markers are ignored);
    ``mark`` the watermark that fired (``None`` for a turn or a manual request), ``aim`` a lower
    mark that fired with it (see :func:`plan_watermark`) and ``breakdown`` the host's usage
    breakdown at that moment (empty = unknown). With neither ``keep_recent`` nor
    ``keep_recent_tokens`` set, a ``manual`` request keeps only the newest exchange (the newest
    user message onwards) and a turn-triggered one what fits under ``fill_target`` of the window
    next to the summary at its full budget (see :func:`fill_keep_tokens`)."""
    conv = conversation_messages(messages)
    if reason == "turn" and (threshold is None or len(conv) < threshold):
        return CompressionPlan(skip=f"{len(conv)} messages, below threshold {threshold}")
    nothing = f"nothing to compress ({len(conv)} active messages)"
    if len(conv) <= 1:
        return CompressionPlan(skip=nothing)
    keep_tokens = keep_recent_tokens
    use_marks = bool(mark) and bool(breakdown)
    fixed = fixed_tokens(breakdown) + core_tokens(messages)
    if reason == "manual" and keep_tokens is None and keep_recent is None:
        # Asked for by a person or an API call: everything but the newest exchange.
        keep_tokens = 0
    elif not use_marks and keep_tokens is None and keep_recent is None:
        keep_tokens = fill_keep_tokens(
            context_window=context_window,
            fill_target=0.5 if fill_target is None else fill_target,
            fixed_tokens=fixed,
            summary_budget_tokens=summary_budget_tokens,
            newest_tokens=conv[-1].tokens or 0,
        )
    if use_marks:
        plan = plan_watermark(
            context_window=context_window,
            mark=mark or 0.0,
            min_gain=min_gain,
            fixed_tokens=fixed,
            summary_budget_tokens=summary_budget_tokens,
            newest_tokens=conv[-1].tokens or 0,
            summary_tokens_now=breakdown.get("summary", 0),
            aim=aim,
        )
        if plan.blocked is not None:
            return CompressionPlan(skip=f"blocked: {plan.blocked}", blocked=plan.blocked)
        if plan.keep_tokens is not None:
            keep_tokens = (
                plan.keep_tokens if keep_tokens is None else min(keep_tokens, plan.keep_tokens)
            )
    cut = cut_point(messages, keep_recent, keep_tokens)
    if cut is None:
        return CompressionPlan(skip=nothing)
    batches = split_batches(cut.messages, batch_tokens)[:max_batches]
    archived_tokens = sum(m.tokens or 0 for b in batches for m in b)
    gain = None
    if reason == "auto" and use_marks:
        # The soft mark is not urgent: a compression that frees little waits until it can free
        # more (the hard mark, if it comes first, compresses regardless).
        gain = gain_estimate(
            archived_tokens=archived_tokens,
            summary_tokens_now=breakdown.get("summary", 0),
            summary_budget_tokens=summary_budget_tokens,
            context_window=context_window,
        )
        if gain < min_gain:
            return CompressionPlan(skip=f"min_gain: would free {gain:.1%} of the window", gain=gain)
    return CompressionPlan(cut=cut, batches=batches, archived_tokens=archived_tokens, gain=gain)


def after_compression(
    messages: Sequence[Message],
    breakdown: Mapping[str, int],
    *,
    covered_up_to_seq: int,
    summary_tokens: int,
) -> tuple[list[Message], dict[str, int]]:
    """The history and usage breakdown a prompt has once a compression archived every
    conversation message up to ``covered_up_to_seq`` (core system messages stay) and its summary
    block takes ``summary_tokens``: what a blocking request that joined another run plans on,
    without reading the store again."""
    left = [
        m
        for m in messages
        if (m.role == "system" and m.kind == "message") or (m.seq or 0) > covered_up_to_seq
    ]
    after = dict(breakdown)
    after["summary"] = summary_tokens
    after["history"] = sum(m.tokens or 0 for m in left if not m.is_marker)
    after["tools"] = 0
    return left, after
