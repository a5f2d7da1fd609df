"""Meaning kept, not word counts: what a reader of the final prompt can still recover, with the
offline ``rules`` summarizer and the shipped defaults.

- A. tau-bench airline, 25 trajectories back to back as one long tool chat (``retention.tau_chain``)
  at a 4,000-token window. At the end: (1) the archived state-changing tool calls (tools whose
  name has no read-only word such as get/search/list/think) that one sentence or line of the
  summary still states: a segment that names the call's key id (its ``reservation_id``, else
  the reservation id its result returned, else its ``user_id``, else the trajectory's user) and
  says what was done (a word with the stem of the tool name's first word: cancel -> cancelled);
  (2) the identifiers of those calls' arguments and of the ground-truth actions that are
  archived, and the share still anywhere in the final prompt (dates reported apart); (3) the
  summary lines that are mostly bare identifiers; (4) tool-pair violations and calls over budget.
  The sliding window of the same budget is measured the same way on what it dropped.
- B. LoCoMo (QA categories 1-4) at 4,000 and 8,000 tokens: a question-driven reader over the
  context the next model call would get. The context is split into sentences, each scored by the
  question's content words it holds (weighted by idf over that context's sentences); a QA is
  FOUND when every content token of its answer is in the top 5 sentences. For the plugin, the
  sliding window and the full history (the ceiling), beside the bag-of-words figure of
  ``retention.py`` (evidence words present anywhere).

    python bench/meaning.py [--data DIR] [--quick] [--out DIR]
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BUDGET,
    Table,
    TokenCounter,
    content_words,
    make_rig,
    mean,
    out_dir,
    parser,
    print_versions,
    progress,
    require_data,
    sent_usage,
    tool_pair_violations,
    versions,
    write_results,
)
from fakes import bench_llm  # noqa: E402
from replay import SUMMARY_OPEN, baseline_runs, replay_through_host  # noqa: E402
from retention import (  # noqa: E402
    CATEGORIES,
    QAScore,
    evidence_indexes,
    ids_in,
    plugin_final_context,
    prompt_text,
    score_locomo,
    tau_chain,
    window_final_context,
)

from host_stub.datasets import (  # noqa: E402
    Conversation,
    load_locomo,
    load_tau_bench,
    tau_action_identifiers,
)
from host_stub.messages import Message, text_of  # noqa: E402
from plugin_memory_summary.base.identifiers import extract_identifiers  # noqa: E402

#: Sentences the question-driven reader takes from a context.
TOP_K = 5
#: Context windows of the LoCoMo reader.
WINDOWS = (BUDGET, 2 * BUDGET)
#: Trajectories in the long tool chat.
CHAIN = 25
SESSION = "tau-long"

# -- words and stems -------------------------------------------------------------------------------

_SUFFIXES = ("ing", "ed", "es", "s")
_LETTERS = re.compile(r"[a-z]+")


def stem(word: str) -> str:
    """A crude stem: a possessive ``'s`` dropped, then one suffix of ``ing``/``ed``/``es``/``s``
    stripped (the stem keeps 3+ letters; ``ss`` keeps its ``s``), ``i`` back to ``y`` after a
    strip (modified -> modify), then a final ``e`` and a doubled final consonant dropped
    (update/updated -> updat, cancelled -> cancel, class/classes -> clas)."""
    w = word.lower().removesuffix("'s")
    for suffix in _SUFFIXES:
        if len(w) - len(suffix) >= 3 and w.endswith(suffix) and not w.endswith("ss"):
            w = w[: -len(suffix)]
            if w.endswith("i"):
                w = w[:-1] + "y"
            break
    if len(w) > 3 and w.endswith("e"):
        w = w[:-1]
    if len(w) > 3 and w[-1] == w[-2] and w[-1].isalpha() and w[-1] not in "aeiou":
        w = w[:-1]
    return w


def terms(text: str) -> set[str]:
    """Content words (``common.content_words``: lower case, stop words and words under 3
    letters removed), stemmed."""
    return {stem(w) for w in content_words(text)}


# -- A: the long tool chat -------------------------------------------------------------------------

#: A tool whose name holds one of these words only reads.
READ_ONLY_WORDS = frozenset(
    "get search list find read lookup calculate think check fetch query view show".split()
)
#: Words that say a verb's action in other words (by verb, not by tool).
VERB_SYNONYMS: dict[str, tuple[str, ...]] = {"update": ("change", "modify")}
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def tool_words(name: str) -> list[str]:
    """The words of a tool name: ``cancel_reservation`` -> cancel, reservation;
    ``getUserDetails`` -> get, user, details."""
    return [w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub("_", name).lower()) if w]


def is_read_only(name: str) -> bool:
    return any(w in READ_ONLY_WORDS for w in tool_words(name))


def verb_matches(word: str, verb: str) -> bool:
    """``word`` says ``verb``: the same stem (book/booked, cancel/cancelled), the ``d`` -> ``t``
    past (send/sent), or a synonym's stem (update/changed)."""
    s = stem(word)
    for v in (verb, *VERB_SYNONYMS.get(verb, ())):
        target = stem(v)
        if s == target or (target.endswith("d") and s == target[:-1] + "t"):
            return True
    return False


