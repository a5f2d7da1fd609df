"""What a message must be before the host stores it: pure checks shared by the transcript
reader (which names the file and line) and the host's entry points.

* **Content.** A user, system or tool message needs content (missing, ``null`` or an empty list
  is refused; an empty string is content). An assistant message needs content or tool calls.
* **Size.** A message's text (its content, plus the arguments of its tool calls) may hold at most
  ``max_message_chars`` characters (``[host] max_message_chars``, default
  :data:`DEFAULT_MAX_MESSAGE_CHARS`; 0 = no limit). An over-long message from outside (a transcript
  line, a user's input, a recorded reply) is refused before anything is stored; a tool's output
  produced by the host is cut to the limit instead (see :func:`cut_to_limit`).
"""

from __future__ import annotations

from .messages import Message, text_of

__all__ = [
    "DEFAULT_MAX_MESSAGE_CHARS",
    "MessageRejected",
    "check_message",
    "cut_to_limit",
    "message_chars",
    "message_problem",
]

#: About 50,000 tokens: more than any one message of a real conversation, far less than the
#: millions of characters that would fill any model's window many times over.
DEFAULT_MAX_MESSAGE_CHARS = 200_000


class MessageRejected(ValueError):
    """A message the host refuses to store; the message is one line."""


def message_chars(message: Message) -> int:
    """The characters a message's size limit counts: its text plus its tool calls' arguments."""
    size = len(text_of(message.content))
    for call in message.tool_calls or []:
        size += len(call.function.arguments) + len(call.function.name)
    return size


def message_problem(message: Message, max_chars: int) -> str | None:
    """Why ``message`` cannot be stored, or ``None``."""
    empty = message.content is None or message.content == []
    if message.role == "assistant":
        if empty and not message.tool_calls:
            return "an assistant message needs content or tool_calls"
    elif empty:
        return f"a {message.role} message needs content (it has none)"
    if max_chars:
        size = message_chars(message)
        if size > max_chars:
            return (
                f"message has {size:,} characters, over the limit of {max_chars:,} "
                "(host.max_message_chars; 0 = no limit)"
            )
    return None


def check_message(message: Message, max_chars: int, where: str = "") -> None:
    problem = message_problem(message, max_chars)
    if problem is not None:
        raise MessageRejected(f"{where}: {problem}" if where else problem)


def cut_to_limit(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters with a note saying how much was left out."""
    if not max_chars or len(text) <= max_chars:
        return text
    kept = max_chars
    for _ in range(3):  # the note's own length depends on the number it gives
        note = f"\n[cut: {len(text) - kept:,} more characters over host.max_message_chars]"
        kept = max(0, max_chars - len(note))
    note = f"\n[cut: {len(text) - kept:,} more characters over host.max_message_chars]"
    return text[:kept] + note
