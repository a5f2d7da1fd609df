"""Acceptance check of the rules engine on the tau-bench airline dev trajectories.

Each trajectory is replayed as a chat that compresses whenever more than 12 messages are active,
keeping the newest 6 (moved earlier so a tool call and its results stay on one side) and folding
the rest into the payload with the rules engine. At each cut:

- every state-changing tool call archived so far is one ledger line of the rendered payload
  that names its reservation (or user) id and what was done;
- against a sliding window of the same total token budget: of the ground-truth action
  identifiers (user ids, reservation and payment ids, flight numbers, dates) that have appeared
  so far and that the window has dropped, at least 80% are still in the rendered payload or the
  kept messages. Each is said inside an item that says what it is (an action, a look-up, a
  sentence), never on a line of bare ids, so an id that only a search listed and no step of
  the summarized part used is no longer kept (the bare list kept 95%, saying nothing of them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from datasets import require

from host_stub.datasets import load_tau_bench, tau_action_identifiers
from host_stub.messages import Message, text_of, tool_groups
from plugin_memory_summary.base.config import DEFAULT_READ_ONLY_TOOLS, PayloadCaps
from plugin_memory_summary.record.fitting import render_payload
from plugin_memory_summary.record.ledger_text import action_phrase
from plugin_memory_summary.record.summary_model import SummaryPayload
from plugin_memory_summary.summarizer.ledger import is_read_only
from plugin_memory_summary.summarizer.rules import rules_merge

THRESHOLD = 12
KEEP = 6
BUDGET = 600


def count(text: str) -> int:
    return len(text) // 4 + 1


def full_text(message: Message) -> str:
    parts = [text_of(message.content)]
    for call in message.tool_calls or []:
        parts.append(f"{call.function.name}({call.function.arguments})")
    return "\n".join(parts)


def cut_point(active: list[Message], keep: int) -> int:
    """Index splitting ``active`` so that at least the newest ``keep`` stay, moved earlier so no
    tool call is separated from its results."""
    cut = max(0, len(active) - keep)
    for start, end, _complete in tool_groups(active):
        if start < cut < end:
            cut = start
    return cut


def splits(active: list[Message], cut: int) -> int:
    return sum(1 for start, end, _ in tool_groups(active) if start < cut < end)


@dataclass
class Tally:
    cuts: int = 0
    seen: int = 0
    dropped: int = 0
    retained: int = 0
    splits: int = 0
    max_tokens: int = 0
    actions: int = 0
    actions_said: int = 0


def simulate(messages: list[Message], truth: set[str], tally: Tally, caps: PayloadCaps) -> None:
    chat = [m for m in messages if m.role != "system"]
    history: list[Message] = []
    active: list[Message] = []
    folded = 0
    payload: SummaryPayload | None = None
    for message in chat:
        history.append(message)
        active.append(message)
        if len(active) <= THRESHOLD:
            continue
        cut = cut_point(active, KEEP)
        tally.splits += splits(active, cut)
        if cut == 0:
            continue
        payload = rules_merge(
            payload, active[:cut], budget_tokens=BUDGET, count_tokens=count, caps=caps
        )
        rendered = render_payload(payload)
        tally.max_tokens = max(tally.max_tokens, count(rendered))
        assert count(rendered) <= BUDGET
        folded += cut
        kept = active[cut:]
        active = kept
        tally.cuts += 1

        before = "\n".join(full_text(m) for m in history[:folded])
        seen = {t for t in truth if t in before}
        kept_text = "\n".join(full_text(m) for m in kept)
        window_budget = BUDGET + sum(count(full_text(m)) for m in kept)
        window: list[str] = []
        used = 0
        for m in reversed(history):
            size = count(full_text(m))
            if used + size > window_budget:
                break
            used += size
            window.append(full_text(m))
        window_text = "\n".join(window)
        lines = rendered.split("\n")
        for m in history[:folded]:
            for c in m.tool_calls or []:
                if is_read_only(c.function.name, DEFAULT_READ_ONLY_TOOLS):
                    continue
                args = json.loads(c.function.arguments or "{}")
                key = args.get("reservation_id") or args.get("user_id") or ""
                done = action_phrase(c.function.name).split()[0]
                tally.actions += 1
                # A failed call is said as tried: it changed nothing.
                tried = f"tried {c.function.name}"
                tally.actions_said += any(
                    key in line and (done in line or tried in line) for line in lines
                )
        dropped = {t for t in seen if t not in window_text}
        retained = {t for t in dropped if t in rendered or t in kept_text}
        tally.seen += len(seen)
        tally.dropped += len(dropped)
        tally.retained += len(retained)


def test_identifier_retention_beats_a_sliding_window() -> None:
    conversations = load_tau_bench(require("tau_bench/airline_dev.json"))
    assert len(conversations) == 100
    caps = PayloadCaps()
    tally = Tally()
    for conversation in conversations:
        simulate(conversation.messages, tau_action_identifiers(conversation), tally, caps)
    share = tally.retained / tally.dropped if tally.dropped else 1.0
    print(
        f"\ntau-bench airline dev: {len(conversations)} trajectories, {tally.cuts} cuts, "
        f"{tally.seen} identifier sightings before a cut, {tally.dropped} dropped by the "
        f"sliding window, {tally.retained} of those kept by the summary "
        f"({share:.1%}); largest payload {tally.max_tokens} tokens of {BUDGET}; "
        f"{tally.actions_said} of {tally.actions} archived actions said"
    )
    assert tally.cuts > 100
    assert tally.dropped > 50
    assert tally.splits == 0
    assert tally.actions > 50 and tally.actions_said == tally.actions
    assert share >= 0.8
