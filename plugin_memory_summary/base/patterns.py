"""Regular expressions compiled on first use.

The plugin's patterns use the third-party ``regex`` module (``\\X`` graphemes, ``\\p{Han}``,
timeouts). Importing it and compiling every pattern used to be a large part of ``import
plugin_memory_summary``, although a host needs them only once a summary is injected or a
compression runs. A module declares ``_NAME = lazy_regex(r"...")`` and calls ``_NAME()`` where
it matches: the first call imports ``regex`` and compiles, every later call returns the same
compiled pattern. Flags are written inline (``(?i)``, ``(?s)``, ``(?im)``) at the start of the
pattern.

:func:`validate_patterns` checks the user's patterns (``redact_patterns``): the config model
validates them with it, and so does the redactor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import regex

__all__ = ["LazyRegex", "lazy_regex", "validate_patterns"]


class LazyRegex:
    """A ``regex`` pattern compiled (and ``regex`` imported) on the first call."""

    __slots__ = ("_compiled", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._compiled: regex.Pattern[str] | None = None

    def __call__(self) -> regex.Pattern[str]:
        compiled = self._compiled
        if compiled is None:
            import regex

            compiled = self._compiled = regex.compile(self.pattern)
        return compiled

    @property
    def compiled(self) -> bool:
        """Whether the pattern has been compiled yet."""
        return self._compiled is not None

    def __repr__(self) -> str:
        return f"lazy_regex({self.pattern!r})"


def lazy_regex(pattern: str) -> LazyRegex:
    """An accessor for ``regex.compile(pattern)``, compiled on its first call."""
    return LazyRegex(pattern)


def validate_patterns(patterns: Sequence[str]) -> None:
    """Raise ``ValueError("redact_patterns[<i>]: invalid regular expression: <reason>")`` for the
    first pattern that does not compile or that matches the empty string (which would redact
    nothing and everything), so config validation can point at the entry."""
    if not patterns:
        return
    import regex

    for i, pattern in enumerate(patterns):
        try:
            compiled = regex.compile(pattern)
        except (regex.error, TypeError, ValueError) as exc:
            raise ValueError(f"redact_patterns[{i}]: invalid regular expression: {exc}") from None
        if compiled.fullmatch("") is not None:
            raise ValueError(
                f"redact_patterns[{i}]: invalid regular expression: matches the empty string"
            )
