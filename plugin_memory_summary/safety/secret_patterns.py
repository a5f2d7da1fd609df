"""The built-in secret patterns the redactor runs (see :mod:`.redact`), with the cue words
each needs before it is tried. Every pattern is linear: character classes without nested
quantifiers, bounded or possessive repetition."""

from __future__ import annotations

__all__ = ["BUILTIN_HINTS", "BUILTIN_PATTERNS"]

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
    # A line break may split the header or the payload, or sit next to a dot (a token wrapped
    # to fit a terminal or an e-mail); the signature is taken up to its line's end.
    "jwt": (
        r"(?<![A-Za-z0-9_-])eyJ(?:[A-Za-z0-9_-]|\r?\n[ \t]*){5,}+\.(?:\r?\n[ \t]*)?"
        r"(?:[A-Za-z0-9_-]|\r?\n[ \t]*){5,}+\.(?:\r?\n[ \t]*)?[A-Za-z0-9_-]*"
    ),
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
    # A run of 32 to 128 hex digits (a 128- or 256-bit key) after a key-like name ("API key:",
    # "hmac_key=", "the api key is", "secret_key <hex>"), with or without ":" or "=": the hex
    # has no shape of its own, and the same digits without such a name (a digest) stay.
    "secret-assignment": (
        r"(?i)(?<![A-Za-z0-9])"
        r"(?:(?:password|passwd|(?<=_)pass|(?-i:PASS)|pwd|secret(?:[_-]?key)?|api[_-]?key|token|密码"
        r"|credentials?|auth[_-]?token|access[_-]?key|private[_-]?key|session[_-]?key"
        r"|signing[_-]?key|encryption[_-]?key)"
        r"[\"']?[ \t]{0,10}[:=：][ \t]{0,10}(?!\[REDACTED:)"
        r"(?:\"(?P<secret>[^\"\n]{1,256})\"|'(?P<secret>[^'\n]{1,256})'"
        r"|(?P<secret>[^\s\"',;]{1,256}))"
        r"|(?:(?:api|auth|access|secret|private|master|hmac|signing|encryption|license|licence"
        r"|client|app|session|webhook|account|service|admin|root|shared)[ \t_-]?)?"
        r"(?:key|token|secret)s?[\"']?"
        r"(?:[ \t]{0,10}[:=：][ \t]{0,10}|[ \t]{1,10}(?:(?:is|was)[ \t]{1,10}:?[ \t]{0,5})?)"
        r"[\"']?(?P<secret>[0-9A-Fa-f]{32,128})(?![0-9A-Za-z]))"
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
    # Payment card numbers: 13 to 19 digits, in one run or in groups (the first of four
    # digits) split by one kind of separator (a space, a dash or a dot, the same all along),
    # that pass the Luhn check (the longest passing prefix is redacted, see the replacer; in
    # groups, a prefix of whole groups). Major networks start with 2-6, so a millisecond
    # timestamp (1...) stays, and dates side by side ("2024-05-20 2024-05-21") change
    # separators, so they stay too.
    "card-number": (
        r"(?<![\d.-])[2-6](?:\d{12,18}|\d{3}(?P<sep>[ .-])\d{1,7}(?:(?P=sep)\d{1,7}){1,8})"
        r"(?!\d|[.-]\d)"
    ),
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
            "key",
        ),
        True,
    ),
    "email": (("@",), False),
    "ssn": (("-",), False),
    "ssn-named": (("ssn", "social"), True),
}
