"""Redact secrets before any text leaves for the summarizer.

A summary outlives the messages it covers and is injected into every later prompt, so a key
pasted once into a chat would otherwise be carried forward for good, and sent to a summarizer that
may be another provider. The built-in patterns target formats with a recognisable shape (a
vendor prefix, a fixed length, a PEM armour line, an assignment to a secret-named key) so that
ordinary ids such as ``mia_li_3668`` or ``certificate_7504069`` pass through untouched.

Every pattern is linear: character classes without nested quantifiers, bounded lengths. User
patterns are the user's responsibility, but a timeout stops one that backtracks catastrophically
from hanging a compression.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._patterns import lazy_regex

if TYPE_CHECKING:
    import regex

__all__ = [
    "BUILTIN_HINTS",
    "BUILTIN_PATTERNS",
    "RedactionError",
    "Redactor",
    "may_match",
    "validate_patterns",
]

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
    "secret-assignment": (
        r"(?i)(?<![A-Za-z0-9])"
        r"(?:password|passwd|pwd|secret(?:[_-]?key)?|api[_-]?key|token|密码)"
        r"[\"']?[ \t]{0,10}[:=：][ \t]{0,10}(?!\[REDACTED:)"
        r"(?:\"(?P<secret>[^\"\n]{1,256})\"|'(?P<secret>[^'\n]{1,256})'"
        r"|(?P<secret>[^\s\"',;]{1,256}))"
    ),
}

#: For each built-in pattern, strings one of which every match contains (``casefold``: looked for
#: in the case-folded text, for the case-insensitive patterns). A text holding none of them cannot
#: match, so its pass is skipped: most texts then cost a few substring searches, not a regex pass
#: per pattern. ``tests/test_redact.py`` checks that every match holds one of its pattern's hints.
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
    "secret-assignment": (("password", "passwd", "pwd", "secret", "api", "token", "密码"), True),
}

_TIMEOUT_S = 5.0


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
        named = list(BUILTIN_PATTERNS.items())
        named += [(f"custom-{i}", p) for i, p in enumerate(extra_patterns)]
        self._passes = [(name, lazy_regex(p)) for name, p in named]
        self._timeout_s = timeout_s

    def redact(self, text: str) -> str:
        """``text`` with every match replaced by ``[REDACTED:<name>]`` (only the ``secret``
        group when a pattern has one). Raises :class:`RedactionError` on a pattern timeout."""
        folded: str | None = None
        for name, pattern in self._passes:
            if name in BUILTIN_HINTS:
                if folded is None:
                    folded = text.casefold()
                if not may_match(name, text, folded):
                    continue
            marker = _marker(name)

            def replace(match: regex.Match[str], marker: str = marker) -> str:
                whole = match.group(0)
                if not whole:
                    return whole
                if "secret" not in match.re.groupindex or match.group("secret") is None:
                    return marker
                start, end = match.span("secret")
                offset = match.start()
                return whole[: start - offset] + marker + whole[end - offset :]

            try:
                redacted = pattern().sub(replace, text, timeout=self._timeout_s)
            except TimeoutError as exc:
                raise RedactionError(f"redaction pattern {name} timed out") from exc
            if redacted != text:
                # A marker may hold a later hint (``[REDACTED:github-token]``): fold again.
                text, folded = redacted, None
        return text