def segments(text: str) -> list[str]:
    """Lines, each split into segments at ``'; '`` and ``'. '``; blank ones dropped."""
    out = []
    for line in text.splitlines():
        out += [s.strip() for s in re.split(r"; |\. ", line) if s.strip()]
    return out


def names_id(segment: str, ident: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(ident)}(?![A-Za-z0-9_])", segment) is not None


def says_done(segment: str, verb: str) -> bool:
    return any(verb_matches(w, verb) for w in _LETTERS.findall(segment.lower()))


@dataclass
class Action:
    """One state-changing tool call: its key id (None: no id known) and the verb of its name."""

    tool: str
    verb: str
    key: str | None
    trajectory: str
    position: int
    arguments: str
    #: The reservation id its result returned when no argument named it (a booking).
    returned: str | None = None
    failed: bool = False


def key_id(arguments: dict[str, Any], returned: str | None, user: str | None) -> str | None:
    """The id a statement of the call must name: its ``reservation_id`` argument, else the
    reservation id its result returned (a booking: it names its user too, but the new
    reservation is what it made, and what tells it from a failed attempt by the same user), else
    its ``user_id`` argument, else the user of its trajectory (None when unknown)."""
    value = arguments.get("reservation_id")
    if isinstance(value, str) and value:
        return value
    if returned:
        return returned
    value = arguments.get("user_id")
    if isinstance(value, str) and value:
        return value
    return user


def returned_id(result: str, arguments: dict[str, Any]) -> str | None:
    """The ``reservation_id`` a JSON tool result holds, when the call's arguments did not."""
    try:
        data = json.loads(result)
    except ValueError:
        return None
    value = data.get("reservation_id") if isinstance(data, dict) else None
    if isinstance(value, str) and value and value != arguments.get("reservation_id"):
        return value
    return None


def recoverable(action: Action, segs: Sequence[str], key: str | None = None) -> bool:
    """One segment names the action's key id (``key`` overrides it) and says what was done; with
    no key id known, one segment saying what was done."""
    key = key or action.key
    return any((key is None or names_id(s, key)) and says_done(s, action.verb) for s in segs)


def _arguments(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def state_changing_actions(
    messages: Sequence[Message],
    positions: Iterable[int],
    owners: Sequence[int],
    trajectories: Sequence[Conversation],
) -> list[Action]:
    """The state-changing calls of the assistant messages at ``positions`` of the chat, keyed
    (their results read from the tool messages right after them)."""
    out = []
    for i in sorted(positions):
        m = messages[i]
        if m.role != "assistant" or not m.tool_calls:
            continue
        results = {}
        for r in messages[i + 1 :]:
            if r.role != "tool":
                break
            results[r.tool_call_id] = text_of(r.content)
        t = trajectories[owners[i]]
        user = t.info.get("task", {}).get("user_id") or None
        for call in m.tool_calls:
            name = call.function.name
            if is_read_only(name):
                continue
            args = _arguments(call.function.arguments)
            result = results.get(call.id, "")
            back = returned_id(result, args)
            words = tool_words(name)
            out.append(
                Action(
                    tool=name,
                    verb=words[0] if words else name,
                    key=key_id(args, back, user),
                    trajectory=t.name,
                    position=i,
                    arguments=call.function.arguments,
                    returned=back,
                    failed=result.lstrip().lower().startswith("error"),
                )
            )
    return out


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}(?:T[\d:.]+Z?)?|\d{1,2}/\d{1,2}/\d{2,4}")


