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

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEMO_CONFIG", "EARLY_FACTS", "FACTS", "generate_conversation"]

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
# Compress once 100 messages are active (the plugin's default is 30), or when the context
# reaches 70% of the window (in the background; at 90%, before the model call).
# Keep the newest 20 messages verbatim.
threshold = 100
keep_recent = 20
auto_compress_threshold = 0.7
hard_compress_threshold = 0.9
# Without a model (no --model) the offline rules engine writes the summary.
fallback = "rules"
"""

#: What the user says early and asks for again at the end (the demo's report checks them).
FACTS: dict[str, str] = {
    "name": "Lena Fischer",
    "partner": "Tom",
    "flight_out": "LH 716",
    "flight_out_date": "2025-04-03",
    "booking_ref": "K7XQ2M",
    "flight_back": "MU 219",
    "flight_back_date": "2025-04-17",
    "hotel_tokyo": "Hotel Gracery Shinjuku",
    "hotel_tokyo_ref": "HG-583920",
    "ryokan": "Ryokan Yachiyo",
    "ryokan_ref": "RY-20417",
    "hotel_shanghai_ref": "SH-77130",
    "jr_pass": "JRP-7741-0932",
    "allergy": "peanut",
    "budget_eur": "5200",
    "project": "~/code/tripplanner",
    "budget_module": "tripplanner/budget.py",
    "issue": "#42",
    "colleague": "王磊",
}

#: The facts of the first day that the report looks for in the final summary.
EARLY_FACTS: dict[str, str] = {
    "flight booking reference": FACTS["booking_ref"],
    "outbound flight": FACTS["flight_out"],
    "Tokyo hotel confirmation": FACTS["hotel_tokyo_ref"],
    "ryokan booking": FACTS["ryokan_ref"],
    "JR Pass order": FACTS["jr_pass"],
    "allergy": FACTS["allergy"],
    "budget module": FACTS["budget_module"],
    "project path": FACTS["project"],
}

TOOLS = (
    "get_weather",
    "search_restaurants",
    "convert_currency",
    "book_restaurant",
    "search_trains",
    "run_tests",
    "read_file",
    "run_python",
)

_CITIES = {
    "Tokyo": ("2025-04-03", "2025-04-08"),
    "Kyoto": ("2025-04-08", "2025-04-12"),
    "Osaka": ("2025-04-12", "2025-04-15"),
    "Shanghai": ("2025-04-15", "2025-04-17"),
}
_SIGHTS = {
    "Tokyo": [
        "Senso-ji in Asakusa",
        "teamLab Planets",
        "the Meiji Shrine",
        "Shimokitazawa",
        "the Tsukiji outer market",
        "Yanaka Ginza",
        "the Shibuya Sky deck",
        "Odaiba",
    ],
    "Kyoto": [
        "Fushimi Inari at dawn",
        "the Arashiyama bamboo grove",
        "Kinkaku-ji",
        "the Philosopher's Path",
        "Nishiki market",
        "Gion in the evening",
        "Tofuku-ji",
    ],
    "Osaka": [
        "Dotonbori",
        "Osaka Castle park",
        "the Kuromon market",
        "Shinsekai",
        "the Umeda Sky Building",
        "a day trip to Nara",
    ],
    "Shanghai": [
        "the Bund",
        "Yu Garden",
        "the French Concession",
        "Tianzifang",
        "the Shanghai Museum",
        "Zhujiajiao water town",
    ],
}
_CUISINES = [
    "ramen",
    "sushi",
    "izakaya",
    "tempura",
    "okonomiyaki",
    "vegetarian",
    "udon",
    "yakitori",
    "kaiseki",
    "soup dumplings",
]
_RESTAURANT_WORDS = [
    "Hana",
    "Kaze",
    "Tsuki",
    "Yama",
    "Mori",
    "Sora",
    "Kawa",
    "Hoshi",
    "Umi",
    "Take",
    "Matsu",
    "Kiku",
]
_RESTAURANT_KINDS = ["-tei", " Shokudo", " Ya", "-an", " Kitchen", " Honten"]
_WEATHER = [
    "light rain",
    "clear skies",
    "partly cloudy",
    "overcast",
    "sunny, cherry blossoms at peak",
    "showers in the afternoon",
    "windy and cool",
]
_EXPENSES = [
    ("JR Pass for two", 620),
    ("museum tickets", 38),
    ("pocket Wi-Fi rental", 54),
    ("dinner at an izakaya", 72),
    ("teamLab tickets", 64),
    ("taxi from the station", 23),
    ("kimono rental in Kyoto", 96),
    ("souvenirs", 45),
    ("Shinkansen seat upgrade", 88),
    ("onsen day pass", 31),
    ("cooking class", 140),
    ("coffee and pastries", 14),
]
_FUNCTIONS = [
    "total_spent",
    "daily_budget",
    "convert_to_eur",
    "load_expenses",
    "parse_date",
    "group_by_city",
    "remaining_budget",
    "format_report",
]
_ERRORS = [
    ("KeyError", "'amount'", "an expense row has no 'amount' column"),
    (
        "TypeError",
        "unsupported operand type(s) for +: 'int' and 'str'",
        "amounts are read from the CSV as strings",
    ),
    (
        "ValueError",
        "time data '2025/04/03' does not match format '%Y-%m-%d'",
        "one date uses slashes instead of dashes",
    ),
    ("ZeroDivisionError", "division by zero", "a city with zero planned days"),
    (
        "AttributeError",
        "'NoneType' object has no attribute 'rate'",
        "the exchange-rate cache is empty on the first run",
    ),
    ("AssertionError", "assert 5199.99 == 5200", "a float rounding difference"),
]
_ACKS = [
    "Thanks, that helps!",
    "Perfect, thank you.",
    "Great, noted.",
    "Ok, sounds good.",
    "Nice, thanks!",
    "Got it.",
]


@dataclass
class _State:
    rng: random.Random
    messages: list[dict[str, Any]] = field(default_factory=list)
    spent: int = 0
    bookings: list[str] = field(default_factory=list)
    tests_total: int = 14
    zh_turns: int = 0
    day: int = 1

    def call_id(self) -> str:
        return f"call_{self.rng.getrandbits(64):016x}"

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def assistant(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def tool(self, name: str, args: dict[str, Any], result: Any, text: str | None = None) -> None:
        """An assistant message calling ``name``, then the tool's JSON result."""
        call_id = self.call_id()
        self.messages.append(
            {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            }
        )
        self.messages.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "name": name,
                "content": json.dumps(result, ensure_ascii=False),
            }
        )


