"""Secret redaction: built-in formats, user patterns, no false positives, linear time."""

from __future__ import annotations

import random
import string
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin_memory_summary.redact import (
    BUILTIN_PATTERNS,
    RedactionError,
    Redactor,
    may_match,
    validate_patterns,
)

# Fake secrets assembled at run time so that no scanner mistakes this file for a leak.
OPENAI = "sk-" + "Ab3dE" * 10
OPENAI_PROJECT = "sk-proj-" + "x9_Y-" * 12
ANTHROPIC = "sk-ant-api03-" + "Qw3-e" * 16
AWS_ID = "AKIA" + "IOSFODNN7EXAMPL1"
AWS_STS = "ASIA" + "Z" * 16
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
GITHUB = "ghp_" + "a1B2" * 9
GITHUB_OAUTH = "gho_" + "Z9y8" * 9
GITHUB_APP = "ghs_" + "k7L6" * 9
GITHUB_PAT = "github_pat_" + "11ABCDEFG0" + "_x" * 20
SLACK = "xoxb-" + "1234567890-0987654321-" + "AbCdEfGh"
GOOGLE = "AIza" + "SyA1" * 8 + "bcd"
STRIPE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
STRIPE_RESTRICTED = "rk_live_" + "51H8zXq" * 4
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0"
    + ".dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk"
)
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEA7bq98nQxT9wX0fT1mU3a5Lz6\n"
    "Yq1b2c3d4e5f6g7h8i9j0kLmNoPqRsTuVwXyZ==\n"
    "-----END RSA PRIVATE KEY-----"
)

REDACTOR = Redactor()


def redact(text: str) -> str:
    return REDACTOR.redact(text)


@pytest.mark.parametrize(
    ("secret", "name"),
    [
        (OPENAI, "openai-key"),
        (OPENAI_PROJECT, "openai-key"),
        (ANTHROPIC, "anthropic-key"),
        (AWS_ID, "aws-access-key-id"),
        (AWS_STS, "aws-access-key-id"),
        (GITHUB, "github-token"),
        (GITHUB_OAUTH, "github-token"),
        (GITHUB_APP, "github-token"),
        (GITHUB_PAT, "github-token"),
        (SLACK, "slack-token"),
        (GOOGLE, "google-api-key"),
        (STRIPE, "stripe-key"),
        (STRIPE_RESTRICTED, "stripe-key"),
        (JWT, "jwt"),
        (PEM, "private-key"),
    ],
)
def test_builtin_formats_are_redacted_whole(secret: str, name: str) -> None:
    text = f"here it is: {secret} (keep it safe)"
    assert redact(text) == f"here it is: [REDACTED:{name}] (keep it safe)"


def test_anthropic_key_is_not_reported_as_openai() -> None:
    assert redact(ANTHROPIC) == "[REDACTED:anthropic-key]"


