"""The rules engine: seed 002's ``fallbackMerge``, improved. It folds a batch of messages into the
previous payload without any model: deterministic (no clock, no randomness, no set iteration),
extractive (every item is text of the previous payload or of the messages, cut at most),
idempotent (the same batch merged twice into its own result adds nothing) and always within the
token budget. Identifiers are carried verbatim; when the cap forces a choice, the ones a user typed
outrank the ones a tool call used, which outrank the ones an assistant mentioned, which outrank
the ones that only appeared in a tool result, across merges (the payload records each
identifier's source); within a tier newer outranks older.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from host_stub.messages import Message, text_of, tool_groups

from ._patterns import lazy_regex
from .config import PayloadCaps
from .excerpts import content_keys, select_excerpts, split_long
from .fitting import apply_caps, fit_lines, fit_to_budget, render_payload
from .identifiers import extract_identifiers
from .parsing import carries_instructions
from .summary_model import (
    SOURCE_TIER,
    Excerpt,
    InProgressTask,
    SummaryPayload,
    group_sources,
    source_tier,
    sources_of,
    stronger_source,
)
from .text import collapse_whitespace, cut_text, sentences

__all__ = ["rules_merge"]

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


# --- identifiers ------------------------------------------------------------------------------


def _rank_identifiers(
    previous: SummaryPayload, turns: list[_Turn]
) -> tuple[list[str], dict[str, str]]:
    """The merged identifier list, least important first (caps keep the tail), and where each
    one came from (``"user"``, ``"argument"``, ``"assistant"``, ``"tool"``).

    Four tiers, by source, lowest first: identifiers only ever seen in tool results; those an
    assistant wrote (and previous ones of unrecorded source, as in a model-written payload);
    those a tool call used; those a user typed. The source is sticky: the previous payload's
    ``identifier_sources`` says where each of its identifiers came from, and an identifier keeps
    the most trusted source it was ever seen with, so a booking reference the user gave on the
    first day outranks every later tool-result or tool-call id, however old it is and whether or
    not the summary's prose still names it. Within a tier the previous identifiers not seen again
    come first (older), then this batch's, keyed ``(specificity, position)``: among tool results,
    one that named few identifiers (a record fetched by id) above a long listing (a search) whose
    entries are mostly not what the conversation is about; newer above older."""
    best: dict[str, tuple[int, int, int, int]] = {}
    sources: dict[str, str] = {}

    def note(ids: list[str], source: str, index: int, specificity: int = 0) -> None:
        for k, ident in enumerate(ids):
            key = (source_tier(source), specificity, index, k)
            if ident not in best or key > best[ident]:
                best[ident] = key
            sources[ident] = stronger_source(sources.get(ident), source)

    for turn in turns:
        if turn.role == "user":
            note(extract_identifiers(turn.text), "user", turn.index)
        elif turn.role == "assistant":
            note(extract_identifiers(turn.text), "assistant", turn.index)
            for call in turn.calls:
                note(extract_identifiers(call.arguments), "argument", turn.index)
        elif turn.role == "tool":
            ids = extract_identifiers(turn.text)
            note(ids, "tool", turn.index, -len(ids))
    recorded = sources_of(previous)
    earlier = [i for i in dict.fromkeys(previous.identifiers) if i not in best]
    for ident in previous.identifiers:
        sources[ident] = stronger_source(sources.get(ident), recorded.get(ident, "assistant"))
    ranked: list[str] = []
    for tier in sorted(SOURCE_TIER.values()):
        ranked += [i for i in earlier if source_tier(sources[i]) == tier]
        batch = [i for i in best if source_tier(sources[i]) == tier]
        ranked += sorted(batch, key=lambda i: best[i][1:])
    return _merge_items([], ranked), sources


# --- the merge --------------------------------------------------------------------------------

#: Share of the budget the identifier list may take (the record gets the rest).
_IDENTIFIER_SHARE = 0.6

#: Open questions and in-progress tasks kept: the newest few (the record carries the rest).
_OPEN_QUESTIONS = 3
_TASKS = 2


def _speaker(turn: _Turn, lang: str) -> str:
    if turn.speaker:
        return turn.speaker
    names = {"user": ("User", "用户"), "assistant": ("Assistant", "助手")}[turn.role]
    return names[1 if lang.lower().startswith("zh") else 0]


def _date_of(turn: _Turn) -> str:
    date = _DATE().search(turn.when) if turn.when else None
    return date.group() if date else turn.when


def _new_excerpts(turns: list[_Turn], caps: PayloadCaps, lang: str) -> list[Excerpt]:
    """Every substantive sentence of both speakers, as whole clauses within ``excerpt_chars``."""
    out: list[Excerpt] = []
    for turn in turns:
        if turn.role not in ("user", "assistant"):
            continue
        part = 0
        for sentence in turn.sentences:
            if not _is_substantive(sentence):
                continue
            for piece in split_long(sentence, caps.excerpt_chars):
                part += 1
                out.append(
                    Excerpt(
                        seq=turn.seq,
                        part=part,
                        speaker=_speaker(turn, lang),
                        when=_date_of(turn),
                        text=piece,
                    )
                )
    return out


_OVERVIEW = lazy_regex(r"^(?:Messages #1-#\d+ summarized\b|已摘要第 1-\d+ 条消息)")


def _summary_text(previous: SummaryPayload, overview: str, caps: PayloadCaps) -> str:
    """The previous prose (a model may have written it: merged, not replaced) with its
    overview line replaced by the new one."""
    lines = [
        line
        for line in previous.summary.strip().split("\n")
        if line.strip() and not _OVERVIEW().match(line)
    ]
    return fit_lines("\n".join([*lines, overview]), caps.summary_chars)


def _overview(turns: list[_Turn], excerpts: list[Excerpt], lang: str) -> str:
    """One line: the messages covered, who speaks, the dates spanned."""
    last = max([t.seq for t in turns] + [e.seq for e in excerpts], default=0)
    generic = {"User", "Assistant", "用户", "助手"}
    ordered = sorted(excerpts, key=lambda e: (e.seq, e.text))
    named = [e.speaker for e in ordered if e.speaker and not e.to_seq and e.speaker not in generic]
    speakers = list(dict.fromkeys(named))[:4]
    dates = [e.when for e in sorted(excerpts, key=lambda e: e.seq) if e.when and not e.to_seq]
    span = (dates[0], dates[-1]) if dates else None
    if lang.lower().startswith("zh"):
        parts = [f"已摘要第 1-{last} 条消息"]
        if speakers:
            parts.append("参与者：" + "、".join(speakers))
        if span:
            parts.append(f"日期：{span[0]}" + (f" 至 {span[1]}" if span[1] != span[0] else ""))
        return "；".join(parts) + "。"
    parts = [f"Messages #1-#{last} summarized"]
    if speakers:
        parts.append("between " + ", ".join(speakers))
    if span:
        parts.append(f"from {span[0]} to {span[1]}" if span[1] != span[0] else f"on {span[0]}")
    return " ".join(parts) + "."


def rules_merge(
    previous: SummaryPayload | None,
    messages: Sequence[Message],
    *,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    caps: PayloadCaps,
    lang: str = "en",
    digest: Sequence[Excerpt] = (),
) -> SummaryPayload:
    """``previous`` with ``messages`` folded in by rules (no model), within ``caps`` and
    ``budget_tokens`` (measured as ``count_tokens(render_payload(result, lang))``). ``digest``:
    a summarizer's sentences on these messages, candidates for the record next to theirs.

    - summary: one overview line (messages covered, speakers, dates spanned);
    - goal: the newest user sentence that asks for something; else the previous goal;
    - open questions: the newest few user questions that no later assistant text answers (shares
      a content word), the previous ones still unanswered first;
    - in-progress task: the goal, done = successful tool calls, to do = the open questions;
    - identifiers: see ``_rank_identifiers``; where each came from is kept in
      ``identifier_sources`` (not rendered); pinned facts: the previous ones, always;
    - excerpts, the record: the sentences of both speakers that carry the most facts per token,
      whole, with the message they came from and its date (``excerpts.select_excerpts``),
      chosen again from the previous record and this batch on every merge, so the budget is
      used and a repeated fact is kept once.
    System messages and event markers are ignored."""
    prev = previous.model_copy(deep=True) if previous is not None else SummaryPayload()
    turns = _digest(messages)
    if not turns:
        return fit_to_budget(apply_caps(prev, caps), budget_tokens, count_tokens, lang)
    user_turns = [t for t in turns if t.role == "user"]
    assistant_turns = [t for t in turns if t.role == "assistant"]

    def item(text: str) -> str:
        return cut_text(collapse_whitespace(text), caps.item_chars, marker_counts=True)

    # Goal.
    requests = []
    for turn in user_turns:
        wishes = [
            s
            for s in turn.sentences
            if _is_substantive(s) and _REQUEST().search(s) and not _CONFIRMATION().search(s)
        ]
        requests.extend(([s for s in wishes if not _is_question(s)] or wishes)[:1])
    # No request, no goal: a chat without one has none (its sentences are in the record).
    goal = requests[-1] if requests else prev.conversation_goal
    goal = cut_text(collapse_whitespace(goal), caps.goal_chars, marker_counts=True)

    # Open questions: previous ones still unanswered, then this batch's.
    reply_keys = [(t.index, _overlap_keys(t.text)) for t in assistant_turns if t.text.strip()]
    all_replies = [keys for _, keys in reply_keys]
    batch_questions: list[str] = []
    unanswered: list[str] = []
    for turn in user_turns:
        replies = [keys for index, keys in reply_keys if index > turn.index]
        for sentence in turn.sentences:
            if _is_question(sentence) and not _is_ack(sentence):
                batch_questions.append(item(sentence))
                if not _answered(sentence, replies):
                    unanswered.append(item(sentence))
    open_questions = _merge_items(
        [
            q
            for q in prev.open_questions
            if q not in batch_questions and not _answered(q, all_replies)
        ],
        unanswered,
    )[-_OPEN_QUESTIONS:]

    # The task in progress: what the tools did.
    done = [
        item(_format_call(c))
        for t in assistant_turns
        for c in t.calls
        if c.result is not None and not _TOOL_FAILURE().search(c.result[:200])
    ]
    tasks = [
        task.model_copy(update={"todo": [q for q in task.todo if q in open_questions]})
        for task in prev.in_progress_tasks
    ]
    task_goal = item(goal)
    if tasks and tasks[-1].goal == task_goal:
        last = tasks.pop()
        tasks.append(
            InProgressTask(goal=task_goal, done=_merge_items(last.done, done), todo=open_questions)
        )
    elif done:
        tasks.append(InProgressTask(goal=task_goal, done=done, todo=open_questions))
    tasks = tasks[-_TASKS:]

    identifiers, identifier_sources = _rank_identifiers(prev, turns)
    identifiers = _within_share(identifiers, budget_tokens * _IDENTIFIER_SHARE, count_tokens)
    new = [*_new_excerpts(turns, caps, lang), *digest]
    base = apply_caps(
        SummaryPayload(
            summary=_summary_text(prev, _overview(turns, [*prev.excerpts, *new], lang), caps),
            conversation_goal=goal,
            open_questions=open_questions,
            in_progress_tasks=tasks,
            identifiers=identifiers,
            pinned_facts=list(prev.pinned_facts),
            identifier_sources=group_sources(identifiers, identifier_sources),
            # A model-written previous payload's lists are kept as they were.
            stable_facts=prev.stable_facts,
            user_profile=prev.user_profile,
            decisions=prev.decisions,
            timeline=prev.timeline,
        ),
        caps,
    )
    base = fit_to_budget(base, budget_tokens, count_tokens, lang)
    rendered = render_payload(base, lang)
    heading = count_tokens("Record (said in the conversation; #n = message number):\n")
    room = budget_tokens - count_tokens(rendered) - heading
    excerpts = select_excerpts(
        prev.excerpts,
        new,
        budget_tokens=max(0, room),
        count_tokens=count_tokens,
        covered=content_keys(rendered),
        bonus=_excerpt_bonus,
    )
    merged = apply_caps(base.model_copy(update={"excerpts": excerpts}), caps)
    # The estimate leaves out the lines' date and seq headers: drop the least important
    # excerpts until the rendering fits.
    while merged.excerpts:
        over = count_tokens(render_payload(merged, lang)) - budget_tokens
        if over <= 0:
            break
        drop, freed = 0, 0
        while drop < len(merged.excerpts) - 1 and freed < over:
            freed += count_tokens(merged.excerpts[drop].text) + 2
            drop += 1
        merged = merged.model_copy(update={"excerpts": merged.excerpts[max(1, drop) :]})
    return fit_to_budget(merged, budget_tokens, count_tokens, lang)


def _within_share(identifiers: list[str], tokens: float, count: Callable[[str], int]) -> list[str]:
    """The most important identifiers (the list's tail) whose list takes at most ``tokens``."""
    kept: list[str] = []
    used = 0
    for ident in reversed(identifiers):
        used += count(ident) + 1
        if used > tokens:
            break
        kept.append(ident)
    return list(reversed(kept))


def _excerpt_bonus(excerpt: Excerpt) -> float:
    """A stated preference or fact about oneself, a confirmed action, or a summarizer's digest
    sentence is worth more than its words alone."""
    if excerpt.to_seq:
        # A summarizer's digest sentence speaks for a range of messages; its opening sentence
        # is what the model made of the range, kept before anything it only repeats.
        return 10.0 if excerpt.part == 0 else 4.0
    if _PROFILE().search(excerpt.text) or _DECISION().search(excerpt.text):
        return 1.5
    return 0.0