def is_date(ident: str) -> bool:
    return _DATE.fullmatch(ident) is not None


_PUNCT = ",;:.()[]{}\"'*-"


def is_bare_id_line(line: str) -> bool:
    """More than half of the line's tokens are identifiers (``Identifiers: A1B2C3 ...``)."""
    tokens = [t.strip(_PUNCT) for t in line.split()]
    tokens = [t for t in tokens if t]
    if not tokens:
        return False
    ids = set(extract_identifiers(line))
    return sum(1 for t in tokens if t in ids) / len(tokens) > 0.5


def is_id_list_line(line: str) -> bool:
    """A list of identifiers and nothing else but, at most, a label that opens the line
    (``Identifiers: A1B2C3 B4C5D6``)."""
    raw = [t for t in line.split() if t.strip(_PUNCT)]
    ids = set(extract_identifiers(line))
    words = [t for t in raw if t.strip(_PUNCT) not in ids]
    if len(words) == len(raw):
        return False
    return not words or (len(words) == 1 and words[0] is raw[0] and words[0].endswith(":"))


def summary_block(prompt: Sequence[dict[str, Any]]) -> str:
    return "\n".join(
        text_of(m.get("content"))
        for m in prompt
        if m.get("role") == "system" and SUMMARY_OPEN in text_of(m.get("content"))
    )


def chain_owners(trajectories: Sequence[Conversation]) -> list[int]:
    """For each message of ``tau_chain(trajectories)``, the trajectory it came from."""
    owners: list[int] = []
    for n, t in enumerate(trajectories):
        owners += [n for m in t.messages if not (owners and m.role == "system")]
    return owners


@dataclass
class ChatScore:
    """What one system kept of the long chat at its end."""

    actions: list[Action]
    recovered: list[bool]
    recovered_line: list[bool]
    recovered_prompt: list[bool]
    ids: set[str]
    ids_present: set[str]
    summary: str = ""
    summary_tokens: int = 0
    bare_lines: list[str] = field(default_factory=list)
    bare_tokens: int = 0
    id_list_lines: int = 0
    violations: int = 0
    over: int = 0
    compressions: Any = "-"


def score_chat(
    chain: Conversation,
    owners: Sequence[int],
    trajectories: Sequence[Conversation],
    gone: set[int],
    context: str,
    summary: str | None,
    counter: TokenCounter,
) -> ChatScore:
    """``gone``: positions of the chat's messages no longer verbatim (archived, or dropped by a
    window); ``context``: the final prompt's text; ``summary``: its summary block (None: none)."""
    actions = state_changing_actions(chain.messages, gone, owners, trajectories)
    summary_segs = segments(summary or "")
    prompt_segs = segments(context)
    ids: set[str] = set()
    for a in actions:
        ids |= set(extract_identifiers(a.arguments))
    gone_text = "\n".join(prompt_text([chain.messages[i].to_openai()]) for i in sorted(gone))
    truth: set[str] = set()
    for t in trajectories:
        truth |= tau_action_identifiers(t)
    ids |= ids_in(gone_text, truth)
    lines = [line for line in (summary or "").splitlines() if line.strip()]
    bare = [line for line in lines if is_bare_id_line(line)]
    return ChatScore(
        actions=actions,
        recovered=[recoverable(a, summary_segs) for a in actions],
        recovered_line=[recoverable(a, lines) for a in actions],
        recovered_prompt=[recoverable(a, prompt_segs) for a in actions],
        ids=ids,
        ids_present=ids_in(context, ids),
        summary=summary or "",
        summary_tokens=counter.text(summary) if summary else 0,
        bare_lines=bare,
        bare_tokens=sum(counter.text(line) for line in bare),
        id_list_lines=sum(is_id_list_line(line) for line in lines),
    )


