"""Pure functions of one text, remembered for the texts they see again.

Every compression reads the previous summary's sentences and identifiers again, and scans them
as it did the last time (secrets, identifiers, content words): the rules engine spent most of a
run on texts it had already seen. A remembered function keeps its answers for the last
``maxsize`` texts of up to ``max_chars`` characters (a larger text is computed each time, so
the memory stays bounded); the answers are immutable (a tuple, a string), the callers copy them
into what they change."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

__all__ = ["remembered"]

_T = TypeVar("_T")

#: Texts remembered per function (a compression reads a few hundred to a thousand), and the
#: longest remembered: at most about 8 MB of text per function, with its answers.
MAX_TEXTS = 4096
MAX_CHARS = 2000


def remembered(
    fn: Callable[[str], _T], *, maxsize: int = MAX_TEXTS, max_chars: int = MAX_CHARS
) -> Callable[[str], _T]:
    """``fn`` with its answers for short texts remembered (least recently used dropped first).
    ``fn`` must be pure and return an immutable value; an exception is never remembered."""
    cached = functools.lru_cache(maxsize=maxsize)(fn)

    @functools.wraps(fn)
    def call(text: str) -> _T:
        return cached(text) if len(text) <= max_chars else fn(text)

    return call
