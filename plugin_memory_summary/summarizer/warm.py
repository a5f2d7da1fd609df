"""Warming up before the first compression: its slow imports (the summarizer's modules, the LLM
service's tokenizer: litellm takes seconds of CPU) run in a worker thread before the scheduler
takes the session's lease, so a lease is held only for the work itself. The plugin hands
:func:`warm_up` to the scheduler, which knows nothing of the summarizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any

__all__ = ["warm_up"]

log = logging.getLogger(__name__)


#: The LLM services already warmed up in this process.
_warmed: weakref.WeakSet[Any] = weakref.WeakSet()


def _warm(llm: Any, model: str | None) -> None:
    from . import summarize  # noqa: F401  (the summarizer's modules)

    llm.count_tokens("warm-up", model)  # the tokenizer and whatever it imports (litellm)


async def warm_up(llm: Any, model: str | None) -> None:
    """Once per LLM service: run the summarizer's slow first imports in a worker thread, before
    a lease is taken (best effort: a failure here shows again, where it matters, in the run)."""
    if llm is None:
        return
    with contextlib.suppress(TypeError):  # a service that takes no weak reference: every time
        if llm in _warmed:
            return
    try:
        await asyncio.to_thread(_warm, llm, model)
    except Exception:
        log.debug("warm-up before the lease failed", exc_info=True)
    with contextlib.suppress(TypeError):
        _warmed.add(llm)
