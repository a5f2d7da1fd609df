"""The demo conversation's facts, vocabulary and the state its turns are written into."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EARLY_FACTS", "FACTS", "TOOLS", "State"]

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

CITIES = {
    "Tokyo": ("2025-04-03", "2025-04-08"),
    "Kyoto": ("2025-04-08", "2025-04-12"),
    "Osaka": ("2025-04-12", "2025-04-15"),
    "Shanghai": ("2025-04-15", "2025-04-17"),
}
SIGHTS = {
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
CUISINES = [
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
RESTAURANT_WORDS = [
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
RESTAURANT_KINDS = ["-tei", " Shokudo", " Ya", "-an", " Kitchen", " Honten"]
WEATHER = [
    "light rain",
    "clear skies",
    "partly cloudy",
    "overcast",
    "sunny, cherry blossoms at peak",
    "showers in the afternoon",
    "windy and cool",
]
EXPENSES = [
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
FUNCTIONS = [
    "total_spent",
    "daily_budget",
    "convert_to_eur",
    "load_expenses",
    "parse_date",
    "group_by_city",
    "remaining_budget",
    "format_report",
]
ERRORS = [
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
ACKS = [
    "Thanks, that helps!",
    "Perfect, thank you.",
    "Great, noted.",
    "Ok, sounds good.",
    "Nice, thanks!",
    "Got it.",
]


ZH_TURNS = [
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


@dataclass
class State:
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
