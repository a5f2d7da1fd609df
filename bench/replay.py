"""Replaying a data-set conversation through the real host, step by step (one step = one model
call), and the baselines computed for the same steps from the conversation alone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common import (
    BUDGET,
    SYSTEM_PROMPT,
    Rig,
    TokenCounter,
    sent_usage,
    sliding_window,
    tool_pair_violations,
    verbatim_count,
)

from host_stub.datasets import Conversation
from host_stub.prompt import PrefixReuse, prefix_reuse, reuse_shares
from host_stub.transcripts import split_turns


@dataclass
class Step:
    """One model call: the tokens of the prompt sent (as the host measured them), how many
    conversation messages it held verbatim, and its tool-pair violations; the tokens of its
    messages and how many of them repeat the previous call's prompt prefix (``None`` on a
    session's first call)."""

    tokens: int
    verbatim: int
    violations: int = 0
    prompt_tokens: int = 0
    reused: int | None = None
    change: PromptChange | None = None

    @property
    def new(self) -> int:
        return self.change.new if self.change else 0


#: How the plugin's summary block opens (the bench knows the plugin; the host does not).
SUMMARY_OPEN = "<conversation-summary"


def _is_summary(m: dict[str, Any] | None) -> bool:
    return m is not None and m.get("role") == "system" and SUMMARY_OPEN in str(m.get("content"))


@dataclass
class PromptChange:
    """How a prompt differs from the previous call's. ``new``: tokens of the conversation
    messages the previous prompt did not hold (no prompt cache could serve them). ``where``: the
    first message that differs: ``""`` (the prompt only grew), ``summary block``, ``tool result
    placeholder`` (the same tool result shown otherwise) or ``history start`` (anything else:
    a window's dropped message, an archived head). At a summary-block change, ``block`` is the
    new block's tokens, ``block_reused`` those that open it as the old one opened, and
    ``block_lines_kept`` the tokens of its lines that the old block had too (anywhere)."""

    new: int = 0
    where: str = ""
    block: int = 0
    block_reused: int = 0
    block_lines_kept: int = 0


def prompt_change(
    previous: Sequence[dict[str, Any]],
    prompt: Sequence[dict[str, Any]],
    count: Callable[[dict[str, Any]], int],
) -> PromptChange:
    held = Counter(repr(m) for m in previous)
    change = PromptChange()
    for m in prompt:
        key = repr(m)
        if held[key]:
            held[key] -= 1
        elif m.get("role") != "system":
            change.new += count(m)
    k = next(
        (i for i, (a, b) in enumerate(zip(previous, prompt, strict=False)) if a != b),
        min(len(previous), len(prompt)),
    )
    if k >= len(previous) or k >= len(prompt):
        return change
    old, now = previous[k], prompt[k]
    if _is_summary(old) or _is_summary(now):
        change.where = "summary block"
        if _is_summary(now):
            change.block = count(now)
            if _is_summary(old):
                change.block_reused = prefix_reuse([old], [now], count).reused
                lines = set(str(old["content"]).splitlines())
                kept = [x for x in str(now["content"]).splitlines() if x in lines]
                change.block_lines_kept = count({"role": "system", "content": "\n".join(kept)})
    elif old.get("role") == now.get("role") == "tool" and (
        old.get("tool_call_id") == now.get("tool_call_id")
    ):
        change.where = "tool result placeholder"
    else:
        change.where = "history start"
    return change


@dataclass
class SystemRun:
    name: str
    steps: list[Step] = field(default_factory=list)
    summarizer_calls: int = 0
    summarizer_input_tokens: int = 0
    #: Per-step time the memory component added (seconds), where measured.
    step_times: list[float] = field(default_factory=list)
    #: Per step: whether it waited for a compression (a summarizer call inline, or a blocking
    #: request); parallel to ``step_times`` where both are measured.
    waited: list[bool] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def blocked_steps(self) -> int:
        return sum(self.waited)

    @property
    def over_budget(self) -> int:
        return sum(1 for s in self.steps if s.tokens > BUDGET)


def step_positions(conversation: Conversation) -> list[int]:
    """Index, in ``conversation.messages``, of each message the host makes a model call for
    (every recorded assistant message, as ``Host._replay_turn`` does)."""
    positions = []
    pos = 0
    for inputs, recorded in split_turns(conversation.messages):
        pos += len(inputs)
        for m in recorded:
            if m.role == "assistant":
                positions.append(pos)
            pos += 1
    return positions


def conversation_tokens(conversation: Conversation, counter: TokenCounter) -> int:
    return sum(counter.stored(m.to_openai()) for m in conversation.messages)


