"""Recall: how well and how fast the memory backends' search finds archived messages.

1. LoCoMo retrieval. Every dev conversation is stored in one session of each backend (all but
   the newest 20 messages archived, as after compressions); each QA question, as written, is the
   query over the whole conversation. Reported: the share of questions with an evidence turn
   among the top 5 and top 10 results (questions without evidence left out).
2. Latency at scale. N generated messages (seeded: sentences drawn from a 50,000-word vocabulary
   with a Zipf-like frequency, plus identifiers), all archived: one large session holds
   ``--large-share`` of them (default half), sessions of ``--session-size`` messages (default
   1,000) the rest. Each query is 3-5 words of a random stored message, searched for (top 10)
   in that message's session: half of them in the large session, half in the others. Reported
   per backend, size and kind of session: search p50/p99, how often the message the words came
   from is in the top 10, and, for the first ``--exhaustive`` queries of each kind, how much of
   the top 10 an exhaustive ranking (every posting read, every candidate scored) shares; then
   appending one message to the large session p50/p99 (the index update included where the
   append makes it: PostgreSQL, Redis), the bulk-load rate (the archive of everything after it
   included: SQLite and the in-memory store index there) and the index size. After the bulk
   load PostgreSQL's search tables are vacuumed and analyzed, as autovacuum does on a default
   server (its index-only scans need the visibility map); the results say so, and whether
   autovacuum is on.
3. Ranking cases. Short conversations built here, each with the message that should come
   first for its query (the ranking's rules: a message's own words above those lent to it by
   the message before, all the query's words or its phrase above one of them, what a user said
   above a tool's arguments that mention the words), and the demo's conversation with the
   issue's queries. Reported per backend: the rank of that message in the top 10, and in how
   many cases it is first.

    python bench/recall.py [--data DIR] [--quick] [--out DIR] [--sizes 10000,1000000]
        [--backends memory,sqlite,postgres,redis] [--scale-backends sqlite,postgres]
        [--ranking-backends memory,sqlite,postgres,redis]
        [--large-share 0.5] [--session-size 1000] [--exhaustive 50]

PostgreSQL and Redis use ``MEMORY_SUMMARY_PG_URL`` / ``MEMORY_SUMMARY_REDIS_URL`` (defaults: the
local servers), a schema / key prefix of their own, removed afterwards. A backend whose server is
unreachable is reported as skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    Table,
    mean,
    out_dir,
    parser,
    percentile,
    print_versions,
    progress,
    require_data,
    versions,
    write_results,
)

from host_stub.datasets import load_locomo  # noqa: E402
from host_stub.memory import open_memory, search_plan  # noqa: E402
from host_stub.messages import Message, ToolCall, ToolCallFunction  # noqa: E402
from host_stub.services import MemoryService  # noqa: E402

PG_URL = os.environ.get("MEMORY_SUMMARY_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("MEMORY_SUMMARY_REDIS_URL", "redis://127.0.0.1:6379/0")
ALL_BACKENDS = ("memory", "sqlite", "postgres", "redis")
KEEP_ACTIVE = 20
APPEND_SAMPLES = 200


def count(message: Message) -> int:
    """Token counts are not what is measured here: a cheap stand-in."""
    return len(str(message.content)) // 4 + 1


# -- stores -----------------------------------------------------------------------------------


class Store:
    """A fresh store of one backend, and what removes it afterwards."""

    def __init__(self, backend: str, tmp: Path) -> None:
        self.backend = backend
        self.tag = f"bench_recall_{uuid.uuid4().hex[:10]}"
        if backend == "memory":
            self.url = "memory://"
        elif backend == "sqlite":
            self.path = tmp / f"{self.tag}.db"
            self.url = f"sqlite:///{self.path}"
        elif backend == "postgres":
            self.url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={self.tag}"
        else:
            self.url = f"{REDIS_URL}?prefix={self.tag}:"
        self.memory: MemoryService = open_memory(self.url, count)

    async def index_size(self) -> int | None:
        """Bytes the search index takes (``None``: not measured for this backend)."""
        if self.backend == "sqlite":
            await self.memory.close()
            with sqlite3.connect(self.path) as db:
                try:
                    rows = db.execute(
                        "SELECT SUM(pgsize) FROM dbstat WHERE name LIKE 'search%'"
                    ).fetchone()
                    return int(rows[0] or 0)
                except sqlite3.OperationalError:
                    return None
        if self.backend == "postgres":
            import asyncpg

            conn = await asyncpg.connect(PG_URL)
            try:
                total = 0
                for table in ("search_entries", "search_postings", "search_terms"):
                    total += int(
                        await conn.fetchval(
                            f"SELECT pg_total_relation_size('\"{self.tag}\".{table}')"
                        )
                    )
                return total
            finally:
                await conn.close()
        if self.backend == "redis":
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(REDIS_URL)
            total = 0
            try:
                for kind in ("xd", "xf", "xo", "xp"):
                    async for key in client.scan_iter(match=f"{self.tag}:{kind}:*", count=1000):
                        total += await client.memory_usage(key) or 0
            finally:
                await client.aclose()
            return total
        return None

    async def vacuum(self) -> str | None:
        """After a bulk load: PostgreSQL's search tables vacuumed and analyzed, as autovacuum
        does on a default server (the index-only scans of the postings need the visibility
        map); what was done, or ``None``."""
        if self.backend != "postgres":
            return None
        import asyncpg

        conn = await asyncpg.connect(PG_URL)
        try:
            autovacuum = await conn.fetchval("SHOW autovacuum")
            started = time.perf_counter()
            await conn.execute(
                f'VACUUM ANALYZE "{self.tag}".search_postings, "{self.tag}".search_terms,'
                f' "{self.tag}".search_entries'
            )
            took = time.perf_counter() - started
        finally:
            await conn.close()
        return (
            f"PostgreSQL: VACUUM ANALYZE of the search tables after the bulk load ({took:.1f} s;"
            f" autovacuum is {autovacuum} on this server)"
        )

    async def drop(self) -> None:
        try:
            await self.memory.close()
        except Exception:
            pass
        if self.backend == "postgres":
            import asyncpg

            conn = await asyncpg.connect(PG_URL)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.tag}" CASCADE')
            finally:
                await conn.close()
        elif self.backend == "redis":
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(REDIS_URL)
            try:
                keys = [k async for k in client.scan_iter(match=f"{self.tag}:*", count=1000)]
                for i in range(0, len(keys), 1000):
                    await client.delete(*keys[i : i + 1000])
            finally:
                await client.aclose()


async def reachable(backend: str, tmp: Path) -> str | None:
    """Why ``backend`` cannot be measured, or ``None``."""
    store = Store(backend, tmp)
    try:
        await store.memory.get_epoch("probe")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await store.drop()
    return None


# -- 1. LoCoMo retrieval ------------------------------------------------------------------------


def evidence_seqs(evidence: list[str], index: dict[str, int]) -> set[int]:
    """The seqs of a QA's evidence turns (one session per conversation, seq = index + 1)."""
    ids = [part.strip() for item in evidence for part in str(item).split(";")]
    return {index[i] + 1 for i in ids if i in index}


