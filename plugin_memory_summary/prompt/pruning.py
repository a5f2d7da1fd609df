"""Tier 1, before any summarizer call: old tool output shown as a one-line placeholder.

A tool result older than the newest few tool-call groups is rarely read again, yet in a tool-heavy
chat it is most of the prompt. The prompt shows it as one line (the tool, a digest of its
arguments, its size, its message number); the stored message stays whole, in the history and for
``memory_expand``. A tool result too large for the window even when it is new is shown cut, with
the same pointer to the whole. Only when the pruned prompt still passes a watermark does the
summarizer run. The decisions here are pure: the host's ``prune_history`` hook and the plugin's
compression planning compute the same replacements from the same messages.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from host_stub.messages import Message, text_of, tool_groups

from ..base import MemorySummaryConfig, collapse_whitespace, conversation_messages, cut_text

__all__ = [
    "Grouped",
    "configured_replacements",
    "cut_result",
    "group",
    "prune_replacements",
    "pruned_costs",
    "result_limit",
]

#: Characters of a call's arguments shown in a placeholder.
_ARGS_CHARS = 80
#: Identifiers of a pruned result its placeholder names at most.
HELD_IDS = 6


def _digest(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        args = None
    if isinstance(args, dict):
        shown = ", ".join(
            f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
            for k, v in args.items()
        )
    else:
        shown = collapse_whitespace(arguments)
    return f"{name}({cut_text(collapse_whitespace(shown), _ARGS_CHARS)})"


def _pointer(seq: int, recall: bool) -> str:
    return f"memory_expand({seq}, {seq}) shows it whole" if recall else "stored whole"


def placeholder(seq: int, call: str, tokens: int, recall: bool, held: Sequence[str] = ()) -> str:
    """The one line an old tool result is shown as: which call it answered, its size, the
    identifiers it held (``held``: what the model may still need to act on), and where it is."""
    holds = f"; it held {', '.join(held)}" if held else ""
    return (
        f"[tool result #{seq} of {call}, {tokens:,} tokens, pruned from the prompt{holds}; "
        f"{_pointer(seq, recall)}]"
    )


def result_limit(context_window: int, share: float) -> int:
    """Tokens one tool result may take in the prompt (``share`` of the window)."""
    return max(64, int(context_window * share))


#: A history's conversation messages and their tool-call groups (``tool_groups``).
Grouped = tuple[list[Message], list[tuple[int, int, bool]]]


def group(messages: Sequence[Message]) -> Grouped:
    """``messages``' conversation messages and their tool-call groups, found once for all the
    prunings of one prompt."""
    conv = conversation_messages(messages)
    return conv, tool_groups(conv)


def prune_replacements(
    messages: Sequence[Message],
    *,
    keep_tool_groups: int,
    max_result_tokens: int | None,
    count_tokens: Callable[[str], int],
    recall: bool = True,
    memo: dict[tuple[object, ...], tuple[str, int]] | None = None,
    grouped: Grouped | None = None,
) -> dict[int, str]:
    """What the prompt shows instead of some tool results, by seq: results of every tool-call
    group but the newest ``keep_tool_groups`` become a placeholder line (when that is shorter);
    a kept result over ``max_result_tokens`` is cut to about that many tokens with a note of what
    was left out. Calls stay whole and paired with their (shown) results. ``memo`` remembers
    placeholder lines and their counts between calls (a message never changes). ``grouped``:
    :func:`group` of ``messages``, when the caller has it (a fit prunes several times)."""
    conv, groups = grouped if grouped is not None else group(messages)
    old = len(groups) - max(0, keep_tool_groups)
    out: dict[int, str] = {}
    for g, (start, end, _complete) in enumerate(groups):
        calls = {c.id: c.function for c in conv[start].tool_calls or []}
        for reply in conv[start + 1 : end]:
            if reply.seq is None:
                continue
            tokens = reply.tokens
            if tokens is None:
                tokens = count_tokens(text_of(reply.content))
            function = calls.get(str(reply.tool_call_id))
            if g < old:
                key = (
                    reply.seq,
                    tokens,
                    recall,
                    function.name if function else None,
                    function.arguments if function else None,
                )
                known = memo.get(key) if memo is not None else None
                if known is None:
                    from ..summarizer import held_ids  # the identifier scanner: on first use

                    call = _digest(function.name, function.arguments) if function else "a tool"
                    held = held_ids(
                        text_of(reply.content),
                        function.arguments if function else "",
                        HELD_IDS,
                    )
                    line = placeholder(reply.seq, call, tokens, recall, held)
                    known = (line, count_tokens(line))
                    if memo is not None:
                        if len(memo) >= 65_536:
                            memo.clear()
                        memo[key] = known
                if known[1] < tokens:
                    out[reply.seq] = known[0]
            elif max_result_tokens is not None and tokens > max_result_tokens:
                cut = cut_result(reply, max_result_tokens, count_tokens, recall)
                if count_tokens(cut) < tokens:  # a cut never makes a result longer
                    out[reply.seq] = cut
    return out


def cut_result(
    reply: Message,
    limit: int,
    count_tokens: Callable[[str], int],
    recall: bool = True,
    *,
    floor: int = 0,
) -> str:
    """A tool result as the prompt shows it in about ``limit`` tokens: its start, cut between
    words, with a note of what was left out and where the whole is; under ``floor`` tokens,
    only the note."""
    text = text_of(reply.content)
    tokens = reply.tokens if reply.tokens is not None else count_tokens(text)
    assert reply.seq is not None
    if limit < max(1, floor):
        return (
            f"[tool result #{reply.seq}, {tokens:,} tokens, left out of the prompt for room; "
            f"{_pointer(reply.seq, recall)}]"
        )
    note = (
        f"\n[cut: about {limit:,} of {tokens:,} tokens of tool result "
        f"#{reply.seq} shown; {_pointer(reply.seq, recall)}]"
    )
    # The note is part of the limit.
    room = max(1, limit - count_tokens(note))
    keep_chars = max(1, len(text) * room // max(1, tokens))
    return cut_text(text, keep_chars, marker_counts=True) + note


def pruned_costs(
    messages: Sequence[Message], replacements: dict[int, str], count_tokens: Callable[[str], int]
) -> list[Message]:
    """``messages`` with the token count of each replaced one set to what the prompt shows
    (content unchanged: planning measures the prompt, summarizing reads the stored text)."""
    if not replacements:
        return list(messages)
    return [
        m.model_copy(update={"tokens": count_tokens(replacements[m.seq])})
        if m.seq in replacements
        else m
        for m in messages
    ]


def configured_replacements(
    config: MemorySummaryConfig,
    messages: Sequence[Message],
    window: int,
    count_tokens: Callable[[str], int],
    recall: bool,
    memo: dict[tuple[object, ...], tuple[str, int]] | None = None,
) -> dict[int, str]:
    """:func:`prune_replacements` as ``config`` sets it (``prune_keep_tool_groups`` unset: old
    groups stay whole; ``tool_result_max_share`` 0: no cut; strategy ``off``: nothing)."""
    share = config.tool_result_max_share
    if config.strategy == "off" or (config.prune_keep_tool_groups is None and not share):
        return {}
    keep = config.prune_keep_tool_groups
    return prune_replacements(
        messages,
        keep_tool_groups=len(messages) if keep is None else keep,
        max_result_tokens=result_limit(window, share) if share else None,
        count_tokens=count_tokens,
        recall=recall,
        memo=memo,
    )
