"""The rules engine's reading of a batch: its turns (speaker, date, sentences, tool calls with
their results) and the small judgements made on a sentence (an acknowledgement, a question, a
request, a stated preference, a confirmed action)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from host_stub.messages import Message, text_of, tool_groups

from .identifiers import extract_identifiers
from .parsing import carries_instructions
from .patterns import lazy_regex
from .text import collapse_whitespace, sentences

# --- vocabulary -------------------------------------------------------------------------------

_ACK_WORDS = frozenset(
    """yes yeah yep yup ok okay k sure please proceed go ahead thanks thank you ty no nope nah
    that's thats it is fine great perfect correct right confirm confirmed do that sounds good
    cool alright all hi hello hey bye goodbye sounds lets let's 好 好的 是 是的 对 对的
    嗯 嗯嗯 谢谢 谢谢你 多谢 可以 行 没问题 确认 收到 好吧 不用 不 不是 你好 再见""".split()
)
_STOPWORDS_EN = frozenset(
    """the and for are but not you your yours with this that these those from have has had was
    were been being will would could should can may might must shall what which who whom whose
    when where why how all any both each few more most other some such only own same than too
    very just also into onto over under again then once here there about above below after
    before between through during out off our ours they them their theirs she her hers him his
    its it's i'm i'd i'll i've you're you'd you'll we're we'd let let's please thanks thank
    hello yes okay sure like want need would could get got make made know see one two three
    there's here's that's what's don't doesn't didn't can't won't isn't aren't wasn't weren't
    also well much many still even now need does did done doing able via per""".split()
)

_REQUEST = lazy_regex(
    r"(?i)\b(?:i(?:'d| would) (?:like|love)|i want|i wanna|i need|i wish|i plan"
    r"|i(?:'m| am) (?:looking|trying|hoping|planning)|looking (?:for|to)|help me"
    r"|can you|could you|would you|please(?! (?:proceed|go ahead|confirm|do))|let's)\b"
    r"|我想|我要|我需要|我打算|帮我|请你|请帮|麻烦|能否|能不能|可不可以|希望"
)
#: A reply to the assistant ("Yes, please proceed with that booking"): not a new goal.
_CONFIRMATION = lazy_regex(
    r"(?i)^(?:yes|yeah|yep|yup|ok|okay|sure|no|nope|correct|right|great|perfect|alright)\b"
    r"|^(?:好的|好|是的|是|对|可以|行|没问题|确认|不用|不是)"
)
_DECISION = lazy_regex(
    r"(?i)\b(?:confirmed|booked|done|completed|cancell?ed|updated|scheduled|resolved|agreed|reserved"
    r"|refunded|processed|modified|changed|upgraded|successfully|finali[sz]ed|approved|issued"
    r"|all set)\b|已|完成|确认|成功|搞定"
)
_PROFILE = lazy_regex(
    r"(?i)\b(?:i(?:'m| am) (?:a|an|from|allergic|married|single|vegetarian|vegan|retired|based)\b"
    r"|my name(?: is|'s)|call me|i live|i work|i prefer|i like|i love|i hate|i dislike"
    r"|i don't like|i do not like|i was born|my birthday|i have (?:a|an|two|three|\d)"
    r"|i usually|i always|i never|my (?:[\w-]+ ){0,2}(?:is|are)\b)"
    r"|我是|我叫|我的名字|我住|我在.{0,8}工作|我喜欢|我爱|我不喜欢|我讨厌|我偏好|我习惯|我来自"
    r"|我对.{0,6}过敏|我有|我的.{1,6}是"
)
_TOOL_FAILURE = lazy_regex(
    r"(?i)^\s*(?:error|exception|failed|failure)\b|\b(?:not found|invalid|unauthori[sz]ed|denied)\b"
)
_LOCOMO_PREFIX = lazy_regex(r"^\s*\[([^\[\]\n]{3,60})\]\s*(?:([^:：\n]{1,40}?)[:：]\s+)?")
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_DATE = lazy_regex(
    r"\b\d{4}-\d{1,2}-\d{1,2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH},?\s+\d{{4}}\b"
    rf"|\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b"
    r"|\d{4}年\d{1,2}月(?:\d{1,2}[日号])?|\d{1,2}月\d{1,2}[日号]",
)
_WORD = lazy_regex(r"[\p{L}\p{N}'’]+")
_LATIN_WORD = lazy_regex(r"[A-Za-z][A-Za-z0-9'\-]{2,}")
_CJK_RUN = lazy_regex(r"\p{Han}+")


# --- digesting the batch ----------------------------------------------------------------------


@dataclass
class _Call:
    name: str
    arguments: str
    result: str | None


@dataclass
class _Turn:
    index: int
    role: str
    text: str
    seq: int = 0
    when: str = ""
    speaker: str = ""
    sentences: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)


def _digest(messages: Sequence[Message]) -> list[_Turn]:
    chat = [m for m in messages if not m.is_marker and m.role != "system"]
    results: dict[int, dict[str, str]] = {}
    for start, end, _complete in tool_groups(chat):
        by_id: dict[str, str] = {}
        for reply in chat[start + 1 : end]:
            by_id.setdefault(str(reply.tool_call_id), text_of(reply.content))
        results[start] = by_id
    turns: list[_Turn] = []
    for index, message in enumerate(chat):
        text = text_of(message.content)
        turn = _Turn(index=index, role=message.role, text=text, seq=message.seq or 0)
        if message.role in ("user", "assistant"):
            prefix = _LOCOMO_PREFIX().match(text)
            if prefix:
                turn.when = prefix.group(1).strip()
                turn.speaker = (prefix.group(2) or "").strip()
                turn.text = text[prefix.end() :]
            turn.sentences = sentences(turn.text)
        if message.role == "assistant" and message.tool_calls:
            by_id = results.get(index, {})
            turn.calls = [
                _Call(c.function.name, c.function.arguments or "", by_id.get(c.id))
                for c in message.tool_calls
            ]
        turns.append(turn)
    return turns


def _words(sentence: str) -> list[str]:
    return [w.lower().strip("'’") for w in _WORD().findall(sentence)]


def _is_ack(sentence: str) -> bool:
    words = _words(sentence)
    return all(w in _ACK_WORDS for w in words)


def _is_substantive(sentence: str) -> bool:
    # A sentence that instructs the agent is no fact, and the summary goes back in as a system
    # message: it stays in the archive (``memory_search`` quotes it as data), not in the record.
    if _is_ack(sentence) or carries_instructions(sentence):
        return False
    words = _words(sentence)
    han = sum(len(run) for run in _CJK_RUN().findall(sentence))
    return len(words) >= 3 or han >= 4 or bool(extract_identifiers(sentence))


def _is_question(sentence: str) -> bool:
    return sentence.rstrip().endswith(("?", "？"))


def _overlap_keys(text: str) -> set[str]:
    keys = {w.lower() for w in _LATIN_WORD().findall(text) if w.lower() not in _STOPWORDS_EN}
    for run in _CJK_RUN().findall(text):
        keys.update(run[i : i + 2] for i in range(len(run) - 1))
    keys.update(extract_identifiers(text))
    return keys


def _answered(question: str, replies: list[set[str]]) -> bool:
    """A question counts as answered when a later assistant text shares a content word with it
    (any later assistant text, if the question has no content word). ``replies`` holds the
    ``_overlap_keys`` of those texts."""
    keys = _overlap_keys(question)
    if not keys:
        return bool(replies)
    return any(keys & reply for reply in replies)


def _format_call(call: _Call) -> str:
    try:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return f"{call.name}({collapse_whitespace(call.arguments)})"
    if not isinstance(args, dict):
        return f"{call.name}({json.dumps(args, ensure_ascii=False)})"
    parts = []
    for key, value in args.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"{key}={shown}")
    return f"{call.name}({', '.join(parts)})"


def _merge_items(old: list[str], new: list[str]) -> list[str]:
    """``old`` then ``new``, a repeated item keeping its newest position."""
    combined = [i for i in old + new if i]
    return list(reversed(list(dict.fromkeys(reversed(combined)))))
