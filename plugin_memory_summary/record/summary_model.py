"""The structured summary: what the summarizer returns (as JSON), what the rules engine builds,
and the bookkeeping of where its identifiers came from."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "IDENTIFIER_SOURCES",
    "SOURCE_TIER",
    "Excerpt",
    "InProgressTask",
    "LedgerEntry",
    "SummaryPayload",
    "TimelineEvent",
    "copy_payload",
    "group_sources",
    "identifier_rank",
    "source_tier",
    "sources_of",
    "stronger_source",
]


#: Where an identifier can come from, least trusted first: a tool result, an assistant's text,
#: a tool call's arguments, the user's text.
IDENTIFIER_SOURCES: tuple[str, ...] = ("tool", "assistant", "argument", "user")


# The models build their validators on first use, not at import (``defer_build``).
class InProgressTask(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    goal: str = ""
    done: list[str] = Field(default_factory=list)
    todo: list[str] = Field(default_factory=list)


class TimelineEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    when: str = ""
    event: str = ""


class Excerpt(BaseModel):
    """A sentence kept verbatim from the conversation, with the message it came from; or a
    sentence of the summarizer's digest of a range of messages (``seq`` to ``to_seq``)."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    seq: int = 0
    #: The last message it speaks for, when it digests a range (a summarizer's sentence).
    to_seq: int = 0
    #: Its place among the sentences of that message.
    part: int = 0
    speaker: str = ""
    #: The date of the message when its text carries one ("8 May, 2023").
    when: str = ""
    text: str = ""


class LedgerEntry(BaseModel):
    """One tool call of the summarized part (``summarizer.ledger``): what it did, to what, for
    whom, with what outcome. A look-up (``read_only``) keeps only the values of its result a
    later step used, each under its key, in ``result``."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    seq: int = 0
    tool: str = ""
    #: What it acted on: ``reservation`` and its id (from an id argument its name points at,
    #: else the id its result returned).
    kind: str = ""
    entity: str = ""
    #: For whom: ``user mia_li_3668``.
    owner: str = ""
    #: Its other arguments, ``key=value``.
    details: list[str] = Field(default_factory=list)
    #: What an old entry's details keep: their identifiers, each detail's apart.
    brief: list[str] = Field(default_factory=list)
    ok: bool = True
    #: The outcome: the result's status and new ids (or the error's first words).
    result: list[str] = Field(default_factory=list)
    read_only: bool = False
    #: How much of it the summary says, set by the budget as it ages: 0 all, 1 the ids of its
    #: details (``brief``), 2 what was done to what, for whom, 3 what was done to what, on one
    #: line with the other actions of its kind. The entry keeps its details, so a later merge
    #: with more room says them again.
    level: int = Field(default=0, ge=0, le=3)


class SummaryPayload(BaseModel):
    """What the summarizer returns (as JSON) and what the rules engine builds."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    summary: str = ""
    conversation_goal: str = ""
    stable_facts: list[str] = Field(default_factory=list)
    user_profile: list[str] = Field(default_factory=list)
    decisions: list[str] = Field(default_factory=list)
    open_questions: list[str] = Field(default_factory=list)
    in_progress_tasks: list[InProgressTask] = Field(default_factory=list)
    timeline: list[TimelineEvent] = Field(default_factory=list)
    retrieval_hints: list[str] = Field(default_factory=list)
    identifiers: list[str] = Field(default_factory=list)
    #: Sentences kept verbatim (the rules engine's record of the conversation), least important
    #: first like every list; rendered in conversation order, grouped by date, with their seqs.
    excerpts: list[Excerpt] = Field(default_factory=list)
    #: What the tools did (``summarizer.ledger.ledger_entries``), oldest first: every
    #: state-changing call, never dropped by a merge (an old one keeps fewer details); rendered
    #: folded per entity.
    ledger: list[LedgerEntry] = Field(default_factory=list)
    #: The values of look-ups that a later step used, under their keys (oldest first).
    lookups: list[LedgerEntry] = Field(default_factory=list)
    #: Facts a user pinned: every later merge keeps them, whatever the summarizer returns.
    pinned_facts: list[str] = Field(default_factory=list)
    #: Bookkeeping, never rendered and never asked of a model: where the identifiers were seen,
    #: as source -> identifiers (sources: ``IDENTIFIER_SOURCES``). The rules engine writes it so
    #: an identifier the user typed stays ahead of tool-result ones across merges, whatever the
    #: rest of the payload still says. An identifier listed under no source counts as
    #: ``"assistant"`` (a model-written payload carries none). Identifiers are list values, not
    #: keys, so redacting the payload's string values redacts them here too.
    identifier_sources: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("identifier_sources", mode="before")
    @classmethod
    def _known_sources(cls, value: Any) -> dict[str, list[str]]:
        """Only known sources and string identifiers; anything else is dropped (a damaged
        bookkeeping field must never make a stored record unreadable)."""
        if not isinstance(value, dict):
            return {}
        out: dict[str, list[str]] = {}
        for source in IDENTIFIER_SOURCES:
            items = value.get(source)
            if isinstance(items, list):
                kept = [i for i in items if isinstance(i, str) and i.strip()]
                if kept:
                    out[source] = list(dict.fromkeys(kept))
        return out


