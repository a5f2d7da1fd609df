"""Rules every memory backend shares, kept in one place so the backends cannot drift apart."""

from __future__ import annotations

import copy
import json
import marshal
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from ..messages import Message, ToolCall, clone_model
from ..services import MetadataEntry

__all__ = [
    "StoreNotFound",
    "TokenCounter",
    "body_of",
    "decode_row",
    "check_limit",
    "check_ttl",
    "copy_message",
    "DecodedRows",
    "dump_value",
    "error_line",
    "is_core",
    "load_value",
    "message_from_row",
    "metadata_entry",
    "new_lease_token",
    "one_line",
    "redact_url",
    "select_trim",
    "stored_message",
    "to_datetime",
    "tokens_of",
]

TokenCounter = Callable[[Message], int]

#: Message fields that live in their own columns (or are the store's own), not in the JSON body.
_COLUMN_FIELDS = {"seq", "epoch", "tokens", "archived", "role", "kind"}


class StoreNotFound(LookupError):
    """A store opened with ``create=False`` is not there: no SQLite file (or one that holds no
    store), no PostgreSQL schema or tables. ``store`` names it (a URL, its password hidden),
    ``reason`` says what is missing; the message is ``no such store: <store>: <reason>``."""

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(f"no such store: {store}: {reason}")
        self.store = store
        self.reason = reason


def tokens_of(message: Message, token_counter: TokenCounter) -> int:
    """The message's token count: the one it carries, else the counter's."""
    if message.tokens is not None:
        return message.tokens
    return int(token_counter(message))


def body_of(message: Message) -> str:
    """The message's own fields (everything but the store columns) as JSON text."""
    return json.dumps(
        message.model_dump(mode="json", exclude=_COLUMN_FIELDS),
        ensure_ascii=False,
        separators=(",", ":"),
    )


#: The fields a store sets on a message it keeps.
_STORE_FIELDS = {"seq", "epoch", "tokens", "archived"}


def stored_message(message: Message, *, seq: int, epoch: int, tokens: int) -> Message:
    """``message`` as a store without a JSON column keeps it: its fields in their JSON form
    (what :func:`body_of` writes and :func:`message_from_row` reads back: tuples become lists,
    keys strings, NaN null), new containers sharing no part with ``message``, the store's
    fields set. The text itself is never made: a parse of it would give the same fields."""
    data = message.model_dump(mode="json", exclude=_STORE_FIELDS)
    data.update(seq=seq, epoch=epoch, tokens=tokens, archived=None)
    return Message.model_validate(data)


_SCALARS = (str, int, float, bool, type(None))


def copy_message(message: Message) -> Message:
    """A private copy of a stored message: a new model whose mutable parts (list content, tool
    calls, metadata) are deep copies; strings and numbers, which cannot change, are shared. A
    deep copy of every field took most of an in-memory turn."""
    update: dict[str, Any] = {}
    if isinstance(message.content, list):
        update["content"] = copy.deepcopy(message.content)
    if message.tool_calls:
        update["tool_calls"] = [_copy_call(call) for call in message.tool_calls]
    metadata = message.metadata  # copied even when empty: a caller may fill it in
    flat = all(isinstance(value, _SCALARS) for value in metadata.values())
    update["metadata"] = dict(metadata) if flat else copy.deepcopy(metadata)
    return clone_model(message, update)


def _copy_call(call: ToolCall) -> ToolCall:
    """A private copy of a tool call: new models sharing their strings (a deep copy took most
    of the copy of a tool-calling message); deep only when an extra field holds a container."""
    function = call.function
    if _flat(call.__pydantic_extra__) and _flat(function.__pydantic_extra__):
        return clone_model(call, {"function": clone_model(function)})
    return copy.deepcopy(call)


def _flat(extra: dict[str, Any] | None) -> bool:
    return not extra or all(isinstance(value, _SCALARS) for value in extra.values())


#: One stored row as a database returns it: seq, epoch, role, kind, body, tokens, archived.
MessageRow = tuple[int, int, str, str, str, int, "str | None"]


def decode_row(row: Sequence[Any]) -> Message:
    """A stored message from its row ``(seq, epoch, role, kind, body, tokens, archived)``."""
    seq, epoch, role, kind, body, tokens, archived = row
    return message_from_row(
        role=role, kind=kind, body=body, seq=seq, epoch=epoch, tokens=tokens, archived=archived
    )


class DecodedRows:
    """The messages a database backend decoded from the active rows of its recently read
    sessions, so a snapshot decodes only the rows it has not seen (a turn adds one or two):
    parsing the JSON body and validating the model took about 20 us a row, a private copy of
    the decoded message takes a few. A row is reused only when every column it was decoded
    from is equal (another process may have rewritten it); each read keeps exactly the rows
    it returned, for the ``sessions`` most recently read."""

    def __init__(self, sessions: int = 256) -> None:
        self._limit = sessions
        self._by_session: dict[str, dict[int, tuple[MessageRow, Message]]] = {}

    def messages(self, session_id: str, rows: Sequence[MessageRow]) -> list[Message]:
        seen = self._by_session.pop(session_id, {})
        kept: dict[int, tuple[MessageRow, Message]] = {}
        out = []
        for row in rows:
            hit = seen.get(row[0])
            message = hit[1] if hit is not None and hit[0] == row else decode_row(row)
            kept[row[0]] = (row, message)
            out.append(copy_message(message))
        self._by_session[session_id] = kept
        while len(self._by_session) > self._limit:
            del self._by_session[next(iter(self._by_session))]  # the least recently read
        return out

    def add(self, session_id: str, decoded: Sequence[tuple[MessageRow, Message]]) -> None:
        """Rows this process just wrote, with their messages (private to the cache): the next
        read finds them decoded."""
        kept = self._by_session.pop(session_id, {})
        kept.update((row[0], (row, message)) for row, message in decoded)
        self._by_session[session_id] = kept
        while len(self._by_session) > self._limit:
            del self._by_session[next(iter(self._by_session))]

    def forget(self, session_id: str | None = None) -> None:
        """Drop one session's decoded rows, or every session's."""
        if session_id is None:
            self._by_session.clear()
        else:
            self._by_session.pop(session_id, None)


