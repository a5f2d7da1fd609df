"""The identifier scanner: which tokens of a text are identifiers worth carrying verbatim (ids,
codes, flight numbers, dates, addresses, paths), told apart from words, amounts and shouting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .memo import remembered
from .patterns import LazyRegex, lazy_regex

if TYPE_CHECKING:
    import regex

__all__ = ["extract_identifiers", "reads_as_number"]


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
#: Digits and separators only: a date or a date and time as the scanner keeps them
#: (``2024-05-20``, ``05/20/2024``, ``2024-05-04T06:04:48Z``), an account, order or phone
#: number, a postal code.
_DIGITS_ONLY = lazy_regex(
    r"\d+(?:[/.\-]\d+)*(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
)
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
    return list(_identifiers(text))


def _scan_identifiers(text: str) -> tuple[str, ...]:
    found: dict[str, None] = {}
    if text:
        _scan(text, _SCAN_ALL(), found)
    return tuple(found)


_identifiers = remembered(_scan_identifiers)


def reads_as_number(identifier: str) -> bool:
    """``identifier`` is digits and separators only: a date or a date and time
    (``2024-05-20``, ``2024-05-04T06:04:48``), an account, order or phone number, a postal
    code. Unlike a code with letters (``HXDUBJ``, ``credit_card_9525117``, ``HAT136``), whose
    form tells its kind, such a number said nothing but through the label it stood under (a
    birth date, a record's ``created_at``, a ``zip``), which a list of identifiers drops."""
    return bool(_DIGITS_ONLY().fullmatch(identifier))