# -- day one: the facts ---------------------------------------------------------------------------
def _day_one(s: _State) -> None:
    f = FACTS
    s.user(
        f"Hi! I'm {f['name']}. My partner {f['partner']} and I are going to Japan in April and I'd "
        "like your help planning it over the next weeks. I also have a small Python project I'm "
        "writing for the trip budget, so expect some coding questions too."
    )
    s.assistant(
        "Nice to meet you, Lena! Happy to help with both the trip and the code. To start, tell "
        "me your dates, what you have booked already, and anything I must always keep in mind "
        "(diet, mobility, budget)."
    )
    s.user(
        f"Flights are booked: {f['flight_out']} Frankfurt to Tokyo Haneda on "
        f"{f['flight_out_date']}, booking reference {f['booking_ref']}. We come back from "
        f"Shanghai on {f['flight_back']} on {f['flight_back_date']}, same booking. Important: "
        f"I have a severe {f['allergy']} allergy, so every restaurant suggestion has to be "
        f"{f['allergy']}-safe. Tom is vegetarian."
    )
    s.assistant(
        f"Noted: out on {f['flight_out']} on {f['flight_out_date']}, back on {f['flight_back']} "
        f"on {f['flight_back_date']}, booking reference {f['booking_ref']}. I will only suggest "
        f"places that can handle a severe {f['allergy']} allergy and that have vegetarian dishes "
        "for Tom. I'd also suggest carrying an allergy card in Japanese; I can write one."
    )
    s.user(
        f"Hotels: {f['hotel_tokyo']} from 2025-04-03 to 2025-04-08, confirmation "
        f"{f['hotel_tokyo_ref']}, then {f['ryokan']} in Kyoto until 2025-04-12, booking "
        f"{f['ryokan_ref']}. Osaka and Shanghai are not booked yet. Total budget is "
        f"{f['budget_eur']} EUR for everything except the flights."
    )
    s.assistant(
        f"Got it: Tokyo at {f['hotel_tokyo']} (3-8 April, {f['hotel_tokyo_ref']}), Kyoto at "
        f"{f['ryokan']} (8-12 April, {f['ryokan_ref']}). Still open: Osaka (12-15 April) and "
        f"Shanghai (15-17 April). Budget: {f['budget_eur']} EUR excluding flights; I'll keep a "
        "running total whenever you tell me about an expense."
    )
    s.user(
        f"The code lives in {f['project']}, Python 3.12. The budget logic is in "
        f"{f['budget_module']} and I track bugs on GitHub; the open one is issue {f['issue']} "
        "(totals are off when expenses are in yen). Tests run with `pytest -q`."
    )
    s.tool(
        "read_file",
        {"path": f["budget_module"]},
        {
            "path": f["budget_module"],
            "content": "from decimal import Decimal\n\nRATES = {'EUR': Decimal('1'), 'JPY': "
            "Decimal('0.0061')}\n\ndef total_spent(rows):\n    return sum(r['amount'] "
            "for r in rows)\n",
        },
    )
    s.assistant(
        f"I read {f['budget_module']}. `total_spent` adds the raw amounts without converting "
        "them, so a 12,000 JPY row counts as 12,000 EUR: that is issue #42. Convert each row "
        "with `RATES[row['currency']]` before summing:\n\n```python\ndef total_spent(rows):\n"
        "    return sum(Decimal(r['amount']) * RATES[r['currency']] for r in rows)\n```"
    )
    s.user("我同事王磊在上海工作，我们回国前会在上海见他。他说会帮我们订外滩附近的酒店。")
    s.assistant(
        "好的，我记下了：你们在上海会见你的同事王磊（4月15日到17日），他会帮忙订外滩附近的酒店。"
        "订好以后把确认号告诉我，我一起记下来。"
    )
    s.user(f"Also, we ordered a 7-day JR Pass, order number {f['jr_pass']}. It starts in Kyoto.")
    s.assistant(
        f"Noted: 7-day JR Pass, order {f['jr_pass']}, activated in Kyoto on 8 April, so it "
        "covers Kyoto, the trip to Osaka and day trips until 14 April."
    )


