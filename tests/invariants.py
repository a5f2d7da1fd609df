"""Incremental checks of the design's per-session invariants (DESIGN.md, "Invariants every test
suite should hold"), usable after every turn of any test.

:class:`InvariantChecker` watches one session of one memory service. Each
:meth:`~InvariantChecker.check` reads the epoch, the summary record, the active history, and of the
archive only what can have changed since the previous check: a message once verified archived
with a valid reason stays valid (archiving is one-way and ``covered_up_to_seq`` is itself checked
never to go back), so only seqs still active (or unseen) at the last check are resolved again.
The reads are ordered so that a compression committing concurrently cannot cause a false alarm
(see :meth:`~InvariantChecker.check`). It asserts:

* no message lost: every message of the current epoch is active, or archived ``summarized`` with
  ``seq <= covered_up_to_seq`` of the summary record, or archived ``window`` / ``fallback-trim``;
  the epoch's seqs have no gap, and every message a test says it appended is found, unchanged;
* no active message is covered by the summary (it would reach the model twice);
* the active history (event markers left out, as the host does) has no tool result without its
  call and no call without all its results (positional pairing, :func:`tool_groups`);
* ``covered_up_to_seq`` never goes back within an epoch, the record's metadata version never goes
  back at all (a ``forget`` resets it: use a new checker after one), and the record never belongs
  to a later epoch than the session's;
* system messages are never archived by a compression (reasons ``summarized``, ``window``,
  ``fallback-trim``); ``deleted`` archives in the current epoch only with ``allow_user_archive``.

:func:`check_sent` checks what the host sent to a model (``TurnResult.sent``): no orphan tool
result, no call without all its results.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from host_stub.messages import Message, tool_groups
from host_stub.services import SUMMARY_NAMESPACE, MemoryService

__all__ = ["InvariantChecker", "InvariantError", "check_sent", "tool_pairing_problems"]

#: Archive reasons a compression (or the plugin's explicit strategy / fallback) may use.
COMPRESSION_REASONS = frozenset({"summarized", "window", "fallback-trim"})


class InvariantError(AssertionError):
    """An invariant does not hold; the message names the session, the seq and what is wrong."""


def tool_pairing_problems(messages: Sequence[Message]) -> list[str]:
    """Orphan tool results and incomplete tool-call groups in ``messages`` (in order, positional
    pairing as the chat APIs require), described one per item; empty when all is well."""
    problems: list[str] = []
    inside: set[int] = set()
    for start, end, complete in tool_groups(list(messages)):
        inside.update(range(start + 1, end))
        if not complete:
            call = messages[start]
            wanted = sorted(c.id for c in call.tool_calls or [])
            got = sorted(str(m.tool_call_id) for m in messages[start + 1 : end])
            problems.append(
                f"call without all its results at position {start} (seq {call.seq}): "
                f"calls {wanted}, results {got}"
            )
    for i, m in enumerate(messages):
        if m.role == "tool" and i not in inside:
            problems.append(
                f"tool result without its call at position {i} (seq {m.seq}, "
                f"tool_call_id {m.tool_call_id!r})"
            )
    return problems


def check_sent(prompts: Iterable[Sequence[dict[str, Any]]], where: str = "") -> None:
    """What the host sent (``TurnResult.sent``: OpenAI-format prompts) has no tool result without
    its call and no call without all its results."""
    for n, prompt in enumerate(prompts):
        messages = [
            Message.model_validate(
                {
                    k: m[k]
                    for k in ("role", "content", "tool_calls", "tool_call_id", "name")
                    if k in m
                }
            )
            for m in prompt
        ]
        problems = tool_pairing_problems(messages)
        if problems:
            raise InvariantError(f"{where} prompt {n} sent to the model: " + "; ".join(problems))


@dataclass
class _Expected:
    role: str
    content: Any


@dataclass
class InvariantChecker:
    """Checks one session of ``memory`` incrementally; call :meth:`check` after every turn."""

    memory: MemoryService
    session_id: str
    namespace: str = SUMMARY_NAMESPACE
    #: How many checks ran, and how many archived messages were read in total (the incremental
    #: reads keep this near the number of messages ever archived, not checks x archive size).
    checks: int = 0
    archived_read: int = 0
    epoch: int | None = None
    covered: int = 0
    version: int = 0
    #: Highest seq seen so far, and the seqs of the current epoch still active at the last check
    #: (the only ones whose state can change).
    last_seq: int = 0
    pending: set[int] = field(default_factory=set)
    #: seq -> archive reason, for every message of the current epoch found archived.
    archived: dict[int, str] = field(default_factory=dict)
    #: Lowest seq of the current epoch seen (its messages are contiguous from there).
    epoch_first_seq: int | None = None
    expected: dict[int, _Expected] = field(default_factory=dict)
    #: Set when the test itself deletes messages (``Host.delete_messages``): then ``deleted``
    #: archives in the current epoch are expected.
    allow_user_archive: bool = False

    def _fail(self, what: str) -> None:
        raise InvariantError(f"session {self.session_id!r} (epoch {self.epoch}): {what}")

    def expect(self, messages: Iterable[Message]) -> None:
        """Messages a test appended (as returned by the store, with ``seq``): each must be found
        at its seq, with its role and content, by the next check."""
        for m in messages:
            if m.seq is None:
                raise ValueError("expect() needs stored messages (with seq)")
            self.expected[m.seq] = _Expected(m.role, m.content)

    async def check(self, appended: Iterable[Message] = ()) -> None:
        """Verify every invariant now. ``appended``: messages appended since the last check (see
        :meth:`expect`)."""
        self.expect(appended)
        for _ in range(5):
            # A compression may commit between any two reads; each check below pairs reads whose
            # order makes it sound. Archiving and coverage only grow and a commit archives and
            # covers in one step, so: the record read *before* the history may not cover an
            # active message; a message missing from the history is in the (later) archive read;
            # the record read *after* the archive covers every 'summarized' message in it; and a
            # message in both reads was archived in between (the archive wins).
            epoch = await self.memory.get_epoch(self.session_id)
            before = await self.memory.get_metadata(self.namespace, self.session_id)
            active = await self.memory.get_history(self.session_id)
            archived = await self._read_archive(epoch, active)
            entry = await self.memory.get_metadata(self.namespace, self.session_id)
            if await self.memory.get_epoch(self.session_id) == epoch:
                break
        else:  # pragma: no cover - a test that clears in a tight loop
            self._fail("epoch kept changing while checking")
        self._check(epoch, active, archived, before, entry)
        self.checks += 1

    async def _read_archive(self, epoch: int, active: list[Message]) -> list[Message]:
        """The archived messages of ``epoch`` whose state is not known yet: those with a seq at or
        above the lowest unresolved one, read newest first in growing pages."""
        if self.epoch is not None and epoch != self.epoch:
            page = await self.memory.get_archived(self.session_id, epoch=epoch)
            self.archived_read += len(page)
            return page
        unresolved = [*self.pending, self.last_seq + 1]
        low = min(unresolved)
        top = max([self.last_seq, *(m.seq or 0 for m in active)])
        limit = max(16, top - low + 8)
        while True:
            page = await self.memory.get_archived(self.session_id, epoch=epoch, limit=limit)
            self.archived_read += len(page)
            if len(page) < limit:
                # By contract that is the whole archive; read it whole (it costs no more) so a
                # store whose ``limit`` is off cannot hide a message from the check.
                page = await self.memory.get_archived(self.session_id, epoch=epoch)
                self.archived_read += len(page)
            if len(page) < limit or (page[0].seq or 0) <= low:
                return [m for m in page if (m.seq or 0) >= low]
            limit *= 2

    def _new_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.covered = 0
        self.pending = set()
        self.archived = {}
        self.epoch_first_seq = None
        # Messages a test appended before the clear belong to the old epoch.
        self.expected = {s: e for s, e in self.expected.items() if s > self.last_seq}

    def _covered(self, entry: Any, epoch: int) -> int:
        if entry is None or entry.deleted or entry.value is None:
            return 0
        record_epoch = int(entry.value.get("epoch", 0))
        if record_epoch > epoch:
            self._fail(f"summary record of a future epoch {record_epoch}")
        return int(entry.value.get("covered_up_to_seq", 0)) if record_epoch == epoch else 0

    def _check(
        self, epoch: int, active: list[Message], archived: list[Message], before: Any, entry: Any
    ) -> None:
        if self.epoch is None or epoch != self.epoch:
            if self.epoch is not None and epoch < self.epoch:
                self._fail(f"epoch went back from {self.epoch} to {epoch}")
            self._new_epoch(epoch)

        # -- the summary record: versions and coverage only go forward ------------------------
        covered_before = self._covered(before, epoch)
        covered = self._covered(entry, epoch)
        for read in (before, entry):
            if read is not None:
                if read.version < self.version:
                    self._fail(
                        f"summary metadata version went back from {self.version} to {read.version}"
                    )
                self.version = read.version
        for value in (covered_before, covered):
            if value < self.covered:
                self._fail(f"covered_up_to_seq went back from {self.covered} to {value}")
            self.covered = value

        # -- every message of the epoch accounted for ------------------------------------------
        seen: dict[int, Message] = {}
        for m in active:
            if m.seq is None:
                self._fail(f"active message without seq: {m!r}")
            if m.archived is not None:
                self._fail(f"seq {m.seq}: returned as active but archived {m.archived!r}")
            seen[m.seq] = m
        for m in archived:
            assert m.seq is not None
            # In both reads: archived after the history read; the archive is the newer state.
            if m.epoch != epoch:
                self._fail(f"seq {m.seq}: archive read of epoch {epoch} returned epoch {m.epoch}")
            reason = m.archived
            if reason is None:
                self._fail(f"seq {m.seq}: returned as archived without a reason")
            if reason in COMPRESSION_REASONS and m.role == "system" and m.kind == "message":
                self._fail(f"seq {m.seq}: system message archived by a compression ({reason!r})")
            if reason == "summarized" and m.seq > covered:
                self._fail(
                    f"seq {m.seq}: archived 'summarized' but the summary covers only up to "
                    f"seq {covered}"
                )
            if reason not in COMPRESSION_REASONS and not self.allow_user_archive:
                # ``cleared`` / ``deleted`` in the current epoch: only a user action does that.
                self._fail(f"seq {m.seq}: archived with reason {reason!r} in the current epoch")
            previous = self.archived.get(m.seq)
            if previous is not None and previous != reason:
                self._fail(f"seq {m.seq}: archive reason changed from {previous!r} to {reason!r}")
            self.archived[m.seq] = reason
            seen[m.seq] = m

        # Verified archived messages below the lowest unresolved seq were not re-read; they stay
        # valid (one-way archive, coverage never goes back). The rest must all be accounted for.
        epoch_seqs = sorted(s for s, m in seen.items() if m.epoch == epoch)
        if epoch_seqs:
            first = (
                epoch_seqs[0]
                if self.epoch_first_seq is None
                else min(self.epoch_first_seq, epoch_seqs[0])
            )
            self.epoch_first_seq = first
        for seq in list(self.pending):
            if seq not in seen:
                self._fail(
                    f"seq {seq} was active at the last check and is now neither active nor archived"
                )
        top = max([self.last_seq, *seen])
        if self.epoch_first_seq is not None:
            low = max(self.epoch_first_seq, min([*self.pending, self.last_seq + 1]))
            missing = [s for s in range(low, top + 1) if s not in seen and s not in self.archived]
            if missing:
                self._fail(f"seqs {missing[:10]} of the epoch are neither active nor archived")
        for seq, want in self.expected.items():
            m = seen.get(seq)
            if m is None:
                if seq in self.archived:
                    continue  # verified archived at an earlier check
                self._fail(f"appended seq {seq} ({want.role}) is neither active nor archived")
            if m.role != want.role or m.content != want.content:
                self._fail(
                    f"seq {seq} changed: stored {m.role}/{m.content!r:.80}, "
                    f"appended {want.role}/{want.content!r:.80}"
                )

        # -- no active message is covered by the summary ---------------------------------------
        for m in active:
            if m.kind == "message" and m.role != "system" and (m.seq or 0) <= covered_before:
                self._fail(
                    f"seq {m.seq} ({m.role}) is still active but the summary covers it "
                    f"(covered_up_to_seq {covered_before}): it would be sent twice"
                )

        # -- the active history pairs every tool call with its results ------------------------
        problems = tool_pairing_problems([m for m in active if not m.is_marker])
        if problems:
            self._fail("active history: " + "; ".join(problems))

        self.pending = {m.seq for m in active if m.epoch == epoch and m.seq is not None}
        self.last_seq = top
        # Expected messages verified and no longer active need no further look.
        self.expected = {s: e for s, e in self.expected.items() if s in self.pending}
