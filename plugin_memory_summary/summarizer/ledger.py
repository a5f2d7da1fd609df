"""The action ledger: what the tools of a summarized part did, one entry per call that changed
something, and the few facts of a look-up that a later step used.

A tool chat's memory is its actions: which reservation was booked, changed, cancelled, for whom,
with what. A list of bare identifiers says none of that. So the rules engine reads every tool call
of a batch with its result:

- a call of a state-changing tool (any tool whose name does not start with a read-only verb:
  ``get``, ``search``, ``list``, ... ``MemorySummaryConfig.read_only_tools``) becomes one
  ``record.LedgerEntry``: its seq, the tool, the thing it acted on (the id argument its name
  points at: ``reservation_id`` for ``cancel_reservation``; else the id its result returned, as
  a booking's new reservation id), for whom (a user, customer or account id),
  its other arguments, and its outcome (``ok`` with the result's status and new ids, or
  ``error`` with the error's first words);
- a call of a read-only tool leaves an entry only for the values of its result that a later
  call or reply of the batch used, each under the key it stood under (``reservations NO6SVK``),
  so an identifier never enters the summary without saying what it is.

Everything here is pure and deterministic: the same batch gives the same entries. Saying them,
folded per entity, is ``record.ledger_text``'s (the prompt side loads no identifier scanner)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from host_stub.messages import Message, text_of, tool_groups

from ..base import (
    DEFAULT_READ_ONLY_TOOLS,
    collapse_whitespace,
    cut_text,
    extract_identifiers,
    lazy_regex,
)
from ..record import LedgerEntry, ledger_lines, tool_words

__all__ = [
    "DEFAULT_READ_ONLY_TOOLS",
    "actions_text",
    "brief_details",
    "is_read_only",
    "ledger_entries",
]

#: Characters of one argument value, of an error, of a text result kept in an entry.
_VALUE_CHARS = 60
_ERROR_CHARS = 80
_TEXT_RESULT_CHARS = 120
#: Values of one look-up kept, and the most ids a result may hold to count as a record (a
#: profile, a reservation) rather than a listing, whose ids are kept only when a later step
#: used them.
_LOOKUP_VALUES = 16
_RECORD_IDS = 16

_ID_KEY = lazy_regex(r"(?i)^(.*?)[_\-]?(?:id|ids|uuid|number|no|code|ref|reference|locator)$")
#: Id keys that name who an action was for rather than what it acted on.
_PARTY = lazy_regex(
    r"(?i)^(?:user|customer|client|account|member|owner|person|patient|guest|employee|buyer"
    r"|profile|contact)$"
)
#: Id keys of what an action used (how it paid) rather than what it acted on.
_MEANS = lazy_regex(r"(?i)(?:^|_)(?:payment|card|method|wallet|instrument|source|token)$")
_STATUS_KEYS = frozenset(
    "status state result outcome amount total balance refund refunded price cost".split()
)


def is_read_only(name: str, read_only: Iterable[str]) -> bool:
    """A tool that only reads: its name is one of ``read_only`` or starts with one of its words
    (``get_user_details`` by ``get``)."""
    words = tool_words(name)
    marks = {m.strip().lower() for m in read_only if m.strip()}
    return name.lower() in marks or (bool(words) and words[0] in marks)


# --- reading a call ---------------------------------------------------------------------------


def _load(text: str) -> Any:
    text = text.strip()
    if not text or text[0] not in "{[":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _id_thing(key: str) -> str | None:
    """``reservation`` for ``reservation_id``; ``""`` for ``id``; ``None`` for no id key."""
    match = _ID_KEY().match(key)
    if match is None:
        return None
    return match.group(1).strip("_-").lower()


def _scalar(value: Any) -> str | None:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        text = collapse_whitespace(value)
        return cut_text(text, _VALUE_CHARS, marker_counts=True) if text else None
    return None


def _show(value: Any) -> str:
    """An argument's value in a few words: a scalar as it is; an object as its values; a list
    of them joined by `` / ``."""
    single = _scalar(value)
    if single is not None:
        return single
    if isinstance(value, dict):
        return " ".join(s for v in value.values() if (s := _show(v)))
    if isinstance(value, list):
        return " / ".join(s for v in value if (s := _show(v)))
    return ""


def _entity(
    tool: str, args: dict[str, Any], result: Any
) -> tuple[str, str, str | None, str, str | None]:
    """(kind, id, its key, owner, the owner's key) of a state-changing call."""
    words = set(tool_words(tool))
    id_args = [(k, _id_thing(k), v) for k, v in args.items() if _scalar(v) is not None]
    id_args = [(k, t, v) for k, t, v in id_args if t is not None and not isinstance(v, bool)]
    top = result if isinstance(result, dict) else {}
    id_results = [(k, _id_thing(k), v) for k, v in top.items() if _scalar(v) is not None]
    id_results = [(k, t, v) for k, t, v in id_results if t is not None and not isinstance(v, bool)]

    def named(candidates: list[tuple[str, str | None, Any]]) -> tuple[str, str, str] | None:
        for key, thing, value in candidates:
            if thing and set(tool_words(thing)) <= words:
                return key, thing, str(value)
        return None

    parties = [(k, t or "", str(v)) for k, t, v in id_args if t and _PARTY().match(t)]
    means = [(k, t or "", str(v)) for k, t, v in id_args if t and _MEANS().search(t)]
    others = [
        (k, t or "", str(v))
        for k, t, v in id_args
        if t and not _PARTY().match(t) and not _MEANS().search(t)
    ]
    # What its name points at; else the thing it names by id (not whom it is for, nor what
    # paid); else the id its result returned under a name the tool's points at (a booking's
    # new id); else what paid; else whom.
    hit = named(id_args) or (others[0] if others else None) or named(id_results)
    hit = hit or (means[0] if means else None) or (parties[0] if parties else None)
    kind, ident, key = (hit[1], hit[2], hit[0]) if hit else ("", "", None)
    owner, owner_key = "", None
    for k, thing, value in [*id_args, *id_results]:
        if k != key and thing and _PARTY().match(thing) and str(value) != ident:
            owner, owner_key = f"{thing} {value}", k
            break
    return kind, ident, key, owner, owner_key


def _result_facts(result: Any, text: str, skip: set[str], said: str) -> list[str]:
    """What an ok result adds: its status and the ids it returned that the call did not name;
    a short text result whole."""
    if isinstance(result, dict):
        facts = []
        for key, value in result.items():
            shown = _scalar(value)
            if shown is None or key in skip:
                continue
            if key.lower() in _STATUS_KEYS or (_id_thing(key) is not None and shown not in said):
                facts.append(f"{key}={shown}")
        return facts
    if result is None:
        body = collapse_whitespace(text)
        if body and len(body) <= _TEXT_RESULT_CHARS:
            return [body]
        return [i for i in extract_identifiers(body) if i not in said][:4]
    return []


def _is_error(message: Message, body: str) -> bool:
    if message.metadata.get("is_error"):
        return True
    return body.lstrip().lower().startswith(("error", "exception", "failed"))


def brief_details(details: list[str]) -> list[str]:
    """What an old entry's details keep: their identifiers (ids, dates, flight numbers) under
    their key, without the other words, each item still apart (``flights HAT136 2024-05-20 /
    HAT039 2024-05-20``)."""
    out = []
    for detail in details:
        key, _, value = detail.partition("=")
        items = [" ".join(extract_identifiers(part)) for part in (value or key).split(" / ")]
        kept = " / ".join(i for i in items if i)
        if kept:
            out.append(f"{key} {kept}" if value else kept)
    return out


def _action(seq: int, tool: str, arguments: str, reply: Message) -> LedgerEntry:
    body = text_of(reply.content)
    loaded = _load(arguments)
    args = loaded if isinstance(loaded, dict) else {}
    result = _load(body)
    kind, ident, key, owner, owner_key = _entity(tool, args, result)
    details = [
        f"{k}={shown}" for k, v in args.items() if k not in (key, owner_key) and (shown := _show(v))
    ]
    if not args and arguments.strip():
        details = [cut_text(collapse_whitespace(arguments), _VALUE_CHARS, marker_counts=True)]
    if _is_error(reply, body):
        # A failed try changed nothing: what it was and why it failed are enough.
        return LedgerEntry(
            seq=seq,
            tool=tool,
            kind=kind,
            entity=ident,
            owner=owner,
            ok=False,
            result=[cut_text(collapse_whitespace(body), _ERROR_CHARS, marker_counts=True)],
        )
    skip = {k for k in (key, owner_key) if k}
    return LedgerEntry(
        seq=seq,
        tool=tool,
        kind=kind,
        entity=ident,
        owner=owner,
        details=details,
        brief=brief_details(details),
        result=_result_facts(result, body, skip, f"{arguments} {ident} {owner}"),
    )


def _leaves(value: Any, label: str = "") -> Iterable[tuple[str, str]]:
    """(the key a scalar stood under, the scalar) for every scalar in a JSON value; a key that
    is itself an id (``{"credit_card_1": {...}}``) keeps its parent's label and counts as a
    value too."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if extract_identifiers(str(key)) == [str(key)]:
                yield label, str(key)
                yield from _leaves(inner, label)
            else:
                yield from _leaves(inner, str(key))
    elif isinstance(value, list):
        for inner in value:
            yield from _leaves(inner, label)
    else:
        shown = _scalar(value)
        if shown is not None and label:
            yield label, shown


def _lookup(seq: int, tool: str, arguments: str, reply: Message, later: str) -> LedgerEntry | None:
    """What a look-up found that is worth keeping, under its keys: of a record (a result with
    few ids: a profile, a reservation fetched by id) its ids; of a listing (a search) only the
    ones ``later`` (what the batch said and did after it) used; with nothing of that, what it
    looked for, when its arguments name an id or a date. ``None`` for a failed look-up or one
    with neither (a ``think`` step)."""
    body = text_of(reply.content)
    if _is_error(reply, body):
        return None
    result = _load(body)
    pairs = (
        list(_leaves(result))
        if result is not None
        else [("", i) for i in extract_identifiers(body)]
    )
    ids = [(label, value) for label, value in pairs if extract_identifiers(value) == [value]]
    record = len({value for _, value in ids}) <= _RECORD_IDS
    used: dict[str, list[str]] = {}
    count = 0
    for label, value in ids:
        if count >= _LOOKUP_VALUES:
            break
        if value in arguments or not (record or value in later):
            continue
        if any(value in values for values in used.values()):
            continue
        used.setdefault(label, []).append(value)
        count += 1
    loaded = _load(arguments)
    args = loaded if isinstance(loaded, dict) else {}
    details = [f"{k}={s}" for k, v in args.items() if (s := _show(v))]
    if not used and not any(extract_identifiers(d) for d in details):
        return None  # found nothing worth keeping and looked for nothing in particular
    # Commas between values: dates side by side with spaces read as a card number to a redactor.
    facts = [f"{label} {', '.join(values)}".strip() for label, values in used.items()]
    return LedgerEntry(seq=seq, tool=tool, details=details, result=facts, read_only=True)


def held_ids(body: str, arguments: str = "", limit: int = 6) -> list[str]:
    """The identifiers a record (a result with few ids: a profile, a reservation fetched by id)
    holds, each with the key it stood under (``user_id mia_li_3668``), in the result's order,
    without those its call's ``arguments`` already name: what a pruned result's placeholder says
    it held. At most ``limit``; none of a listing (a search's many ids, as the ledger keeps
    none of them unless used)."""
    result = _load(body)
    pairs = (
        list(_leaves(result))
        if result is not None
        else [("", i) for i in extract_identifiers(body)]
    )
    if len({value for _, value in pairs if extract_identifiers(value) == [value]}) > _RECORD_IDS:
        return []
    out: list[str] = []
    seen: set[str] = set()
    for label, value in pairs:
        if len(out) >= limit:
            break
        if value in seen or value in arguments or extract_identifiers(value) != [value]:
            continue
        seen.add(value)
        out.append(f"{label} {value}".strip())
    return out


def ledger_entries(
    messages: Sequence[Message], read_only: Iterable[str] = DEFAULT_READ_ONLY_TOOLS
) -> list[LedgerEntry]:
    """One entry per state-changing tool call of ``messages`` with its result, and one per
    look-up (``_lookup``), in conversation order. A call without a result in ``messages`` is
    left out (the cut keeps a call and its results on one side)."""
    marks = tuple(read_only)
    chat = [m for m in messages if not m.is_marker and m.role != "system"]
    said_after: list[str] = [""] * (len(chat) + 1)
    for i in range(len(chat) - 1, -1, -1):
        m = chat[i]
        parts = [said_after[i + 1]]
        if m.role in ("user", "assistant"):
            parts.append(text_of(m.content))
        for call in m.tool_calls or ():
            parts.append(call.function.arguments or "")
        said_after[i] = " ".join(p for p in parts if p)
    entries: list[LedgerEntry] = []
    #: Whom the conversation is serving: the last party id a call named (``user_id``).
    party = ""
    for start, end, _complete in tool_groups(chat):
        owner = chat[start]
        replies = {str(r.tool_call_id): r for r in chat[start + 1 : end]}
        for call in owner.tool_calls or ():
            reply = replies.get(str(call.id))
            if reply is None:
                continue
            tool, arguments = call.function.name or "unknown", call.function.arguments or ""
            party = _party_of(arguments) or party
            seq = owner.seq or 0
            if is_read_only(tool, marks):
                entry = _lookup(seq, tool, arguments, reply, said_after[end])
                if entry is not None:
                    entries.append(entry)
                continue
            action = _action(seq, tool, arguments, reply)
            if not action.entity and not action.owner and party:
                # A call that names nobody (a hand-over) was made for whom the conversation
                # was serving.
                action = action.model_copy(update={"owner": party})
            entries.append(action)
    return entries


def _party_of(arguments: str) -> str:
    """``user mia_li_3668`` for a call whose arguments name a party by id."""
    loaded = _load(arguments)
    for key, value in loaded.items() if isinstance(loaded, dict) else ():
        thing = _id_thing(key)
        if thing and _PARTY().match(thing) and isinstance(value, str) and value.strip():
            return f"{thing} {value.strip()}"
    return ""


def actions_text(messages: Sequence[Message], read_only: Iterable[str]) -> str:
    """The ledger lines of the state-changing calls of ``messages``, as a merge would say them
    whole: what a compression's summary must have room for, whatever else it keeps."""
    entries = [e for e in ledger_entries(messages, read_only) if not e.read_only]
    return "\n".join(ledger_lines(entries))
