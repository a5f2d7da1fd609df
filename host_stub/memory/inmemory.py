"""In-process memory backend: plain dicts behind one ``asyncio.Lock``. For tests and demos.

Every method takes the lock for its whole body, so each call is one atomic step, as a
transaction is in the SQL backends. Stored messages are private copies: callers may mutate what
they pass in or get back without touching the store.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..messages import ArchiveReason, Message, clone_model
from ..services import (
    SUMMARY_NAMESPACE,
    LeaseLost,
    LeaseToken,
    MetadataEntry,
    SearchHit,
    SessionInfo,
    Snapshot,
)
from ..session_ids import check_session_id
from .common import (
    TokenCounter,
    check_limit,
    check_ttl,
    copy_message,
    dump_value,
    is_core,
    load_value,
    new_lease_token,
    select_trim,
    stored_message,
    to_datetime,
    tokens_of,
)
from .search_plan import (
    CONTEXT_SPAN,
    Candidate,
    Indexed,
    choose,
    lend_context,
    own_terms,
    plan_search,
    query_terms,
    rank,
    tool_message,
    weighted_counts,
)

__all__ = ["InMemoryMemory"]


class _Doc(NamedTuple):
    """A message's search entry."""

    counts: dict[str, float]  # term -> weighted frequency
    length: float  # their sum
    stored_at: float
    own: str  # its own terms, in order, space-joined
    tool: bool  # a tool's traffic (ranked lower)


@dataclass
class _Session:
    epoch: int = 0
    last_seq: int = 0
    updated_at: float = field(default_factory=time.time)
    #: seq -> stored message (``archived`` set once archived), in seq order.
    messages: dict[int, Message] = field(default_factory=dict)
    #: The search index: term -> {seq: term frequency}, oldest seq first;
    #: seq -> its entry (:class:`_Doc`).
    postings: dict[str, dict[int, float]] = field(default_factory=dict)
    docs: dict[int, _Doc] = field(default_factory=dict)
    total_terms: float = 0.0

    #: (seq, own terms) of the message indexed last: the next catch-up needs them as context.
    last_own: tuple[int, list[str]] | None = None
    #: Messages up to this seq are in the index; those after it are indexed by the next
    #: :meth:`catch_up` (a search, an archive), not by the append that stored them.
    indexed_seq: int = 0
    #: When each message not indexed yet was stored.
    pending: dict[int, float] = field(default_factory=dict)

    def previous_terms(self, first_seq: int) -> tuple[int, list[str]] | None:
        """``(seq, own terms)`` of the searchable message messages from ``first_seq`` on follow
        (at most :data:`CONTEXT_SPAN` seqs back)."""
        for seq in range(first_seq - 1, max(0, first_seq - 1 - CONTEXT_SPAN), -1):
            if seq in self.docs:
                if self.last_own is not None and self.last_own[0] == seq:
                    return self.last_own
                own = own_terms(self.messages[seq])
                return None if own is None else (seq, own)
        return None

    def catch_up(self) -> None:
        """Index the messages stored since the last catch-up."""
        if self.indexed_seq >= self.last_seq:
            return
        docs = [
            (seq, own_terms(self.messages[seq]))
            for seq in range(self.indexed_seq + 1, self.last_seq + 1)
            if seq in self.pending
        ]
        previous = self.previous_terms(self.indexed_seq + 1)
        for (seq, _), indexed in zip(docs, lend_context(docs, previous), strict=True):
            if indexed is not None:
                self.index(seq, indexed, self.pending[seq])
        self.indexed_seq = self.last_seq
        self.pending.clear()

    def index(self, seq: int, indexed: Indexed, now: float) -> None:
        counts = weighted_counts(indexed)
        for term, tf in counts.items():
            self.postings.setdefault(term, {})[seq] = tf
        length = sum(counts.values())
        tool = tool_message(self.messages[seq])
        self.docs[seq] = _Doc(counts, length, now, " ".join(indexed[0]), tool)
        self.total_terms += length
        self.last_own = (seq, indexed[0])

    def unindex(self, seqs: Sequence[int]) -> None:
        if self.last_own is not None and self.last_own[0] in seqs:
            self.last_own = None
        for seq in seqs:
            doc = self.docs.pop(seq, None)
            if doc is None:
                continue
            self.total_terms -= doc.length
            for term in doc.counts:
                posting = self.postings.get(term)
                if posting is not None:
                    posting.pop(seq, None)
                    if not posting:
                        del self.postings[term]

    #: The active ones only (an index: reads of the active history never walk the archive).
    active: dict[int, Message] = field(default_factory=dict)


