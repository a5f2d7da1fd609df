"""What the plugin remembers of each session between turns, so the per-turn check is O(1).

It is a hint only: every compression decides again on a fresh snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from host_stub.services import Snapshot

from ..base import conversation_messages, core_tokens
from ..record import read_record
from .prompt_fit import Fit

__all__ = ["MAX_TRACKED_SESSIONS", "SessionState", "SessionTable"]

#: Sessions whose per-turn state one plugin instance keeps (least recently used forgotten first).
MAX_TRACKED_SESSIONS = 10_000


@dataclass
class SessionState:
    """One session's numbers as the last snapshot or run left them."""

    active: int = 0
    last_seq: int = 0
    turns_since: int | None = None
    context_window: int | None = None
    breakdown: dict[str, int] = field(default_factory=dict)
    #: Tokens of the core system messages in the history (never compressed) at the last read.
    core_tokens: int = 0
    cooldown_until: float = 0.0
    #: Newest seq when a watermark compression was found unable to help (the cooldown's key).
    blocked_seq: int | None = None
    warned: bool = False
    #: The numbers above were read from the store at least once in this process.
    synced: bool = False
    syncing: bool = False
    #: The last prompt's fit (``prompt_fit``) and the view it was computed for.
    fit: tuple[tuple[object, ...], Fit] | None = None
    #: Tokens of messages as the prompt shows them replaced, by (seq, length, hash of the text).
    shown_tokens: dict[tuple[int | None, int, int], int] = field(default_factory=dict)

    def set_after_run(self, after: tuple[int, int]) -> None:
        """A run set the counters to what it left (``base.decisions.counters_after_run``)."""
        self.active, self.last_seq = after
        self.turns_since = 0
        self.synced, self.syncing = True, False


class SessionTable:
    """Per-session state, most recently used last; past ``limit`` sessions the least recently
    used is forgotten (its next turn reads its numbers from the store again, as on its first
    turn in this process)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_TRACKED_SESSIONS if limit is None else limit
        self._states: OrderedDict[str, SessionState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._states

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def get(self, session_id: str) -> SessionState:
        """The session's state (created empty on first use), marked most recently used."""
        state = self._states.get(session_id)
        if state is None:
            state = self._states[session_id] = SessionState()
            while len(self._states) > self.limit:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(session_id)
        return state

    def peek(self, session_id: str) -> SessionState | None:
        """The state if known, without creating it or changing the order."""
        return self._states.get(session_id)

    def forget(self, session_id: str) -> None:
        self._states.pop(session_id, None)

    def refresh(self, snap: Snapshot) -> SessionState:
        """Set a session's numbers from a snapshot of the store."""
        state = self.get(snap.session_id)
        conv = conversation_messages(snap.messages)
        record = read_record(snap.record, snap.epoch)
        state.active = len(conv)
        state.core_tokens = core_tokens(snap.messages)
        state.last_seq = snap.last_seq or 0
        state.synced, state.syncing = True, False
        if record is None:
            state.turns_since = None
        else:
            state.turns_since = sum(
                1 for m in conv if m.role == "user" and (m.seq or 0) > record.compressed_at_seq
            )
        return state