async def locomo_retrieval(
    backend: str, data: Path, tmp: Path, conversations: int | None = None
) -> dict[str, Any]:
    found5 = found10 = asked = 0
    by_category: dict[int, list[int]] = {}
    latencies: list[float] = []
    for conversation in load_locomo(data)[:conversations]:
        store = Store(backend, tmp)
        try:
            session = conversation.name
            messages = conversation.messages
            for i in range(0, len(messages), 200):
                await store.memory.append(session, messages[i : i + 200])
            await store.memory.trim_history(session, keep_recent=KEEP_ACTIVE)
            for qa in conversation.qa:
                wanted = evidence_seqs(qa.get("evidence", []), conversation.turn_index)
                if not wanted:
                    continue
                start = time.perf_counter()
                hits = await store.memory.search(session, str(qa["question"]), limit=10)
                latencies.append(time.perf_counter() - start)
                seqs = [h.message.seq for h in hits]
                in5 = bool(wanted & set(seqs[:5]))
                in10 = bool(wanted & set(seqs))
                asked += 1
                found5 += in5
                found10 += in10
                category = by_category.setdefault(int(qa.get("category", 0)), [0, 0, 0])
                category[0] += 1
                category[1] += in5
                category[2] += in10
        finally:
            await store.drop()
    return {
        "questions": asked,
        "top5": found5 / asked,
        "top10": found10 / asked,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "by_category": by_category,
    }


# -- 2. latency at scale ---------------------------------------------------------------------------

