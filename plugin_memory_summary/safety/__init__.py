"""What keeps conversation text from doing harm where the plugin sends it: secrets redacted
before any text leaves for the summarizer (``redact``, its patterns in ``secret_patterns``,
applied to messages and payloads by ``scrub``), and text made inert as prompt structure
(``hygiene``: the injected summary block, the transcript quoted to the summarizer)."""

from __future__ import annotations

from .hygiene import (
    defuse_transcript_tags,
    framing_overhead,
    neutralise,
    skeleton,
    wrap_summary_block,
)
from .redact import RedactionError, Redactor
from .scrub import redact_messages, safe_redactor, scrub_payload

__all__ = [
    "RedactionError",
    "Redactor",
    "defuse_transcript_tags",
    "framing_overhead",
    "neutralise",
    "redact_messages",
    "safe_redactor",
    "scrub_payload",
    "skeleton",
    "wrap_summary_block",
]
