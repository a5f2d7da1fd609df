"""Service Protocols a host hands to plugins, and the small models they return.

A plugin names the services it needs as arguments of its ``startup`` hook implementation and
receives them injected; it never imports a backend. Every method is ``async`` except the token
counter and the model-window look-ups, which are pure CPU work.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from .messages import ArchiveReason, Message

__all__ = [
    "EventBusProtocol",
    "HostProtocol",
    "Completion",
    "LLMService",
    "LLMUsage",
    "LeaseLost",
    "LeaseToken",
    "MemoryService",
    "MessageArchiveService",
    "MetadataEntry",
    "SearchHit",
    "OpensAtStart",
    "SnapshotOnAppend",
    "SessionInfo",
    "Snapshot",
    "SUMMARY_NAMESPACE",
    "YieldsToTurns",
]

#: Namespace of the summary record, shared by the host (it reads it with the history, as one
#: snapshot) and the summary plugin (it writes it through ``commit_compression``).
SUMMARY_NAMESPACE = "summary"


# Every model here builds its validator on first use, not at import (``defer_build``).
class MetadataEntry(BaseModel):
    """A versioned metadata value. ``value is None and deleted`` means it was deleted; a key that
    was never written has no entry at all (``get_metadata`` returns ``None``). ``version`` grows by
    one on every write or delete and never goes back, so it serves compare-and-set."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    namespace: str
    key: str
    value: dict[str, Any] | None
    version: int
    deleted: bool = False
    updated_at: datetime | None = None


class Snapshot(BaseModel):
    """The active history and a metadata record read in one transaction."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    session_id: str
    epoch: int
    messages: list[Message]
    record: MetadataEntry | None = None

    @property
    def first_seq(self) -> int | None:
        return self.messages[0].seq if self.messages else None

    @property
    def last_seq(self) -> int | None:
        return self.messages[-1].seq if self.messages else None


class SessionInfo(BaseModel):
    model_config = ConfigDict(defer_build=True)

    session_id: str
    epoch: int
    active: int
    archived: int
    last_seq: int
    updated_at: datetime | None = None


class SearchHit(BaseModel):
    """One match of ``MemoryService.search``: the stored message (its ``seq``, ``role``, and
    ``archived`` reason, ``None`` while still active), its rank score (higher is better; only
    comparable within one answer) and when it was stored, where the store knows."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    message: Message
    score: float
    stored_at: datetime | None = None


