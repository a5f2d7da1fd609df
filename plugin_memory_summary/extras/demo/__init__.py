"""``host-stub demo``: a long, realistic conversation, generated here, deterministically.

:func:`generate_conversation` writes a multi-day chat between a user (Lena) and her assistant:
planning a trip to Japan and Shanghai, and help with her Python project. Facts are stated early
(names, booking references, dates, an allergy, file paths) and asked for again near the end;
tools are called (OpenAI format, with ids) and answer with JSON; some days are partly in
Chinese. The same seed gives the same conversation, byte for byte, on every machine.

:data:`DEMO_CONFIG` is the host config the demo runs with (``host-stub demo --print-config``
shows it; pass a changed copy back with ``--config FILE``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from . import trip
from .words import ACKS, EARLY_FACTS, ERRORS, FACTS, FUNCTIONS, TOOLS, ZH_TURNS, State

__all__ = ["DEMO_CONFIG", "EARLY_FACTS", "FACTS", "TOOLS", "generate_conversation"]

#: The host config of ``host-stub demo``. A small model's context window, so that a few hundred
#: turns need compressing; the plugin's own defaults otherwise.
DEMO_CONFIG = """\
# host-stub demo: the host config the demo runs with.
# Copy it (host-stub demo --print-config > demo.toml), change it, then run
# host-stub demo --config demo.toml

[host]
# A small model's window, so the conversation has to be compressed.
context_window = 8000
reserve_for_reply = 512
system_prompt = "You are Lena's assistant: trip planning, and help with her Python project."

[plugin.memory-summary]
# Compress once 100 messages are active, or when the context reaches 70% of the window (in the
# background; at 90%, before the model call); keep the newest 20 messages verbatim. After each
# key: the plugin's own value, when the key is left out.
threshold = 100                  # default: unset (no message count: the watermarks decide)
keep_recent = 20                 # default: unset (as many as fit the fill target)
auto_compress_threshold = 0.7    # default: 0.85
hard_compress_threshold = 0.9    # default: 0.9
# Without a model (no --model) the offline rules engine writes the summary.
fallback = "rules"               # default: "rules"
"""


# -- coding help, Chinese, small talk ------------------------------------------------------------
def _coding_error(s: State) -> None:
    kind, msg, cause = s.rng.choice(ERRORS)
    fn = s.rng.choice(FUNCTIONS)
    line = s.rng.randrange(12, 140)
    s.user(
        f"Now `{fn}` fails:\n```\nTraceback (most recent call last):\n  File "
        f'"{FACTS["budget_module"]}", line {line}, in {fn}\n{kind}: {msg}\n```\nAny idea?'
    )
    s.assistant(
        f"The {kind} at line {line} of {FACTS['budget_module']} means {cause}. Validate "
        f"the row when you load it, not in `{fn}`: parse amounts with `Decimal`, dates "
        "with `date.fromisoformat`, and fail with a message naming the CSV line. Then add "
        "a test with the bad row so it stays fixed."
    )


def _run_tests(s: State) -> None:
    s.tests_total += s.rng.randrange(0, 3)
    failed = s.rng.choice([0, 0, 1, 2])
    s.user(
        s.rng.choice(
            [
                "Can you run the tests?",
                "Run the test suite again please.",
                "Did that fix it? Run pytest.",
            ]
        )
    )
    failures = [f"tests/test_budget.py::test_{s.rng.choice(FUNCTIONS)}" for _ in range(failed)]
    s.tool(
        "run_tests",
        {"command": "pytest -q", "cwd": FACTS["project"]},
        {
            "passed": s.tests_total - failed,
            "failed": failed,
            "failures": failures,
            "duration_s": round(s.rng.uniform(0.4, 2.5), 2),
        },
    )
    if failed:
        s.assistant(
            f"{s.tests_total - failed} passed, {failed} failed: "
            + ", ".join(failures)
            + ". Let's look at the first one."
        )
    else:
        s.assistant(f"All {s.tests_total} tests pass.")


def _write_code(s: State) -> None:
    fn = s.rng.choice(FUNCTIONS)
    s.user(f"Could you write `{fn}` for {FACTS['budget_module']}? Keep it small.")
    s.assistant(
        f"Here is a small `{fn}`:\n\n```python\ndef {fn}(rows, "
        f'budget=Decimal(\'{FACTS["budget_eur"]}\')):\n    """Amounts in EUR, converted with '
        "RATES.\"\"\"\n    spent = sum(Decimal(r['amount']) * RATES[r['currency']] "
        "for r in rows)\n    return budget - spent\n```\n\nIt reuses "
        "RATES, so yen rows are converted too (the issue #42 fix)."
    )
    s.tool(
        "run_python",
        {"code": f"from tripplanner.budget import {fn}; print({fn}([]))"},
        {"stdout": f"{FACTS['budget_eur']}\n", "stderr": "", "exit_code": 0},
        text="Quick check with an empty expense list:",
    )
    s.assistant(f"With no expenses it returns {FACTS['budget_eur']}, as expected.")


