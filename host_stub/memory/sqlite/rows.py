"""The columns a read selects, the shapes of rows and jobs, and the decoding of rows (on the event
loop, after the transaction)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ...messages import Message
from ...services import (
    MetadataEntry,
)
from ..common import (
    decode_row,
    load_value,
    metadata_entry,
)

#: The search index's rowid of message ``seq`` of the session with key ``id`` is
#: ``id << _SEQ_BITS | seq``: a session's entries are one rowid range, which FTS5 seeks to.
_SEQ_BITS = 32
_SEQ_MASK = (1 << _SEQ_BITS) - 1

#: A message row: ``(seq, epoch, role, kind, body, tokens, archived)``.
_MESSAGE_COLUMNS = "seq, epoch, role, kind, body, tokens, archived"
_PREFIXED_COLUMNS = ", ".join(f"m.{c}" for c in _MESSAGE_COLUMNS.split(", "))
#: A metadata row: ``(namespace, key, value, version, deleted, updated_at)``.
_METADATA_COLUMNS = "namespace, key, value, version, deleted, updated_at"

_T = TypeVar("_T")
_Row = tuple[Any, ...]
#: What an append writes of one message: ``(role, kind, body, tokens)``.
_Given = tuple[str, str, str, int]
#: What a snapshot reads: the active rows, the record's row (if any), the epoch.
_SnapshotRows = tuple[list[_Row], "_Row | None", int]
#: A transaction's body: runs between ``BEGIN`` and ``COMMIT``, in the worker thread (or, for a
#: short one, on the calling thread: see ``_call``).
_Job = Callable[[sqlite3.Connection], _T]


def _messages(rows: Iterable[_Row]) -> list[Message]:
    return [decode_row(row) for row in rows]


def _entry(row: _Row) -> MetadataEntry:
    namespace, key, value, version, deleted, updated_at = row
    return metadata_entry(
        namespace,
        key,
        value=load_value(value),
        version=version,
        deleted=deleted,
        updated_at=updated_at,
    )