# -- turn kinds ----------------------------------------------------------------------------------
def _city(s: _State) -> str:
    return s.rng.choice(list(_CITIES))


def _restaurant(s: _State) -> str:
    return s.rng.choice(_RESTAURANT_WORDS) + s.rng.choice(_RESTAURANT_KINDS)


def _weather(s: _State) -> None:
    city = _city(s)
    start, end = _CITIES[city]
    day = f"{start[:-2]}{int(start[-2:]) + s.rng.randrange(0, 3):02d}"
    s.user(
        s.rng.choice(
            [
                f"What's the weather looking like in {city} on {day}?",
                f"Can you check the forecast for {city} around {day}?",
                f"Will we need umbrellas in {city} on {day}?",
            ]
        )
    )
    cond = s.rng.choice(_WEATHER)
    hi, lo = s.rng.randrange(14, 24), s.rng.randrange(6, 13)
    s.tool(
        "get_weather",
        {"city": city, "date": day},
        {
            "city": city,
            "date": day,
            "condition": cond,
            "high_c": hi,
            "low_c": lo,
            "rain_probability": round(s.rng.random(), 2),
            "source": "climatology",
        },
    )
    s.assistant(
        f"For {city} on {day} the outlook is {cond}, {lo}-{hi} °C. Pack layers: mornings are "
        f"cool{', and take a compact umbrella' if 'rain' in cond or 'shower' in cond else ''}."
    )