def _chinese(s: State) -> None:
    # The first one gives the Shanghai hotel's confirmation number.
    user, reply = ZH_TURNS[s.rng.randrange(len(ZH_TURNS)) if s.zh_turns else 0]
    s.zh_turns += 1
    s.user(user)
    s.assistant(reply)


def _ack(s: State) -> None:
    s.user(s.rng.choice(ACKS))
    s.assistant(
        s.rng.choice(["You're welcome!", "Anytime.", "Glad it helps.", "Happy to help, just ask."])
    )


_KINDS: list[tuple[Callable[[State], None], int]] = [
    (trip.weather, 8),
    (trip.restaurants, 9),
    (trip.currency, 5),
    (trip.expense, 10),
    (trip.book, 5),
    (trip.train, 5),
    (trip.sightseeing, 9),
    (_coding_error, 8),
    (_run_tests, 8),
    (_write_code, 6),
    (_chinese, 5),
    (_ack, 8),
]


def _recall(s: State) -> None:
    """The last turns ask for what day one said."""
    f = FACTS
    pairs = [
        (
            "Remind me, what was our flight booking reference and flight number out?",
            f"Booking reference {f['booking_ref']}, {f['flight_out']} Frankfurt to Tokyo Haneda on "
            f"{f['flight_out_date']}; back on {f['flight_back']} on {f['flight_back_date']}.",
        ),
        (
            "What's the ryokan booking number again?",
            f"{f['ryokan']} in Kyoto, 8-12 April, booking {f['ryokan_ref']}.",
        ),
        (
            "And how much of the budget is left?",
            f"You have spent {s.spent} EUR of {f['budget_eur']} EUR, so "
            f"{int(f['budget_eur']) - s.spent} EUR are left.",
        ),
        (
            "Last thing: which file had the yen bug, and what was the issue number?",
            f"{f['budget_module']} in {f['project']}, issue {f['issue']}: "
            "totals did not convert yen amounts before summing.",
        ),
    ]
    for user, reply in pairs:
        s.user(user)
        s.assistant(reply)


def generate_conversation(turns: int = 300, seed: int = 7) -> list[dict[str, Any]]:
    """A conversation of ``turns`` user turns (at least 20) in OpenAI format, the same for the
    same arguments."""
    if turns < 20:
        raise ValueError("the demo conversation needs at least 20 turns")
    s = State(rng=random.Random(seed))
    trip.day_one(s)
    kinds = [k for k, _ in _KINDS]
    weights = [w for _, w in _KINDS]
    per_day = max(10, turns // 8)
    while _turns(s.messages) < turns - 4:
        if _turns(s.messages) >= per_day * s.day:
            s.day += 1
            s.user(
                s.rng.choice(
                    [
                        f"Good morning! Day {s.day} of planning.",
                        "Morning, back at it.",
                        "Hi again, I have a few more questions.",
                        "早上好！今天继续吧。",
                    ]
                )
            )
            s.assistant("Welcome back! Where shall we pick up?")
            continue
        s.rng.choices(kinds, weights)[0](s)
    _recall(s)
    return s.messages


def _turns(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m["role"] == "user")
