"""A summarizer's answer, read and made safe to merge.

The model digests the new part of the conversation; the rules engine merges that digest into the
previous summary (its record, identifiers, pinned facts, tasks are never the model's to drop).
What is taken from an answer, whatever its form:

- JSON (in a code fence or not): its fields. An answer cut off at the length limit keeps its
  complete members; one with no complete member is unusable.
- Plain prose that passes the gate (not empty, not a refusal, not an error dump, not JSON
  debris, not an echo of the request): its sentences; cut off, its complete sentences.
- Never: a sentence or item that is a JSON fragment, that names an identifier found nowhere
  in the conversation or the previous summary (an invented id would be carried for good), that
  is meta-talk (about the answer or the conversation as a document, "This response is a JSON
  object ...", "The transcript shows ...", or spoken to the reader as an assistant, "I'm glad
  you enjoyed the chat", "feel free to ask": :func:`.parsing.meta_talk_reason`), or, in prose,
  whose words are mostly not in them (made up, not digested). A preamble ("Here is the
  summary:") is taken off the sentence it opens.

Only an answer with nothing left after this is rejected, and the rules engine merges alone; the
reason is ``meta-talk`` when that is mostly what was left out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from host_stub.messages import Message

from .identifiers import extract_identifiers
from .parsing import (
    answer_gate,
    debris_reason,
    echo_reason,
    meta_lead,
    meta_talk_reason,
    parse_summary_output,
    plain_text_gate,
)
from .summary_model import Excerpt, SummaryPayload
from .text import collapse_whitespace, sentences

__all__ = [
    "DIGEST_SPEAKER",
    "Answer",
    "AnswerRejected",
    "digest_excerpts",
    "layer_answer",
    "read_answer",
]

#: How a digest sentence is labelled in the record.
DIGEST_SPEAKER = {"en": "Summary", "zh": "摘要"}

_LISTS = ("stable_facts", "user_profile", "decisions", "open_questions")
_LOOKS_JSON = ("{", "[", "```")


class AnswerRejected(Exception):
    """Nothing of the answer can be used (the reason is the message, never the answer)."""


@dataclass
class Answer:
    """What an answer gives the merge: its fields (identifiers checked against the source) and
    the sentences of its prose, plus notes on what was left out."""

    payload: SummaryPayload
    digest: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        p = self.payload
        return not (
            self.digest
            or p.conversation_goal
            or any(getattr(p, name) for name in _LISTS)
            or p.timeline
        )


def _invented(text: str, source: str) -> list[str]:
    return [i for i in extract_identifiers(text) if i not in source]


def _complete_sentences(text: str) -> list[str]:
    """The sentences of prose cut off mid-sentence, the unfinished last one left out."""
    found = sentences(text)
    if found and not found[-1].rstrip().endswith((".", "!", "?", "。", "！", "？", '"', ")")):
        found = found[:-1]
    return found


def read_answer(text: str, *, cut_off: bool, instructions: str, source: str) -> Answer:
    """``text`` read as JSON or prose (see the module doc). ``cut_off``: the answer hit the
    length limit; ``instructions``: the request's own text (an echo of it is no answer);
    ``source``: the conversation part and previous summary, where every identifier the answer
    keeps must appear. Raises :class:`AnswerRejected` when nothing is usable."""
    if not text.strip():
        raise AnswerRejected("empty answer")
    reason = answer_gate(text, None) or echo_reason(text, instructions)
    if reason is not None:
        raise AnswerRejected(reason)
    notes: list[str] = []
    prose_answer = False
    parsed = parse_summary_output(text, partial=cut_off)
    if parsed is None:
        if text.lstrip().startswith(_LOOKS_JSON) and debris_reason(text) is not None:
            raise AnswerRejected(
                "JSON cut off before any complete item" if cut_off else "broken JSON"
            )
        reason = plain_text_gate(text)
        if reason is not None:
            raise AnswerRejected(reason)
        prose = _complete_sentences(text) if cut_off else sentences(text)
        parsed = SummaryPayload()
        digest, prose_answer = prose, True
    elif not parsed.summary.strip():
        raise AnswerRejected("JSON without a usable summary")
    else:
        digest = sentences(parsed.summary)
    if cut_off:
        notes.append("answer cut off at the length limit: its complete items were kept")
    # Prose is where a weak model makes lines up; JSON fields are read as the model wrote them.
    out = _Dropped()
    kept = _clean_items(digest, source, out, judged=prose_answer)
    payload = _clean_payload(parsed, source, out)
    if out.total:
        kinds = (["meta-talk"] if out.meta else []) + (
            ["JSON fragments, identifiers or words not in the conversation"] if out.other else []
        )
        notes.append(f"{out.total} item(s) left out: {', '.join(kinds)}")
    answer = Answer(payload=payload, digest=kept, notes=notes)
    if answer.empty:
        if out.meta and out.meta >= out.other:
            # An answer about itself, or spoken to the reader: its own kind in the report.
            raise AnswerRejected(
                "meta-talk: the answer spoke of itself or to the reader, not of the "
                f"conversation ({out.total} left out)"
            )
        raise AnswerRejected(
            "nothing usable in the answer" + (f" ({out.total} left out)" if out.total else "")
        )
    return answer


_WORD = re.compile(r"[A-Za-z]{4,}")
#: A sentence whose words are mostly not in the conversation was made up, not digested (small
#: models continue a dialogue with lines nobody said): at least this share must be found there.
GROUNDED = 0.4


def _stems(text: str) -> set[str]:
    return {w[:5].lower() for w in _WORD.findall(text)}


def _grounded(item: str, source_stems: set[str]) -> bool:
    """Whether ``item``'s words (four letters or more, compared by their first five) are found
    among the source's; an item with fewer than three such words is not judged."""
    stems = _stems(item)
    return len(stems) < 3 or len(stems & source_stems) / len(stems) >= GROUNDED


