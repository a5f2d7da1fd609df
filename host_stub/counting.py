"""How the host counts a prompt's tokens: with the LLM service's counter for the chat model, each
text or message that comes back at every model call (a summary block, a placeholder, the system
message with the block merged in) counted once while it is among the last few seen."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from .messages import Message, text_of
from .prompt import wire_key

__all__ = [
    "CONTRIBUTION_COUNTS",
    "SHOWN_COUNTS",
    "WIRE_COUNTS",
    "PromptCounts",
    "remembered",
]

#: Contribution texts whose token counts the host keeps (each session's summary block, a few
#: static ones).
CONTRIBUTION_COUNTS = 256
#: Replaced history messages (placeholders, cut tool results) whose shown token counts the host
#: keeps, over all sessions.
SHOWN_COUNTS = 4096
#: Prompt messages that are not history messages (the system message with the contributions
#: merged in) whose token counts the host keeps, over all sessions.
WIRE_COUNTS = 256

#: The LLM service's ``count_tokens`` for the chat model: a text, or a list of messages (models
#: or OpenAI-format dicts) counted as a stored message is.
Counter = Callable[[Any], int]


def remembered(cache: OrderedDict[Any, int], key: Any, limit: int, count: Callable[[], int]) -> int:
    """``cache[key]``, from ``count()`` when it is not there; the least recently used entries
    go past ``limit``."""
    n = cache.get(key)
    if n is None:
        n = cache[key] = count()
        while len(cache) > limit:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return n


class PromptCounts:
    """The host's token counts. ``count`` is the LLM service's counter for the chat model (looked
    up at each count: the service and the model are the host's, set at start)."""

    def __init__(self, count: Counter) -> None:
        self._count = count
        #: Tokens of the contributions' texts lately seen (a summary block is the same text from
        #: one compression to the next: counted once, not at every model call).
        self._texts: OrderedDict[str, int] = OrderedDict()
        #: Tokens of the history messages plugins replaced lately, as shown (see :meth:`shown`).
        self._shown: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        #: Tokens of the prompt messages lately counted that carry no stored count (see
        #: :meth:`wire_remembered`).
        self._wires: OrderedDict[tuple[Any, ...], int] = OrderedDict()

    def message(self, message: Message) -> int:
        """One message as the store counts it; an event marker is never sent: 0 (and no
        tokenizer loaded for it)."""
        if message.is_marker:
            return 0
        return self._count([message])

    def text(self, text: str) -> int:
        return self._count(text)

    def wire(self, message: Mapping[str, Any]) -> int:
        """One OpenAI-format message, counted as a stored message is."""
        return self._count([dict(message)])

    def wire_remembered(self, message: Mapping[str, Any]) -> int:
        """:meth:`wire`, remembered for the last few plain messages counted (the system message
        with a new summary block merged in is counted once, by the prompt build that follows
        the compression in the background, not again by the turn)."""
        key = wire_key(message)
        if key is None:
            return self.wire(message)
        return remembered(self._wires, key, WIRE_COUNTS, lambda: self.wire(message))

    def known_or_count(self, message: Mapping[str, Any], known: Mapping[Any, int]) -> int:
        """A message the last prompt also sent (at another place: the history moved after a
        compression or a trim) has the count it had there (``known``, by
        :func:`~host_stub.prompt.wire_key`); any other is counted."""
        key = wire_key(message)
        found = known.get(key) if key is not None else None
        return found if found is not None else self.wire_remembered(message)

    def contribution(self, text: str) -> int:
        """A contribution's tokens, counted once while its text is among the last few seen."""
        return remembered(self._texts, text, CONTRIBUTION_COUNTS, lambda: self.text(text))

    def shown(self, session_id: str, message: Message) -> int:
        """A history message as a plugin's replacement shows it. The same replacement (a
        placeholder, a cut) comes back at every call and is counted once; the key holds what
        the count reads (a forgotten session's seqs start again at 1)."""
        key = (
            session_id,
            message.seq,
            message.role,
            message.tool_call_id,
            message.name,
            text_of(message.content),
        )
        return remembered(self._shown, key, SHOWN_COUNTS, lambda: self.message(message))
