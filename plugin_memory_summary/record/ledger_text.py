"""Saying the action ledger (built by ``summarizer.ledger``): an entry in words, entries folded
per entity, the look-ups. Pure text work on stored entries, with no identifier scanner: the
prompt side renders a record without loading the rules engine's machinery."""

from __future__ import annotations

import re
from collections.abc import Sequence

from .summary_model import LedgerEntry

__all__ = ["action_phrase", "ledger_lines", "lookup_lines", "tool_words"]

_SPLIT_NAME = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")

#: Past tenses a rule does not make; verbs whose last consonant doubles.
_IRREGULAR = {
    "send": "sent",
    "make": "made",
    "pay": "paid",
    "buy": "bought",
    "set": "set",
    "reset": "reset",
    "put": "put",
    "give": "gave",
    "take": "took",
    "run": "ran",
    "rerun": "reran",
    "write": "wrote",
    "rewrite": "rewrote",
    "build": "built",
    "rebuild": "rebuilt",
    "sell": "sold",
    "hold": "held",
    "withdraw": "withdrew",
    "begin": "began",
    "upload": "uploaded",
    "forward": "forwarded",
    "shut": "shut",
    "split": "split",
    "spend": "spent",
    "lend": "lent",
}
_DOUBLING = frozenset(
    "cancel transfer submit refer stop ship drop plan admit commit tag log label travel "
    "signal total permit rebook".split()
)
#: Words that start a tool name as a verb (the ones above count too).
_VERBS = frozenset(
    """add apply approve archive assign attach authorize block book cancel capture change charge
    clear close complete confirm connect create credit debit decline delete deny deposit
    disable dismiss edit email enable end enroll escalate exchange execute extend file flag
    grant install invite issue join lock mark merge message modify move notify open order
    publish post purchase queue rate reassign rebook receive record redeem refund register
    reject release reload remove rename renew reopen replace reply report request reschedule
    reserve resolve restore resume return revoke save schedule share sign start subscribe
    suspend swap switch terminate text transfer trigger unblock unlock unsubscribe update
    upgrade downgrade upsert verify void waive""".split()
)
_LINKS = frozenset({"to", "for", "from", "with", "of", "in", "on", "the", "a", "an", "by"})


def tool_words(name: str) -> list[str]:
    """The lower-case words of a tool name: ``update_reservation_flights`` and
    ``updateReservationFlights`` give ``["update", "reservation", "flights"]``."""
    return [w.lower() for w in _SPLIT_NAME.findall(name)]


def _past(verb: str) -> str:
    if verb in _IRREGULAR:
        return _IRREGULAR[verb]
    if verb in _DOUBLING:
        return verb + verb[-1] + "ed"
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and len(verb) > 1 and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def action_phrase(tool: str, kind: str = "") -> str:
    """What a call did, in words: ``cancel_reservation`` on a reservation is ``cancelled``,
    ``update_reservation_flights`` ``updated flights``, ``transfer_to_human_agents``
    ``transferred to human agents``; a name that does not start with a verb stays as it is."""
    words = tool_words(tool)
    if not words or not (words[0] in _VERBS or words[0] in _IRREGULAR or words[0] in _DOUBLING):
        return tool
    thing = set(tool_words(kind))
    rest = [w for w in words[1:] if w not in thing and (w + "s") not in thing]
    while rest and rest[-1] in _LINKS:
        rest.pop()
    return " ".join([_past(words[0]), *rest])


# --- rendering --------------------------------------------------------------------------------


def _shown(entry: LedgerEntry) -> tuple[list[str], list[str]]:
    """The details and the outcome ``entry`` says at its ``level``."""
    if entry.level <= 0:
        return entry.details, entry.result
    if entry.level == 1:
        return entry.brief, entry.result
    return [], []


def _segment(entry: LedgerEntry) -> str:
    """One action in words: ``cancelled #88 (reason=change_of_plan): status=cancelled``."""
    details, result = _shown(entry)
    if entry.ok:
        head = f"{action_phrase(entry.tool, entry.kind)} #{entry.seq}"
    else:
        head = f"tried {entry.tool} #{entry.seq}"
    text = head + (f" ({', '.join(details)})" if details else "")
    if not entry.ok:
        return text + (f", failed: {'; '.join(result)}" if result else ", failed")
    return text + (f": {', '.join(result)}" if result else "")


