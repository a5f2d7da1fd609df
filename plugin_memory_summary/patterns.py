"""Regular expressions compiled on first use.

The plugin's patterns use the third-party ``regex`` module (``\\X`` graphemes, ``\\p{Han}``,
timeouts). Importing it and compiling every pattern used to be a large part of ``import
plugin_memory_summary``, although a host needs them only once a summary is injected or a
compression runs. A module declares ``_NAME = lazy_regex(r"...")`` and calls ``_NAME()`` where
it matches: the first call imports ``regex`` and compiles, every later call returns the same
compiled pattern. Flags are written inline (``(?i)``, ``(?s)``, ``(?im)``) at the start of the
pattern.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import regex

__all__ = ["LazyRegex", "lazy_regex"]


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