def message_from_row(
    *, role: str, kind: str, body: str, seq: int, epoch: int, tokens: int, archived: str | None
) -> Message:
    """Rebuild a stored message from its columns and JSON body."""
    data: dict[str, Any] = json.loads(body)
    data.update(role=role, kind=kind, seq=seq, epoch=epoch, tokens=tokens, archived=archived)
    return Message.model_validate(data)


def is_core(role: str, kind: str) -> bool:
    """System messages are core memory: trims and compressions never archive them."""
    return role == "system" and kind == "message"


def select_trim(
    active: Sequence[tuple[int, str, str]], keep_recent: int | None, up_to_seq: int | None
) -> list[int]:
    """The seqs ``trim_history`` archives, given the active ``(seq, kind, role)`` oldest first.

    ``up_to_seq``: every active seq ``<= up_to_seq``. ``keep_recent``: the kept window starts at
    the ``keep_recent``-th newest conversation message (kind ``message``, not a system message);
    everything older goes, event markers included, while markers inside the window stay. With no
    more than ``keep_recent`` such messages there is nothing to trim; ``keep_recent=0`` archives
    every active message. System messages (core memory) are never selected.
    """
    if (keep_recent is None) == (up_to_seq is None):
        raise ValueError("trim_history needs exactly one of keep_recent or up_to_seq")
    movable = [(seq, kind) for seq, kind, role in active if not is_core(role, kind)]
    if up_to_seq is not None:
        return [seq for seq, _ in movable if seq <= up_to_seq]
    assert keep_recent is not None
    if keep_recent < 0:
        raise ValueError(f"keep_recent must be >= 0, got {keep_recent}")
    if keep_recent == 0:
        return [seq for seq, _ in movable]
    real = [seq for seq, kind in movable if kind == "message"]
    if len(real) <= keep_recent:
        return []
    cutoff = real[-keep_recent]
    return [seq for seq, _ in movable if seq < cutoff]


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


def check_ttl(ttl_s: float) -> None:
    if not ttl_s > 0:
        raise ValueError(f"lease ttl_s must be > 0, got {ttl_s}")


def new_lease_token() -> str:
    return secrets.token_hex(16)


def to_datetime(ts: float | None) -> datetime | None:
    """A stored unix time as an aware UTC datetime."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def dump_value(value: dict[str, Any]) -> str:
    """A metadata value as the stores keep it: compact JSON text."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


#: Texts of at least this many characters are remembered by :func:`load_value`.
PARSED_MIN_CHARS = 2_048
#: At most this many characters of remembered texts (with their parsed forms, about 3x).
PARSED_MAX_CHARS = 4_000_000
_parsed: OrderedDict[str, bytes] = OrderedDict()
_parsed_chars = 0
_parsed_lock = threading.Lock()


def load_value(text: str | None) -> dict[str, Any] | None:
    """A stored metadata value (``None`` for a deleted one), a new object at every call.

    A large text read again (a summary record, at every prompt build) is not parsed again: its
    value is kept in ``marshal``'s form, which gives a new copy in about half the time of a JSON
    parse; the most recently read :data:`PARSED_MAX_CHARS` characters of texts are kept."""
    global _parsed_chars
    if text is None:
        return None
    if len(text) < PARSED_MIN_CHARS:
        return json.loads(text)
    with _parsed_lock:
        blob = _parsed.get(text)
        if blob is not None:
            _parsed.move_to_end(text)
    if blob is not None:
        return marshal.loads(blob)
    value = json.loads(text)
    blob = marshal.dumps(value)
    with _parsed_lock:
        if text not in _parsed:
            _parsed[text] = blob
            _parsed_chars += len(text)
            while _parsed_chars > PARSED_MAX_CHARS and len(_parsed) > 1:
                old, _ = _parsed.popitem(last=False)
                _parsed_chars -= len(old)
    return value


def metadata_entry(
    namespace: str,
    key: str,
    *,
    value: dict[str, Any] | None,
    version: int,
    deleted: Any,
    updated_at: float | None,
) -> MetadataEntry:
    """A stored metadata row as the entry every backend returns (``updated_at`` in unix
    seconds)."""
    return MetadataEntry(
        namespace=namespace,
        key=key,
        value=value,
        version=int(version),
        deleted=bool(deleted),
        updated_at=to_datetime(updated_at),
    )


def redact_url(url: str) -> str:
    """``url`` with its password (in the user info, or a ``password=`` parameter) as ``***``;
    safe to log and to show."""
    head, sep, rest = url.partition("://")
    if sep:
        # The last "@" ends the user info (a raw "@" in a password is common); masking too much
        # when a query value holds an "@" is the safe side.
        userinfo, at, hostpart = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        if at and colon:
            rest = f"{user}:***@{hostpart}"
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", head + sep + rest)


def one_line(text: str) -> str:
    """``text`` on one line: every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())


def error_line(exc: BaseException) -> str:
    """An exception on one line: its type, then its text."""
    return f"{type(exc).__name__}: {one_line(str(exc)) or 'no details'}"