async def plugin_chat(
    chain: Conversation,
    owners: Sequence[int],
    trajectories: Sequence[Conversation],
    counter: TokenCounter,
) -> ChatScore:
    rig = await make_rig(bench_llm(counter=counter, default_model=None), {})
    violations = over = 0

    async def after_turn(result: Any) -> None:
        nonlocal violations, over
        violations += sum(tool_pair_violations(p) for p in result.sent)
        over += sum(1 for u in sent_usage(result) if u.used > BUDGET)

    try:
        await replay_through_host(rig, chain, SESSION, drain=True, after_turn=after_turn)
        _, prompt, _, _ = await rig.host.build_prompt(SESSION, dry_run=True)
        archived = [m for m in await rig.host.memory.get_archived(SESSION) if not m.is_marker]
        active = [m for m in await rig.host.memory.get_history(SESSION) if not m.is_marker]
        compressions = len(rig.finals("done"))
    finally:
        await rig.close()
    # The store's messages in seq order are the chat's messages in order (markers left out).
    stored = sorted([*archived, *active], key=lambda m: m.seq or 0)
    if len(stored) != len(chain.messages):
        raise RuntimeError(f"stored {len(stored)} messages for {len(chain.messages)} replayed")
    archived_seqs = {m.seq for m in archived}
    gone = {i for i, m in enumerate(stored) if m.seq in archived_seqs}
    score = score_chat(
        chain, owners, trajectories, gone, prompt_text(prompt), summary_block(prompt), counter
    )
    score.violations, score.over, score.compressions = violations, over, compressions
    return score


def window_chat(
    chain: Conversation,
    owners: Sequence[int],
    trajectories: Sequence[Conversation],
    counter: TokenCounter,
) -> ChatScore:
    context, kept = window_final_context(chain, counter)
    gone = {i for i, m in enumerate(chain.messages) if m.role != "system" and i not in kept}
    score = score_chat(chain, owners, trajectories, gone, context, None, counter)
    _, window, _ = baseline_runs(chain, counter)
    score.violations = sum(s.violations for s in window.steps)
    score.over = window.over_budget
    return score


def _share(n: int, total: int) -> Any:
    return round(n / total, 3) if total else "-"


def action_table(title: str, plugin: ChatScore, window: ChatScore) -> Table:
    table = Table(
        title,
        [
            "tool",
            "plugin: archived",
            "plugin: failed (error result)",
            "plugin: recoverable from a summary segment",
            "plugin: from a summary line",
            "plugin: from a segment of the whole prompt",
            "window: dropped",
            "window: recoverable from prompt",
        ],
    )

    def tally(score: ChatScore, tool: str | None) -> list[int]:
        rows = zip(
            score.actions,
            score.recovered,
            score.recovered_line,
            score.recovered_prompt,
            strict=True,
        )
        picked = [(a, r, line, p) for a, r, line, p in rows if tool is None or a.tool == tool]
        return [
            len(picked),
            sum(a.failed for a, _, _, _ in picked),
            sum(r for _, r, _, _ in picked),
            sum(line for _, _, line, _ in picked),
            sum(p for _, _, _, p in picked),
        ]

    tools = sorted({a.tool for a in plugin.actions} | {a.tool for a in window.actions})
    for tool in [*tools, None]:
        n, failed, rec, rec_line, rec_prompt = tally(plugin, tool)
        wn, _, _, _, w_prompt = tally(window, tool)
        table.add(
            tool or "all",
            n,
            failed,
            f"{rec} ({_share(rec, n)})",
            f"{rec_line} ({_share(rec_line, n)})",
            f"{rec_prompt} ({_share(rec_prompt, n)})",
            wn,
            f"{w_prompt} ({_share(w_prompt, wn)})",
        )
    hit, booked = booked_by_user(plugin)
    if booked:
        table.note = (
            f"Plugin: calls whose result returned a new reservation id (successful bookings, "
            f"keyed above on that id): {booked}; recoverable from the summary when keyed on their "
            f"user_id argument instead: {hit}."
        )
    return table


