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
  you enjoyed the chat", "feel free to ask": :func:`.parsing.meta_talk_reason`), that says
  there is nothing to say ("No new information.": :func:`.parsing.nothing_said_reason`), or
  that is not grounded in what it digests (:func:`grounding_reason`: a name, number, date or
  code the source lacks, two names no sentence of the source gives together, too few of its
  words found there). A preamble ("Here is the summary:") is taken off the sentence it opens.

An answer with an item that turns a request into a standing rule of the agent's
(:func:`.parsing.standing_rule_reason`) is rejected whole. Otherwise only an answer with nothing
left after this is rejected, and the rules engine merges alone; the reason is the kind most of
what was left out had (``meta-talk``, ``says nothing``, ``ungrounded``). Items left out as
ungrounded are a reason of their own (``ungrounded: ...``), the others a note.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from host_stub.messages import Message

from ..base import collapse_whitespace, cut_middle, extract_identifiers, sentences
from ..record import Excerpt, SummaryPayload
from .parsing import (
    answer_gate,
    debris_reason,
    echo_reason,
    meta_lead,
    meta_talk_reason,
    nothing_said_reason,
    parse_summary_output,
    plain_text_gate,
    standing_rule_reason,
)

__all__ = [
    "DIGEST_SPEAKER",
    "GROUNDED",
    "GROUNDED_CJK",
    "Answer",
    "AnswerRejected",
    "Grounds",
    "digest_excerpts",
    "grounding_reason",
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
    #: What was left out: ``(kind, item, why)``, kind ``ungrounded``, ``meta-talk``, ...
    dropped: list[tuple[str, str, str]] = field(default_factory=list)

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
    ``source``: the conversation part, the previous summary and the pinned facts, where every
    item the answer keeps must be grounded (:func:`grounding_reason`). Raises
    :class:`AnswerRejected` when nothing is usable."""
    if not text.strip():
        raise AnswerRejected("empty answer")
    reason = (
        answer_gate(text, None)
        or echo_reason(text, instructions)
        or nothing_said_reason(meta_lead(text.strip()))
    )
    if reason is not None:
        raise AnswerRejected(reason)
    notes: list[str] = []
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
        digest = prose
    elif not parsed.summary.strip():
        raise AnswerRejected("JSON without a usable summary")
    else:
        digest = sentences(parsed.summary)
    if cut_off:
        notes.append("answer cut off at the length limit: its complete items were kept")
    out = _Dropped(grounds=Grounds.of(source))
    kept = _clean_items(digest, source, out)
    payload = _clean_payload(parsed, source, out)
    if out.rule is not None:
        # A steered answer: nothing of it is merged, not even its grounded items.
        raise AnswerRejected(out.rule)
    notes += out.notes()
    answer = Answer(payload=payload, digest=kept, notes=notes, dropped=list(out.items))
    if answer.empty:
        raise AnswerRejected(out.rejection())
    return answer


# --- grounding: every item must be found in what it digests -----------------------------------

#: A kept item's content words (by their stems) must be found in the source at this share at
#: least; an item of three content words or fewer may miss one.
GROUNDED = 0.7
#: The same for Chinese, by pairs of neighbouring characters (no words to stem).
GROUNDED_CJK = 0.6

#: Words, numbers and codes (``14A``, ``K7XQ2M``: letters and digits, found as they are).
_TOKEN = re.compile(r"[A-Za-z0-9]+")
_UNIT = re.compile(r"^(\d+)[a-z]{1,3}$")
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
#: An opening stamp the model copied from the transcript (``[5:23 pm on 8 May, 2023]:``).
_STAMP = re.compile(r"^\s*\[([^\[\]{}\n]{1,60})\]\s*:?\s*")
#: A line's or sentence's opening speaker label (``Caroline:``, ``user:``), after any stamp.
_LABEL = re.compile(
    r"^\s*(?:\[[^\[\]\n]{0,80}\]\s*:?\s*"
    r"|([^\s:\[\]()]{1,30}(?: [^\s:\[\]()]{1,30}){0,2}|tool (?:result|error) \([^)]*\))\s*:\s+)"
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)|(?<=[。！？])")

_STOP = frozenset(
    """a an as at be by do if in is no of on or so to up i me my mine we us our ours he it the
    and for with was were has have had his her hers him
    she they them their theirs this that these those from into onto about after before also
    very just some any all each both
    more most other such only own same than too can will would should could may might must not
    are been being did does doing done who whom whose which what when where why how there here
    then once again further while because until against between through during above below
    under over off out its our ours your yours you yourself himself herself themselves itself
    yes now one get gets got getting go goes going went gone make makes made take takes took
    come comes came let lets yet still even ever much many lot lots really well way thing things
    something anything everything someone anyone everyone today now new also though although
    however therefore thus since upon within without via per etc okay ok hey hi hello thanks
    thank please sure able like likes liked just kind sort quite rather""".split()
)
#: A summary's own vocabulary: who spoke and how, not what was said.
_FRAMING = frozenset(
    """user users assistant assistants speaker speakers traveller traveler travellers customer
    client person conversation conversations chat chats discussion discussions discuss discussed
    discusses discussing mention mentions mentioned mentioning talk talks talked talking say says
    said saying tell tells told telling ask asks asked asking share shares shared sharing explain
    explains explained note notes noted express expresses expressed describe describes described
    state states stated add adds added reply replies replied answer answers answered confirm
    confirms confirmed agree agrees agreed suggest suggests suggested want wants wanted prefer
    prefers preferred decide decides decided topic topics summary summaries part recap update
    updates provide provides provided offer offers offered respond responds responded response
    inform informs informed request requests requested""".split()
)
_MONTHS_DAYS = frozenset(
    """january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday
    saturday sunday""".split()
)
_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
        fifteen sixteen seventeen eighteen nineteen twenty""".split()
    )
} | {"thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000"}
#: Chinese pairs that frame a summary (the user, the assistant, said, asked, talked about).
_FRAMING_CJK = frozenset(
    "用户 助手 对话 提到 讨论 表示 询问 说明 分享 谈到 聊到 交流 总结 摘要 回答 回复".split()
)
_SUFFIXES = ("ingly", "edly", "ings", "ing", "ies", "ied", "ed", "es", "ly", "s")


