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

from ..base import lazy_regex, remembered, validate_patterns
from .secret_patterns import BUILTIN_HINTS, BUILTIN_PATTERNS

if TYPE_CHECKING:
    import regex

__all__ = [
    "BUILTIN_HINTS",
    "BUILTIN_PATTERNS",
    "STDLIB_PASSES",
    "RedactionError",
    "Redactor",
    "fold_for_secrets",
    "may_match",
    "random_looking",
    "secret_span",
]

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
    """The longest prefix of the number that is a card number (13 to 19 digits passing the Luhn
    check): a quantity written after the number ("... 1111 5 items") is not part of it. A
    number in groups is cut between groups only."""
    text = match.group(0)
    sep = match.group("sep")
    if not sep:
        for n in range(min(len(text), 19), 12, -1):
            if _luhn_ok(text[:n]):
                return match.start(), match.start() + n
        return None
    best, digits, end = 0, "", -1
    for group in text.split(sep):
        digits += group
        end += len(group) + 1
        if len(digits) > 19:
            break
        if len(digits) >= 13 and _luhn_ok(digits):
            best = end
    return (match.start(), match.start() + best) if best else None


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


#: Full-width letters, digits and key punctuation (``Ａ``, ``１``, ``＝``), folded to ASCII: a key
#: typed or pasted in full-width form reads the same to a model. Other compatibility forms (the
#: long s ``ſ``, superscripts, Chinese punctuation) stay as they are.
_SECRET_FOLD = {
    code: chr(code - 0xFEE0)
    for code in range(0xFF01, 0xFF5F)
    if chr(code - 0xFEE0).isalnum() or chr(code - 0xFEE0) in "_-+/=.@"
}
#: Invisible format characters (zero-width space and joiners, word joiner, soft hyphen, BOM,
#: direction marks) between two characters of a key: a model reads ``AKIA\u200b...`` as the key.
_INVISIBLE_INSIDE = lazy_regex(r"(?<=[A-Za-z0-9_+/=.-])\p{Cf}+(?=[A-Za-z0-9_+/=.-])")


def fold_for_secrets(text: str) -> str:
    """``text`` as the secret patterns should read it: full-width letters, digits and key
    punctuation folded to ASCII (their NFKC form), and invisible format characters inside a run
    of key characters dropped. Other text (Chinese punctuation, an emoji's zero-width joiner)
    stays as it is."""
    if text.isascii():
        return text
    return _INVISIBLE_INSIDE().sub("", text.translate(_SECRET_FOLD))


_MARKER = "[REDACTED:"


class RedactionError(RuntimeError):
    """A user pattern did not finish in time: the text must not be sent unredacted."""


def _marker(name: str) -> str:
    return f"[REDACTED:{name}]"


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
        #: Short texts' answers remembered: each compression scrubs the previous summary again.
        self._remembered = remembered(self._redact)

    def redact(self, text: str) -> str:
        """``text`` with every match replaced by ``[REDACTED:<name>]`` (only the ``secret``
        group when a pattern has one). Raises :class:`RedactionError` on a pattern timeout."""
        return self._remembered(text)

    def _redact(self, text: str) -> str:
        redacted = self._passes(text)
        # A secret written with invisible characters inside (``AKIA\u200b...``) or in full-width
        # letters reads the same to a model but not to a pattern. When the folded text holds
        # more secrets, the result is the folded text with both the secrets found as written
        # and those found folded redacted; otherwise the text keeps its own characters.
        folded = fold_for_secrets(text)
        if folded == text or self._passes(folded).count(_MARKER) <= redacted.count(_MARKER):
            return redacted
        return self._passes(fold_for_secrets(redacted))

    def _passes(self, text: str) -> str:
        """``text`` through every pass, in order."""
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
