"""The structured summary: its model, parsing, caps and rendering."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._patterns import LazyRegex, lazy_regex
from .config import PayloadCaps

if TYPE_CHECKING:
    import regex

__all__ = [
    "IDENTIFIER_SOURCES",
    "InProgressTask",
    "SummaryPayload",
    "TimelineEvent",
    "apply_caps",
    "extract_identifiers",
    "fit_to_budget",
    "parse_summary_output",
    "payload_from_text",
    "plain_text_gate",
    "refusal_reason",
    "render_payload",
]


#: Where an identifier can come from, least trusted first: a tool result, an assistant's text,
#: a tool call's arguments, the user's text.
IDENTIFIER_SOURCES: tuple[str, ...] = ("tool", "assistant", "argument", "user")


# The models build their validators on first use, not at import (``defer_build``).
class InProgressTask(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    goal: str = ""
    done: list[str] = Field(default_factory=list)
    todo: list[str] = Field(default_factory=list)


class TimelineEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)

    when: str = ""
    event: str = ""


class SummaryPayload(BaseModel):
    """What the summarizer returns (as JSON) and what the rules engine builds."""

    model_config = ConfigDict(extra="ignore", defer_build=True)

    summary: str = ""
    conversation_goal: str = ""
    stable_facts: list[str] = Field(default_factory=list)
    user_profile: list[str] = Field(default_factory=list)
    decisions: list[str] = Field(default_factory=list)
    open_questions: list[str] = Field(default_factory=list)
    in_progress_tasks: list[InProgressTask] = Field(default_factory=list)
    timeline: list[TimelineEvent] = Field(default_factory=list)
    retrieval_hints: list[str] = Field(default_factory=list)
    identifiers: list[str] = Field(default_factory=list)
    #: Facts a user pinned: every later merge keeps them, whatever the summarizer returns.
    pinned_facts: list[str] = Field(default_factory=list)
    #: Bookkeeping, never rendered and never asked of a model: where the identifiers were seen,
    #: as source -> identifiers (sources: ``IDENTIFIER_SOURCES``). The rules engine writes it so
    #: an identifier the user typed stays ahead of tool-result ones across merges, whatever the
    #: rest of the payload still says. An identifier listed under no source counts as
    #: ``"assistant"`` (a model-written payload carries none). Identifiers are list values, not
    #: keys, so redacting the payload's string values redacts them here too.
    identifier_sources: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("identifier_sources", mode="before")
    @classmethod
    def _known_sources(cls, value: Any) -> dict[str, list[str]]:
        """Only known sources and string identifiers; anything else is dropped (a damaged
        bookkeeping field must never make a stored record unreadable)."""
        if not isinstance(value, dict):
            return {}
        out: dict[str, list[str]] = {}
        for source in IDENTIFIER_SOURCES:
            items = value.get(source)
            if isinstance(items, list):
                kept = [i for i in items if isinstance(i, str) and i.strip()]
                if kept:
                    out[source] = list(dict.fromkeys(kept))
        return out


# ---------------------------------------------------------------------------------------------
# Ordering convention
#
# Every list in a payload is ordered oldest (least important) first, newest (most important)
# last. Caps and the budget fitter drop from the head, so the tail survives longest. For
# ``identifiers`` the rules engine sorts by priority as well as recency (identifiers a user typed
# outrank ones a tool call used, which outrank ones an assistant wrote, which outrank ones that
# only appeared in a tool result), so "the tail" means "the identifiers most worth keeping". The
# priority is remembered across merges in ``identifier_sources``; ``apply_caps`` orders by it.
# ---------------------------------------------------------------------------------------------

#: The caps and the budget fitter keep higher tiers longer: what the user typed, over what a
#: tool call used, over what an assistant wrote, over what only a tool returned. An identifier
#: seen from several sources keeps the highest.
_SOURCE_TIER = {name: tier for tier, name in enumerate(IDENTIFIER_SOURCES, start=1)}
_DEFAULT_SOURCE = "assistant"


def _stronger_source(a: str | None, b: str) -> str:
    """The more trusted of two sources (``a`` may be unknown)."""
    if a is None or _SOURCE_TIER[b] > _SOURCE_TIER[a]:
        return b
    return a


def _sources_of(payload: SummaryPayload) -> dict[str, str]:
    """identifier -> its recorded source (the most trusted when listed twice); identifiers
    listed under no source are absent (they count as ``"assistant"``)."""
    found: dict[str, str] = {}
    for source in IDENTIFIER_SOURCES:
        for ident in payload.identifier_sources.get(source, []):
            found[ident.strip()] = _stronger_source(found.get(ident.strip()), source)
    return found


def _source_tier(source: str | None) -> int:
    return _SOURCE_TIER[source or _DEFAULT_SOURCE]


def _group_sources(identifiers: list[str], by_id: dict[str, str]) -> dict[str, list[str]]:
    """The bookkeeping field for ``identifiers``: the recorded ones grouped by source, in the
    order of ``identifiers``; the others left out (they count as ``"assistant"``)."""
    groups: dict[str, list[str]] = {}
    for ident in identifiers:
        source = by_id.get(ident)
        if source is not None:
            groups.setdefault(source, []).append(ident)
    return {s: groups[s] for s in IDENTIFIER_SOURCES if s in groups}


_LIST_FIELDS = ("stable_facts", "user_profile", "decisions", "open_questions", "retrieval_hints")
_GRAPHEME = lazy_regex(r"\X")
_ELLIPSIS = "…"


def _cut(text: str, limit: int, marker: str = _ELLIPSIS) -> str:
    """``text`` cut to at most ``limit`` code points on a grapheme boundary, ``marker`` appended
    when something was cut (and room allows)."""
    if len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    if limit <= len(marker):
        marker = ""
    room = limit - len(marker)
    used = 0
    for match in _GRAPHEME().finditer(text):
        size = match.end() - match.start()
        if used + size > room:
            break
        used += size
    return text[:used].rstrip() + marker


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fit_lines(text: str, limit: int) -> str:
    """A multi-line rolling text (the summary) shortened to ``limit`` code points: the oldest
    (first) lines go first; a line that only needs trimming is cut instead of dropped; a single
    remaining line is cut at its end."""
    text = text.strip()
    if len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    lines = [line for line in text.split("\n") if line.strip()]
    while len(lines) > 1:
        total = sum(len(line) for line in lines) + len(lines) - 1
        excess = total - limit
        if excess <= 0:
            break
        oldest = lines[0]
        if len(oldest) - excess >= 40:
            lines[0] = _cut(oldest, len(oldest) - excess)
            break
        lines.pop(0)
    return _cut("\n".join(lines), limit)


# --- identifiers ------------------------------------------------------------------------------

_SCAN_ALTERNATIVES = {
    "kv": r'"(?P<key>[A-Za-z_][A-Za-z0-9_\-]{0,40})"\s*:\s*'
    r'(?:"(?P<val>[^"\\\r\n]{1,200})"|(?P<num>-?\d{1,40}(?:\.\d+)?(?:[eE][+-]?\d+)?)(?![\w.]))',
    "datetime": r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?",
    "url": r"\b(?:https?|ftp)://[^\s<>\"'`]+",
    "email": r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+",
    "winpath": r"\b[A-Za-z]:\\[^\s\"'<>|*?]*",
    "path": r"(?:~|\.{1,2})?/[A-Za-z0-9_.\-~]+(?:/[A-Za-z0-9_.\-~]+)*/?"
    r"|[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)+/?",
    # A flight number: a two-letter airline code and 1-4 digits, spaced ("LH 716") or not.
    "flight": r"(?<![\w\-/.@])[A-Z]{2}(?:\ \d{1,4}|\d{2,4})(?![\w\-]|[.,:/]\d)",
    "token": r"[A-Za-z0-9_]+(?:[-.][A-Za-z0-9_]+)*",
}


def _scanner(*names: str) -> LazyRegex:
    return lazy_regex("|".join(f"(?P<{n}>{_SCAN_ALTERNATIVES[n]})" for n in names))


_SCAN_ALL = _scanner("kv", "datetime", "url", "email", "winpath", "path", "flight", "token")
_SCAN_NO_KV = _scanner("datetime", "url", "email", "winpath", "path", "flight", "token")
_SCAN_TOKENS = _scanner("flight", "token")
_SCAN_WORDS = _scanner("token")

_ID_KEY_SUFFIX = lazy_regex(
    r"(?:^|[_\-])(?:id|ids|uuid|guid|number|num|no|code|ref|reference|sku|pnr|locator)$"
)
_ID_KEY_CAMEL = lazy_regex(r"[a-z0-9](?:Id|ID|Number|Num|No|Code|Ref)$")
#: A number with at most one separator and no letters: an amount, a range, a decimal.
_PLAIN_NUMBER = lazy_regex(r"(\d+)(?:([.,\-/])(\d+))?")
_NUMERIC_DATE = lazy_regex(r"\d{1,4}[/.\-]\d{1,2}[/.\-]\d{1,4}")
_WORD_PLUS_DIGIT = lazy_regex(r"[a-z]+[_\-]?\d")
#: A count and its unit: "7-day", "24-hour", "5-star".
_DIGIT_PLUS_WORD = lazy_regex(r"\d{1,3}-[a-z]+")
_HAS_EXTENSION = lazy_regex(r"[A-Za-z0-9_\-]\.[A-Za-z0-9]{1,8}$")
_TRAILING_PUNCT = ".,;:!?)]}'\""
#: Digits from which a plain number reads as a phone, account or order number, not an amount.
_LONG_NUMBER_DIGITS = 7
#: Upper-case words that are shouting, not codes.
_CAPS_STOPWORDS = frozenset(
    """ABOUT ABOVE ACTIVE AFTER AGAIN ALERT ALWAYS APPROVED AVAILABLE BELOW BOOKED CANCELED
    CANCELLED CAUTION CLOSED COMPLETE COMPLETED CONFIRMED COULD DANGER DEBUG DELAYED DENIED
    DEPRECATED DISABLED ENABLED ERROR FAILED FAILURE FALSE FINAL FIRST FIXME GREAT HELLO
    IMPORTANT INACTIVE INVALID LOWER NEVER NOTICE OPTIONAL OTHER PASSED PENDING PLEASE REJECTED
    REQUIRED RESULT SHOULD SORRY STATUS SUCCESS THANK THANKS THERE THESE THOSE TODAY TOTAL
    UNPAID UPDATE UPPER URGENT USING VALID WARNING WHERE WHICH WHILE WORLD WOULD YOURS""".split()
)
#: Two-letter words and abbreviations that a number can follow without being a flight number.
_NOT_AIRLINES = frozenset(
    """AD AM AN AS AT BC BE BY CH DO DR EU FY GO HE HI ID IF IN IS IT ME MR MS MY ND NO NR OF OH
    OK ON OR PG PM PP RD SO SS ST TH TO UK UN UP US VS WE""".split()
)
#: Words after which a code is named: "reservation HXDUBJ", "order no. 58392", "PNR: QWERTY",
#: "确认号 ...". Fillers ("is", "ID", "number", ":", "#", quotes, bold) may come between.
_ID_CUE = lazy_regex(
    r"(?i)(?:\b(?:reservations?|bookings?|confirmations?|conf|references?|refs?|locators?|pnrs?"
    r"|orders?|tickets?|vouchers?|coupons?|promo|codes?|ids?|numbers?|invoices?|accounts?"
    r"|tracking|membership|certificates?|serial|sku|zip|postcode|passport)"
    r"|\bno\.|\bnr\.?|#|№|号|编号|单号|代码)"
    r"(?:[\s:：#=*\"'“(\[\-]+(?:is|was|are|id|ids|number|no|code|reference|ref|是|为)\b)*"
    r"[\s:：#=*\"'“(\[\-]*$"
)
_LIST_SEP = (
    r"[\"'”*]*[ \t]*(?:[,;/、，；][ \t]*(?:(?:and|or)[ \t]+)?|(?:and|or|和|或)[ \t]*"
    r"|\n\s*(?:[-*•]|\d{1,3}[.)])[ \t]+)[\"'“*]*"
)
#: Between two items of a list of codes ("DF89BM, COVE6R, and IIHXDG"; a bulleted list).
_BETWEEN_CODES = lazy_regex(_LIST_SEP)
#: A letter-and-digit code right after a list separator.
_NEXT_CODE = lazy_regex(_LIST_SEP + r"(?=[A-Z]*\d)(?=\d*[A-Z])[A-Z0-9]{5,}\b")
_QUOTES = {'"': '"', "'": "'", "“": "”"}
_JSON_KEY_AFTER = lazy_regex(r"[\"'”]\s*:")
#: A JSON number under an id key that reads as an id ("order_id": 58392011).
_ID_NUMBER = lazy_regex(r"\d{5,}")


def _is_id_key(key: str) -> bool:
    return bool(_ID_KEY_SUFFIX().search(key.lower()) or _ID_KEY_CAMEL().search(key))


def _cued(text: str, start: int) -> bool:
    """A code-naming word ("reservation", "order no.", "PNR", "#") right before ``start``."""
    return bool(_ID_CUE().search(text, max(0, start - 60), start))


def _quoted(text: str, start: int, end: int) -> bool:
    """``text[start:end]`` is a whole quoted string (a JSON list item, a quoted code), not a
    key (``"RATES": ...``)."""
    if start == 0 or end >= len(text):
        return False
    close = _QUOTES.get(text[start - 1])
    return close is not None and text[end] == close and not _JSON_KEY_AFTER().match(text, end)


def _is_range(first: str, second: str) -> bool:
    """``10-22``, ``1000-2000``: two numbers of the same width, ascending."""
    return len(first) == len(second) and int(first) < int(second)


def _number_is_identifier(number: regex.Match[str], text: str, start: int, end: int) -> bool:
    """A plain number (at most one separator, no letters) is an amount, a range or a decimal
    unless it is long (7+ digits: a phone, account or order number; a hyphenated pair that is
    not a range), named as a code ("order 58392", "#58392") or quoted (a JSON string: amounts
    are JSON numbers)."""
    first, separator, second = number.group(1), number.group(2), number.group(3) or ""
    if separator in (".", ","):
        return False
    if len(first) + len(second) >= _LONG_NUMBER_DIGITS and not (
        separator and _is_range(first, second)
    ):
        return True
    return _cued(text, start) or _quoted(text, start, end)


def _caps_is_code(text: str, start: int, end: int, quoted_codes: bool, last_code: int) -> bool:
    """An upper-case word is a code (``HXDUBJ``) rather than a word or a constant (``RATES``)
    when something says so: a code-naming word before it, quotes around it (unless it is the
    value of a non-id JSON key), or a list of codes it belongs to."""
    if _cued(text, start) or (quoted_codes and _quoted(text, start, end)):
        return True
    if last_code >= 0 and _BETWEEN_CODES().fullmatch(text, last_code, start):
        return True
    return bool(_NEXT_CODE().match(text, end, min(len(text), end + 40)))


def _token_is_identifier(
    text: str, start: int, end: int, *, quoted_codes: bool = True, last_code: int = -1
) -> bool:
    token = text[start:end]
    if len(token) < 5:
        return False
    if any(c.isdigit() for c in token):
        number = _PLAIN_NUMBER().fullmatch(token)
        if number:
            return _number_is_identifier(number, text, start, end)
        return not (_WORD_PLUS_DIGIT().fullmatch(token) or _DIGIT_PLUS_WORD().fullmatch(token))
    if token.isupper() and token.replace("_", "").isalpha():
        if token in _CAPS_STOPWORDS or token.startswith("_"):
            return False
        return _caps_is_code(text, start, end, quoted_codes, last_code) and not _shouted(
            text, start, end
        )
    return False


_CAPS_WORDS_BEFORE = lazy_regex(r"(?:\b[A-Z]+[ \t]+){1,2}$")
_CAPS_WORDS_AFTER = lazy_regex(r"(?:[ \t]+[A-Z]+\b){1,2}")
_CAPS_WORD = lazy_regex(r"[A-Z]+")


def _shouted(text: str, start: int, end: int) -> bool:
    """An upper-case word inside a run of three or more space-separated upper-case words ("JUST
    DOING IT") is shouting, not a code (a comma-separated list of codes is not a run). Only
    letter-only words are judged; codes with digits always count."""
    word = text[start:end]
    if not word.isalpha():
        return False
    before = _CAPS_WORDS_BEFORE().search(text[max(0, start - 40) : start])
    after = _CAPS_WORDS_AFTER().match(text, end, min(len(text), end + 40))
    run = 1
    run += len(_CAPS_WORD().findall(before.group())) if before else 0
    run += len(_CAPS_WORD().findall(after.group())) if after else 0
    return run >= 3


def _path_is_identifier(path: str) -> bool:
    if not any(c.isalpha() for c in path):
        return False
    if path.startswith(("/", "~/", "./", "../")):
        segments = [s for s in path.split("/") if s and s not in (".", "..", "~")]
        return len(segments) >= 2 or bool(_HAS_EXTENSION().search(path.rstrip("/")))
    return bool(_HAS_EXTENSION().search(path))


def _scan(
    text: str,
    pattern: regex.Pattern[str],
    out: dict[str, None],
    start: int = 0,
    end: int | None = None,
    *,
    quoted_codes: bool = True,
    state: list[int] | None = None,
) -> None:
    """Identifiers of ``text[start:end]`` into ``out``. The whole ``text`` is context (a cue word
    before a code, quotes around it); ``state[0]`` is where the last code ended (lists of
    codes)."""
    state = state if state is not None else [-1]
    for match in pattern.finditer(text, start, len(text) if end is None else end):
        kind = match.lastgroup
        whole = match.group()
        if kind == "kv":
            key = match.group("key")
            value = match.group("val")
            if value is None:
                # A JSON number: under an id key an id ("order_id": 58392011), else a quantity.
                number = match.group("num")
                if _is_id_key(key) and _ID_NUMBER().fullmatch(number):
                    out.setdefault(number, None)
                else:
                    _scan(text, _SCAN_TOKENS(), out, match.start(), match.start("num"), state=state)
                continue
            value = value.strip()
            if (
                _is_id_key(key)
                and len(value) >= 3
                and not any(c.isspace() for c in value)
                and "," not in value
                and not (_PLAIN_NUMBER().fullmatch(value) and len(value) < 5)
            ):
                out.setdefault(value, None)
                state[0] = match.end("val")
            else:
                _scan(
                    text,
                    _SCAN_NO_KV(),
                    out,
                    match.start(),
                    match.end(),
                    quoted_codes=False,
                    state=state,
                )
        elif kind in ("datetime", "url", "email"):
            out.setdefault(whole.rstrip(_TRAILING_PUNCT), None)
        elif kind == "winpath":
            value = whole.rstrip(_TRAILING_PUNCT)
            if len(value) > 3:
                out.setdefault(value, None)
        elif kind == "path":
            value = whole.rstrip(_TRAILING_PUNCT)
            if _path_is_identifier(value):
                out.setdefault(value, None)
            elif _NUMERIC_DATE().fullmatch(value):
                out.setdefault(value, None)
            else:
                _scan(
                    text,
                    _SCAN_TOKENS(),
                    out,
                    match.start(),
                    match.end(),
                    quoted_codes=quoted_codes,
                    state=state,
                )
        elif kind == "flight":
            if whole[:2] in _NOT_AIRLINES:  # "AM 10", "OK 200": read as ordinary tokens
                _scan(
                    text,
                    _SCAN_WORDS(),
                    out,
                    match.start(),
                    match.end(),
                    quoted_codes=quoted_codes,
                    state=state,
                )
                continue
            out.setdefault(whole, None)
            state[0] = match.end()
        elif _token_is_identifier(
            text, match.start(), match.end(), quoted_codes=quoted_codes, last_code=state[0]
        ):
            out.setdefault(whole, None)
            state[0] = match.end()


def extract_identifiers(text: str) -> list[str]:
    """Identifiers worth carrying verbatim, deduplicated, in first-seen order.

    Kept: tokens of 5+ characters mixing letters and digits (user ids ``mia_li_3668``, payment
    ids, flight numbers ``HAT136``, ``RES-47133``, versions ``v1.2.3``), flight numbers with a
    two-letter airline code (``LH 716``, ``LH716``), dates (``2024-05-20``, ``05/20/2024``, ISO
    date-times), e-mail addresses, URLs, file paths (``/etc/x.conf``, ``C:\\x``, ``src/a/b.py``),
    numbers of 7+ digits (phone, account and order numbers), shorter ones of 5+ digits only when
    named as a code ("order 58392", "#58392", ``订单号58392``) or quoted (a JSON string), upper-case
    codes of 5+ letters only when named as a code ("reservation HXDUBJ", "PNR: QWERTY"), quoted
    (``["HXDUBJ", ...]``) or listed with other codes, and the values of id-like JSON keys
    (``"reservation_id": "ABC123"``, ``"order_id": 58392``). Not kept: ordinary words, amounts
    and ranges (``12000``, ``10-22``, ``3.14``, a JSON number under a key such as ``amount``),
    times (``06:00``), upper-case words that are shouting or constants (``RATES``), words with
    one trailing digit (``address1``) and counts with their unit (``7-day``)."""
    found: dict[str, None] = {}
    if text:
        _scan(text, _SCAN_ALL(), found)
    return list(found)


# --- parsing a model's answer -----------------------------------------------------------------

_FENCE = lazy_regex(r"(?s)```[A-Za-z0-9_-]*[ \t]*\n?(.*?)(?:```|\Z)")
_TRAILING_COMMA = lazy_regex(r",\s*([}\]])")
_FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "summary": ("summary", "summary_text", "long_term_summary"),
    "conversation_goal": ("conversation_goal", "goal", "user_goal"),
    "stable_facts": ("stable_facts", "facts", "key_facts"),
    "user_profile": ("user_profile", "user_preferences", "preferences", "profile", "user_facts"),
    "decisions": ("decisions", "resolved_points", "resolved", "conclusions"),
    "open_questions": ("open_questions", "pending_questions", "questions", "unresolved"),
    "in_progress_tasks": ("in_progress_tasks", "tasks", "unfinished_tasks", "pending_tasks"),
    "timeline": ("timeline", "events", "event_timeline"),
    "retrieval_hints": ("retrieval_hints", "keywords", "hints"),
    "identifiers": ("identifiers", "ids", "entities"),
    "pinned_facts": ("pinned_facts",),
}
_KNOWN_KEYS = frozenset(k for aliases in _FIELD_ALIASES.values() for k in aliases)


def _json_objects(text: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    for candidate in (text, _TRAILING_COMMA().sub(r"\1", text)):
        start = candidate.find("{")
        tries = 0
        while start != -1 and tries < 50:
            tries += 1
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except ValueError:
                start = candidate.find("{", start + 1)
                continue
            if isinstance(value, dict):
                found.append(value)
                return found
            start = candidate.find("{", start + 1)
    return found


def _outermost_object(text: str) -> dict[str, Any] | None:
    sources = [m.group(1) for m in _FENCE().finditer(text)] + [text]
    for source in sources:
        objects = _json_objects(source)
        if objects:
            return objects[0]
    return None


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(v.strip() for v in value if v.strip())
    return None


def _as_item(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return _one_line(value) or None
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        parts = [(k, _as_item(v)) for k, v in value.items()]
        parts = [(k, v) for k, v in parts if v]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0][1]
        return "; ".join(f"{k}: {v}" for k, v in parts)
    return None


def _as_items(value: Any) -> list[str] | None:
    if value is None:
        return []
    if not isinstance(value, list):
        value = [value]
    items: list[str] = []
    for entry in value:
        for leaf in entry if isinstance(entry, list) else [entry]:
            item = _as_item(leaf)
            if item:
                items.append(item)
    if value and not items and not all(v in ("", None) or v == [] for v in value):
        return None
    return items


def _pick(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if key in data and data[key] not in (None, "", []):
            return data[key]
    return None


def _as_tasks(value: Any) -> list[InProgressTask] | None:
    if value is None:
        return []
    if not isinstance(value, list):
        value = [value]
    tasks: list[InProgressTask] = []
    for entry in value:
        if isinstance(entry, str):
            if entry.strip():
                tasks.append(InProgressTask(goal=_one_line(entry)))
        elif isinstance(entry, dict):
            goal = _as_item(_pick(entry, "goal", "task", "title", "name", "description")) or ""
            done = _as_items(_pick(entry, "done", "completed", "finished")) or []
            todo = (
                _as_items(
                    _pick(entry, "todo", "to_do", "pending", "remaining", "next", "next_steps")
                )
                or []
            )
            if goal or done or todo:
                tasks.append(InProgressTask(goal=goal, done=done, todo=todo))
    if value and not tasks:
        return None
    return tasks


_WHEN_PREFIX = lazy_regex(r"(?s)^\s*\[([^\]]{1,40})\]\s*(.+)$|^\s*([^:：]{1,40}?)\s*[:：]\s+(.+)$")


def _as_timeline(value: Any) -> list[TimelineEvent] | None:
    if value is None:
        return []
    if not isinstance(value, list):
        value = [value]
    events: list[TimelineEvent] = []
    for entry in value:
        if isinstance(entry, str):
            text = entry.strip()
            if not text:
                continue
            match = _WHEN_PREFIX().match(text)
            when = event = ""
            if match:
                when = (match.group(1) or match.group(3) or "").strip()
                event = (match.group(2) or match.group(4) or "").strip()
            if when and any(c.isdigit() for c in when):
                events.append(TimelineEvent(when=when, event=_one_line(event)))
            else:
                events.append(TimelineEvent(event=_one_line(text)))
        elif isinstance(entry, dict):
            when = _as_item(_pick(entry, "when", "date", "time", "timestamp")) or ""
            event = _as_item(_pick(entry, "event", "what", "description", "text", "summary")) or ""
            if when or event:
                events.append(TimelineEvent(when=when, event=event))
    if value and not events:
        return None
    return events


def _coerce(data: dict[str, Any]) -> SummaryPayload | None:
    fields: dict[str, Any] = {}
    for name, aliases in _FIELD_ALIASES.items():
        raw = _pick(data, *aliases)
        if raw is None:
            continue
        if name in ("summary", "conversation_goal"):
            value: Any = _as_text(raw)
            if name == "conversation_goal" and value is not None:
                value = _one_line(value)
        elif name == "in_progress_tasks":
            value = _as_tasks(raw)
        elif name == "timeline":
            value = _as_timeline(raw)
        else:
            value = _as_items(raw)
        if value:
            fields[name] = value
    if not fields:
        return None
    return SummaryPayload(**fields)


def parse_summary_output(text: str) -> SummaryPayload | None:
    """A model's answer parsed into a payload, tolerantly: code fences are stripped, the outermost
    JSON object is taken, seed-002 field names (``user_preferences``, ``resolved_points``,
    ``pending_questions``) are accepted as aliases, a string where a list belongs becomes a
    one-item list, and tasks / timeline entries may be plain strings. A field whose value cannot
    be read is left empty. ``None`` when there is no JSON object or no field of it carries
    anything usable."""
    if not text or "{" not in text:
        return None
    data = _outermost_object(text)
    if data is None:
        return None
    if not (_KNOWN_KEYS & data.keys()):
        nested = [v for v in data.values() if isinstance(v, dict) and _KNOWN_KEYS & v.keys()]
        if len(nested) != 1:
            return None
        data = nested[0]
    return _coerce(data)


# --- the plain-text gate ----------------------------------------------------------------------

_REFUSAL_ANYWHERE = lazy_regex(
    r"\bI(?:'m| am) (?:sorry|afraid),? but\b"
    r"|\bI (?:can(?:no|')t|can not|won't|will not|am unable to|'m unable to) "
    r"(?:help|assist|comply|provide|do that|fulfil+|complete|summari[sz]e|continue)\b"
    r"|\bAs an AI\b|\bAs a (?:large )?language model\b"
    r"|作为一个?(?:AI|ai|人工智能|语言模型|大语言模型|AI助手)"
    r"|我(?:无法|不能|没法)(?:提供|协助|帮助|帮你|完成|回答|满足|处理|总结|继续)",
)
_REFUSAL_START = lazy_regex(
    r"(?i)^(?:I(?:'m| am) sorry|Sorry\b|I apologi[sz]e|I (?:cannot|can't|can not|won't)\b"
    r"|I(?:'m| am) (?:unable|not able)\b|Unfortunately,? I\b"
    r"|抱歉|很抱歉|对不起|非常抱歉|我无法|我不能|很遗憾)"
)
_ERROR_DUMP = lazy_regex(
    r"(?im)^(?:error|exception|fatal|traceback)\b\s*[:(\[]?"
    r"|Traceback \(most recent call last\)"
    r"|^\s*[A-Za-z_.]*(?:Error|Exception): "
    r"|^\s*\{\s*\"error\"\s*:"
    r"|^\s*<(?:!doctype|html)\b"
    r"|^\s*(?:HTTP/\d(?:\.\d)? )?[45]\d\d (?:[A-Z][a-z]+ ?)+$"
)


def refusal_reason(text: str) -> str | None:
    """Why ``text`` reads as a refusal (English or Chinese), or ``None``. Apologies only count at
    the start; unambiguous phrases ("As an AI", "I can't help", "我无法提供") anywhere in the
    first 300 characters."""
    head = text.lstrip(" \t\r\n*#>-\"'“「").strip()[:300]
    match = _REFUSAL_START().match(head) or _REFUSAL_ANYWHERE().search(head)
    if match:
        return f"refusal: {match.group()!r}"
    return None


def _error_reason(text: str) -> str | None:
    match = _ERROR_DUMP().search(text.strip()[:2000])
    if match:
        return f"error output: {_one_line(match.group())[:60]!r}"
    return None


def plain_text_gate(text: str, previous: SummaryPayload | None) -> str | None:
    """Why plain (non-JSON) summarizer output must be rejected, or ``None`` to accept it: it must
    be non-empty, not a refusal, not an error dump, and keep every identifier of ``previous``."""
    if not text or not text.strip():
        return "empty output"
    reason = refusal_reason(text) or _error_reason(text)
    if reason:
        return reason
    if previous is not None:
        lost = [i for i in previous.identifiers if i not in text]
        if lost:
            shown = ", ".join(lost[:5])
            more = f" (+{len(lost) - 5} more)" if len(lost) > 5 else ""
            return f"lost identifiers: {shown}{more}"
    return None


def payload_from_text(text: str, previous: SummaryPayload | None) -> SummaryPayload:
    """Accepted plain text as a payload: the text is the summary, identifiers are those of
    ``previous`` (the gate checked they are in the text, and their recorded sources stay)
    followed by the ones found in it, and ``previous``'s pinned facts are kept."""
    prior = list(previous.identifiers) if previous else []
    identifiers = list(dict.fromkeys(prior + extract_identifiers(text)))
    return SummaryPayload(
        summary=text.strip(),
        identifiers=identifiers,
        pinned_facts=list(previous.pinned_facts) if previous else [],
        identifier_sources=_group_sources(identifiers, _sources_of(previous)) if previous else {},
    )


# --- caps -------------------------------------------------------------------------------------


def _cap_items(items: list[str], count: int, chars: int) -> list[str]:
    """The newest ``count`` distinct non-empty items, each cut to ``chars``; a repeated item keeps
    its newest position."""
    cut = [_cut(_one_line(i), chars) for i in items]
    cut = [i for i in cut if i]
    newest_first = list(dict.fromkeys(reversed(cut)))
    return list(reversed(newest_first[:count])) if count > 0 else []


def apply_caps(payload: SummaryPayload, caps: PayloadCaps) -> SummaryPayload:
    """``payload`` within ``caps``: every list keeps its newest ``list_items`` items (the timeline
    ``timeline_items``, identifiers the last ``identifiers``: see the ordering convention above),
    duplicates removed, each item cut to ``item_chars`` without splitting a grapheme; the goal is
    cut to ``goal_chars`` and the summary to ``summary_chars`` (oldest lines first). Identifiers
    are never cut (a cut identifier is a wrong one): one longer than ``item_chars`` is dropped.
    When the payload records where its identifiers came from (``identifier_sources``), they are
    first ordered by source, stably: tool-result ones, then assistant (and unrecorded) ones, then
    the ones a tool call used, then the ones the user typed, so the cap drops the least trusted
    first.
    Pinned facts are kept whole and never dropped."""
    n, chars = caps.list_items, caps.item_chars
    fields: dict[str, Any] = {
        name: _cap_items(getattr(payload, name), n, chars) for name in _LIST_FIELDS
    }
    tasks = [
        InProgressTask(
            goal=_cut(_one_line(t.goal), chars),
            done=_cap_items(t.done, n, chars),
            todo=_cap_items(t.todo, n, chars),
        )
        for t in payload.in_progress_tasks
    ]
    tasks = [t for t in tasks if t.goal or t.done or t.todo]
    timeline: list[TimelineEvent] = []
    seen: set[tuple[str, str]] = set()
    for event in reversed(payload.timeline):
        item = TimelineEvent(
            when=_cut(_one_line(event.when), chars), event=_cut(_one_line(event.event), chars)
        )
        key = (item.when, item.event)
        if (item.when or item.event) and key not in seen:
            seen.add(key)
            timeline.append(item)
    identifiers = [i.strip() for i in payload.identifiers]
    identifiers = [i for i in identifiers if i and len(i) <= chars]
    identifiers = list(reversed(list(dict.fromkeys(reversed(identifiers)))))
    sources = _sources_of(payload)
    if sources:
        # Stable: within a tier the list's own order (oldest first) stays.
        identifiers.sort(key=lambda i: _source_tier(sources.get(i)))
    kept = identifiers[max(0, len(identifiers) - caps.identifiers) :] if caps.identifiers else []
    return SummaryPayload(
        summary=_fit_lines(payload.summary, caps.summary_chars),
        conversation_goal=_cut(_one_line(payload.conversation_goal), caps.goal_chars),
        in_progress_tasks=tasks[-n:],
        timeline=list(reversed(timeline[: caps.timeline_items])),
        identifiers=kept,
        pinned_facts=list(payload.pinned_facts),
        identifier_sources=_group_sources(kept, sources),
        **fields,
    )


# --- rendering --------------------------------------------------------------------------------

_HEADINGS = {
    "en": {
        "sep": ": ",
        "item_sep": "; ",
        "conversation_goal": "Goal",
        "summary": "Summary",
        "pinned_facts": "Pinned facts",
        "user_profile": "User profile",
        "stable_facts": "Facts",
        "decisions": "Decisions",
        "in_progress_tasks": "In progress",
        "open_questions": "Open questions",
        "timeline": "Timeline",
        "identifiers": "Identifiers",
        "retrieval_hints": "Keywords",
        "done": "done",
        "todo": "to do",
    },
    "zh": {
        "sep": "：",
        "item_sep": "；",
        "conversation_goal": "目标",
        "summary": "摘要",
        "pinned_facts": "置顶事实",
        "user_profile": "用户信息",
        "stable_facts": "已确认事实",
        "decisions": "已有结论",
        "in_progress_tasks": "进行中任务",
        "open_questions": "待解决问题",
        "timeline": "时间线",
        "identifiers": "标识符",
        "retrieval_hints": "检索关键词",
        "done": "已完成",
        "todo": "待办",
    },
}


def render_payload(payload: SummaryPayload, lang: str = "en") -> str:
    """The payload as compact text (this is what is injected and counted): one heading per
    non-empty section, in English or Chinese (``lang`` starting with ``zh``); identifiers and
    keywords on one line each. An empty payload renders as ``""``."""
    h = _HEADINGS["zh" if lang.lower().startswith("zh") else "en"]
    sep, item_sep = h["sep"], h["item_sep"]
    out: list[str] = []

    def bullets(name: str, items: list[str]) -> None:
        lines = [f"- {_one_line(i)}" for i in items if i.strip()]
        if lines:
            out.append(f"{h[name]}{sep.rstrip()}")
            out.extend(lines)

    goal = _one_line(payload.conversation_goal)
    if goal:
        out.append(f"{h['conversation_goal']}{sep}{goal}")
    summary = payload.summary.strip()
    if summary:
        out.append(
            f"{h['summary']}{sep}{summary}"
            if "\n" not in summary
            else f"{h['summary']}{sep.rstrip()}\n{summary}"
        )
    bullets("pinned_facts", payload.pinned_facts)
    bullets("user_profile", payload.user_profile)
    bullets("stable_facts", payload.stable_facts)
    bullets("decisions", payload.decisions)
    tasks = []
    for task in payload.in_progress_tasks:
        line = _one_line(task.goal)
        done = item_sep.join(_one_line(d) for d in task.done if d.strip())
        todo = item_sep.join(_one_line(t) for t in task.todo if t.strip())
        if done:
            line += f" ({h['done']}{sep}{done})"
        if todo:
            line += f" ({h['todo']}{sep}{todo})"
        if line.strip():
            tasks.append(line.strip())
    bullets("in_progress_tasks", tasks)
    bullets("open_questions", payload.open_questions)
    events = [
        (f"[{_one_line(e.when)}] " if e.when.strip() else "") + _one_line(e.event)
        for e in payload.timeline
    ]
    bullets("timeline", events)
    for name in ("identifiers", "retrieval_hints"):
        items = [i.strip() for i in getattr(payload, name) if i.strip()]
        if items:
            out.append(f"{h[name]}{sep}{', '.join(items)}")
    return "\n".join(out)


# --- fitting a token budget -------------------------------------------------------------------

_ORDERED_LISTS = (
    "timeline",
    "stable_facts",
    "decisions",
    "in_progress_tasks",
    "open_questions",
    "user_profile",
)


def _materialize(base: SummaryPayload, state: dict[str, int]) -> SummaryPayload:
    def tail(items: list[Any], keep: int) -> list[Any]:
        return list(items[len(items) - keep :]) if keep > 0 else []

    identifiers = tail(base.identifiers, state["identifiers"])

    return SummaryPayload(
        summary=_fit_lines(base.summary, state["summary"]),
        conversation_goal=_cut(base.conversation_goal.strip(), state["conversation_goal"]),
        stable_facts=tail(base.stable_facts, state["stable_facts"]),
        user_profile=tail(base.user_profile, state["user_profile"]),
        decisions=tail(base.decisions, state["decisions"]),
        open_questions=tail(base.open_questions, state["open_questions"]),
        in_progress_tasks=[
            t.model_copy(deep=True)
            for t in tail(base.in_progress_tasks, state["in_progress_tasks"])
        ],
        timeline=[e.model_copy() for e in tail(base.timeline, state["timeline"])],
        retrieval_hints=tail(base.retrieval_hints, state["retrieval_hints"]),
        identifiers=identifiers,
        # Pinned facts are dropped from the newest end: only the last resort gets here.
        pinned_facts=list(base.pinned_facts[: state["pinned_facts"]]),
        identifier_sources=_group_sources(identifiers, _sources_of(base)),
    )


def _reduction_states(base: SummaryPayload) -> list[dict[str, int]]:
    """Ever smaller versions of ``base`` as keep-counts / character limits, in sacrifice order:
    keywords; then every list down to a few newest items and the summary to half; then the lists
    entirely; the summary; the goal; identifiers (lowest priority first); pinned facts last."""
    state = {
        name: len(getattr(base, name))
        for name in (*_ORDERED_LISTS, "retrieval_hints", "identifiers", "pinned_facts")
    }
    state["summary"] = len(base.summary.strip())
    state["conversation_goal"] = len(base.conversation_goal.strip())
    states = [dict(state)]

    def shrink_list(name: str, floor: int) -> None:
        while state[name] > floor:
            state[name] -= 1
            states.append(dict(state))

    def shrink_text(name: str, floor: int) -> None:
        length = state[name]
        step = max(8, -(-length // 48))
        while length > floor:
            length = max(floor, length - step)
            state[name] = length
            states.append(dict(state))

    shrink_list("retrieval_hints", 0)
    for name in _ORDERED_LISTS:
        shrink_list(name, 1 if name == "in_progress_tasks" else 3)
    shrink_text("summary", state["summary"] // 2)
    for name in _ORDERED_LISTS:
        shrink_list(name, 0)
    shrink_text("summary", 0)
    shrink_text("conversation_goal", 0)
    shrink_list("identifiers", 0)
    shrink_list("pinned_facts", 0)
    return states


def fit_to_budget(
    payload: SummaryPayload,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
    lang: str = "en",
) -> SummaryPayload:
    """``payload`` reduced until ``count_tokens(render_payload(p, lang)) <= budget_tokens``.

    Sacrifice order (see ``_reduction_states``): retrieval keywords, the oldest timeline events,
    facts, decisions, tasks, open questions and profile entries (first down to a few, with the
    summary halved, then entirely), then the summary (oldest lines first), the goal, identifiers
    (from the head of the list: oldest / lowest priority), and as the very last resort pinned
    facts, dropped whole from the newest end. The candidates form one shrinking sequence; a
    binary search over it takes about log2(length) counts. The result always fits, except when
    even the empty rendering does not (``count_tokens("") > budget_tokens``): then the empty
    payload is returned. Always terminates."""
    base = payload.model_copy(deep=True)
    if count_tokens(render_payload(base, lang)) <= budget_tokens:
        return base
    states = _reduction_states(base)
    cache: dict[int, tuple[SummaryPayload, bool]] = {}

    def fits(index: int) -> bool:
        if index not in cache:
            candidate = _materialize(base, states[index])
            cache[index] = (
                candidate,
                count_tokens(render_payload(candidate, lang)) <= budget_tokens,
            )
        return cache[index][1]

    low, high = 1, len(states) - 1  # states[0] (the original) does not fit
    if high < low or not fits(high):
        return SummaryPayload()
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return cache[high][0]
