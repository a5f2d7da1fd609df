"""Redact secrets before any text leaves for the summarizer.

A summary outlives the messages it covers and is injected into every later prompt, so a key
pasted once into a chat would otherwise be carried forward for good, and sent to a summarizer that
may be another provider. The built-in patterns target formats with a recognisable shape (a
vendor prefix, a fixed length, a PEM armour line, an assignment to a secret-named key) so that
ordinary ids such as ``mia_li_3668`` or ``certificate_7504069`` pass through untouched.

Secrets given in prose ("my password is hunter2", "PIN: 4821") are found by their cue word, with
a list of ordinary words that keep "the password is required" as it is. Some kinds have no fixed
shape: a pattern finds candidates and a check decides (the Luhn check for card numbers, a value
that decodes to ``user:password`` for a bare ``Basic``, lower case, upper case and digits mixed
with frequent changes for a random token), so that booking references, flight numbers, order
ids, paths, digests and UUIDs stay.

Every pattern is linear: character classes without nested quantifiers, bounded or possessive
repetition. User patterns are the user's responsibility, but a timeout stops one that
backtracks catastrophically from hanging a compression.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._patterns import lazy_regex

if TYPE_CHECKING:
    import regex

__all__ = [
    "BUILTIN_HINTS",
    "BUILTIN_PATTERNS",
    "STDLIB_PASSES",
    "RedactionError",
    "Redactor",
    "may_match",
    "random_looking",
    "secret_span",
    "validate_patterns",
]

#: Words that follow "password is" in ordinary prose ("the password is required"): not secrets.
_NOT_SECRET_WORDS = (
    "required|incorrect|wrong|correct|invalid|valid|expired|too|not|the|a|an|set|reset|changed"
    "|needed|missing|empty|same|different|case|stored|saved|still|being|also|forgotten|lost"
    "|weak|strong|short|long|hidden|encrypted|hashed|protected|sent|shown|visible|known"
    "|unknown|ok|fine|good|bad|that|this|it|in|on|at|for|of|to|your|my|his|her|their|our"
    "|what|how|where|when|why|which|one|now|no|none|null|needed|mandatory|optional|secret"
    "|private|safe|here|there|below|above|attached|updated|incorrectly|please"
)

#: The same for a passphrase, which may well start with an ordinary word ("correct horse ...").
_NOT_PHRASE_WORDS = (
    "required|incorrect|wrong|invalid|expired|too|not|set|reset|changed|needed|missing|empty"
    "|stored|saved|forgotten|lost|weak|strong|short|long|encrypted|hashed|sent|unknown|below"
    "|above|attached|updated|mandatory|optional"
)

# Named group ``secret``: when present only that part is replaced, so the key of an assignment
# (``password=``) stays readable and the summary can still say that a password was given.
BUILTIN_PATTERNS: dict[str, str] = {
    # The body (base64 and ``Proc-Type: ...`` header lines) is matched possessively and cannot
    # contain ``-----``, so a text full of BEGIN lines without an END stays linear; a key cut
    # off before its END line is still redacted.
    "private-key": (
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
        r"(?>[A-Za-z0-9+/=\s]|[A-Za-z-]{1,20}:[^\n]{0,200})*+"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----)?"
    ),
    "anthropic-key": r"(?<![A-Za-z0-9_-])sk-ant-[A-Za-z0-9_-]{20,}",
    # A digit or capital letter is required: real keys are random, slugs such as
    # ``sk-learn-compatible-estimators`` are not.
    "openai-key": (
        r"(?<![A-Za-z0-9_-])sk-(?:proj-|svcacct-|admin-)?"
        r"(?=[A-Za-z0-9_-]*[0-9A-Z])[A-Za-z0-9_-]{20,}"
    ),
    "stripe-key": r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}",
    "aws-access-key-id": r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])",
    "aws-secret-key": (
        r"(?i)aws_?secret(?:_?access)?_?key[\"']?\s{0,10}[:=]\s{0,10}[\"']?"
        r"(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])"
    ),
    "github-token": (
        r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})"
    ),
    "slack-token": r"(?<![A-Za-z0-9-])xox[abprs]-[A-Za-z0-9-]{10,}",
    "google-api-key": r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}(?![A-Za-z0-9_-])",
    "jwt": r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",
    "bearer-token": r"(?i)\bbearer\s{1,10}(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)",
    "url-credentials": r"(?<=://)[^\s/:@]{1,256}:(?!\[REDACTED:)(?P<secret>[^\s/@]{1,256})@",
    # The key may be quoted (JSON) and prefixed (``db_password``, ``client_secret``); the value
    # is taken whole when quoted, up to a delimiter otherwise. A value that is already a
    # redaction marker is left alone so that passes never stack.
    # Tokens with a vendor prefix.
    "huggingface-token": r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}(?![A-Za-z0-9])",
    "gitlab-token": (
        r"(?<![A-Za-z0-9_-])gl(?:pat|dt|rt|ptt|soat|cbt|imt|oas|ffct|agent)-[A-Za-z0-9_-]{20,}"
    ),
    "npm-token": r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])",
    # ``Basic <base64 of user:password>``: after ``Authorization:`` always, elsewhere only when
    # the value decodes to ``user:password`` (so "basic understanding" stays; see the check).
    "basic-auth": (
        r"(?i)(?<![A-Za-z0-9])(?P<header>authorization[\"']?[ \t]{0,10}[:=][ \t]{0,10}[\"']?)?"
        r"basic[ \t]{1,10}(?P<secret>[A-Za-z0-9+/]{4,1024}={0,2})(?![A-Za-z0-9+/=])"
    ),
    # Azure storage / service bus connection strings, and the signature of a SAS URL.
    "azure-key": (
        r"(?i)(?:(?<![A-Za-z0-9])(?:account|shared[_-]?access)key[ \t]{0,10}=[ \t]{0,10}|[?&]sig=)"
        r"(?P<secret>[A-Za-z0-9%+/]{20,1024}(?:=|%3D){0,2})"
    ),
    # Passwords, passphrases and PINs given in prose ("my password is hunter2", "the wifi
    # passphrase is correct horse battery staple", "PIN: 4821"). A value that is an ordinary word
    # ("the password is required") stays. A passphrase runs to the end of its clause.
    "passphrase": (
        r"(?i)(?<![A-Za-z0-9])pass[ \t-]?phrase"
        r"(?:s|[ \t]{1,5}(?![:=]|is\b|was\b)[\w'-]{1,20}){0,4}?"
        r"[\"']?[ \t]{0,5}(?:[:=：]|[ \t](?:is|was|will[ \t]be)\b[ \t]{0,5}:?)[ \t]{0,5}"
        r"(?!\[REDACTED:)(?!(?:" + _NOT_PHRASE_WORDS + r")\b)"
        r"(?:\"(?P<secret>[^\"\n]{1,256})\"|'(?P<secret>[^'\n]{1,256})'"
        r"|“(?P<secret>[^”\n]{1,256})”|(?P<secret>[^\s.;,!?\"“][^\n.;,!?\"“]{0,255}))"
    ),
    "prose-password": (
        r"(?i)(?<![A-Za-z0-9])(?:password|passwd|passcode|pwd)s?"
        r"(?:[ \t]{1,5}(?!is\b|was\b)[\w'-]{1,20}){0,4}?"
        r"[ \t]{1,5}(?:is|was|will[ \t]be|reads)(?:[ \t]{1,5}:?|:)[ \t]{0,5}"
        r"(?!\[REDACTED:)(?!(?:" + _NOT_SECRET_WORDS + r")\b)"
        r"(?:\"(?P<secret>[^\"\n]{1,256})\"|'(?P<secret>[^'\n]{1,256})'"
        r"|“(?P<secret>[^”\n]{1,256})”|(?P<secret>[^\s\"“',;]{0,255}[^\s\"“',;.!?:)]))"
    ),
    # "pin" is also a verb ("pin 1234 Main Street as my address"): in lower case it needs
    # "code", "number", a colon or "is" after it.
    "pin": (
        r"(?i)(?<![A-Za-z0-9])(?:(?-i:PIN)|pin(?=[ \t-]?(?:code|number|no\b)"
        r"|s?(?:[ \t]{1,5}(?:is|was)\b|[ \t]{0,5}[:=#：])))"
        r"(?:[ \t-]?(?:code|number|no\.?))?s?"
        r"(?:[ \t]{1,5}(?:is|was)|[ \t]{0,5}[:=#：])?[ \t]{0,5}:?[ \t]{0,5}"
        r"(?P<secret>\d{4,8})(?!\d|[-/.:]\d)"
    ),
    # The key may be quoted (JSON) and prefixed (``db_password``, ``client_secret``, ``DB_PASS``);
    # the value is taken whole when quoted, up to a delimiter otherwise. A value that is already a
    # redaction marker is left alone so that passes never stack.
    "secret-assignment": (
        r"(?i)(?<![A-Za-z0-9])"
        r"(?:password|passwd|(?<=_)pass|(?-i:PASS)|pwd|secret(?:[_-]?key)?|api[_-]?key|token|密码"
        r"|credentials?|auth[_-]?token|access[_-]?key|private[_-]?key|session[_-]?key"
        r"|signing[_-]?key|encryption[_-]?key)"
        r"[\"']?[ \t]{0,10}[:=：][ \t]{0,10}(?!\[REDACTED:)"
        r"(?:\"(?P<secret>[^\"\n]{1,256})\"|'(?P<secret>[^'\n]{1,256})'"
        r"|(?P<secret>[^\s\"',;]{1,256}))"
    ),
    "email": (
        r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@"
        r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,8}[A-Za-z]{2,24}"
        r"(?![A-Za-z0-9-])"
    ),
    # US social security numbers: dashed (area, group and serial never all-zero, no 666 or 9xx
    # area), or any 9 digits named as one. Two passes: an alternation of both is several times
    # slower than each alone.
    "ssn": r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])",
    "ssn-named": (
        r"(?<![A-Za-z0-9])(?i:ssn|social[ \t]security(?:[ \t](?:number|no\.?))?)"
        r"[^\d\n]{0,20}?(?P<secret>\d{3}[ -]?\d{2}[ -]?\d{4})(?!\d)"
    ),
    # Payment card numbers: 13 to 19 digits, spaced or dashed, that pass the Luhn check (the
    # longest passing prefix is redacted, see the replacer). Major networks start with 2-6, so a
    # millisecond timestamp (1...) stays.
    "card-number": r"(?<![\d-])[2-6](?:[ -]?\d){12,18}(?!\d)",
    # Any other long random-looking token (see the check): upper case, lower case and digits
    # mixed with frequent changes between them, such as an AWS secret access key without its key
    # name. Hex digests, UUIDs, upper-case codes, words, paths and file names stay.
    # A run that goes on after a dot (``name.ext``, ``host.domain``) is never one.
    "high-entropy": (
        r"(?<![A-Za-z0-9_/+=.-])[A-Za-z0-9_/+=-]{20}[A-Za-z0-9_/+=-]*+(?!\.?[A-Za-z0-9_/+=-])"
    ),
}

#: For each built-in pattern, strings one of which every match contains (``casefold``: looked for
#: in the case-folded text, for the case-insensitive patterns). A text holding none of them cannot
#: match, so its pass is skipped: most texts then cost a few substring searches, not a regex pass
#: per pattern. ``tests/test_redact.py`` checks that every match holds one of its pattern's hints.
#: A card number and a random token have no fixed part: those two passes always run.
BUILTIN_HINTS: dict[str, tuple[tuple[str, ...], bool]] = {
    "private-key": (("PRIVATE KEY-----",), False),
    "anthropic-key": (("sk-ant-",), False),
    "openai-key": (("sk-",), False),
    "stripe-key": (("_live_", "_test_"), False),
    "aws-access-key-id": (("AKIA", "ASIA"), False),
    "aws-secret-key": (("secret",), True),
    "github-token": (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"), False),
    "slack-token": (("xox",), False),
    "google-api-key": (("AIza",), False),
    "jwt": (("eyJ",), False),
    "bearer-token": (("bearer",), True),
    "url-credentials": (("://",), False),
    "huggingface-token": (("hf_",), False),
    "gitlab-token": (("gl",), False),
    "npm-token": (("npm_",), False),
    "basic-auth": (("basic",), True),
    "azure-key": (("accountkey", "accesskey", "access_key", "access-key", "sig="), True),
    "passphrase": (("phrase",), True),
    "prose-password": (("passw", "passcode", "pwd"), True),
    "pin": (("pin",), True),
    "secret-assignment": (
        (
            "pass",
            "pwd",
            "secret",
            "api",
            "token",
            "密码",
            "credential",
            "access",
            "private_key",
            "private-key",
            "privatekey",
            "session",
            "signing",
            "encryption",
        ),
        True,
    ),
    "email": (("@",), False),
    "ssn": (("-",), False),
    "ssn-named": (("ssn", "social"), True),
}

_TIMEOUT_S = 5.0

#: Built-in passes run by the standard library's ``re``, several times faster than ``regex`` on
#: these (character-class scans, look-behinds): each is linear, so it needs no timeout. The
#: others use ``regex`` (repeated group names) and run with the timeout.
STDLIB_PASSES = frozenset(
    {"url-credentials", "azure-key", "pin", "email", "card-number", "high-entropy"}
)


class _LazyStdlib:
    """Like :class:`~._patterns.LazyRegex`, compiled by the standard library's ``re``."""

    __slots__ = ("_compiled", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._compiled: Any = None

    def __call__(self) -> Any:
        if self._compiled is None:
            import re

            self._compiled = re.compile(self.pattern)
        return self._compiled

    @property
    def compiled(self) -> bool:
        """Whether the pattern has been compiled yet."""
        return self._compiled is not None


#: Each digit doubled as the Luhn check does, its digits summed ("7" -> 14 -> "5").
_LUHN_DOUBLE = str.maketrans("0123456789", "0246813579")


def _luhn_ok(digits: str) -> bool:
    """The Luhn check, with string operations only (no loop over the digits in Python)."""
    rev = digits[::-1]
    plain, doubled = rev[0::2], rev[1::2].translate(_LUHN_DOUBLE)
    return (sum(plain.encode()) + sum(doubled.encode()) - 48 * len(digits)) % 10 == 0


def _card_span(match: regex.Match[str]) -> tuple[int, int] | None:
    """The longest prefix of the run of digits that is a card number (13 to 19 digits passing
    the Luhn check): a quantity written after the number ("... 1111 5 items") is not part of
    it."""
    text = match.group(0)
    digits = text.replace(" ", "").replace("-", "")[:19]
    # From the left, the Luhn check doubles the digits at even places for an even length, at
    # odd places for an odd length: four sums of string slices per length, no loop per digit.
    even, odd = digits[0::2], digits[1::2]
    even_x2, odd_x2 = even.translate(_LUHN_DOUBLE), odd.translate(_LUHN_DOUBLE)
    for n in range(len(digits), 12, -1):
        k_even, k_odd = (n + 1) // 2, n // 2
        if n % 2 == 0:
            total = sum(even_x2[:k_even].encode()) + sum(odd[:k_odd].encode())
        else:
            total = sum(even[:k_even].encode()) + sum(odd_x2[:k_odd].encode())
        if (total - 48 * n) % 10 == 0:
            if n == len(digits) and len(text) - text.count(" ") - text.count("-") == n:
                return match.span()
            seen = 0
            for end, ch in enumerate(text, start=1):
                seen += ch.isdigit()
                if seen == n:
                    return match.start(), match.start() + end
    return None


_RUNS = _LazyStdlib(r"[a-z]+|[A-Z]+|[0-9]+")
_SEGMENTS = _LazyStdlib(r"[A-Za-z0-9]+")
_DIGIT = _LazyStdlib(r"[0-9]")


#: Only this many characters of a long token are looked at: a longer one is judged by its start.
_SAMPLE = 256


def random_looking(token: str, *, min_changes: float = 0.4) -> bool:
    """Whether ``token`` reads as random key material rather than a word, a code or a path: it
    mixes lower case, upper case and digits, and at least ``min_changes`` of its neighbouring
    letter and digit pairs change class (random base-62 text: about 0.6;
    ``CamelCaseIdentifier2024Name``: 0.31; a path of words: less). Pure hex (digests, UUIDs) and
    upper-case codes have no lower case or no upper case, so they stay."""
    token = token[:_SAMPLE]
    if token.lower() == token or token.upper() == token or _DIGIT().search(token) is None:
        return False
    # Pairs of neighbours within each run of letters and digits, and how many of them change
    # class: one change fewer than the runs of one class.
    segments = _SEGMENTS().findall(token)
    pairs = sum(map(len, segments)) - len(segments)
    changes = len(_RUNS().findall(token)) - len(segments)
    return pairs > 0 and changes >= min_changes * pairs


def _high_entropy_span(match: regex.Match[str]) -> tuple[int, int] | None:
    """A run of token characters that is random-looking key material. A 40-character run of
    the AWS alphabet is held to a lower bar: the documentation's example key ends in
    ``EXAMPLEKEY``."""
    token = match.group(0)
    aws_like = len(token) == 40 and not any(c in token for c in "_-=")
    if random_looking(token, min_changes=0.25 if aws_like else 0.4):
        return match.start(), match.start() + len(token)
    return None


def _basic_auth_span(match: regex.Match[str]) -> tuple[int, int] | None:
    """After ``Authorization:`` any value; elsewhere only one that decodes to ``user:pass``."""
    span = match.span("secret")
    if match.group("header"):
        return span
    value = match.group("secret")
    import base64
    import binascii

    try:
        decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    head, sep, _ = decoded.partition(b":")
    if sep and head and all(32 <= c < 127 for c in decoded):
        return span
    return None


#: Patterns whose match is only a candidate: the function returns the span to replace, or
#: ``None`` to leave the match as it is.
_SPANS: dict[str, Callable[[regex.Match[str]], tuple[int, int] | None]] = {
    "card-number": _card_span,
    "basic-auth": _basic_auth_span,
    "high-entropy": _high_entropy_span,
}


def secret_span(name: str, match: regex.Match[str]) -> tuple[int, int] | None:
    """The span of ``match`` (a match of the pass ``name``) to replace by the marker: the
    ``secret`` group when the pattern has one and it matched, else the whole match; ``None`` when
    the pattern's check says the match is not a secret after all."""
    check = _SPANS.get(name)
    if check is not None:
        return check(match)
    if "secret" in match.re.groupindex and match.group("secret") is not None:
        return match.span("secret")
    return match.span()


def may_match(name: str, text: str, folded: str) -> bool:
    """Whether the pass ``name`` could match ``text`` (``folded`` = ``text.casefold()``): false
    only when the text holds none of the pattern's hints; always true for user patterns."""
    hint = BUILTIN_HINTS.get(name)
    if hint is None:
        return True
    needles, casefold = hint
    haystack = folded if casefold else text
    return any(needle in haystack for needle in needles)


class RedactionError(RuntimeError):
    """A user pattern did not finish in time: the text must not be sent unredacted."""


def _marker(name: str) -> str:
    return f"[REDACTED:{name}]"


def validate_patterns(patterns: Sequence[str]) -> None:
    """Raise ``ValueError("redact_patterns[<i>]: invalid regular expression: <reason>")`` for the
    first pattern that does not compile or that matches the empty string (which would redact
    nothing and everything), so config validation can point at the entry."""
    if not patterns:
        return
    import regex

    for i, pattern in enumerate(patterns):
        try:
            compiled = regex.compile(pattern)
        except (regex.error, TypeError, ValueError) as exc:
            raise ValueError(f"redact_patterns[{i}]: invalid regular expression: {exc}") from None
        if compiled.fullmatch("") is not None:
            raise ValueError(
                f"redact_patterns[{i}]: invalid regular expression: matches the empty string"
            )


class Redactor:
    """Applies the built-in patterns, then the user's (named ``custom-<i>``), in order.

    Each pattern runs as its own pass, most specific first. A later built-in pass never
    re-redacts an earlier marker (its character classes exclude ``[`` or it checks for one), so
    ``api_key=sk-...`` keeps the more telling name ``openai-key``. The patterns are compiled on
    the first :meth:`redact` (the user's are checked at construction).
    """

    def __init__(self, extra_patterns: Sequence[str] = (), *, timeout_s: float = _TIMEOUT_S):
        validate_patterns(extra_patterns)
        #: The user's patterns, as given.
        self.extra_patterns: tuple[str, ...] = tuple(extra_patterns)
        named = list(BUILTIN_PATTERNS.items())
        named += [(f"custom-{i}", p) for i, p in enumerate(extra_patterns)]
        #: The passes, in the order they run: ``(name, accessor of the compiled pattern)``.
        self.passes = [
            (
                name,
                _LazyStdlib(p)
                if name in STDLIB_PASSES and i < len(BUILTIN_PATTERNS)
                else lazy_regex(p),
            )
            for i, (name, p) in enumerate(named)
        ]
        self._timeout_s = timeout_s

    def redact(self, text: str) -> str:
        """``text`` with every match replaced by ``[REDACTED:<name>]`` (only the ``secret``
        group when a pattern has one). Raises :class:`RedactionError` on a pattern timeout."""
        folded: str | None = None
        for name, pattern in self.passes:
            if name in BUILTIN_HINTS:
                if folded is None:
                    folded = text.casefold()
                if not may_match(name, text, folded):
                    continue
            marker = _marker(name)

            def replace(match: regex.Match[str], marker: str = marker, name: str = name) -> str:
                whole = match.group(0)
                if not whole:
                    return whole
                span = secret_span(name, match)
                if span is None:
                    return whole
                offset = match.start()
                return whole[: span[0] - offset] + marker + whole[span[1] - offset :]

            try:
                if isinstance(pattern, _LazyStdlib):
                    redacted = pattern().sub(replace, text)
                else:
                    redacted = pattern().sub(replace, text, timeout=self._timeout_s)
            except TimeoutError as exc:
                raise RedactionError(f"redaction pattern {name} timed out") from exc
            if redacted != text:
                # A marker may hold a later hint (``[REDACTED:github-token]``): fold again.
                text, folded = redacted, None
        return text