def booked_by_user(score: ChatScore) -> tuple[int, int]:
    """Of the calls whose result returned a new reservation id: those a summary segment states
    by their ``user_id`` argument instead, and their number."""
    booked = [a for a in score.actions if a.returned]
    segs = segments(score.summary)
    hits = 0
    for a in booked:
        user = _arguments(a.arguments).get("user_id")
        hits += isinstance(user, str) and bool(user) and recoverable(a, segs, key=user)
    return hits, len(booked)


def identifier_row(label: str, score: ChatScore, bare: bool) -> list[Any]:
    dates = {i for i in score.ids if is_date(i)}
    others = score.ids - dates
    present = score.ids_present
    return [
        label,
        len(score.ids),
        len(present),
        _share(len(present), len(score.ids)),
        f"{len(others & present)} of {len(others)}",
        f"{len(dates & present)} of {len(dates)}",
        score.summary_tokens if bare else "-",
        len(score.bare_lines) if bare else "-",
        score.bare_tokens if bare else "-",
        score.id_list_lines if bare else "-",
        score.violations,
        score.over,
        score.compressions,
    ]


# -- B: the question-driven reader -----------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    """Lines, each split after ``.``, ``!`` or ``?`` followed by white space; stripped, blank
    ones dropped, nothing added."""
    out = []
    for line in text.splitlines():
        out += [s.strip() for s in _SENTENCE_END.split(line) if s.strip()]
    return out


def idf(sentence_terms: Sequence[set[str]]) -> dict[str, float]:
    """Inverse document frequency over the sentences: ``log(1 + N / df)``."""
    df: dict[str, int] = defaultdict(int)
    for ts in sentence_terms:
        for t in ts:
            df[t] += 1
    n = len(sentence_terms)
    return {t: math.log(1 + n / d) for t, d in df.items()}


def score_sentence(question: set[str], sentence: set[str], weights: dict[str, float]) -> float:
    return sum(weights.get(t, 0.0) for t in question & sentence)


def top_k(
    question: set[str], sentence_terms: Sequence[set[str]], weights: dict[str, float], k: int
) -> list[int]:
    """Indexes of the ``k`` best-scoring sentences (score > 0), best first; ties in context
    order."""
    scored = [(score_sentence(question, ts, weights), i) for i, ts in enumerate(sentence_terms)]
    ranked = sorted((x for x in scored if x[0] > 0), key=lambda x: (-x[0], x[1]))
    return [i for _, i in ranked[:k]]


def found(answer: str, chosen: Sequence[str]) -> bool:
    """Every content token of ``answer`` is in the ``chosen`` sentences; an answer without
    content tokens must appear there as a string (case-insensitive)."""
    wanted = terms(answer)
    if wanted:
        have: set[str] = set()
        for s in chosen:
            have |= terms(s)
        return wanted <= have
    needle = answer.strip().lower()
    return bool(needle) and any(needle in s.lower() for s in chosen)


@dataclass
class Reader:
    """A context prepared for the reader: its sentences, their terms and the idf weights."""

    sentences: list[str]
    terms: list[set[str]]
    weights: dict[str, float]

    @classmethod
    def of(cls, text: str) -> Reader:
        sents = sentences(text)
        ts = [terms(s) for s in sents]
        return cls(sents, ts, idf(ts))

    def finds(self, question: str, answer: str, k: int = TOP_K) -> bool:
        chosen = top_k(terms(question), self.terms, self.weights, k)
        return found(answer, [self.sentences[i] for i in chosen])


def usable_qas(conversation: Conversation) -> list[dict[str, Any]]:
    """The QAs ``retention.score_locomo`` scores: categories 1-4, with an answer and evidence
    inside the replayed part."""
    out = []
    for qa in conversation.qa:
        if qa.get("category") not in CATEGORIES or "answer" not in qa:
            continue
        indexes = evidence_indexes(conversation, qa.get("evidence", []))
        if indexes and indexes[-1] < len(conversation.messages):
            out.append(qa)
    return out


def read_all(conversation: Conversation, context: str) -> list[tuple[int, bool]]:
    reader = Reader.of(context)
    return [
        (int(qa["category"]), reader.finds(str(qa["question"]), str(qa["answer"])))
        for qa in usable_qas(conversation)
    ]


def full_history_text(conversation: Conversation) -> str:
    return prompt_text([m.to_openai() for m in conversation.messages])


# -- the run ---------------------------------------------------------------------------------------


def by_category(items: Sequence[tuple[int, float]]) -> dict[Any, list[float]]:
    out: dict[Any, list[float]] = defaultdict(list)
    for cat, value in items:
        out[cat].append(value)
        out["all"].append(value)
    return out


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    args = p.parse_args()
    locomo_path = require_data(args.data, "locomo/locomo_dev.json")
    tau_path = require_data(args.data, "tau_bench/airline_dev.json")
    out = out_dir(args.out)
    v = versions()
    print_versions(v)
    started = time.perf_counter()
    counter = TokenCounter()
    conversations = load_locomo(locomo_path)
    trajectories = load_tau_bench(tau_path)
    if args.quick:
        conversations = [
            Conversation(c.name, c.messages[:160], c.qa, c.turn_index) for c in conversations[:1]
        ]
        trajectories = trajectories[:8]

    # A: the long tool chat.
    chain_parts = trajectories[: min(CHAIN, len(trajectories))]
    chain = tau_chain(chain_parts)
    owners = chain_owners(chain_parts)
    progress(f"tau-bench long chat ({len(chain_parts)} trajectories): plugin")
    plugin = await plugin_chat(chain, owners, chain_parts, counter)
    progress("tau-bench long chat: sliding window")
    window = window_chat(chain, owners, chain_parts, counter)
    title = f"tau-bench airline, {len(chain_parts)} trajectories back to back ({BUDGET} tokens)"
    actions = action_table(
        f"{title}: archived (plugin) or dropped (window) state-changing tool calls that one "
        "sentence still states (names the key id and says what was done)",
        plugin,
        window,
    )
    ids_table = Table(
        f"{title}: identifiers of the archived/dropped state-changing calls' arguments and of "
        "the archived ground-truth actions, present anywhere in the final prompt; summary lines "
        "that are mostly bare identifiers",
        [
            "system",
            "ids archived",
            "ids present",
            "share present",
            "non-date ids present",
            "dates kept",
            "summary block tokens",
            "bare id lines (>50% ids)",
            "tokens in bare id lines",
            "id-list lines (ids and a label only)",
            "tool-pair violations",
            "calls over budget",
            "compressions",
        ],
    )
    ids_table.add(*identifier_row("plugin: default", plugin, True))
    ids_table.add(*identifier_row("sliding window (tool groups whole)", window, False))

    # B: the question-driven reader.
    full_found: list[tuple[int, bool]] = []
    full_bag: list[QAScore] = []
    for conv in conversations:
        text = full_history_text(conv)
        full_found += read_all(conv, text)
        full_bag += score_locomo(conv, text, set(range(len(conv.messages))))
    reader_table = Table(
        f"LoCoMo question-driven reader ({len(conversations)} conversations, QA categories 1-4): "
        f"share of QAs whose answer tokens are all in the top {TOP_K} sentences the question "
        "picks, beside the bag-of-words figure (evidence words present anywhere)",
        [
            "context window",
            "category",
            "QAs",
            "found: plugin",
            "found: sliding window",
            "found: full history",
            "plugin / full history",
            "bag: plugin evidence words",
            "bag: window evidence words",
            "bag: full history evidence words",
        ],
    )
    reader_extra: dict[str, Any] = {}
    for size in WINDOWS:
        ours: list[tuple[int, bool]] = []
        theirs: list[tuple[int, bool]] = []
        ours_bag: list[QAScore] = []
        theirs_bag: list[QAScore] = []
        for conv in conversations:
            progress(f"locomo {conv.name}: defaults at {size}")
            context, _, kept, _, _ = await plugin_final_context(conv, {}, counter, size)
            ours += read_all(conv, context)
            ours_bag += score_locomo(conv, context, kept)
            w_context, w_kept = window_final_context(conv, counter, size)
            theirs += read_all(conv, w_context)
            theirs_bag += score_locomo(conv, w_context, w_kept)
        found_by = [by_category([(c, float(f)) for c, f in x]) for x in (ours, theirs, full_found)]
        bag_by = [
            by_category([(s.category, s.evidence_recall) for s in x])
            for x in (ours_bag, theirs_bag, full_bag)
        ]
        for cat in [*sorted(c for c in found_by[2] if c != "all"), "all"]:
            plugin_share, window_share, full_share = (mean(f[cat]) for f in found_by)
            if len(found_by[0][cat]) != len(bag_by[0][cat]):
                raise RuntimeError("reader and bag-of-words scored different QAs")
            reader_table.add(
                size,
                "all (1-4)" if cat == "all" else f"{cat} {CATEGORIES[cat]}",
                len(found_by[0][cat]),
                round(plugin_share, 3),
                round(window_share, 3),
                round(full_share, 3),
                round(plugin_share / full_share, 3) if full_share else "-",
                *(round(mean(b[cat]), 3) for b in bag_by),
            )
        reader_extra[str(size)] = {
            "plugin_found": sum(f for _, f in ours),
            "window_found": sum(f for _, f in theirs),
            "full_history_found": sum(f for _, f in full_found),
            "qas": len(ours),
        }

    notes = [
        f"Host context_window {BUDGET} (LoCoMo also {2 * BUDGET}), reserve_for_reply 0, the "
        "plugin's shipped defaults; no summarizer model, so every compression is the rules "
        "engine. Sliding window: the newest messages that fit the same budget, tool groups whole.",
        "State-changing call: a tool whose name has none of the words "
        + "/".join(sorted(READ_ONLY_WORDS))
        + ". Recoverable: one segment (a line of the summary block split at '; ' and '. ') names "
        "the call's key id (reservation_id argument, else the reservation id its result returned "
        "(a booking), else user_id argument, else the trajectory's user id) and holds a word "
        "with the stem of the tool name's first word (update also: change, modify). 'A "
        "summary line': the same test on whole lines (a line may state several actions on one "
        "id, separated by '; '). 'Whole prompt': the segment test on every line of the final "
        "prompt (tool call names are not in its text); the window has only that.",
        "Identifiers: extract_identifiers over the arguments of the archived (dropped) "
        "state-changing calls, plus tau_action_identifiers of the chained trajectories found in "
        "the archived (dropped) messages; present = found anywhere in the final prompt's text. "
        "Bare id line: a summary line whose tokens are more than half identifiers; id-list "
        "line: nothing but identifiers after, at most, one opening label ('Identifiers:').",
        f"Reader: the context is split at line ends and after . ! ? followed by white space; a "
        "sentence's score is the sum of the idf (log(1 + N/df) over that context's sentences) of "
        "the question's content words it holds (stop words and words under 3 letters removed, "
        f"s/es/ed/ing stripped); the top {TOP_K} sentences with a score above 0 are read (ties "
        "in context order). Found: every content token of the answer is in them (an answer with "
        "none: its string). Full history = every message of the conversation as the context "
        "(the ceiling of this reader). Bag = retention.py's evidence words present anywhere.",
    ]
    misses = [asdict(a) for a, r in zip(plugin.actions, plugin.recovered, strict=True) if not r]
    write_results(
        "meaning",
        "Meaning kept: statements of archived actions, identifiers, a question-driven reader",
        [actions, ids_table, reader_table],
        out=out,
        versions_used=v,
        settings={
            "budget": BUDGET,
            "locomo windows": list(WINDOWS),
            "engine": "rules",
            "config": "shipped defaults",
            "top_k": TOP_K,
            "trajectories chained": len(chain_parts),
            "quick": args.quick,
        },
        runtime_s=time.perf_counter() - started,
        notes=notes,
        extra={
            "plugin_actions_missed": misses,
            "plugin_actions_recovered": [
                asdict(a) for a, r in zip(plugin.actions, plugin.recovered, strict=True) if r
            ],
            "window_actions_missed": [
                asdict(a)
                for a, r in zip(window.actions, window.recovered_prompt, strict=True)
                if not r
            ],
            "plugin_ids_missing": sorted(plugin.ids - plugin.ids_present),
            "window_ids_missing": sorted(window.ids - window.ids_present),
            "bare_id_lines": [line[:200] for line in plugin.bare_lines],
            "reader": reader_extra,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