class LeaseToken(BaseModel):
    """A held lease. ``fence`` is its fencing token: every acquisition of a name returns a larger
    one than all earlier acquisitions of that name in the store (released or expired ones
    included), so a write made under the lease can be refused once a newer holder took it."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str
    token: str
    expires_at: float
    fence: int = 0


class LeaseLost(RuntimeError):
    """A write made under a lease was refused: a newer holder took the lease (its fencing token
    is larger). Nothing was written."""

    def __init__(self, lease: LeaseToken) -> None:
        super().__init__(f"lease {lease.name!r} (fence {lease.fence}) was taken by a newer holder")
        self.lease = lease


@runtime_checkable
class MemoryService(Protocol):
    """Conversation store. ``seq`` is per session, gapless and in commit order. Messages are
    archived with a reason, never deleted, except by ``forget``."""

    async def append(self, session_id: str, messages: Sequence[Message]) -> list[Message]:
        """Store messages; return them with ``seq``, ``epoch`` and ``tokens`` set."""
        ...

    async def get_history(self, session_id: str, limit: int | None = None) -> list[Message]:
        """Active messages, oldest first; with ``limit``, only the newest ``limit``."""
        ...

    async def get_archived(
        self, session_id: str, *, epoch: int | None = None, limit: int | None = None
    ) -> list[Message]:
        """Archived messages (with their reason), oldest first; optionally of one epoch only."""
        ...

    async def snapshot(self, session_id: str, namespace: str = SUMMARY_NAMESPACE) -> Snapshot:
        """Active history plus the metadata record ``(namespace, session_id)``, consistently."""
        ...

    async def search(
        self, session_id: str, query: str, *, role: str | None = None, limit: int = 10
    ) -> list[SearchHit]:
        """This session's messages that match any word of ``query``, best first: active and
        archived, never cleared, deleted or event markers, never another session's."""
        ...

    async def get_range(self, session_id: str, from_seq: int, to_seq: int) -> list[Message]:
        """This session's searchable messages with ``from_seq <= seq <= to_seq``, oldest first
        (what ``search`` can find: not cleared, deleted or event markers)."""
        ...

    async def trim_history(
        self,
        session_id: str,
        keep_recent: int | None = None,
        up_to_seq: int | None = None,
        reason: ArchiveReason = "window",
        *,
        lease: LeaseToken | None = None,
    ) -> list[int]:
        """Archive all active messages but the newest ``keep_recent`` (event markers and system
        messages do not count) or everything with ``seq <= up_to_seq``; return the archived seqs.
        System messages are core memory: never archived here. With ``lease``, raise
        :class:`LeaseLost` and change nothing if a newer holder took that lease. Aalis:
        trimHistory."""
        ...

    async def commit_compression(
        self,
        session_id: str,
        record: dict[str, Any],
        expected_version: int,
        archive_through_seq: int,
        *,
        epoch: int,
        namespace: str = SUMMARY_NAMESPACE,
        lease: LeaseToken | None = None,
    ) -> bool:
        """Atomically: if the record ``(namespace, session_id)`` is still at ``expected_version``
        (0 = never written) and the session is still at ``epoch``, write ``record`` and archive
        every active message with ``seq <= archive_through_seq`` as ``summarized`` (system
        messages excepted: they are core memory). Return whether it won; a lost race changes
        nothing. With ``lease`` (the one the run holds), raise :class:`LeaseLost` and change
        nothing if a newer holder took that lease (its fencing token is no longer the latest)."""
        ...

    async def get_metadata(self, namespace: str, key: str) -> MetadataEntry | None:
        """The entry, ``None`` if never written, or a tombstone (``deleted``) if deleted."""
        ...

    async def save_metadata(
        self,
        namespace: str,
        key: str,
        value: dict[str, Any],
        expected_version: int | None = None,
    ) -> int | None:
        """Write; return the new version, or ``None`` if ``expected_version`` did not match."""
        ...

    async def delete_metadata(
        self, namespace: str, key: str, expected_version: int | None = None
    ) -> int | None:
        """Mark deleted (a tombstone keeps the version); return the new version or ``None``."""
        ...

    async def list_metadata(self, namespace: str) -> list[MetadataEntry]:
        """The namespace's live (not deleted) entries."""
        ...

    async def acquire_lease(self, name: str, ttl_s: float) -> LeaseToken | None:
        """Take the named lease for ``ttl_s`` seconds unless someone holds an unexpired one; the
        token carries a fencing token larger than every earlier acquisition's of ``name``."""
        ...

    async def renew_lease(self, lease: LeaseToken, ttl_s: float) -> LeaseToken | None:
        """Extend a lease that is still ours and unexpired to ``ttl_s`` seconds from now; return
        it with its new expiry (same token and fence), or ``None`` if it expired, was released
        or was taken over. A live holder renews well before expiry (a heartbeat), so a crashed
        holder's lease runs out after one ``ttl_s``."""
        ...

    async def release_lease(self, lease: LeaseToken) -> bool:
        """Give the lease back if it is still ours; return whether it was."""
        ...

    async def get_epoch(self, session_id: str) -> int:
        """The session's epoch (0 for an unknown session); ``clear`` bumps it."""
        ...

    async def clear(self, session_id: str, types: Sequence[str] | None = None) -> int:
        """Bump the session's epoch and return it. ``types`` (``None`` = all) picks what goes:
        ``history`` archives the active messages as ``cleared``; any other name deletes the
        session's record in that metadata namespace."""
        ...

    async def delete_messages(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        """Mark messages deleted (a rollback or an edit): archived with reason ``deleted``, active
        or not. Return the seqs it changed. The host then sends ``memory:messages-deleted``."""
        ...

    async def forget(self, session_id: str) -> None:
        """Delete everything of a session, archived messages and metadata included."""
        ...

    async def list_sessions(self) -> list[SessionInfo]:
        """Every session with its active and archived counts."""
        ...

    async def close(self) -> None:
        """Release connections; the service is unusable afterwards."""
        ...


@runtime_checkable
class SnapshotOnAppend(Protocol):
    """What a store may add to :class:`MemoryService` (optional): an append and a snapshot of
    what it left, in one transaction and one round trip. A host reads a snapshot right after it
    stores what comes before a model call (the user's message, the tools' results); a store
    that has this method saves it a second trip (SQLite: a worker-thread hop)."""

    async def append_snapshot(
        self, session_id: str, messages: Sequence[Message], namespace: str = SUMMARY_NAMESPACE
    ) -> tuple[list[Message], Snapshot]:
        """``append(session_id, messages)``, then ``snapshot(session_id, namespace)`` of the
        session as that append left it."""
        ...


@runtime_checkable
class OpensAtStart(Protocol):
    """What a store may add to :class:`MemoryService` (optional): opening its connection at the
    host's start. A store opens itself on first use otherwise, and the first turn would wait
    for it (SQLite: the file, WAL and the schema, a few milliseconds); a store that cannot be
    opened then fails the start instead of the first turn."""

    async def open(self) -> None:
        """Open the connection now (nothing if it is open); raise what the first call would."""
        ...


@runtime_checkable
class YieldsToTurns(Protocol):
    """What a host may add to :class:`HostProtocol` (optional): background work lets the
    host's turns go first. A turn's store call that leaves the event loop (a worker thread, a
    database round trip) lets any ready task run; a background compression that starts its CPU
    work then (parsing an answer, merging a record, rendering a block: milliseconds) holds the
    turn's next step until it is done. A plugin awaits this between such steps."""

    async def after_turns(self, max_wait_s: float) -> bool:
        """Return ``True`` once none of the host's turns waits on the store (at once when none
        does), ``False`` after ``max_wait_s`` seconds of turns waiting."""
        ...


class LLMUsage(BaseModel):
    model_config = ConfigDict(defer_build=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    #: True when the provider reported no usage and the service counted the tokens itself.
    estimated: bool = False


class Completion(BaseModel):
    """What one model call returned."""

    model_config = ConfigDict(defer_build=True)

    text: str
    finish_reason: str | None = None
    usage: LLMUsage = Field(default_factory=LLMUsage)
    cost: float | None = None
    model: str = ""
    tool_calls: list[dict[str, Any]] | None = None


@runtime_checkable
class LLMService(Protocol):
    """Model calls, token counts and model windows (the reference host builds it on litellm)."""

    default_model: str | None

    async def complete(
        self,
        messages: Sequence[Message | dict[str, Any]],
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion:
        """One model call; raises on provider errors and timeouts (callers decide what to do)."""
        ...

    def context_window(self, model: str | None = None) -> int:
        """Input window of ``model`` (or the default model), config overrides first."""
        ...

    def max_output_tokens(self, model: str | None = None) -> int:
        """Largest answer ``model`` can give."""
        ...

    def count_tokens(
        self, messages_or_text: str | Sequence[Message | dict[str, Any]], model: str | None = None
    ) -> int:
        """Token count; never reaches the network."""
        ...


@runtime_checkable
class MessageArchiveService(Protocol):
    """Optional: a visible log of the conversation (compression markers go here)."""

    async def save_message(self, session_id: str, message: Message) -> None:
        """Keep ``message`` in the session's visible log."""
        ...


class EventBusProtocol(Protocol):
    """The host's signal bus (see :mod:`host_stub.signals` for the names and payloads)."""

    def connect(self, name: str, receiver: Any, *, typed: bool = False) -> None:
        """Call ``receiver(sender, **payload)`` on every ``name`` signal; with ``typed``,
        ``receiver(sender, payload)``, the payload's model of :mod:`host_stub.signals`."""
        ...

    def disconnect(self, name: str, receiver: Any) -> None:
        """Stop calling ``receiver``."""
        ...

    async def send(self, name: str, built: Any = None, /, **payload: Any) -> list[Any]:
        """Validate ``payload`` against the signal's model and await every receiver; or send
        ``built``, the signal's payload model made by the sender (not validated again)."""
        ...


class HostProtocol(Protocol):
    """What a plugin may use of the host that started it."""

    bus: EventBusProtocol
    memory: MemoryService
    llm: LLMService

    def get_plugin(self, name: str) -> Any:
        """The loaded plugin instance registered under ``name``."""
        ...

    def context_window(self) -> int:
        """The context window of the host's chat model (for plugins acting outside a turn)."""
        ...