class InMemoryMemory:
    """A :class:`~host_stub.services.MemoryService` that lives and dies with the process."""

    def __init__(
        self, token_counter: TokenCounter, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._count = token_counter
        #: Lease expiry is read from this clock (unix seconds); tests may pass their own.
        self._clock = clock
        self._lock = asyncio.Lock()
        self._sessions: dict[str, _Session] = {}
        #: Each entry without its value, and the value as JSON text (as the other backends keep
        #: it): a read parses the text (a third of a dump and parse of the value).
        self._metadata: dict[tuple[str, str], tuple[MetadataEntry, str | None]] = {}
        self._leases: dict[str, LeaseToken] = {}
        #: name -> the last fencing token handed out (kept after release and expiry).
        self._fences: dict[str, int] = {}

    def _check_fence(self, lease: LeaseToken | None) -> None:
        if lease is not None and self._fences.get(lease.name, 0) != lease.fence:
            raise LeaseLost(lease)

    # -- helpers (call with the lock held) ---------------------------------------------------

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session()
        return session

    def _active(self, session_id: str) -> list[Message]:
        session = self._sessions.get(session_id)
        if session is None:
            return []
        return list(session.active.values())

    def _archive(
        self, session: _Session, seqs: Sequence[int], reason: ArchiveReason, now: float
    ) -> None:
        for seq in seqs:
            session.messages[seq].archived = reason
            session.active.pop(seq, None)
        if seqs:
            session.updated_at = now

    def _write_metadata(
        self, namespace: str, key: str, value: dict[str, Any] | None, now: float
    ) -> int:
        version = self._version(namespace, key) + 1
        entry = MetadataEntry(
            namespace=namespace,
            key=key,
            value=None,
            version=version,
            deleted=value is None,
            updated_at=to_datetime(now),
        )
        self._metadata[(namespace, key)] = (entry, None if value is None else dump_value(value))
        return version

    def _version(self, namespace: str, key: str) -> int:
        current = self._metadata.get((namespace, key))
        return current[0].version if current else 0

    # -- messages -----------------------------------------------------------------------------

    async def append(self, session_id: str, messages: Sequence[Message]) -> list[Message]:
        check_session_id(session_id)
        if not messages:
            return []
        counted = [(m, tokens_of(m, self._count)) for m in messages]
        async with self._lock:
            return self._append(session_id, counted)

    async def append_snapshot(
        self, session_id: str, messages: Sequence[Message], namespace: str = SUMMARY_NAMESPACE
    ) -> tuple[list[Message], Snapshot]:
        check_session_id(session_id)
        counted = [(m, tokens_of(m, self._count)) for m in messages]
        async with self._lock:
            out = self._append(session_id, counted) if counted else []
            return out, self._snapshot(session_id, namespace)

    def _append(self, session_id: str, counted: list[tuple[Message, int]]) -> list[Message]:
        """With the lock held: store ``counted`` (messages and their tokens)."""
        session = self._session(session_id)
        now = time.time()
        out: list[Message] = []
        for message, tokens in counted:
            session.last_seq += 1
            # In its JSON form, as the SQL backends store it, so all accept the same input.
            stored = stored_message(
                message, seq=session.last_seq, epoch=session.epoch, tokens=tokens
            )
            session.messages[stored.seq] = stored  # type: ignore[index]
            session.pending[session.last_seq] = now  # indexed by the next catch-up
            session.active[stored.seq] = stored  # type: ignore[index]
            out.append(copy_message(stored))
        session.updated_at = now
        return out

    async def get_history(self, session_id: str, limit: int | None = None) -> list[Message]:
        check_limit(limit)
        async with self._lock:
            return _copies(_newest(self._active(session_id), limit))

    async def get_archived(
        self, session_id: str, *, epoch: int | None = None, limit: int | None = None
    ) -> list[Message]:
        check_limit(limit)
        async with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return []
            found = [
                m
                for m in session.messages.values()
                if m.archived is not None and (epoch is None or m.epoch == epoch)
            ]
            return _copies(_newest(found, limit))

    async def snapshot(self, session_id: str, namespace: str = SUMMARY_NAMESPACE) -> Snapshot:
        async with self._lock:
            return self._snapshot(session_id, namespace)

    def _snapshot(self, session_id: str, namespace: str) -> Snapshot:
        session = self._sessions.get(session_id)
        return Snapshot(
            session_id=session_id,
            epoch=session.epoch if session else 0,
            messages=_copies(self._active(session_id)),
            record=_entry_copy(self._metadata.get((namespace, session_id))),
        )

    async def search(
        self, session_id: str, query: str, *, role: str | None = None, limit: int = 10
    ) -> list[SearchHit]:
        check_limit(limit)
        terms = query_terms(query)
        async with self._lock:
            session = self._sessions.get(session_id)
            if session is None or not terms or not limit:
                return []
            session.catch_up()
            if not session.docs:
                return []
            docs = session.docs
            postings = session.postings
            plan = plan_search(
                terms,
                [len(postings.get(t, ())) for t in terms],
                len(docs),
                session.total_terms,
                limit=limit,
            )
            holders: dict[int, set[int]] = {}
            found: list[set[int]] = []
            for read in plan.reads:
                lists = [postings.get(terms[i], {}) for i in read.terms]
                smallest = min(lists, key=len)
                # Oldest first in each posting dict; newest first when only the newest count.
                seqs: Iterable[int] = reversed(smallest) if read.limit else smallest
                if len(lists) > 1:
                    seqs = (s for s in seqs if all(s in other for other in lists))
                if role is not None:
                    seqs = (s for s in seqs if session.messages[s].role == role)
                got = set(itertools.islice(seqs, read.limit))
                found.append(got)
                for i in read.terms:
                    holders.setdefault(i, set()).update(got)
            candidates = set().union(*found)
            # The probes look among the candidates holding a term read whole, and those from the
            # oldest message read on holding the term read newest first (as the SQL stores do;
            # those of a conjunction were found by the larger ones, read first).
            whole = [postings.get(terms[i], {}) for i in plan.whole]
            newest = [
                (r.terms[0], postings.get(terms[r.terms[0]], {}), min(got))
                for r, got in zip(plan.reads, found, strict=True)
                if r.limit and got and len(r.terms) == 1
            ]
            for i in plan.probes:
                posting = postings.get(terms[i], {})
                holders.setdefault(i, set()).update(
                    s
                    for s in candidates
                    if s in posting
                    and (
                        any(s in w for w in whole)
                        or any(s >= low and s in p and t != i for t, p, low in newest)
                    )
                )
            best = rank(
                plan,
                (
                    Candidate(
                        seq,
                        [docs[seq].counts.get(t, 0.0) for t in terms],
                        docs[seq].length,
                        docs[seq].own,
                        docs[seq].tool,
                    )
                    for seq in choose(plan, holders, limit)
                ),
                limit,
            )
            return [
                SearchHit(
                    message=copy_message(session.messages[seq]),
                    score=value,
                    stored_at=to_datetime(docs[seq].stored_at),
                )
                for seq, value in best
            ]

    async def get_range(self, session_id: str, from_seq: int, to_seq: int) -> list[Message]:
        async with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return []
            session.catch_up()
            return _copies(
                [
                    m
                    for s, m in session.messages.items()
                    if from_seq <= s <= to_seq and s in session.docs
                ]
            )

    async def trim_history(
        self,
        session_id: str,
        keep_recent: int | None = None,
        up_to_seq: int | None = None,
        reason: ArchiveReason = "window",
        *,
        lease: LeaseToken | None = None,
    ) -> list[int]:
        async with self._lock:
            self._check_fence(lease)
            active = [(m.seq or 0, m.kind, m.role) for m in self._active(session_id)]
            seqs = select_trim(active, keep_recent, up_to_seq)
            if seqs:
                session = self._sessions[session_id]
                session.catch_up()  # an archive is background work: the index catches up here
                self._archive(session, seqs, reason, time.time())
            return seqs

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
        async with self._lock:
            self._check_fence(lease)
            session = self._sessions.get(session_id)
            current_epoch = session.epoch if session else 0
            if self._version(namespace, session_id) != expected_version:
                return False
            if current_epoch != epoch:
                return False
            now = time.time()
            self._write_metadata(namespace, session_id, record, now)
            if session is not None:
                session.catch_up()  # an archive is background work: the index catches up here
                seqs = [
                    m.seq or 0
                    for m in self._active(session_id)
                    if (m.seq or 0) <= archive_through_seq and not is_core(m.role, m.kind)
                ]
                self._archive(session, seqs, "summarized", now)
            return True

    # -- metadata -----------------------------------------------------------------------------

    async def get_metadata(self, namespace: str, key: str) -> MetadataEntry | None:
        async with self._lock:
            return _entry_copy(self._metadata.get((namespace, key)))

    async def save_metadata(
        self,
        namespace: str,
        key: str,
        value: dict[str, Any],
        expected_version: int | None = None,
    ) -> int | None:
        check_session_id(key)
        if value is None:
            raise ValueError("save_metadata needs a value; use delete_metadata to delete")
        async with self._lock:
            if expected_version is not None and self._version(namespace, key) != expected_version:
                return None
            return self._write_metadata(namespace, key, value, time.time())

    async def delete_metadata(
        self, namespace: str, key: str, expected_version: int | None = None
    ) -> int | None:
        async with self._lock:
            if expected_version is not None and self._version(namespace, key) != expected_version:
                return None
            return self._write_metadata(namespace, key, None, time.time())

    async def list_metadata(self, namespace: str) -> list[MetadataEntry]:
        async with self._lock:
            found = [
                stored
                for (ns, _), stored in self._metadata.items()
                if ns == namespace and not stored[0].deleted
            ]
            return [_copy_entry(stored) for stored in sorted(found, key=lambda s: s[0].key)]

    # -- leases -------------------------------------------------------------------------------

    async def acquire_lease(self, name: str, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        async with self._lock:
            now = self._clock()
            held = self._leases.get(name)
            if held is not None and held.expires_at > now:
                return None
            fence = self._fences[name] = self._fences.get(name, 0) + 1
            lease = LeaseToken(
                name=name, token=new_lease_token(), expires_at=now + ttl_s, fence=fence
            )
            self._leases[name] = lease
            return lease

    async def renew_lease(self, lease: LeaseToken, ttl_s: float) -> LeaseToken | None:
        check_ttl(ttl_s)
        async with self._lock:
            now = self._clock()
            held = self._leases.get(lease.name)
            if held is None or held.token != lease.token or held.expires_at <= now:
                return None
            renewed = held.model_copy(update={"expires_at": now + ttl_s})
            self._leases[lease.name] = renewed
            return renewed

    async def release_lease(self, lease: LeaseToken) -> bool:
        async with self._lock:
            held = self._leases.get(lease.name)
            if held is None or held.token != lease.token:
                return False
            del self._leases[lease.name]
            return True

    # -- sessions -----------------------------------------------------------------------------

    async def get_epoch(self, session_id: str) -> int:
        async with self._lock:
            session = self._sessions.get(session_id)
            return session.epoch if session else 0

    async def clear(self, session_id: str, types: Sequence[str] | None = None) -> int:
        check_session_id(session_id)
        async with self._lock:
            now = time.time()
            session = self._session(session_id)
            session.epoch += 1
            session.updated_at = now
            if types is None or "history" in types:
                seqs = [m.seq or 0 for m in self._active(session_id)]
                self._archive(session, seqs, "cleared", now)
                session.unindex(list(session.docs))
                session.indexed_seq = session.last_seq  # what was not indexed never will be
                session.pending.clear()
            if types is None:
                namespaces = sorted(ns for ns, key in self._metadata if key == session_id)
            else:
                namespaces = [t for t in dict.fromkeys(types) if t != "history"]
            for namespace in namespaces:
                self._write_metadata(namespace, session_id, None, now)
            return session.epoch

    async def delete_messages(self, session_id: str, seqs: Sequence[int]) -> list[int]:
        async with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return []
            found = sorted(
                s
                for s in set(seqs)
                if s in session.messages and session.messages[s].archived != "deleted"
            )
            session.catch_up()  # the messages after them were lent their terms
            self._archive(session, found, "deleted", time.time())
            session.unindex(found)
            return found

    async def forget(self, session_id: str) -> None:
        async with self._lock:
            self._sessions.pop(session_id, None)
            for ns_key in [k for k in self._metadata if k[1] == session_id]:
                del self._metadata[ns_key]

    async def list_sessions(self) -> list[SessionInfo]:
        async with self._lock:
            out = []
            for session_id in sorted(self._sessions):
                session = self._sessions[session_id]
                active = len(session.active)
                out.append(
                    SessionInfo(
                        session_id=session_id,
                        epoch=session.epoch,
                        active=active,
                        archived=len(session.messages) - active,
                        last_seq=session.last_seq,
                        updated_at=to_datetime(session.updated_at),
                    )
                )
            return out

    async def close(self) -> None:
        """Nothing to release; the data stays readable until the object is dropped."""


def _newest(messages: list[Message], limit: int | None) -> list[Message]:
    if limit is None:
        return messages
    return messages[max(0, len(messages) - limit) :] if limit else []


def _copies(messages: list[Message]) -> list[Message]:
    return [copy_message(m) for m in messages]


def _entry_copy(stored: tuple[MetadataEntry, str | None] | None) -> MetadataEntry | None:
    return None if stored is None else _copy_entry(stored)


def _copy_entry(stored: tuple[MetadataEntry, str | None]) -> MetadataEntry:
    """A private copy of a stored metadata entry: its value parsed from the JSON text it was
    saved as (a dump and a parse of a large summary record at every read cost three times
    as much). A deleted entry, frozen and without a value, is shared."""
    entry, text = stored
    return entry if text is None else clone_model(entry, {"value": load_value(text)})
