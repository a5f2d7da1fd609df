"""The demo's first day (where the facts are stated) and the trip-planning turns."""

from __future__ import annotations

from .words import (
    CITIES,
    CUISINES,
    EXPENSES,
    FACTS,
    RESTAURANT_KINDS,
    RESTAURANT_WORDS,
    SIGHTS,
    WEATHER,
    State,
)

__all__ = [
    "book",
    "currency",
    "day_one",
    "expense",
    "restaurants",
    "sightseeing",
    "train",
    "weather",
]


# -- day one: the facts ---------------------------------------------------------------------------
def day_one(s: State) -> None:
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
def pick_city(s: State) -> str:
    return s.rng.choice(list(CITIES))


def pick_restaurant(s: State) -> str:
    return s.rng.choice(RESTAURANT_WORDS) + s.rng.choice(RESTAURANT_KINDS)


def weather(s: State) -> None:
    city = pick_city(s)
    start, end = CITIES[city]
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
    cond = s.rng.choice(WEATHER)
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


def restaurants(s: State) -> None:
    city, cuisine = pick_city(s), s.rng.choice(CUISINES)
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
                "name": pick_restaurant(s),
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
            + ", ".join(str(r["name"]) for r in found if r is not best)
            + " because of the peanut risk or no vegetarian dishes. Show them your allergy card "
            "when you order."
        )
    else:
        s.assistant(
            f"None of these is safe enough for a severe peanut allergy with vegetarian "
            f"options; I'd skip {cuisine} in {city} or ask the hotel to call ahead."
        )


def currency(s: State) -> None:
    yen = s.rng.choice([3500, 8200, 12000, 15600, 24000, 48000])
    s.user(f"How much is {yen:,} yen in euros today?")
    rate = round(s.rng.uniform(0.0059, 0.0064), 5)
    s.tool(
        "convert_currency",
        {"amount": yen, "from": "JPY", "to": "EUR"},
        {"amount": yen, "from": "JPY", "to": "EUR", "rate": rate, "result": round(yen * rate, 2)},
    )
    s.assistant(f"{yen:,} JPY is about {yen * rate:.2f} EUR at today's rate ({rate}).")


def expense(s: State) -> None:
    what, eur = s.rng.choice(EXPENSES)
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


def book(s: State) -> None:
    city = pick_city(s)
    name = pick_restaurant(s)
    date = CITIES[city][0][:-2] + f"{int(CITIES[city][0][-2:]) + s.rng.randrange(0, 2):02d}"
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


def train(s: State) -> None:
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


def sightseeing(s: State) -> None:
    city = pick_city(s)
    picks = s.rng.sample(SIGHTS[city], 3)
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
