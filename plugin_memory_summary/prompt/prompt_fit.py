"""The prompt fitted to the window when tier 1 and the summary at full size would pass it.

A compression can only archive what is older than the newest turn; when the newest messages are
large (a long tool result arriving while the summary block and the tail already fill a small
window), the prompt would go over the budget whatever a compression does. Before that happens
the prompt gives way, cheapest loss first: more old tool groups shown as a placeholder (down to
the newest group), the summary block down to half its size (its least important items first,
never mid-word), the old results' placeholders down to a few words (a turn of many tool calls),
the newest group's results cut to the room left (a placeholder when even a cut would not fit),
and last the summary block down to what is left. The stored messages stay whole
(``memory_expand`` reopens them). Pure: the plugin's ``prune_history`` and ``agent_prompt``
compute it once per prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from host_stub.messages import Message, text_of

from .pruning import Grouped, cut_result, group, prune_replacements

__all__ = ["MESSAGE_OVERHEAD", "Fit", "fit_margin", "fit_prompt", "short_placeholder"]

#: Tokens a chat message costs beyond its text (role and framing), counted for a replacement.
MESSAGE_OVERHEAD = 8

#: The smallest cut of a tool result worth showing (tokens); less becomes a placeholder.
_MIN_CUT = 48


@dataclass(frozen=True)
class Fit:
    """What the prompt shows instead of some tool results, and the tokens the summary block may
    take (``None``: its full budget)."""

    replacements: dict[int, str]
    block_budget: int | None = None


def fit_margin(window: int) -> int:
    """Tokens kept free under the window for counting differences (1%, at least 16)."""
    return max(16, window // 100)


def fit_prompt(
    messages: Sequence[Message],
    *,
    window: int,
    fixed: int,
    block_tokens: int,
    keep_tool_groups: int,
    max_result_tokens: int | None,
    count_tokens: Callable[[str], int],
    recall: bool = True,
    memo: dict[tuple[object, ...], tuple[str, int]] | None = None,
    count_shown: Callable[[Message, str], int] | None = None,
    prune_to: int | None = None,
) -> Fit:
    """Tier 1's replacements for ``messages`` and, when ``fixed`` (system prompt, tool
    definitions, reply reserve) + the summary block (``block_tokens``) + the history as shown
    would pass ``window`` less :func:`fit_margin`, the cheapest deeper cut that fits (see the
    module's docstring). When nothing fits, the deepest cut and no summary block (budget 0).
    ``count_shown(message, text)``: the tokens of a message shown as ``text`` (as the host
    counts it; default its text and :data:`MESSAGE_OVERHEAD`).

    ``prune_to`` (the soft mark, in tokens): a prompt that fits the window but passes it gets
    more old tool groups as placeholders when that alone brings it under (tier 1 instead of a
    summarizer call); when it cannot, tier 1 stays as configured and the compression decides."""
    limit = window - fit_margin(window)
    counter = count_shown or (lambda _m, text: count_tokens(text) + MESSAGE_OVERHEAD)
    grouped = group(messages)

    def prune(keep: int) -> dict[int, str]:
        return prune_replacements(
            messages,
            keep_tool_groups=keep,
            max_result_tokens=max_result_tokens,
            count_tokens=count_tokens,
            recall=recall,
            memo=memo,
            grouped=grouped,
        )

    def shown(replacements: dict[int, str]) -> int:
        return fixed + sum(_shown_tokens(m, replacements, counter) for m in messages)

    replacements = prune(keep_tool_groups)
    total = shown(replacements) + block_tokens
    target = limit if prune_to is None else min(limit, prune_to)
    if total <= target:
        return Fit(replacements)
    groups = len(grouped[1])
    if total <= limit:
        for keep in range(min(keep_tool_groups, groups) - 1, 0, -1):
            deeper = prune(keep)
            if shown(deeper) + block_tokens <= target:
                return Fit(deeper)
        return Fit(replacements)
    for keep in range(min(keep_tool_groups, groups) - 1, 0, -1):
        replacements = prune(keep)
        if shown(replacements) + block_tokens <= limit:
            return Fit(replacements)
    floor = block_tokens // 2
    rest = shown(replacements)
    if rest + floor <= limit:
        return Fit(replacements, limit - rest)
    # A turn of many tool calls: even one line per old result is too much; a few words each.
    old = _placeholders(replacements)
    replacements = {
        seq: short_placeholder(seq, recall) if seq in old else text
        for seq, text in replacements.items()
    }
    rest = shown(replacements)
    if rest + floor <= limit:
        return Fit(replacements, limit - rest)
    replacements = _cut_newest(
        grouped, replacements, limit - floor - rest, count_tokens, counter, recall
    )
    return Fit(replacements, max(0, min(block_tokens, limit - shown(replacements))))


def short_placeholder(seq: int, recall: bool) -> str:
    """The fewest words an old tool result is shown as, with where it is."""
    return f"[result #{seq} pruned" + (f"; memory_expand({seq}, {seq})]" if recall else "]")


def _placeholders(replacements: dict[int, str]) -> set[int]:
    """The seqs whose replacement is tier 1's one-line placeholder (not a cut)."""
    return {seq for seq, text in replacements.items() if text.startswith("[tool result #")}


def _shown_tokens(
    message: Message, replacements: dict[int, str], counter: Callable[[Message, str], int]
) -> int:
    if message.seq is not None and message.seq in replacements:
        return counter(message, replacements[message.seq])
    if message.tokens is not None:
        return message.tokens
    return counter(message, text_of(message.content))


def _cut_newest(
    grouped: Grouped,
    replacements: dict[int, str],
    over: int,
    count_tokens: Callable[[str], int],
    counter: Callable[[Message, str], int],
    recall: bool,
) -> dict[int, str]:
    """``replacements`` with the results of the newest tool group cut so the prompt loses
    ``-over`` tokens (``over`` < 0), each in proportion to its size; a result whose share would
    be under ``_MIN_CUT`` tokens is shown as its pointer only."""
    if over >= 0:
        return replacements
    conv, groups = grouped
    if not groups:
        return replacements
    start, end, _ = groups[-1]
    results = [m for m in conv[start + 1 : end] if m.seq is not None]
    sizes = {m.seq: _shown_tokens(m, replacements, counter) for m in results}
    total = sum(sizes.values())
    if total <= 0:
        return replacements
    allowed = max(0, total + over)  # over < 0: what the group may still take
    out = dict(replacements)
    for m in results:
        assert m.seq is not None
        share = allowed * sizes[m.seq] // total - MESSAGE_OVERHEAD
        out[m.seq] = cut_result(m, max(0, share), count_tokens, recall, floor=_MIN_CUT)
    return out