def _restaurants(s: _State) -> None:
    city, cuisine = _city(s), s.rng.choice(_CUISINES)
    s.user(
        s.rng.choice(
            [
                f"Any good {cuisine} places in {city}? Remember the allergy.",
                f"Where should we eat {cuisine} in {city}?",
                f"Find us a {cuisine} dinner spot in {city} for one evening.",
            ]
        )
    )
    found = []
    for _ in range(3):
        found.append(
            {
                "name": _restaurant(s),
                "rating": round(s.rng.uniform(3.8, 4.8), 1),
                "price": s.rng.choice(["¥", "¥¥", "¥¥¥"]),
                "allergen_info": s.rng.choice(
                    ["peanut-free kitchen", "can adapt dishes", "uses peanut oil", "no information"]
                ),
                "vegetarian_options": s.rng.choice([True, True, False]),
            }
        )
    s.tool(
        "search_restaurants",
        {"city": city, "cuisine": cuisine, "avoid": ["peanuts"]},
        {"results": found},
    )
    safe = [
        r
        for r in found
        if r["allergen_info"] in ("peanut-free kitchen", "can adapt dishes")
        and r["vegetarian_options"]
    ]
    if safe:
        best = safe[0]
        s.assistant(
            f"{best['name']} ({best['rating']}★, {best['price']}) looks best: "
            f"{best['allergen_info']} and vegetarian options for Tom. I left out "
            + ", ".join(r["name"] for r in found if r is not best)
            + " because of the peanut risk or no vegetarian dishes. Show them your allergy card "
            "when you order."
        )
    else:
        s.assistant(
            f"None of these is safe enough for a severe peanut allergy with vegetarian "
            f"options; I'd skip {cuisine} in {city} or ask the hotel to call ahead."
        )


def _currency(s: _State) -> None:
    yen = s.rng.choice([3500, 8200, 12000, 15600, 24000, 48000])
    s.user(f"How much is {yen:,} yen in euros today?")
    rate = round(s.rng.uniform(0.0059, 0.0064), 5)
    s.tool(
        "convert_currency",
        {"amount": yen, "from": "JPY", "to": "EUR"},
        {"amount": yen, "from": "JPY", "to": "EUR", "rate": rate, "result": round(yen * rate, 2)},
    )
    s.assistant(f"{yen:,} JPY is about {yen * rate:.2f} EUR at today's rate ({rate}).")


def _expense(s: _State) -> None:
    what, eur = s.rng.choice(_EXPENSES)
    eur = eur + s.rng.randrange(-5, 6)
    s.spent += eur
    s.user(
        s.rng.choice(
            [
                f"We just paid {eur} EUR for {what}.",
                f"Add {eur} EUR for {what}.",
                f"Expense: {what}, {eur} EUR.",
            ]
        )
    )
    left = int(FACTS["budget_eur"]) - s.spent
    s.assistant(
        f"Added {what} ({eur} EUR). Spent so far: {s.spent} EUR of "
        f"{FACTS['budget_eur']} EUR, {left} EUR left."
    )


def _book(s: _State) -> None:
    city = _city(s)
    name = _restaurant(s)
    date = _CITIES[city][0][:-2] + f"{int(_CITIES[city][0][-2:]) + s.rng.randrange(0, 2):02d}"
    s.user(
        f"Please book {name} in {city} for two on {date} at 19:00, and tell them about the allergy."
    )
    ref = f"RES-{s.rng.randrange(10000, 99999)}"
    s.bookings.append(ref)
    s.tool(
        "book_restaurant",
        {
            "restaurant": name,
            "city": city,
            "date": date,
            "time": "19:00",
            "party_size": 2,
            "notes": "severe peanut allergy; one vegetarian",
        },
        {"status": "confirmed", "reservation_id": ref, "restaurant": name, "date": date},
    )
    s.assistant(
        f"Booked: {name}, {city}, {date} at 19:00 for two, reservation {ref}. I added a "
        "note about the severe peanut allergy and the vegetarian guest."
    )


def _train(s: _State) -> None:
    a, b = s.rng.choice(
        [("Tokyo", "Kyoto"), ("Kyoto", "Osaka"), ("Osaka", "Nara"), ("Kyoto", "Himeji")]
    )
    s.user(f"Which trains go from {a} to {b}, and does the JR Pass cover them?")
    options = [
        {
            "train": f"{s.rng.choice(['Hikari', 'Kodama', 'Special Rapid'])} "
            f"{s.rng.randrange(400, 700)}",
            "departs": f"{s.rng.randrange(7, 19):02d}:{s.rng.choice(['03', '18', '33', '48'])}",
            "minutes": s.rng.randrange(15, 160),
            "jr_pass": True,
        }
        for _ in range(2)
    ]
    s.tool("search_trains", {"from": a, "to": b}, {"options": options})
    s.assistant(
        f"Take {options[0]['train']} at {options[0]['departs']} ({options[0]['minutes']} "
        f"min) or {options[1]['train']} at {options[1]['departs']}. Both are covered by "
        f"your JR Pass ({FACTS['jr_pass']}); Nozomi trains are not, avoid those."
    )


