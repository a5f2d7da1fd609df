"""How messages, metadata records and index entries are encoded for the scripts and decoded from
what they return."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...messages import Message
from ...services import (
    MetadataEntry,
)
from ..common import (
    message_from_row,
    metadata_entry,
)
from ..search_plan import (
    tool_message,
)


def _message(seq: str | int, raw: str, archived: str | None) -> Message:
    # raw = {"epoch":E,"role":R,"kind":K,"tokens":N,"body":{...}}; the head holds no strings
    # but the role and kind literals, so the first ',"body":' ends it.
    cut = raw.index(',"body":')
    head = json.loads(raw[:cut] + "}")
    return message_from_row(
        role=head["role"],
        kind=head["kind"],
        body=raw[cut + len(',"body":') : -1],
        seq=int(seq),
        epoch=head["epoch"],
        tokens=head["tokens"],
        archived=archived,
    )


def _messages(flat: list[Any]) -> list[Message]:
    return [_message(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]


def _text(value: str | bytes) -> str:
    """A value the client returns: text already (``decode_responses``), typed as either."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _entry(namespace: str, key: str, raw: str) -> MetadataEntry:
    data = json.loads(raw)
    return metadata_entry(
        namespace,
        key,
        value=data["value"],
        version=data["version"],
        deleted=data["deleted"],
        updated_at=data["updated_at"] / 1000,
    )


def _pairs(terms: Sequence[str]) -> str:
    """Terms as the scripts read them: ``"<term>:<count> ..."``."""
    counts: dict[str, int] = {}
    for term in terms:
        counts[term] = counts.get(term, 0) + 1
    return " ".join(f"{term}:{tf}" for term, tf in counts.items())


def _own_entry(message: Message, own: list[str] | None) -> str:
    """What the ranking reads of a message: ``"<tool> <term> ..."``, its own terms in order
    (``tool`` 1 for a tool's traffic, else 0); ``""`` for a message that is not indexed."""
    if own is None:
        return ""
    return " ".join([str(int(tool_message(message))), *own])


def _index_doc(own: list[str] | None) -> str:
    """A message's own entry for the append script: ``"<terms> <term>:<tf> ..."``; ``""`` for
    a message that is not indexed."""
    if own is None:
        return ""
    return f"{len(own)} {_pairs(own)}".rstrip()