def _stem(word: str) -> str:
    """A light stem: common endings off, then the first six letters (``integrated`` and
    ``integration``, ``booking`` and ``booked``, ``stories`` and ``story`` are one)."""
    w = word.lower()
    for suffix in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and not w.endswith("ss"):
            w = w[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
            if suffix in ("ing", "ings", "ed") and w[-1] == w[-2] and w[-1] not in "aeioulsz":
                w = w[:-1]  # planning, planned: plan
            break
    if len(w) > 3 and w.endswith("e"):
        w = w[:-1]
    return w[:6]


def _cjk_pairs(text: str) -> set[str]:
    return {
        run[i : i + 2]
        for run in _CJK_RUN.findall(text)
        for i in range(len(run) - 1)
        if run[i : i + 2] not in _FRAMING_CJK
    }


def _common(word: str) -> bool:
    """A function word or a summary's framing word, never a name."""
    w = word.lower()
    return w in _STOP or w in _FRAMING or len(w) < 2


def _split_sentences(line: str) -> list[str]:
    return [p for p in _SENTENCE_END.split(line) if p.strip()]


def _strip_labels(sentence: str) -> tuple[str, list[str]]:
    """``sentence`` without its opening stamps and speaker labels, and the labels."""
    labels: list[str] = []
    while True:
        match = _LABEL.match(sentence)
        if match is None or not match.group(0):
            return sentence, labels
        if match.group(1):
            labels.append(match.group(1))
        sentence = sentence[match.end() :]


def _capitalised(sentence: str) -> tuple[list[str], list[str]]:
    """The capitalised words of ``sentence`` (common words left out): the one that opens it,
    and the others."""
    opening: list[str] = []
    inner: list[str] = []
    for i, m in enumerate(_TOKEN.finditer(sentence)):
        word = m.group()
        if word[0].isupper() and word.isalpha() and not _common(word):
            (opening if i == 0 else inner).append(word)
    return opening, inner


#: A role label of the transcript: its lines are said by the person who introduced themselves.
_ROLES = frozenset({"user", "assistant", "用户", "助手"})
_NAME = r"([A-Z][a-z]+(?:\s+[A-Z][a-z]+)?)"
#: Who introduces themselves ("I'm Lena Fischer", "my name is Jon").
_SELF = re.compile(r"\b(?:I'm|I am|I’m|[Mm]y name is|[Cc]all me)\s+" + _NAME)
#: Someone named as a person (or a pet): addressed ("Hey Mel", "Thanks, Caroline"), named by
#: what they are to someone ("my partner Tom", "her dog Pixie"), or named so ("named Luna").
_PERSON = re.compile(
    r"\b(?i:hey|hi|hello|thanks|thank\s+you|bye|dear|congrats|congratulations|sorry),?\s+"
    + _NAME
    + r"|\b(?i:my|his|her|their|our|your)\s+(?:\w+\s+)?(?i:partner|friend|girlfriend|boyfriend"
    r"|wife|husband|fianc[ée]e?|sister|brother|sibling|mom|mum|mother|dad|father|parent|son"
    r"|daughter|kid|child|baby|boss|colleague|co-?worker|neighbou?r|cousin|aunt|uncle|niece"
    r"|nephew|grandma|grandmother|grandpa|grandfather|roommate|teacher|student|doctor"
    r"|therapist|mentor|coach|dog|cat|puppy|kitten|pet)s?,?\s+"
    + _NAME
    + r"|\b(?:named|called)\s+"
    + _NAME
)


@dataclass(frozen=True)
class Grounds:
    """The source of an answer (the conversation part, the previous summary, the pinned facts),
    read once: its words, their stems, its numbers, its names (capitalised within a sentence,
    never written in lower case), the people among them (speakers, who introduced themselves,
    who is addressed or named as someone's partner, friend, pet ...) and, per sentence, the
    names it holds (its speaker's included: a speaker's line names its speaker)."""

    words: frozenset[str]
    stems: frozenset[str]
    numbers: frozenset[str]
    names: frozenset[str]
    people: frozenset[str]
    together: tuple[frozenset[str], ...]
    pairs: frozenset[str]

    @classmethod
    def of(cls, source: str) -> Grounds:
        tokens = _TOKEN.findall(source)
        lower = {t for t in tokens if t.islower()}
        words = {t.lower() for t in tokens}
        numbers = {t.lstrip("0") or "0" for t in tokens if t.isdigit()}
        numbers |= {_NUMBER_WORDS[w] for w in words if w in _NUMBER_WORDS}
        lines = [(line, _strip_labels(line)[1]) for line in source.split("\n")]
        # Who speaks as each role: the name a line of that role introduces itself with.
        role_names: dict[str, list[str]] = {}
        for line, labels in lines:
            roles = [lab.lower() for lab in labels if lab.lower() in _ROLES]
            for match in _SELF.finditer(line) if roles else ():
                role_names.setdefault(roles[0], []).extend(match.group(1).split())
        people = {w.lower() for found in role_names.values() for w in found}
        for match in _PERSON.finditer(source):
            name = next(g for g in match.groups() if g)
            people.update(w.lower() for w in name.split())
        names: set[str] = set()
        together: list[frozenset[str]] = []
        for line, _ in lines:
            speakers: list[str] = []
            for part in _split_sentences(line):
                sentence, labels = _strip_labels(part)
                if labels:
                    speakers = [
                        w
                        for lab in labels
                        for w in [*_TOKEN.findall(lab), *role_names.get(lab.lower(), [])]
                        if w[0].isupper() and not _common(w)
                    ]
                    people.update(w.lower() for w in speakers)
                opening, inner = _capitalised(sentence)
                names.update(w.lower() for w in [*speakers, *inner])
                found = {w.lower() for w in [*speakers, *opening, *inner]}
                if len(found) > 1:
                    together.append(frozenset(found))
        proper = frozenset(names - lower)
        return cls(
            words=frozenset(words),
            stems=frozenset(_stem(w) for w in words if w.isalpha()),
            numbers=frozenset(numbers),
            names=proper,
            people=frozenset(people & proper),
            together=tuple(together),
            pairs=frozenset(_cjk_pairs(source)),
        )

    def named_together(self, a: str, b: str) -> bool:
        return any(a in names and b in names for names in self.together)


def _item_names(text: str, grounds: Grounds) -> list[str]:
    """The names ``text`` gives: capitalised words within its sentences, and a sentence's
    opening word when the source has it as a name."""
    found: list[str] = []
    for part in _split_sentences(text):
        sentence, labels = _strip_labels(part)
        opening, inner = _capitalised(sentence)
        # An opening word or a label ("Goal:", "Caroline:") is a name when the source has it as one.
        label_words = [w for lab in labels for w in _TOKEN.findall(lab)]
        found += [w for w in [*label_words, *opening] if w.lower() in grounds.names] + inner
    return list(dict.fromkeys(found))


#: A transcript's role label inside an answer ("assistant: [10:37 am ...] Melanie: ..."): the
#: model copied the dialogue instead of summarizing it.
_TRANSCRIPT_LABEL = re.compile(r"(?i)(?:^|[\s.!?])(?:user|assistant|用户|助手)\s*[:：]\s*\S")


def _near_names(item: str, grounds: Grounds) -> list[str]:
    """Capitalised words that are not in the source but share a stem with one of its names
    ("Carolina" for "Caroline"): a name misspelt is another person."""
    known = {_stem(n) for n in grounds.names}
    out = []
    for word in re.findall(r"\b[A-Z][a-z]{2,}\b", item):
        if word.lower() not in grounds.words and _stem(word.lower()) in known:
            out.append(word)
    return out


def grounding_reason(item: str, grounds: Grounds, *, words: bool = True) -> str | None:
    """Why ``item`` is not grounded in the source, or ``None``. Grounded: every number (digits
    or a number word), date, code and name it gives is in the source; two people of the source
    it gives together are named together by one sentence of it (a speaker's line names its
    speaker); and (with ``words``) at least :data:`GROUNDED` of its other content words (by
    stem: not function words, not a summary's framing words such as "user", "discussed",
    "mentioned") are found there (all but one when it has three or fewer); Chinese is judged by
    pairs of neighbouring characters (:data:`GROUNDED_CJK`)."""
    if _TRANSCRIPT_LABEL.search(item):
        return "a line of the transcript copied, not a summary of it"
    tokens = _TOKEN.findall(item)
    numbers = {t.lstrip("0") or "0" for t in tokens if t.isdigit()}
    numbers |= {_NUMBER_WORDS[t.lower()] for t in tokens if t.lower() in _NUMBER_WORDS}
    missing = sorted(numbers - grounds.numbers, key=len)
    if missing:
        return f"number {missing[0]} not in the conversation"
    for token in tokens:
        if token.isalpha() or token.isdigit() or token.lower() in grounds.words:
            continue
        # A code (``14A``, ``K7XQ2M``) is found as it is; a number with its unit or ordinal
        # (``23kg``, ``12th``, ``5pm``) by its number.
        unit = _UNIT.match(token)
        if unit is None or (unit.group(1).lstrip("0") or "0") not in grounds.numbers:
            return f"{token!r} not in the conversation"
    names = _item_names(item, grounds)
    absent = [n for n in names if n.lower() not in grounds.words]
    absent += _near_names(item, grounds)
    if absent:
        return f"{absent[0]!r} not in the conversation"
    # Two people (not places, not things: those a sentence may well name apart) given together.
    people = list(dict.fromkeys(n.lower() for n in names if n.lower() in grounds.people))
    for i, a in enumerate(people):
        for b in people[i + 1 :]:
            if not grounds.named_together(a, b):
                return (
                    f"names {a.title()} and {b.title()} together, "
                    "which no sentence of the conversation does"
                )
    if not words:
        return None
    name_words = {n.lower() for n in names}
    content = {
        _stem(t)
        for t in tokens
        if t.isalpha()
        and len(t) >= 3
        and not _common(t)
        and t.lower() not in name_words
        and t.lower() not in _NUMBER_WORDS
        and t.lower() not in _MONTHS_DAYS
    }
    unknown = content - grounds.stems
    if unknown and not (len(content) <= 3 and len(unknown) <= 1):
        if (len(content) - len(unknown)) / len(content) < GROUNDED:
            return (
                f"{len(unknown)} of its {len(content)} words not in the conversation "
                f"({', '.join(sorted(unknown)[:3])})"
            )
    pairs = _cjk_pairs(item)
    if len(pairs) >= 3 and len(pairs & grounds.pairs) / len(pairs) < GROUNDED_CJK:
        unknown_pairs = len(pairs - grounds.pairs)
        return f"{unknown_pairs} of its {len(pairs)} character pairs not in the conversation"
    return None


def _ground(item: str, grounds: Grounds, *, words: bool = True) -> tuple[str, str | None]:
    """``item`` as it may be kept (an opening stamp the source does not support taken off) and
    why it is not grounded, or ``None``."""
    stamp = _STAMP.match(item)
    if stamp is not None and grounding_reason(stamp.group(1), grounds) is not None:
        item = item[stamp.end() :]
    return item, grounding_reason(item, grounds, words=words)


#: Kinds of item left out of an answer, as the notes and the reasons name them.
_META, _NOTHING, _DEBRIS, _INVENTED, _UNGROUNDED = (
    "meta-talk",
    "says nothing",
    "JSON fragments",
    "identifiers not in the conversation",
    "ungrounded",
)


@dataclass
class _Dropped:
    """Items left out of an answer: ``(kind, item, why)``."""

    grounds: Grounds
    items: list[tuple[str, str, str]] = field(default_factory=list)
    #: Why an item turned an instruction into a standing rule (the whole answer is rejected).
    rule: str | None = None

    def add(self, kind: str, item: str, why: str = "") -> None:
        self.items.append((kind, collapse_whitespace(item), why))

    def count(self, kind: str) -> int:
        return sum(1 for k, _, _ in self.items if k == kind)

    @property
    def total(self) -> int:
        return len(self.items)

    def _sample(self, kind: str) -> str:
        item, why = next((i, w) for k, i, w in self.items if k == kind)
        # A run's reasons are joined with "; ": the example must not look like two.
        return f"e.g. {cut_middle(item.replace(';', ','), 120)!r}: {why}"

    def notes(self) -> list[str]:
        """What was left out: one note for all kinds but ungrounded items, which are a reason
        of their own (``ungrounded: ...``, a kind in the report)."""
        out = []
        kinds = {k: self.count(k) for k, _, _ in self.items if k != _UNGROUNDED}
        if kinds:
            n = sum(kinds.values())
            out.append(
                f"{n} item(s) left out: " + ", ".join(f"{k} ({c})" for k, c in kinds.items())
            )
        dropped = self.count(_UNGROUNDED)
        if dropped:
            out.append(
                f"ungrounded: {dropped} item(s) of the answer left out, not found in the "
                f"conversation ({self._sample(_UNGROUNDED)})"
            )
        return out

    def rejection(self) -> str:
        """Why an answer with nothing left is rejected: its most common kind of item left out."""
        meta, nothing = self.count(_META), self.count(_NOTHING)
        ungrounded = self.count(_UNGROUNDED)
        other = self.total - meta - nothing - ungrounded
        if meta and meta >= max(nothing, ungrounded, other):
            # An answer about itself, or spoken to the reader: its own kind in the report.
            return (
                "meta-talk: the answer spoke of itself or to the reader, not of the "
                f"conversation ({self.total} left out)"
            )
        if nothing and nothing >= max(ungrounded, other):
            return (
                "says nothing: the answer only said there was nothing to say "
                f"({self.total} left out)"
            )
        if ungrounded and ungrounded >= other:
            return (
                f"ungrounded: no item of the answer was found in the conversation ({ungrounded} "
                f"dropped, {self._sample(_UNGROUNDED)})"
            )
        return "nothing usable in the answer" + (f" ({self.total} left out)" if self.total else "")


def _clean_item(item: str, source: str, out: _Dropped, *, words: bool = True) -> str | None:
    """``item`` as kept (its preamble taken off, on one line), or ``None``, counted in ``out``;
    ``words``: its words are judged too, not only its names, numbers and codes."""
    text = meta_lead(item) if item.strip() else item
    if not text.strip() or meta_talk_reason(text) is not None:
        if item.strip():
            out.add(_META, item)
        return None
    rule = standing_rule_reason(text)
    if rule is not None:
        out.rule = out.rule or rule
        return None
    if nothing_said_reason(text) is not None:
        out.add(_NOTHING, item)
        return None
    if debris_reason(text) is not None:
        out.add(_DEBRIS, item)
        return None
    if _invented(text, source):
        out.add(_INVENTED, item, ", ".join(_invented(text, source)[:3]))
        return None
    text, why = _ground(text, out.grounds, words=words)
    if why is not None:
        out.add(_UNGROUNDED, item, why)
        return None
    return collapse_whitespace(text)


def _clean_items(
    items: Sequence[str], source: str, out: _Dropped, *, words: bool = True
) -> list[str]:
    kept = [k for i in items if (k := _clean_item(i, source, out, words=words)) is not None]
    return list(dict.fromkeys(kept))


def _clean_payload(parsed: SummaryPayload, source: str, out: _Dropped) -> SummaryPayload:
    update: dict[str, object] = {"summary": ""}
    for name in _LISTS:
        # Open questions, like the goal, are the model's reading of the part (what it still
        # waits for), not claims of what was said: only their names, numbers and codes are judged.
        words = name != "open_questions"
        update[name] = _clean_items(getattr(parsed, name), source, out, words=words)
    timeline = []
    for e in parsed.timeline:
        event = _clean_item(e.event, source, out)
        if event is None:
            continue
        # Its date, like every date of an answer, must be the conversation's.
        why = (
            f"its date: {', '.join(_invented(e.when, source))} not in the conversation"
            if _invented(e.when, source)
            else (grounding_reason(e.when, out.grounds) if e.when.strip() else None)
        )
        if why is None:
            timeline.append(e.model_copy(update={"event": event}))
        else:
            out.add(_UNGROUNDED, f"{e.when}: {e.event}", why)
    update["timeline"] = timeline
    goal = parsed.conversation_goal
    # The goal is the model's reading of what the part is for, in its own words: its names,
    # numbers and codes must be the conversation's, its other words need not be.
    update["conversation_goal"] = (
        (_clean_item(goal, source, out, words=False) or "") if goal.strip() else ""
    )
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