def test_private_key_cut_off_before_its_end_line_is_still_redacted() -> None:
    partial = PEM.rsplit("\n", 2)[0]
    assert redact(partial) == "[REDACTED:private-key]"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter2 ok", "password=[REDACTED:secret-assignment] ok"),
        ("DB_PASSWORD: s3cr3t!", "DB_PASSWORD: [REDACTED:secret-assignment]"),
        ('{"passwd": "correct horse battery"}', '{"passwd": "[REDACTED:secret-assignment]"}'),
        ("client_secret='abc def'", "client_secret='[REDACTED:secret-assignment]'"),
        ("api_key = 12345abcde", "api_key = [REDACTED:secret-assignment]"),
        ("API-KEY:zzz", "API-KEY:[REDACTED:secret-assignment]"),
        ("access_token=tok_123;", "access_token=[REDACTED:secret-assignment];"),
        ("密码：abc123", "密码：[REDACTED:secret-assignment]"),
        (
            f"aws_secret_access_key = {AWS_SECRET}",
            "aws_secret_access_key = [REDACTED:aws-secret-key]",
        ),
        (
            "Authorization: Bearer abcDEF0123456789.xyz_-~+/==",
            "Authorization: Bearer [REDACTED:bearer-token]",
        ),
        (
            "postgres://admin:pa55word@db.internal:5432/app",
            "postgres://admin:[REDACTED:url-credentials]@db.internal:5432/app",
        ),
    ],
)
def test_assignments_redact_the_value_only(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_assignment_of_a_known_key_keeps_the_specific_name() -> None:
    assert redact(f"api_key={OPENAI}") == "api_key=[REDACTED:openai-key]"
    assert redact(f"token: {JWT}") == "token: [REDACTED:jwt]"
    assert redact(f"https://u:{GITHUB}@h") == "https://u:[REDACTED:github-token]@h"


@pytest.mark.parametrize(
    "text",
    [
        "My user id is mia_li_3668.",
        "Use certificate_7504069 and gift_card_7219486, then credit_card_4421486.",
        "Flight HAT136 on 2024-05-20 at 15:00:00 EST, reservation ZFA04Y and 4WQ150.",
        "Payment id: credit_card_4421486",
        "The sk-learn-compatible-estimators package, task-runner-for-the-whole-team.",
        "max_tokens: 512, tokens: 2000, token_budget = 7, summary_token_ratio: 0.05",
        "The bearer of bad news arrived.",
        "The secret to good bread is time.",
        "AKIA is a prefix; AKIA123 is too short.",
        "See https://example.com/path?x=1 and mailto:someone@example.com",
        "eyJ is how base64 JSON starts.",
        "对不起，我的用户名是 mia_li_3668，订单 ZFA04Y。",
    ],
)
def test_ordinary_ids_and_prose_survive(text: str) -> None:
    assert redact(text) == text


def test_every_builtin_pattern_has_a_test_above() -> None:
    tested = {
        "openai-key",
        "anthropic-key",
        "aws-access-key-id",
        "aws-secret-key",
        "github-token",
        "slack-token",
        "google-api-key",
        "stripe-key",
        "jwt",
        "private-key",
        "bearer-token",
        "url-credentials",
        "secret-assignment",
    }
    assert set(BUILTIN_PATTERNS) == tested


def test_user_patterns_are_named_by_position() -> None:
    redactor = Redactor([r"EMP-\d{6}", r"(?i)project\s+bluebird"])
    assert redactor.redact("EMP-123456 works on Project  Bluebird") == (
        "[REDACTED:custom-0] works on [REDACTED:custom-1]"
    )
    assert Redactor().redact("EMP-123456") == "EMP-123456"


def test_user_pattern_with_a_secret_group_redacts_only_that_group() -> None:
    redactor = Redactor([r"pin (?P<secret>\d{4})"])
    assert redactor.redact("my pin 1234 ok") == "my pin [REDACTED:custom-0] ok"


def test_redaction_is_idempotent() -> None:
    text = f"k={OPENAI} password=abc {PEM} Bearer {'q' * 20}"
    once = redact(text)
    assert redact(once) == once
    assert "[REDACTED:" in once


def test_validate_patterns_reports_the_index_and_reason() -> None:
    validate_patterns([r"ok\d+", r"also-ok"])
    with pytest.raises(ValueError, match=r"^redact_patterns\[1\]: invalid regular expression: "):
        validate_patterns([r"fine", r"(unclosed"])
    with pytest.raises(ValueError, match=r"redact_patterns\[0\]: .*empty string"):
        validate_patterns([r"a*"])
    with pytest.raises(ValueError, match=r"redact_patterns\[0\]"):
        Redactor([r"[z-a]"])


def test_a_catastrophic_user_pattern_times_out_instead_of_hanging() -> None:
    redactor = Redactor([r"(a+)+$"], timeout_s=0.05)
    started = time.thread_time()  # CPU time of this thread: other processes' load does not count
    with pytest.raises(RedactionError):
        redactor.redact("a" * 5000 + "!")
    assert time.thread_time() - started < 2


def _noise(size: int) -> str:
    rng = random.Random(1234)
    alphabet = string.ascii_letters + string.digits + " _-=:/+.\n\"'"
    return "".join(rng.choices(alphabet, k=size))


@pytest.mark.parametrize(
    "text",
    [
        _noise(1_000_000),
        "a" * 1_000_000,
        "password=" * 110_000,
        "-----BEGIN PRIVATE KEY-----" * 37_000,
        "sk-" * 330_000,
        "eyJaaaaaa." * 100_000,
        "Bearer " * 140_000,
        "x://a:" * 160_000,
    ],
    ids=["noise", "letters", "assignments", "pem-begins", "sk", "jwt", "bearer", "urls"],
)
def test_one_megabyte_is_redacted_in_under_a_second(text: str) -> None:
    # CPU time of this thread (about 0.2 s here), not wall time: a busy machine makes the wall
    # clock run on while this thread waits, but a pattern that backtracks burns CPU.
    started = time.thread_time()
    REDACTOR.redact(text)
    assert time.thread_time() - started < 1.0


def test_secrets_inside_a_megabyte_are_all_found() -> None:
    text = _noise(500_000) + f" {GITHUB} " + _noise(500_000) + f" {AWS_ID} "
    out = REDACTOR.redact(text)
    assert GITHUB not in out and AWS_ID not in out
    assert "[REDACTED:github-token]" in out and "[REDACTED:aws-access-key-id]" in out


# -- the hint prefilter ----------------------------------------------------------------------------

_SECRETS = [
    OPENAI,
    OPENAI_PROJECT,
    ANTHROPIC,
    AWS_ID,
    AWS_STS,
    GITHUB,
    GITHUB_OAUTH,
    GITHUB_APP,
    GITHUB_PAT,
    SLACK,
    GOOGLE,
    STRIPE,
    STRIPE_RESTRICTED,
    JWT,
    PEM,
]
_FRAGMENTS = [
    *_SECRETS,
    "aws_secret_access_key = " + AWS_SECRET,
    "Bearer abcdefghijklmnop1234",
    "https://user:hunter2@example.com/x",
    "password: 'pa ss'",
    "PASSWORD=x",
    "pwd=x",
    "passwd: y",
    "api_key=z",
    "Secret_Key = q",
    "ſecret=long-s-folds",  # (?i) folds U+017F to "s"
    "API-KEY: v",
    "token = t0k",
    "密码：123",
    "[REDACTED:github-token]",
    "sk-",
    "eyJ",
    "xox",
    "AIza",
    "://",
    "-----BEGIN ",
    "PRIVATE KEY-----",
    " ",
    "\n",
    "=",
    ":",
    "'",
    '"',
    "_",
    "-",
]


def _reference_redact(text: str) -> str:
    """The passes without the prefilter: every built-in pattern, in order, on every text."""
    import regex

    for name, source in BUILTIN_PATTERNS.items():
        pattern = regex.compile(source)

        def replace(match: regex.Match[str], marker: str = f"[REDACTED:{name}]") -> str:
            whole = match.group(0)
            if "secret" not in match.re.groupindex or match.group("secret") is None:
                return marker
            start, end = match.span("secret")
            return whole[: start - match.start()] + marker + whole[end - match.start() :]

        text = pattern.sub(replace, text)
    return text


_texts = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=12)), max_size=12).map(
    "".join
)


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_every_match_of_a_builtin_pattern_holds_one_of_its_hints(text: str) -> None:
    import regex

    folded = text.casefold()
    for name, source in BUILTIN_PATTERNS.items():
        if regex.search(source, text) is not None:
            assert may_match(name, text, folded), (name, text)


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_the_prefilter_changes_no_redaction(text: str) -> None:
    assert Redactor().redact(text) == _reference_redact(text)


def test_a_text_without_hints_runs_no_pattern() -> None:
    redactor = Redactor()
    redactor.redact("warm up")
    text = '{"reservation_id": "ZFA04Y", "status": "confirmed", "cabin": "economy"}' * 50
    calls = []
    for name, pattern in redactor._passes:
        compiled = pattern()

        class Spy:
            def sub(self, *args, _c=compiled, _n=name, **kwargs):  # type: ignore[no-untyped-def]
                calls.append(_n)
                return _c.sub(*args, **kwargs)

        pattern._compiled = Spy()  # type: ignore[assignment]
    assert redactor.redact(text) == text and calls == []
    assert redactor.redact(text + " token=abc") != text and calls == ["secret-assignment"]