def _segments(group: list[LedgerEntry]) -> list[str]:
    """The actions of one entity in words; failed tries of the same tool in a row are said once
    with their seqs and the last error (they changed nothing)."""
    out: list[str] = []
    i = 0
    while i < len(group):
        entry = group[i]
        j = i + 1
        while not entry.ok and j < len(group) and not group[j].ok and group[j].tool == entry.tool:
            j += 1
        if j - i > 1:
            seqs = ", ".join(f"#{e.seq}" for e in group[i:j])
            result = _shown(group[j - 1])[1]
            error = f": {'; '.join(result)}" if result else ""
            out.append(f"tried {entry.tool} {seqs}, failed{error}")
        else:
            out.append(_segment(entry))
        i = j
    return out


def _folded_lines(entries: Sequence[LedgerEntry]) -> list[str]:
    """The oldest actions (``level`` 3) folded by what was done: ``booked (restaurant):
    RST-0470 #12, RST-0480 #19``; ``transferred to human agents #166, #628``."""
    groups: dict[tuple[str, str, bool], list[LedgerEntry]] = {}
    for entry in entries:
        phrase = action_phrase(entry.tool, entry.kind) if entry.ok else f"tried {entry.tool}"
        groups.setdefault((phrase, entry.kind, entry.ok), []).append(entry)
    lines = []
    for (phrase, kind, ok), group in groups.items():
        said = ", ".join(f"{e.entity} #{e.seq}" if e.entity else f"#{e.seq}" for e in group)
        head = f"{phrase} ({kind}):" if kind else phrase
        lines.append(f"{head} {said}" + ("" if ok else ", failed"))
    return lines


def ledger_lines(entries: Sequence[LedgerEntry]) -> list[str]:
    """The ledger folded per entity, one line each, in the order each was first acted on:
    ``reservation EUJUY6 (user lucas_brown_4047): booked #12 (...); updated flights #40
    (...); cancelled #88: status=cancelled``. A call that names no entity has a line of its
    own, led by whom it was for when known; the same id acted on for someone else starts a
    line of its own. The oldest entries, when the budget binds hardest (``level`` 3), are
    folded by what was done instead, still each with its id and seq (``_folded_lines``)."""
    ordered = sorted(entries, key=lambda e: e.seq)
    folded = _folded_lines([e for e in ordered if e.level >= 3])
    groups: dict[tuple[str, str, int], list[LedgerEntry]] = {}
    #: Per entity, its latest group and that group's owner.
    latest: dict[tuple[str, str], tuple[tuple[str, str, int], str]] = {}
    for i, entry in enumerate(e for e in ordered if e.level < 3):
        if not entry.entity:
            groups[("", "", i)] = [entry]
            continue
        thing = (entry.kind, entry.entity)
        known = latest.get(thing)
        if known is None or (entry.owner and known[1] and entry.owner != known[1]):
            key = (*thing, i)
            groups[key] = []
            latest[thing] = (key, entry.owner)
        elif entry.owner and not known[1]:
            latest[thing] = (known[0], entry.owner)
        groups[latest[thing][0]].append(entry)
    owners = {key: owner for key, owner in latest.values()}
    lines = folded
    for key, group in groups.items():
        body = "; ".join(_segments(group))
        owner = owners.get(key) or next((e.owner for e in group if e.owner), "")
        if group[0].entity:
            subject = f"{key[0]} {key[1]}".strip()
            lines.append(f"{subject}{f' ({owner})' if owner else ''}: {body}")
        else:
            lines.append(f"{owner}: {body}" if owner else body)
    return lines


def lookup_lines(entries: Sequence[LedgerEntry]) -> list[str]:
    """A look-up per line: ``#5 get_user_details(user_id=mia_li_3668): reservations NO6SVK``."""
    return [
        f"#{e.seq} {e.tool}({', '.join(e.details)})"
        + (f": {'; '.join(e.result)}" if e.result else "")
        for e in sorted(entries, key=lambda e: e.seq)
    ]