@dataclass
class _Dropped:
    """Items left out of an answer: as meta-talk, and for any other reason."""

    meta: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.meta + self.other


def _usable(item: str, source: str, source_stems: set[str] | None = None) -> bool:
    """Whether an item can be kept; with ``source_stems``, its words are judged too."""
    return (
        bool(item.strip())
        and debris_reason(item) is None
        and not _invented(item, source)
        and (source_stems is None or _grounded(item, source_stems))
    )


def _meta(item: str) -> bool:
    """``item`` (its preamble taken off) is nothing but meta-talk."""
    return not item.strip() or meta_talk_reason(item) is not None


def _clean_item(item: str, source: str, out: _Dropped, stems: set[str] | None = None) -> str | None:
    """``item`` as kept (its preamble taken off, on one line), or ``None``, counted in ``out``."""
    text = meta_lead(item) if item.strip() else item
    if item.strip() and _meta(text):
        out.meta += 1
        return None
    if not _usable(text, source, stems):
        out.other += 1
        return None
    return collapse_whitespace(text)


def _clean_items(
    items: Sequence[str], source: str, out: _Dropped, *, judged: bool = False
) -> list[str]:
    stems = _stems(source) if judged and items else None
    kept = [k for i in items if (k := _clean_item(i, source, out, stems)) is not None]
    return list(dict.fromkeys(kept))


def _clean_payload(parsed: SummaryPayload, source: str, out: _Dropped) -> SummaryPayload:
    update: dict[str, object] = {"summary": ""}
    for name in _LISTS:
        update[name] = _clean_items(getattr(parsed, name), source, out)
    timeline = []
    for e in parsed.timeline:
        event = _clean_item(e.event, source, out)
        if event is not None and not _invented(e.when, source):
            timeline.append(e.model_copy(update={"event": event}))
        elif event is not None:
            out.other += 1
    update["timeline"] = timeline
    goal = parsed.conversation_goal
    keep_goal = goal and not _meta(goal) and _usable(goal, source)
    update["conversation_goal"] = goal if keep_goal else ""
    # An identifier the model lists must be in the source: one that is nowhere is not one.
    update["identifiers"] = [i for i in parsed.identifiers if i and i in source]
    update["in_progress_tasks"] = []
    update["retrieval_hints"] = []
    return parsed.model_copy(update=update)


def layer_answer(previous: SummaryPayload | None, answer: Answer) -> SummaryPayload:
    """``previous`` with the answer's checked identifiers and open questions added (the rules
    engine then folds the batch into this; its lists and record stay, never replaced by what a
    model left out)."""
    prev = previous or SummaryPayload()
    ids = list(dict.fromkeys([*prev.identifiers, *answer.payload.identifiers]))
    # Its open questions join the previous ones; the rules engine drops those answered since.
    questions = [q for q in prev.open_questions if q not in answer.payload.open_questions]
    return prev.model_copy(
        update={"identifiers": ids, "open_questions": [*questions, *answer.payload.open_questions]}
    )


def digest_excerpts(answer: Answer, batch: Sequence[Message], lang: str) -> list[Excerpt]:
    """The answer as record lines for the range of messages it digests: its prose sentences,
    then its facts, profile and decisions, then its dated events (under their dates). They
    compete with the conversation's own sentences for the record, facts per token deciding, so
    a model's answer adds what it says well and costs nothing where it repeats."""
    seqs = [m.seq for m in batch if m.seq is not None]
    if not seqs:
        return []
    speaker = DIGEST_SPEAKER["zh" if lang.lower().startswith("zh") else "en"]
    p = answer.payload
    texts = [*answer.digest, *p.stable_facts, *p.user_profile, *p.decisions]
    out = [
        Excerpt(seq=min(seqs), to_seq=max(seqs), part=i, speaker=speaker, text=text)
        for i, text in enumerate(dict.fromkeys(texts))
    ]
    out += [
        Excerpt(
            seq=min(seqs),
            to_seq=max(seqs),
            part=len(out) + i,
            speaker=speaker,
            when=e.when,
            text=e.event,
        )
        for i, e in enumerate(p.timeline)
        if e.event
    ]
    return out