def baseline_runs(
    conversation: Conversation, counter: TokenCounter, budget: int = BUDGET
) -> tuple[SystemRun, SystemRun, SystemRun]:
    """No compression, the sliding window (tool groups kept whole) and the naive sliding window
    (cut anywhere), for the same steps as the host replay. System messages are core memory:
    always sent, never windowed."""
    none, window, naive = (
        SystemRun("no compression"),
        SystemRun("sliding window"),
        SystemRun("naive sliding window"),
    )
    wire = [m.to_openai() for m in conversation.messages]
    system_base = counter.text(SYSTEM_PROMPT)
    head = [{"role": "system", "content": SYSTEM_PROMPT}]
    previous: dict[str, list[dict[str, Any]]] = {}

    def step(run: SystemRun, fixed: int, system: list[Any], history: list[Any], used: int) -> None:
        prompt = [*head, *system, *history]
        before = previous.get(run.name)
        reuse = prefix_reuse(before, prompt, counter.stored)
        run.steps.append(
            Step(
                fixed + used,
                len(history),
                tool_pair_violations(history),
                reuse.tokens,
                reuse.reused if before is not None else None,
                prompt_change(before, prompt, counter.stored) if before is not None else None,
            )
        )
        previous[run.name] = prompt

    for pos in step_positions(conversation):
        before = wire[:pos]
        system = [m for m in before if m["role"] == "system"]
        history = [m for m in before if m["role"] != "system"]
        fixed = system_base + sum(counter.stored(m) for m in system)
        tokens = [counter.stored(m) for m in history]
        step(none, fixed, system, history, sum(tokens))
        start = sliding_window(history, budget, fixed, tokens, keep_groups=True)
        step(window, fixed, system, history[start:], sum(tokens[start:]))
        start = sliding_window(history, budget, fixed, tokens, keep_groups=False)
        step(naive, fixed, system, history[start:], sum(tokens[start:]))
    return none, window, naive


async def replay_through_host(
    rig: Rig,
    conversation: Conversation,
    session_id: str,
    *,
    drain: bool = False,
    after_turn: Callable[[Any], Awaitable[None]] | None = None,
) -> SystemRun:
    """Replay ``conversation`` with ``Host.run_turn(..., recorded=...)``: the recorded replies
    stand in for the model, the plugin runs for real. Steps are what the host measured
    (``TurnResult.usage``) and sent (``TurnResult.sent``)."""
    run = SystemRun("plugin")
    previous: list[dict[str, Any]] | None = None

    def count(m: dict[str, Any]) -> int:
        return int(rig.llm.count_tokens([m]))

    for inputs, recorded in split_turns(conversation.messages):
        result = await rig.host.run_turn(session_id, inputs, recorded=recorded)
        if result.error:
            raise RuntimeError(f"{session_id}: turn failed: {result.error}")
        for usage, prompt in zip(sent_usage(result), result.sent, strict=True):
            run.steps.append(
                Step(
                    usage.used - usage.breakdown.reserved_for_reply,
                    verbatim_count(prompt),
                    tool_pair_violations(prompt),
                    usage.message_tokens,
                    usage.reused_tokens,
                    prompt_change(previous, prompt, count) if previous is not None else None,
                )
            )
            previous = prompt
        if drain:
            await rig.drain()
        if after_turn is not None:
            await after_turn(result)
    return run


def summarize_steps(runs: Sequence[SystemRun]) -> dict[str, float]:
    steps = [s for r in runs for s in r.steps]
    return {
        "steps": len(steps),
        "mean": sum(s.tokens for s in steps) / max(1, len(steps)),
        "max": max((s.tokens for s in steps), default=0),
        "over": sum(1 for s in steps if s.tokens > BUDGET),
        "verbatim": sum(s.verbatim for s in steps) / max(1, len(steps)),
        "violations": sum(s.violations for s in steps),
    }


@dataclass
class PrefixReuseRow:
    """Over every call after a session's first: the calls, the share of their prompt tokens
    that repeat the previous call's prompt prefix (pooled, and the median per call), and the
    share that were new messages (no cache could serve those): the rest was sent again."""

    calls: int
    reused: float
    median: float
    new: float

    @property
    def resent(self) -> float:
        return 1 - self.reused - self.new


def prefix_reuse_of(runs: Sequence[SystemRun]) -> PrefixReuseRow:
    steps = [s for r in runs for s in r.steps if s.reused is not None]
    calls = [PrefixReuse(s.reused or 0, s.prompt_tokens) for s in steps]
    shares = reuse_shares(calls)
    if shares is None:
        return PrefixReuseRow(0, float("nan"), float("nan"), float("nan"))
    new = sum(s.new for s in steps) / sum(s.prompt_tokens for s in steps)
    return PrefixReuseRow(len(calls), shares[0], shares[1], new)


def changes_of(runs: Sequence[SystemRun]) -> dict[str, tuple[int, float]]:
    """Per first change (``PromptChange.where``) over every call after a session's first: the
    calls, and the tokens they sent again (neither reused nor new) as a share of all the calls'
    prompt tokens."""
    steps = [s for r in runs for s in r.steps if s.reused is not None]
    total = sum(s.prompt_tokens for s in steps) or 1
    out: dict[str, tuple[int, int]] = {}
    for s in steps:
        where = s.change.where if s.change else ""
        calls, tokens = out.get(where, (0, 0))
        out[where] = (calls + 1, tokens + max(0, s.prompt_tokens - (s.reused or 0) - s.new))
    return {where: (calls, tokens / total) for where, (calls, tokens) in out.items()}


def summary_changes_of(runs: Sequence[SystemRun]) -> dict[str, float]:
    """Means over the calls whose first change is the summary block: the prompt's tokens, the
    block's, the block's tokens that open it as the previous block opened, and the block's
    tokens in lines the previous block had too."""
    steps = [s for r in runs for s in r.steps if s.change is not None and s.change.block]
    n = len(steps) or 1
    return {
        "calls": len(steps),
        "prompt": sum(s.prompt_tokens for s in steps) / n,
        "block": sum(s.change.block for s in steps if s.change) / n,
        "block_reused": sum(s.change.block_reused for s in steps if s.change) / n,
        "block_lines_kept": sum(s.change.block_lines_kept for s in steps if s.change) / n,
    }
