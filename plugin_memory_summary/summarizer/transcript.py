"""Render the part of a history that is about to be summarized as a plain-text transcript.

The summarizer sees text, not message objects, so this module decides what it sees: one labelled
block per message, tool calls and results named after their tool, everything cut to a bounded
size. Cuts (``text.cut_text``) count code points but end on a grapheme boundary, so a cut never
leaves half an emoji, a base letter without its accent, or a lone surrogate that would make the
request unencodable.
System messages are core memory and never reach the summarizer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from host_stub.messages import Message, text_of

from ..base import cut_text, lazy_regex

__all__ = [
    "TranscriptLang",
    "is_tool_error",
    "render_message",
    "render_transcript",
    "tool_name_for",
    "transcript_lang",
]

TranscriptLang = Literal["en", "zh"]


def transcript_lang(lang: str) -> TranscriptLang:
    """The transcript language for a record's ``lang``: Chinese labels for ``zh``, else English."""
    return "zh" if lang == "zh" else "en"


# Every character a model may read as a line break. Continuation lines are indented after each
# of them so that only the first line of a block starts at column 0: a message whose text
# contains "assistant: ..." on a line of its own cannot pose as a message of its own.
_LINE_BREAK = lazy_regex(r"\r\n|[\n\r\x0b\x0c\x85\u2028\u2029]")
_CONTINUATION = "\n  "

_LABELS: dict[str, dict[str, str]] = {
    "en": {
        "user": "user: ",
        "assistant": "assistant: ",
        "call": "assistant: call {tool}({args})",
        "result": "tool result ({tool}): ",
        "error": "tool error ({tool}): ",
    },
    "zh": {
        "user": "用户: ",
        "assistant": "助手: ",
        "call": "助手: 调用 {tool}({args})",
        "result": "工具结果({tool}): ",
        "error": "工具错误({tool}): ",
    },
}


def tool_name_for(messages: Sequence[Message], index: int) -> str:
    """The tool name of the tool message at ``index``.

    Pairing is positional, as the chat APIs define it: the call that a result answers is in the
    nearest preceding assistant message, past the sibling results of the same group (and event
    markers, which the host drops before pairing). Looking the id up there, rather than in a map
    over the whole history, keeps a call id that is reused later in the conversation from naming
    the wrong tool. The message's own ``name`` is only a fallback, then ``"unknown"``.
    """
    message = messages[index]
    call_id = message.tool_call_id
    j = index - 1
    while j >= 0 and (messages[j].role == "tool" or messages[j].is_marker):
        j -= 1
    if call_id is not None and j >= 0:
        owner = messages[j]
        if owner.role == "assistant":
            for call in owner.tool_calls or ():
                if call.id == call_id and call.function.name:
                    return call.function.name
    return message.name or "unknown"


def is_tool_error(message: Message) -> bool:
    """Whether a tool result reports a failure: flagged by the host in ``metadata["is_error"]``,
    or (for histories imported from elsewhere) a body starting with ``Error`` / ``error:``."""
    if message.metadata.get("is_error"):
        return True
    body = text_of(message.content).lstrip()
    return body.startswith(("Error", "error:"))


def _labels(lang: str) -> dict[str, str]:
    try:
        return _LABELS[lang]
    except KeyError:
        raise ValueError(
            f"unsupported transcript language {lang!r}; expected 'en' or 'zh'"
        ) from None


def _one_line(text: str) -> str:
    return _LINE_BREAK().sub(" ", text)


def _indent(text: str) -> str:
    return _LINE_BREAK().sub(_CONTINUATION, text)


def render_message(
    messages: Sequence[Message],
    index: int,
    *,
    tool_truncate_chars: int = 200,
    message_truncate_chars: int = 4000,
    lang: TranscriptLang = "en",
    redact: Callable[[str], str] | None = None,
) -> str:
    """The transcript block of ``messages[index]``, or ``""`` when it is not rendered.

    System messages are core memory (never summarized) and event markers are bookkeeping, so
    both render as ``""``; so does a user or assistant message with neither text nor tool calls.
    The history is passed whole because a tool result is named through its group's call.
    ``redact`` runs on every piece of text *before* it is cut, so a cut cannot shorten a secret
    below the length its pattern needs. The whole block is then cut to ``message_truncate_chars``.
    """
    labels = _labels(lang)
    message = messages[index]
    if message.role == "system" or message.is_marker:
        return ""

    def prepare(text: str, limit: int) -> str:
        if redact is not None:
            text = redact(text)
        return _indent(cut_text(text, limit))

    pieces: list[str] = []
    if message.role == "tool":
        tool = _one_line(tool_name_for(messages, index))
        label = labels["error" if is_tool_error(message) else "result"].format(tool=tool)
        pieces.append(label + prepare(text_of(message.content), tool_truncate_chars))
    else:
        text = text_of(message.content)
        if text.strip():
            pieces.append(labels[message.role] + prepare(text, message_truncate_chars))
        if message.role == "assistant":
            for call in message.tool_calls or ():
                args = prepare(call.function.arguments, tool_truncate_chars)
                tool = _one_line(call.function.name) or "unknown"
                pieces.append(labels["call"].format(tool=tool, args=args))
    if not pieces:
        return ""
    return cut_text("\n".join(pieces), message_truncate_chars)


def render_transcript(
    messages: Sequence[Message],
    *,
    tool_truncate_chars: int = 200,
    message_truncate_chars: int = 4000,
    lang: TranscriptLang = "en",
    redact: Callable[[str], str] | None = None,
) -> str:
    """The transcript of ``messages``: one block per rendered message, in order, joined by
    newlines. Deterministic: the same messages and options always give the same text, so a
    retried or repeated compression sends the summarizer the same input."""
    _labels(lang)
    blocks = (
        render_message(
            messages,
            i,
            tool_truncate_chars=tool_truncate_chars,
            message_truncate_chars=message_truncate_chars,
            lang=lang,
            redact=redact,
        )
        for i in range(len(messages))
    )
    return "\n".join(block for block in blocks if block)