_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def vocabulary(rng: random.Random, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


class Generator:
    """Seeded messages: 8-40 words with a Zipf-like frequency (weight 1 / (rank + 50)), and now
    and then an identifier."""

    def __init__(self, seed: int = 7, size: int = 50_000) -> None:
        self.rng = random.Random(seed)
        self.words = vocabulary(self.rng, size)
        weights = [1 / (rank + 50) for rank in range(size)]
        total = sum(weights)
        cumulative, acc = [], 0.0
        for w in weights:
            acc += w / total
            cumulative.append(acc)
        self.cumulative = cumulative

    def message(self, i: int) -> Message:
        n = self.rng.randint(8, 40)
        words = self.rng.choices(self.words, cum_weights=self.cumulative, k=n)
        if self.rng.random() < 0.1:
            words.append(f"REF-{self.rng.randint(10000, 99999)}")
        role = "user" if i % 2 == 0 else "assistant"
        return Message(role=role, content=" ".join(words).capitalize() + ".")

    def query(self, message: Message) -> str:
        words = str(message.content).rstrip(".").split()
        return " ".join(self.rng.sample(words, min(len(words), self.rng.randint(3, 5))))


def layout(size: int, large_share: float, session_size: int) -> list[tuple[str, int]]:
    """``(session, messages)``: one large session with ``large_share`` of ``size``, the rest in
    sessions of about ``session_size``."""
    large = round(size * large_share)
    rest = size - large
    sessions = [("large", large)] if large else []
    count = max(1, round(rest / session_size)) if rest else 0
    for k in range(count):
        sessions.append((f"s{k:05d}", rest // count + (1 if k < rest % count else 0)))
    return sessions


class exhaustive:  # noqa: N801 - a context manager used like a function
    """Searches read every posting and score every candidate while inside."""

    def __enter__(self) -> None:
        self.saved = (search_plan.MAX_POSTINGS, search_plan.RESCORE)
        search_plan.MAX_POSTINGS = search_plan.RESCORE = 10**12

    def __exit__(self, *exc: object) -> None:
        search_plan.MAX_POSTINGS, search_plan.RESCORE = self.saved


async def scale(
    backend: str,
    size: int,
    tmp: Path,
    queries: int,
    *,
    large_share: float,
    session_size: int,
    exhaustive_queries: int,
    batch: int = 1000,
) -> dict[str, Any]:
    store = Store(backend, tmp)
    generator = Generator()
    sessions = layout(size, large_share, session_size)
    appended = sessions[0][0]  # single appends go to the first (the large) session
    rng = random.Random(11)
    # The stored messages the queries come from: (session, index in it) -> group.
    groups = ["large", "other"] if large_share > 0 and len(sessions) > 1 else ["all"]
    wanted: dict[tuple[str, int], str] = {}
    for group in groups:
        pool = [s for s in sessions if (s[0] == "large") == (group == "large") or group == "all"]
        while sum(1 for g in wanted.values() if g == group) < queries // len(groups):
            session, n = rng.choice(pool)
            wanted.setdefault((session, rng.randrange(n)), group)
    picked: list[tuple[str, str, int, Message]] = []  # group, session, seq, message
    loaded = 0
    try:
        started = time.perf_counter()
        for session, n in sessions:
            bulk = n - APPEND_SAMPLES if session == appended else n
            for i in range(0, bulk, batch):
                chunk = [generator.message(j) for j in range(i, min(i + batch, bulk))]
                await store.memory.append(session, chunk)
                for j, message in enumerate(chunk, i):
                    if (session, j) in wanted:
                        picked.append((wanted[(session, j)], session, j + 1, message))
                loaded += len(chunk)
                if loaded % (batch * 100) == 0:
                    progress(f"  {backend}: {loaded:,} of {size:,} messages stored")
        load_s = time.perf_counter() - started
        vacuumed = await store.vacuum()
        appends: list[float] = []
        n_large = sessions[0][1]
        for j in range(n_large - APPEND_SAMPLES, n_large):
            message = generator.message(j)
            start = time.perf_counter()
            await store.memory.append(appended, [message])
            appends.append(time.perf_counter() - start)
            if (appended, j) in wanted:
                picked.append((wanted[(appended, j)], appended, j + 1, message))
        # Archiving everything; SQLite and the in-memory store index what appends stored here
        # (their appends do not index), so this is timed with the load.
        started = time.perf_counter()
        for session, _ in sessions:
            await store.memory.trim_history(session, keep_recent=0)
        load_s += time.perf_counter() - started
        asked = [(g, session, seq, generator.query(m)) for g, session, seq, m in picked]
        rng.shuffle(asked)
        for _, session, _, text in asked[:20]:  # warm-up: caches, the prepared statements
            await store.memory.search(session, text, limit=10)
        results: dict[str, dict[str, Any]] = {}
        for group in groups:
            mine = [a for a in asked if a[0] == group]
            latencies: list[float] = []
            found = empty = 0
            tops: list[tuple[str, int, str, list[int]]] = []
            for _, session, seq, text in mine:
                start = time.perf_counter()
                hits = await store.memory.search(session, text, limit=10)
                latencies.append(time.perf_counter() - start)
                seqs = [h.message.seq or 0 for h in hits]
                found += seq in seqs
                empty += not hits
                tops.append((session, seq, text, seqs))
            shared = known = compared = 0
            with exhaustive():
                for session, seq, text, seqs in tops[:exhaustive_queries]:
                    full = [h.message.seq for h in await store.memory.search(session, text)]
                    if full:
                        compared += 1
                        shared += len(set(full) & set(seqs)) / len(full)
                        known += seq in full
            results[group] = {
                "queries": len(latencies),
                "no_result": empty,
                "search_p50_ms": percentile(latencies, 50) * 1e3,
                "search_p99_ms": percentile(latencies, 99) * 1e3,
                "search_mean_ms": mean(latencies) * 1e3,
                "known_item_top10": found / len(mine) if mine else float("nan"),
                "exhaustive_compared": compared,
                "exhaustive_known_item_top10": known / compared if compared else float("nan"),
                "top10_shared_with_exhaustive": shared / compared if compared else float("nan"),
            }
        index_bytes = await store.index_size()
    finally:
        await store.drop()
    return {
        "size": size,
        "sessions": len(sessions),
        "large_session": sessions[0][1] if large_share > 0 else 0,
        "session_size": session_size,
        "groups": results,
        "append_p50_ms": percentile(appends, 50) * 1e3,
        "append_p99_ms": percentile(appends, 99) * 1e3,
        "load_per_s": (size - APPEND_SAMPLES) / load_s,
        "index_mb": None if index_bytes is None else index_bytes / 1e6,
        "vacuumed": vacuumed,
    }


# -- 3. ranking cases ----------------------------------------------------------------------------


def _user(text: str) -> Message:
    return Message(role="user", content=text)


def _assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


def _call(call_id: str, name: str, **arguments: object) -> Message:
    function = ToolCallFunction(name=name, arguments=json.dumps(arguments))
    return Message(role="assistant", tool_calls=[ToolCall(id=call_id, function=function)])


def _result(call_id: str, name: str, value: object) -> Message:
    return Message(role="tool", tool_call_id=call_id, name=name, content=json.dumps(value))


_ALLERGY = (
    "Hi! Tom and I are in Osaka from Friday to Monday and I'd like your help with the food. "
    "Important: I have a severe peanut allergy, so every place you suggest must be safe for it, "
    "and Tom does not eat fish."
)
_LOCKER = (
    "Before I forget, a few things for the week: the plants need water on Wednesday, my "
    "locker code at the climbing gym is 4417-ZEBRA, and the car is due for its inspection on "
    "the 14th."
)


def _borrowed() -> list[Message]:
    """The allergy stated once; the next message of the user's only thanks for a reply that
    repeats the words."""
    return [
        _user(_ALLERGY),
        _assistant("Noted: no peanuts, no fish for Tom. Where would you like to start?"),
        _user("Find us a ramen place near Namba for Friday night."),
        _assistant(
            "Kaze Ya looks best: a peanut-free kitchen that takes a peanut allergy seriously. "
            "Show them your peanut allergy card anyway."
        ),
        _user("Nice, thanks!"),
    ]


def _many_borrowers() -> list[Message]:
    """As :func:`_borrowed`, with 60 replies repeating the words, each thanked: more messages
    borrow the words than are ranked in full (all tie on the estimate that picks them)."""
    acks = ["Nice, thanks!", "Great.", "Perfect.", "OK.", "Thanks!", "Sounds good."]
    out = [_user(_ALLERGY)]
    for n in range(60):
        out += [
            _assistant(f"Option {n}: a peanut-free kitchen, safe for a peanut allergy."),
            _user(acks[n % len(acks)]),
        ]
    return out


def _one_word() -> list[Message]:
    return [
        _user(_LOCKER),
        _assistant("Noted all three."),
        _user("The promo code worked!"),
        _assistant("Great, that code saved you 10%."),
        _user("Which code?"),
        _assistant("The code SPRING10."),
        _user("The gym changed the locker rooms."),
    ]


def _scattered() -> list[Message]:
    return [
        _user(
            "Remember for later: my locker code at the climbing gym is 4417-ZEBRA, and the gym "
            "opens at seven on weekdays."
        ),
        _assistant("Noted."),
        _user("Code 8812 opens the bike shed; locker 12 needs a code too."),
        _assistant("Noted as well."),
    ]


def _tool_arguments() -> list[Message]:
    """The booking call's note repeats the words, in a shorter text than the user's."""
    return [
        _user(_ALLERGY),
        _assistant("Noted. Shall I book Kaze Ya for Friday?"),
        _user("Yes, for two at seven, and tell them."),
        _call("c1", "book_restaurant", restaurant="Kaze Ya", time="19:00", note="peanut allergy"),
        _result("c1", "book_restaurant", {"reference": "RES-5521", "status": "booked"}),
        _assistant("Booked: Kaze Ya at seven for two, reference RES-5521."),
    ]


def _searches() -> list[Message]:
    """Restaurant searches whose arguments avoid peanuts, each asked for with 'remember the
    allergy' (which lends the word to the call)."""
    out = [_user(_ALLERGY), _assistant("Noted. What first?")]
    for n, (city, cuisine) in enumerate(
        [("Osaka", "ramen"), ("Kyoto", "udon"), ("Tokyo", "sushi"), ("Osaka", "izakaya")]
    ):
        out += [
            _user(f"Any good {cuisine} places in {city}? Remember the allergy."),
            _call(f"c{n}", "search_restaurants", city=city, cuisine=cuisine, avoid=["peanuts"]),
            _result(
                f"c{n}", "search_restaurants", {"results": [{"name": f"{city} {cuisine} {n}"}]}
            ),
            _assistant(f"{city} {cuisine} {n} looks best; it can adapt dishes."),
        ]
    return out


def _demo() -> list[Message]:
    from plugin_memory_summary.extras.demo import generate_conversation

    return [Message.model_validate(m) for m in generate_conversation()]


def _said(messages: list[Message], text: str) -> int:
    """The seq (1-based) of the first user message holding ``text``."""
    return next(i for i, m in enumerate(messages, 1) if m.role == "user" and text in str(m.content))


#: (case, the rule it checks, conversation, query, role, the text of the message expected first)
RANKING_CASES: list[tuple[str, str, Any, str, str | None, str]] = [
    ("borrowed", "own words above borrowed", _borrowed, "peanut allergy", "user", "severe peanut"),
    (
        "borrowed x60",
        "own words above borrowed, more borrowers than ranked in full",
        _many_borrowers,
        "peanut allergy",
        "user",
        "severe peanut",
    ),
    ("one word", "all the words above one", _one_word, "locker code", None, "locker code at"),
    ("scattered", "the phrase above the words apart", _scattered, "locker code", None, "4417"),
    (
        "tool note",
        "a user's sentence above a tool's arguments",
        _tool_arguments,
        "peanut allergy",
        None,
        "severe peanut",
    ),
    (
        "tool searches",
        "a user's sentence above arguments that mention one word",
        _searches,
        "peanut allergy",
        None,
        "severe peanut",
    ),
    (
        "demo, user",
        "the demo: the user's own statement",
        _demo,
        "peanut allergy",
        "user",
        "severe peanut",
    ),
    ("demo", "the demo: the user's own statement", _demo, "peanut allergy", None, "severe peanut"),
]


async def ranking_cases(backend: str, tmp: Path) -> dict[str, int | None]:
    """Each case's expected message's rank in the top 10 (``None``: not in it)."""
    store = Store(backend, tmp)
    ranks: dict[str, int | None] = {}
    try:
        for n, (case, _, make, query, role, expected) in enumerate(RANKING_CASES):
            messages = make()
            session = f"case{n}"
            await store.memory.append(session, messages)
            want = _said(messages, expected)
            hits = await store.memory.search(session, query, role=role, limit=10)
            seqs = [h.message.seq for h in hits]
            ranks[case] = seqs.index(want) + 1 if want in seqs else None
    finally:
        await store.drop()
    return ranks


# -- main ----------------------------------------------------------------------------------------


def _list(text: str, allowed: tuple[str, ...]) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad:
        raise SystemExit(f"unknown backend {bad[0]!r} (expected {', '.join(allowed)})")
    return items


async def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", default="10000", help="archived messages per scale run, e.g. 10000,1000000"
    )
    p.add_argument("--backends", default=",".join(ALL_BACKENDS), help="backends for LoCoMo")
    p.add_argument(
        "--scale-backends", default="sqlite,postgres", help="backends for the scale runs"
    )
    p.add_argument(
        "--ranking-backends", default=",".join(ALL_BACKENDS), help="backends for the ranking cases"
    )
    p.add_argument("--queries", type=int, default=500, help="timed searches per scale run")
    p.add_argument(
        "--large-share",
        type=float,
        default=0.5,
        help="share of the messages in the one large session (default 0.5; 0: none)",
    )
    p.add_argument("--session-size", type=int, default=1000, help="messages of each other session")
    p.add_argument(
        "--exhaustive",
        type=int,
        default=50,
        help="queries of each kind also ranked exhaustively (every posting, every candidate)",
    )
    p.add_argument("--name", default="recall", help="results file name (default recall)")
    args = p.parse_args()
    out = out_dir(args.out)
    backends = _list(args.backends, ALL_BACKENDS)
    data = require_data(args.data, "locomo/locomo_dev.json") if backends else Path()
    scale_backends = _list(args.scale_backends, ALL_BACKENDS)
    ranking_backends = _list(args.ranking_backends, ALL_BACKENDS)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    queries = args.queries
    exhaustive_queries = args.exhaustive
    if not 0 <= args.large_share <= 1 or args.session_size < 1:
        raise SystemExit("--large-share must be in 0..1 and --session-size at least 1")
    if args.quick:  # one LoCoMo conversation, 2,000 messages
        sizes, queries, exhaustive_queries = [2000], 50, 10
    v = versions(extra=("asyncpg", "redis"))
    print_versions(v)
    started = time.perf_counter()
    notes: list[str] = []
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        usable: dict[str, str | None] = {}
        for backend in dict.fromkeys([*backends, *scale_backends, *ranking_backends]):
            usable[backend] = await reachable(backend, tmp)
            if usable[backend]:
                notes.append(f"{backend} skipped: {usable[backend]}")

        retrieval = Table(
            "LoCoMo: each QA question as the query over its whole conversation",
            ["backend", "questions", "evidence in top 5", "evidence in top 10", "p50 ms", "p99 ms"],
        )
        for backend in backends:
            if usable[backend]:
                continue
            progress(f"LoCoMo retrieval on {backend}")
            r = await locomo_retrieval(backend, data, tmp, 1 if args.quick else None)
            extra[f"locomo_{backend}"] = r
            retrieval.add(
                backend,
                r["questions"],
                f"{r['top5']:.1%}",
                f"{r['top10']:.1%}",
                round(r["p50_ms"], 2),
                round(r["p99_ms"], 2),
            )
        categories = Table(
            "LoCoMo by question category (SQLite)",
            ["category", "questions", "evidence in top 5", "evidence in top 10"],
        )
        by_cat = extra.get("locomo_sqlite", {}).get("by_category", {})
        for category in sorted(by_cat):
            n, in5, in10 = by_cat[category]
            categories.add(category, n, f"{in5 / n:.1%}", f"{in10 / n:.1%}")

        measured = [b for b in ranking_backends if not usable[b]]
        ranking = Table(
            "Ranking cases: the rank of the message that should come first (top 10; - = not in it)",
            ["case", "rule", "query", *measured],
        )
        ranks: dict[str, dict[str, int | None]] = {}
        for backend in measured:
            progress(f"ranking cases on {backend}")
            ranks[backend] = await ranking_cases(backend, tmp)
            extra[f"ranking_{backend}"] = ranks[backend]
        for case, rule, _, query, role, _ in RANKING_CASES:
            shown = f'"{query}"' + (f" --role {role}" if role else "")
            ranking.add(
                case,
                rule,
                shown,
                *("-" if ranks[b][case] is None else ranks[b][case] for b in measured),
            )
        if measured:
            ranking.add(
                "first",
                f"cases whose message comes first (of {len(RANKING_CASES)})",
                "",
                *(sum(1 for r in ranks[b].values() if r == 1) for b in measured),
            )

        latency = Table(
            "Search at scale: generated messages, all archived, top-10 searches",
            [
                "backend",
                "messages",
                "searched in",
                "search p50 ms",
                "search p99 ms",
                "words' message in top 10",
                "top 10 shared with exhaustive",
                "queries (no result)",
            ],
        )
        writing = Table(
            "Writing at scale: one message appended to the large session, the bulk load",
            [
                "backend",
                "messages",
                "append p50 ms",
                "append p99 ms",
                "bulk load msgs/s",
                "index MB",
            ],
        )
        for size in sizes:
            for backend in scale_backends:
                if usable[backend]:
                    continue
                progress(f"scale: {size:,} messages on {backend}")
                r = await scale(
                    backend,
                    size,
                    tmp,
                    queries,
                    large_share=args.large_share,
                    session_size=args.session_size,
                    exhaustive_queries=exhaustive_queries,
                )
                extra[f"scale_{backend}_{size}"] = r
                if r["vacuumed"]:
                    notes.append(f"{size:,} messages: {r['vacuumed']}.")
                for group, g in r["groups"].items():
                    where = {
                        "large": f"the large session ({r['large_session']:,})",
                        "other": f"{r['sessions'] - 1:,} other sessions of {r['session_size']:,}",
                        "all": f"{r['sessions']:,} sessions",
                    }[group]
                    latency.add(
                        backend,
                        size,
                        where,
                        round(g["search_p50_ms"], 2),
                        round(g["search_p99_ms"], 2),
                        f"{g['known_item_top10']:.1%} ({g['exhaustive_known_item_top10']:.1%})",
                        f"{g['top10_shared_with_exhaustive']:.1%}",
                        f"{g['queries']} ({g['no_result']})",
                    )
                writing.add(
                    backend,
                    size,
                    round(r["append_p50_ms"], 2),
                    round(r["append_p99_ms"], 2),
                    round(r["load_per_s"]),
                    "-" if r["index_mb"] is None else round(r["index_mb"], 1),
                )
    notes += [
        "Retrieval: a question counts when any of its evidence turns is among the results; the "
        "query is the question as written (any word matches; the ranking of host_stub/memory/"
        "search_plan.py: the rarer words found, then the message's own words, the phrase, BM25; "
        "no tuning to this data set).",
        "Scale: generated text (seeded), 3-5 words of a stored message as the query, searched "
        "in that message's session; \"words' message in top 10\": how often that message is "
        'among the results (in brackets: with the exhaustive ranking); "top 10 shared with '
        "exhaustive\": the share of the exhaustive ranking's top 10 the search returned, over "
        f"the first {exhaustive_queries} queries of each kind (the exhaustive ranking reads every "
        "posting and scores every candidate); append = one message per call, its search index "
        "update included on PostgreSQL and Redis (SQLite indexes what appends stored at the next "
        "search or archive); bulk load = 1,000 messages per append call, then everything "
        "archived (SQLite's index written there); index size: SQLite the "
        "FTS5 tables and the term counts (dbstat), PostgreSQL the search_entries, "
        "search_postings and search_terms tables (their indexes included), Redis the memory of "
        "the index keys.",
        f"Search limits: at most {search_plan.MAX_POSTINGS:,} postings read, {search_plan.RESCORE} "
        f"candidates ranked in full (up to {2 * search_plan.RESCORE} when the last of them ties "
        f"with more), {search_plan.MAX_PROBES} terms probed (host_stub/memory/search_plan.py).",
        "Ranking cases: each conversation is stored in a session of its own (nothing archived) "
        "and searched once, top 10; the demo is the conversation of `host-stub demo` "
        "(generate_conversation(), its default 300 turns).",
    ]
    tables = (
        [retrieval, categories, ranking, latency, writing]
        if categories.rows
        else [
            retrieval,
            ranking,
            latency,
            writing,
        ]
    )
    write_results(
        args.name,
        "Recall: search over archived messages",
        [t for t in tables if t.rows] or [latency],
        out=out,
        versions_used=v,
        settings={
            "sizes": ",".join(str(s) for s in sizes),
            "backends": ",".join(backends),
            "scale backends": ",".join(scale_backends),
            "ranking backends": ",".join(ranking_backends),
            "queries": queries,
            "large share": args.large_share,
            "session size": args.session_size,
            "exhaustive": exhaustive_queries,
            "quick": args.quick,
        },
        runtime_s=time.perf_counter() - started,
        notes=notes,
        extra=extra,
    )


if __name__ == "__main__":
    asyncio.run(main())
