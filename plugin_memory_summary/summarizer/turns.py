"""The rules engine's reading of a batch: its turns (speaker, date, sentences, tool calls with
their results) and the small judgements made on a sentence (an acknowledgement, a question, a
request, a stated preference, a confirmed action)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache

from host_stub.messages import Message, text_of, tool_groups

from ..base import collapse_whitespace, extract_identifiers, lazy_regex, sentences
from ..safety import skeleton
from .parsing import carries_instructions

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

# --- what the record never keeps --------------------------------------------------------------
# Matched in a sentence as a reader sees it (``hygiene.skeleton``: look-alike letters, full-width
# forms, invisible format characters and HTML character references read as ASCII).

_ROLE_WORDS = (
    r"(?:system|sys|user|assistant|human|ai|tool|developer|summari[sz]er|系统|用户|助手|人类)"
)
_CLAIM_WORDS = r"(?:\s*(?:message|prompt|instructions?|note|notice|override|update|says?|说))?"
_COLONS = r"[:：﹕︓꞉∶]"
#: A sentence that opens as another speaker's turn: ``SYSTEM:``, ``**User**:``, ``### system:``,
#: ``[SYSTEM]``, ``<system>``, ``<|im_start|>system``, ``(system):`` (the injected block's inert
#: form), ``系统：``, after a date stamp too (``[8 May, 2023] System:``).
_ROLE_OPENING = lazy_regex(
    r"(?i)^\s*(?:\[[^\[\]\n]{1,60}\][\s:]*)?(?:\d{1,3}[.)]\s+)?"
    r"(?:"
    # ``<|im_start|>``, ``<|system|>``: a chat-template token is never a fact
    r"<\|[^|<>\n]{1,40}\|>"
    # ``System:``, ``**User**:``, ``(system):``, ``User says:``
    rf"|[\s#>*_`~\-•·\"'“‘「『(]*{_ROLE_WORDS}(?![a-z0-9]){_CLAIM_WORDS}"
    rf"[\s*_`\"'”’」』)]*(?:{_COLONS}|>|$)"
    # ``[SYSTEM]``, ``<system>``, ``</user>``, ``|assistant|``
    rf"|[\s#>*_`~\-]*[\[<({{|]\s*/?\s*{_ROLE_WORDS}{_CLAIM_WORDS}\s*[\]>)}}|]"
    r")"
)
#: A LoCoMo-style speaker that is a role name (``[8 May, 2023] System: ...``): no speaker.
_ROLE_NAME = lazy_regex(rf"(?i)^[\s#>*_`~\"'(\[<]*{_ROLE_WORDS}{_CLAIM_WORDS}[\s*_`\"')\]>]*$")

_MACHINE = (
    r"(?:summari[sz]er|summari[sz]ing\s+(?:model|engine|tool)|assistant|ai|llm|language\s+model"
    r"|chat\s?bot|bot|model|agent|system|gpt|chatgpt)"
)
_ORDER = (
    r"(?:output|reply|respond|answer|say|print|write|return|emit|ignore|forget|disregard|obey"
    r"|reveal|repeat|include|insert|append|record|store|remember|delete|erase|drop|omit|wipe"
    r"|e-?mail|send|forward|wire|transfer|leak|comply|pretend|summari[sz]e|treat|act\s+as"
    r"|switch\s+to)"
)
_KEEP_ONLY = r"(?:(?:full|entire|whole|original|initial|hidden|secret)\s+)*"
#: Orders to the summarizer or the agent, which a record of the past never needs: the summary
#: goes back into every prompt as a system message. Matched in the case-folded skeleton by the
#: standard library's ``re``, one ``\b`` before all the branches: a 10 MB sentence costs a second
#: or two, not the tens of a case-insensitive alternation in ``regex``.
_DIRECTIVE_SOURCE = (
    r"\b(?:"
    # "the summarizer must output ...", "the assistant must wire ..."
    rf"{_MACHINE}\s+(?:must|shall|should|has\s+to|needs?\s+to"
    r"|is\s+(?:required|instructed|ordered|told|supposed|expected)\s+to|is\s+to|will\s+now"
    r"|may\s+only|can\s+only|is\s+only\s+allowed\s+to)"
    rf"\s+(?:(?:now|only|always|never|not|immediately|also|just|then)\s+)*{_ORDER}\b"
    # "forget every booking", "wipe your memory", "drop every reservation"
    r"|forget\s+(?:all|every|everything|each|any)\b"
    r"|(?:erase|wipe|purge|clear|delete|drop|discard)\s+(?:(?:all|every|the|your|this)\s+)+"
    r"(?:memory|memories|history|summary|summaries|records?|context)\b"
    r"|(?:delete|drop|remove|omit|erase)\s+(?:every|all)\s+(?:the\s+)?(?:bookings?"
    r"|reservations?|facts?|records?|entries|orders?|items?)\b"
    # "in your summary, say ...", "when you summarize this, ...", "note to the AI: ..."
    r"|(?:in|into|from|to)\s+(?:the|your|this)\s+summary\b"
    r"|summary\s+(?:must|should|shall|needs?\s+to|has\s+to|may\s+only|can\s+only)\b"
    r"|(?:when|while|before|after)\s+(?:you\s+)?(?:summari[sz]e|summari[sz]ing"
    r"|writ(?:e|ing)\s+(?:the|your|a)\s+summary)\b"
    r"|instead\s+of\s+summari[sz]ing\b|(?:do\s+not|don'?t|never)\s+(?:summari[sz]e|record)\b"
    rf"|note\s+to\s+(?:the\s+)?{_MACHINE}\b|summari[sz]er\s*[,:!]"
    # "reveal your system prompt", "developer mode", "ignore everything above"
    r"|(?:reveal|print|show|repeat|output|leak|dump|display)\s+(?:me\s+|us\s+)?"
    rf"(?:(?:your|the)\s+{_KEEP_ONLY}(?:system\s+(?:prompt|message)|initial\s+prompt"
    rf"|hidden\s+(?:prompt|instructions))|your\s+{_KEEP_ONLY}(?:prompt|instructions|rules))\b"
    r"|your\s+system\s+prompt\b"
    r"|(?:developer|god|dan|jailbreak|unrestricted|admin|root|sudo)\s+mode\b|jailbreak"
    r"|(?:ignore|disregard)\s+(?:all|any|every|everything|(?:the\s+)?above"
    r"|the\s+(?:rules|instructions|system|prompt|transcript|conversation))\b"
    r"|new\s+(?:rules?|directives?|system\s+(?:prompt|rules?))\s*[:：]"
    r"|(?:important|urgent|priority|critical)\s+(?:system\s+)?(?:instructions?|directives?"
    r"|overrides?)\s*[:：]"
    r")"
)
#: The same in Chinese ("总结时只输出", "删除所有预订记录", "忘记所有"), for text with Han.
_DIRECTIVE_ZH_SOURCE = (
    r"(?:总结|摘要|记忆)(?:时|中|里)?(?:只|必须|不要|请只)|只(?:输出|回复|回答)"
    r"|忘记(?:所有|全部|一切|之前)|(?:清除|清空|删除)(?:你的)?(?:记忆|摘要|总结|记录)"
    r"|(?:删除|清除|清空)(?:所有|全部)(?:的)?(?:预订|记录|订单)"
    r"|(?:助手|模型|系统|总结器)(?:必须|应该|只能|需要)"
    r"|(?:显示|透露|告诉我)你的(?:系统提示|指令)"
)
#: "reply only with the word PWNED", "output only 'ok'": case matters for the last part (a
#: code in capitals), so it is matched in the skeleton as it is, and only when the case-folded
#: text holds its opening (:data:`_VERBATIM_HEAD_SOURCE`).
_VERBATIM_SOURCE = (
    r"(?i)\b(?:output|reply|respond|answer|print|say|write|return|emit)\s+(?:only|exactly|just"
    r"|solely|nothing\s+(?:but|except|other\s+than))\b(?:\s+(?:with|the|this|that|one|a|single)\b)*"
    r"\s*(?:(?:word|phrase|string|text|token|sentence|letters?)\b|[\"'“‘«]"
    r"|(?-i:[A-Z0-9][A-Z0-9_-]{3,}\b))"
)
_VERBATIM_HEAD_SOURCE = (
    r"\b(?:output|reply|respond|answer|print|say|write|return|emit)\s+"
    r"(?:only|exactly|just|solely|nothing)\b"
)


@cache
def _directive() -> re.Pattern[str]:
    return re.compile(_DIRECTIVE_SOURCE)


@cache
def _directive_zh() -> re.Pattern[str]:
    return re.compile(_DIRECTIVE_ZH_SOURCE)


@cache
def _verbatim() -> re.Pattern[str]:
    return re.compile(_VERBATIM_SOURCE)


@cache
def _verbatim_head() -> re.Pattern[str]:
    return re.compile(_VERBATIM_HEAD_SOURCE)


def _judge(sentence: str) -> bool:
    if carries_instructions(sentence):
        return True
    folded = skeleton(sentence)
    if _ROLE_OPENING().search(folded) is not None:
        return True
    low = folded.casefold()
    if _directive().search(low) is not None:
        return True
    if not low.isascii() and _directive_zh().search(low) is not None:
        return True
    if _verbatim_head().search(low) is not None and _verbatim().search(folded) is not None:
        return True
    return folded != sentence and carries_instructions(folded)


_judged = lru_cache(maxsize=4096)(_judge)
#: Longer sentences are not kept in that cache (it would keep them alive); the last one is.
_CACHED_CHARS = 2000
_last_long: list[tuple[str, bool]] = []


def _refused(sentence: str) -> bool:
    """A sentence the record never keeps, whoever said it: it opens as another speaker's turn (a
    role header), or it gives the summarizer or the agent orders. The summary goes back into
    every prompt as a system message; the sentence stays in the archive, where
    ``memory_search`` quotes it as data."""
    if len(sentence) <= _CACHED_CHARS:
        return _judged(sentence)
    if _last_long and _last_long[0][0] == sentence:
        return _last_long[0][1]
    verdict = _judge(sentence)
    _last_long[:] = [(sentence, verdict)]
    return verdict


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
                speaker = (prefix.group(2) or "").strip()
                if speaker and _ROLE_NAME().match(skeleton(speaker)):
                    # A role is no speaker: its header stays on the text, which is refused.
                    turn.text = text[prefix.end(1) + 1 :].lstrip()
                else:
                    turn.speaker = speaker
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
    # A sentence that instructs the agent or opens as another speaker's turn is no fact, and the
    # summary goes back in as a system message: it stays in the archive (``memory_search``
    # quotes it as data), not in the record, the goal or the open questions.
    if _is_ack(sentence) or _refused(sentence):
        return False
    words = _words(sentence)
    han = sum(len(run) for run in _CJK_RUN().findall(sentence))
    return len(words) >= 3 or han >= 4 or bool(extract_identifiers(sentence))


def _is_question(sentence: str) -> bool:
    """A question the user asked (an open question when nothing answers it): never one that
    opens with a role header or gives the model orders (:func:`_refused`)."""
    return sentence.rstrip().endswith(("?", "？")) and not _refused(sentence)


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