def copy_payload(payload: SummaryPayload) -> SummaryPayload:
    """A deep copy of ``payload`` sharing only what cannot change (strings, numbers): new lists,
    dicts and models all the way down. ``model_copy(deep=True)`` walked every string of a large
    record through ``copy.deepcopy`` and took a sixth of a rules-engine merge."""
    copied: SummaryPayload = _fresh(payload)
    return copied


def _fresh(value: Any) -> Any:
    if isinstance(value, list):
        return [v if isinstance(v, str) else _fresh(v) for v in value]
    if isinstance(value, dict):
        return {k: v if isinstance(v, str) else _fresh(v) for k, v in value.items()}
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        parts = {name: getattr(value, name) for name in fields}
        return value.model_copy(
            update={k: _fresh(v) for k, v in parts.items() if isinstance(v, _CONTAINERS)}
        )
    return value


_CONTAINERS = (list, dict, BaseModel)


# ---------------------------------------------------------------------------------------------
# Ordering convention
#
# Every list in a payload is ordered oldest (least important) first, newest (most important)
# last. Caps and the budget fitter drop from the head, so the tail survives longest. For
# ``identifiers`` the rules engine sorts by priority as well as recency (identifiers a user typed
# outrank ones a tool call used, which outrank ones an assistant wrote, which outrank ones that
# only appeared in a tool result, which outrank dates and other plain numbers only mentioned:
# ``identifier_rank``), so "the tail" means "the identifiers most worth keeping". The source is
# remembered across merges in ``identifier_sources``; ``apply_caps`` orders by the rank.
# ---------------------------------------------------------------------------------------------

#: The caps and the budget fitter keep higher tiers longer: what the user typed, over what a
#: tool call used, over what an assistant wrote, over what only a tool returned. An identifier
#: seen from several sources keeps the highest.
SOURCE_TIER = {name: tier for tier, name in enumerate(IDENTIFIER_SOURCES, start=1)}
_DEFAULT_SOURCE = "assistant"


def stronger_source(a: str | None, b: str) -> str:
    """The more trusted of two sources (``a`` may be unknown)."""
    if a is None or SOURCE_TIER[b] > SOURCE_TIER[a]:
        return b
    return a


def sources_of(payload: SummaryPayload) -> dict[str, str]:
    """identifier -> its recorded source (the most trusted when listed twice); identifiers
    listed under no source are absent (they count as ``"assistant"``)."""
    found: dict[str, str] = {}
    for source in IDENTIFIER_SOURCES:
        for ident in payload.identifier_sources.get(source, []):
            found[ident.strip()] = stronger_source(found.get(ident.strip()), source)
    return found


def source_tier(source: str | None) -> int:
    return SOURCE_TIER[source or _DEFAULT_SOURCE]


def identifier_rank(identifier: str, source: str | None) -> int:
    """How long an identifier is kept when the caps or the budget force a choice (higher:
    longer): its source's tier, except that a number only mentioned (a date, a time stamp, an
    account or postal number that a tool returned or an assistant wrote, never typed by the
    user nor used in a call) ranks below every code: on the identifiers line it has lost the
    label that said what it was (a birth date, a record's ``created_at``, a ``zip``), while a
    code's form still names one thing a later call can use. Lowest first: numbers a tool
    returned, numbers an assistant wrote, codes a tool returned, codes an assistant wrote
    (or of unrecorded source), what a call used, what the user typed."""
    # The scanner's module (and its regex engine) loads on first use, not with the payload.
    from ..base import reads_as_number

    tier = source_tier(source)
    acted_on = SOURCE_TIER["argument"]
    if tier < acted_on and reads_as_number(identifier):
        return tier - acted_on
    return tier


def group_sources(identifiers: list[str], by_id: dict[str, str]) -> dict[str, list[str]]:
    """The bookkeeping field for ``identifiers``: the recorded ones grouped by source, in the
    order of ``identifiers``; the others left out (they count as ``"assistant"``)."""
    groups: dict[str, list[str]] = {}
    for ident in identifiers:
        source = by_id.get(ident)
        if source is not None:
            groups.setdefault(source, []).append(ident)
    return {s: groups[s] for s in IDENTIFIER_SOURCES if s in groups}
