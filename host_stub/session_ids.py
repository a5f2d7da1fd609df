"""The one rule for session ids, the same for every memory backend and checked at the edge (the
command line, the host's entry points, and every backend write that can create a session).

A session id is 1 to :data:`MAX_SESSION_ID_CHARS` characters of letters, marks, digits,
punctuation, symbols and inner plain spaces: no control or format characters (CR, LF, TAB,
U+202E and zero-width characters among them), no other kind of space, no surrogates, no private-use
or unassigned code points, and no space at either end. The length keeps every backend's index
entry small (PostgreSQL refuses an index row over about 2,700 bytes; 128 characters of UTF-8 are
at most 512 bytes).
"""

from __future__ import annotations

import unicodedata

__all__ = ["MAX_SESSION_ID_CHARS", "InvalidSessionId", "check_session_id", "session_id_problem"]

MAX_SESSION_ID_CHARS = 128

#: Unicode general categories allowed: letters, marks, numbers, punctuation, symbols.
_ALLOWED = ("L", "M", "N", "P", "S")


class InvalidSessionId(ValueError):
    """A session id that breaks the rule; the message is one line."""


def session_id_problem(session_id: object) -> str | None:
    """Why ``session_id`` is not a valid session id, or ``None`` when it is."""
    if not isinstance(session_id, str):
        return f"a session id is text, not {type(session_id).__name__}"
    if not session_id:
        return "a session id cannot be empty"
    if len(session_id) > MAX_SESSION_ID_CHARS:
        return (
            f"a session id has at most {MAX_SESSION_ID_CHARS} characters "
            f"(this one has {len(session_id):,})"
        )
    if session_id != session_id.strip(" "):
        return "a session id cannot start or end with a space"
    if session_id.isascii() and session_id.isprintable():
        return None  # printable ASCII is letters, digits, punctuation, symbols and spaces
    bad = _first_disallowed(session_id)
    if bad is not None:
        name = unicodedata.name(bad, "")
        what = f"U+{ord(bad):04X}" + (f" {name}" if name else "")
        return (
            f"a session id cannot contain {what} (allowed: letters, digits, punctuation, "
            "symbols and inner spaces)"
        )
    return None


def _first_disallowed(session_id: str) -> str | None:
    """The first character of ``session_id`` outside the allowed categories (a plain space is
    allowed: where it may stand is checked apart)."""
    for char in session_id:
        if char != " " and not unicodedata.category(char).startswith(_ALLOWED):
            return char
    return None


def check_session_id(session_id: object) -> str:
    """``session_id`` itself, or :class:`InvalidSessionId` naming the problem."""
    problem = session_id_problem(session_id)
    if problem is not None:
        shown = repr(session_id)
        if len(shown) > 40:
            shown = shown[:37] + "..."
        raise InvalidSessionId(f"invalid session id {shown}: {problem}")
    assert isinstance(session_id, str)
    return session_id
