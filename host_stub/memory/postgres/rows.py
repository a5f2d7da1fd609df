"""The columns a read selects, the server clock a write stamps, and the one decoder of message and
metadata rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...messages import Message
from ...services import (
    MetadataEntry,
)
from ..common import (
    load_value,
    message_from_row,
    metadata_entry,
)

#: both from the server's clock.
_NOW = "extract(epoch FROM now())::float8"
_CLOCK = "extract(epoch FROM clock_timestamp())::float8"

_MESSAGE_COLUMNS = "seq, epoch, role, kind, body, tokens, archived"
_PREFIXED_COLUMNS = ", ".join(f"m.{c}" for c in _MESSAGE_COLUMNS.split(", "))


def _entry(row: Any) -> MetadataEntry:
    return metadata_entry(
        row["namespace"],
        row["key"],
        value=load_value(row["value"]),
        version=row["version"],
        deleted=row["deleted"],
        updated_at=row["updated_at"],
    )


def _rows_to_messages(rows: Sequence[Any]) -> list[Message]:
    return [
        message_from_row(
            role=r["role"],
            kind=r["kind"],
            body=r["body"],
            seq=int(r["seq"]),
            epoch=int(r["epoch"]),
            tokens=int(r["tokens"]),
            archived=r["archived"],
        )
        for r in rows
    ]