def _sightseeing(s: _State) -> None:
    city = _city(s)
    picks = s.rng.sample(_SIGHTS[city], 3)
    s.user(
        s.rng.choice(
            [
                f"Plan a relaxed day in {city} for us?",
                f"What would you do with one free day in {city}?",
                f"We have an afternoon in {city}, ideas?",
            ]
        )
    )
    s.assistant(
        f"A relaxed day in {city}: start with {picks[0]} early, before the crowds. Late morning, "
        f"walk over to {picks[1]} and have lunch nearby (bring the allergy card). In the "
        f"afternoon, {picks[2]}, then an early dinner close to the hotel. Keep the evening free; "
        "jet lag and long walking days add up."
    )


def _coding_error(s: _State) -> None:
    kind, msg, cause = s.rng.choice(_ERRORS)
    fn = s.rng.choice(_FUNCTIONS)
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


def _run_tests(s: _State) -> None:
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
    failures = [f"tests/test_budget.py::test_{s.rng.choice(_FUNCTIONS)}" for _ in range(failed)]
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


def _write_code(s: _State) -> None:
    fn = s.rng.choice(_FUNCTIONS)
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


_ZH_TURNS = [
    (
        "王磊说他帮我们订好了外滩附近的酒店，确认号是 SH-77130，4月15日入住，17日退房。",
        "太好了！我记下了：上海酒店确认号 SH-77130，4月15日入住，4月17日退房，由王磊帮忙预订。",
    ),
    (
        "你能帮我写一张中文的过敏卡吗？我对花生严重过敏。",
        "当然可以：\n「我对花生严重过敏，哪怕一点点花生或花生油都会危及生命。请确认我的菜里完全没有花生、花生油和花生酱。谢谢！」"
        "建议打印两份，一份放钱包，一份放手机壳里。",
    ),
    (
        "在上海我们想吃小笼包，哪里比较好？记得汤姆吃素。",
        "推荐去南翔馒头店（豫园附近）吃小笼包，汤姆可以点素菜包和菌菇汤。点菜时请出示过敏卡，确认不用花生油。",
    ),
    (
        "我们4月16日想去朱家角古镇，怎么去最方便？",
        "从人民广场乘坐沪朱高速快线大约一个小时就能到朱家角。建议早上九点前出发，避开人流，下午四点左右返回市区。",
    ),
    (
        "王磊问我们要不要一起吃晚饭，你觉得4月15日还是16日比较好？",
        "15日你们刚从大阪飞过来，可能比较累，我建议16日晚上和王磊一起吃饭，这样白天还可以去朱家角。",
    ),
    (
        "请帮我用中文给王磊写一条短信，谢谢他帮我们订酒店。",
        "「王磊你好！非常感谢你帮我们订了外滩附近的酒店，确认号 SH-77130 已经收到了。"
        "我们4月15日到上海，16日晚上一起吃饭好吗？期待见面！——Lena」",
    ),
]


def _chinese(s: _State) -> None:
    # The first one gives the Shanghai hotel's confirmation number.
    user, reply = _ZH_TURNS[s.rng.randrange(len(_ZH_TURNS)) if s.zh_turns else 0]
    s.zh_turns += 1
    s.user(user)
    s.assistant(reply)


def _ack(s: _State) -> None:
    s.user(s.rng.choice(_ACKS))
    s.assistant(
        s.rng.choice(["You're welcome!", "Anytime.", "Glad it helps.", "Happy to help, just ask."])
    )


_KINDS: list[tuple[Callable[[_State], None], int]] = [
    (_weather, 8),
    (_restaurants, 9),
    (_currency, 5),
    (_expense, 10),
    (_book, 5),
    (_train, 5),
    (_sightseeing, 9),
    (_coding_error, 8),
    (_run_tests, 8),
    (_write_code, 6),
    (_chinese, 5),
    (_ack, 8),
]


def _recall(s: _State) -> None:
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
    s = _State(rng=random.Random(seed))
    _day_one(s)
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
