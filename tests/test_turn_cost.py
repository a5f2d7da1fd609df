"""What a host turn reads: one store snapshot per model call when nothing changed it, a second
read only after a hook wrote to the session; stores that read only the active rows of a long,
mostly archived chat; compression markers never counted (they are never sent)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from host_stub import signals
from host_stub.config import HostConfig
from host_stub.hookspecs import PromptView, hookimpl
from host_stub.host import Host
from host_stub.memory import sqlite as sqlite_store
from host_stub.memory.inmemory import InMemoryMemory
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message
from host_stub.store_watch import reads_with_append
from host_stub.testing import FakeLLM

NO_ENTRY_POINTS = HostConfig.model_validate(
    {"host": {"model": "fake/chat"}, "plugins": {"allow": []}}
)


#: A host without entry points on the in-memory store (it counts with the host's LLM).
IN_MEMORY = NO_ENTRY_POINTS.model_copy(
    update={"host": NO_ENTRY_POINTS.host.model_copy(update={"memory": "memory://"})}
)


class CountingLLM(FakeLLM):
    """Appends the content of every message it is asked to count to ``counted``."""

    def __init__(self, counted: list[str]) -> None:
        super().__init__(default="ok")
        self.counted = counted

    def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
        if isinstance(messages_or_text, list):
            self.counted.extend(
                str(m.get("content") if isinstance(m, dict) else m.content)
                for m in messages_or_text
            )
        return super().count_tokens(messages_or_text, model)


class CountingMemory(InMemoryMemory):
    def __init__(self) -> None:
        super().__init__(token_counter=lambda m: 5)
        self.snapshots = 0

    async def snapshot(self, session_id: str, namespace: str = "summary") -> Any:
        self.snapshots += 1
        return await super().snapshot(session_id, namespace)

    async def append_snapshot(
        self, session_id: str, messages: Any, namespace: str = "summary"
    ) -> Any:
        self.snapshots += 1  # one read, with the append
        return await super().append_snapshot(session_id, messages, namespace)


class Trimmer:
    """A plugin that archives the oldest messages before every model call, as a blocking
    compression does."""

    def __init__(self) -> None:
        self.memory: Any = None

    @hookimpl
    def startup(self, memory: Any) -> None:
        self.memory = memory

    @hookimpl
    async def before_model_call(self, view: PromptView) -> None:
        await self.memory.trim_history(view.session_id, keep_recent=2)


async def test_one_snapshot_per_model_call_when_nothing_changed() -> None:
    memory = CountingMemory()
    async with Host(NO_ENTRY_POINTS, memory=memory, llm=FakeLLM(default="ok")) as host:
        for i in range(3):
            before = memory.snapshots
            result = await host.run_turn(
                "s", f"q{i}", recorded=[Message(role="assistant", content=f"a{i}")]
            )
            assert result.outcome == "replied"
            assert memory.snapshots - before == 1
            assert not any(u.rebuilt for u in result.usage)


class PlainAppends(SQLiteMemory):
    """The SQLite store as one that changes ``append`` sees it: the host never fuses."""

    append = SQLiteMemory.append


async def test_a_sqlite_turn_reads_each_prompt_with_the_append_before_it(tmp_path: Path) -> None:
    """What a turn stores before a model call (the user's message, a tool's result) and the
    snapshot that call's prompt needs are one transaction (one worker-thread hop, not two); the
    last reply, after which no call comes, is stored alone; the prompts are what separate reads
    would have built."""
    from host_stub.messages import ToolCall, ToolCallFunction

    call = ToolCall(id="c1", function=ToolCallFunction(name="lookup", arguments="{}"))
    recorded = [
        Message(role="assistant", tool_calls=[call]),
        Message(role="tool", tool_call_id="c1", content="HAT123 is on time"),
        Message(role="assistant", content="It is on time."),
    ]
    prompts = []
    for fused in (True, False):
        store = SQLiteMemory if fused else PlainAppends  # separate reads
        memory = store(str(tmp_path / f"{fused}.db"), lambda m: 3)
        statements: list[str] = []
        async with Host(NO_ENTRY_POINTS, memory=memory, llm=FakeLLM(default="ok")) as host:
            await host.run_turn("s", "hello", recorded=recorded)  # opens the file
            await memory.set_trace_callback(statements.append)
            result = await host.run_turn("s", "is my flight on time?", recorded=recorded)
        transactions = [s for s in statements if s.startswith("BEGIN")]
        assert len(transactions) == (3 if fused else 5), transactions
        assert result.outcome == "replied" and len(result.sent) == 2
        prompts.append(result.sent)
    assert prompts[0] == prompts[1]


async def test_a_store_that_changes_append_keeps_every_append_its_own() -> None:
    """A subclass or a wrapper of a store that changes ``append`` (to log it) without
    ``append_snapshot`` sees every message the host stores go through its ``append``; the
    stores themselves, and a subclass that changes both, read with the append."""

    class Logging(InMemoryMemory):
        def __init__(self) -> None:
            super().__init__(token_counter=lambda m: 5)
            self.logged: list[int | None] = []

        async def append(self, session_id: str, messages: Any) -> list[Message]:
            out = await super().append(session_id, messages)
            self.logged += [m.seq for m in out]
            return out

    class Wrapper:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    assert reads_with_append(InMemoryMemory(token_counter=lambda m: 1))
    assert reads_with_append(SQLiteMemory(":memory:", lambda m: 1))
    assert reads_with_append(CountingMemory())
    assert not reads_with_append(Logging())
    assert not reads_with_append(Wrapper(InMemoryMemory(token_counter=lambda m: 1)))
    memory = Logging()
    async with Host(NO_ENTRY_POINTS, memory=memory, llm=FakeLLM(default="ok")) as host:
        for i in range(2):
            await host.run_turn("s", f"q{i}", recorded=[Message(role="assistant", content="a")])
    assert memory.logged == [1, 2, 3, 4]


async def test_a_write_after_the_append_is_read_again() -> None:
    """The snapshot read with an append is used only when nothing else wrote to the session
    since the append began: a write that lands meanwhile (a compression committed by another
    task of the host) sends the prompt's build back to the store."""
    memory = CountingMemory()
    async with Host(NO_ENTRY_POINTS, memory=memory, llm=FakeLLM(default="ok")) as host:
        await host.run_turn("s", "q0", recorded=[Message(role="assistant", content="a0")])
        real = memory.append_snapshot

        async def then_trim(session_id: str, messages: Any, namespace: str = "summary") -> Any:
            out = await real(session_id, messages, namespace)
            await memory.trim_history(session_id, keep_recent=1)  # a write in between
            return out

        memory.append_snapshot = then_trim  # type: ignore[method-assign]
        before = memory.snapshots
        result = await host.run_turn("s", "q1", recorded=[Message(role="assistant", content="a1")])
        assert memory.snapshots - before == 2  # the fused read, then a fresh one
        sent = [m["content"] for m in result.sent[-1] if m["role"] != "system"]
        assert sent == ["q1"]


class Summary:
    """A plugin that contributes the same summary block at every model call, as the memory
    plugin does between two compressions."""

    text = "Summary of the chat so far: the user booked flight HAT123 to Boston."

    @hookimpl
    def agent_prompt(self, view: PromptView) -> dict[str, str]:
        return {"id": "summary", "anchor": "context", "content": self.text}


async def test_an_unchanged_summary_block_is_counted_once() -> None:
    counted: list[str] = []

    class Counting(FakeLLM):
        def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
            if isinstance(messages_or_text, str):
                counted.append(messages_or_text)
            return super().count_tokens(messages_or_text, model)

    llm = Counting(default="ok")
    async with Host(NO_ENTRY_POINTS, llm=llm, plugins=[("summary", Summary())]) as host:
        for i in range(4):
            result = await host.run_turn(
                "s", f"q{i}", recorded=[Message(role="assistant", content=f"a{i}")]
            )
        assert result.usage[-1].breakdown.summary == llm.count_tokens(Summary.text)
    assert counted.count(Summary.text) == 2  # once by the host over four turns, once above


async def test_a_hook_that_writes_gets_the_prompt_built_again() -> None:
    memory = CountingMemory()
    async with Host(
        NO_ENTRY_POINTS, memory=memory, llm=FakeLLM(default="ok"), plugins=[("trim", Trimmer())]
    ) as host:
        for i in range(3):
            await memory.append("s", [Message(role="user", content=f"old {i}")])
        result = await host.run_turn("s", "q", recorded=[Message(role="assistant", content="a")])
        assert [u.rebuilt for u in result.usage] == [False, True]
        sent = [m["content"] for m in result.sent[-1] if m["role"] != "system"]
        assert sent == ["old 2", "q"]


async def test_markers_are_stored_without_counting() -> None:
    counted: list[Any] = []

    class Counting(FakeLLM):
        def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
            counted.append(messages_or_text)
            return super().count_tokens(messages_or_text, model)

    # The host opens the store itself, with its own token counter.
    async with Host(IN_MEMORY, llm=Counting(default="ok")) as host:
        marker = Message(role="system", kind="event-marker", content="compressed 3 messages")
        [stored] = await host.memory.append("s", [marker])
        assert stored.tokens == 0
        assert counted == []
        [counted_message] = await host.memory.append("s", [Message(role="user", content="hi")])
        assert counted_message.tokens and len(counted) == 1  # a message is counted


async def test_the_in_memory_store_reads_only_active_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A snapshot and a history read copy the active messages only, however large the archive
    (every message a read hands out is a private copy: counting the copies counts the rows)."""
    from host_stub.memory import inmemory

    copied: list[int | None] = []
    real = inmemory.copy_message

    def counting(message: Message) -> Message:
        copied.append(message.seq)
        return real(message)

    memory = InMemoryMemory(token_counter=lambda m: 1)
    await memory.append("s", [Message(role="user", content=f"m{i}") for i in range(500)])
    await memory.trim_history("s", keep_recent=10)
    monkeypatch.setattr(inmemory, "copy_message", counting)
    snap = await memory.snapshot("s")
    assert [m.seq for m in snap.messages] == list(range(491, 501))
    assert len(await memory.get_history("s")) == 10
    assert sorted(set(copied)) == list(range(491, 501)) and len(copied) == 20
    info = (await memory.list_sessions())[0]
    assert (info.active, info.archived) == (10, 490)


async def test_sqlite_reads_the_active_history_through_its_index(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    # A store written by the previous schema (version 1) is migrated on open.
    raw = sqlite3.connect(path)
    for statement in sqlite_store.MIGRATIONS[0].split(";"):
        if statement.strip():
            raw.execute(statement)
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    memory = SQLiteMemory(str(path), lambda m: 1)
    try:
        await memory.append("s", [Message(role="user", content=f"m{i}") for i in range(50)])
        await memory.trim_history("s", keep_recent=5)
        assert [m.seq for m in (await memory.snapshot("s")).messages] == [46, 47, 48, 49, 50]
    finally:
        await memory.close()
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.SCHEMA_VERSION
        traced: list[str] = []
        raw.set_trace_callback(traced.append)
        rows = sqlite_store.message_rows(raw, "s", archived=False)
        assert [r[0] for r in rows] == [46, 47, 48, 49, 50]
        plan = raw.execute("EXPLAIN QUERY PLAN " + traced[-1].replace("'s'", "?"), ("s",))
        assert any("messages_active" in str(row) for row in plan.fetchall())
    finally:
        raw.close()


async def test_a_sqlite_snapshot_decodes_only_the_rows_it_has_not_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn adds a row or two: the rows this store wrote or its last snapshot of the session
    decoded are reused, as private copies, unless a column changed (another process may
    rewrite a row); another store on the file decodes what it has not seen."""
    from host_stub.memory import common
    from host_stub.memory.sqlite import store as sqlite_store_module

    decoded: list[int] = []
    real = common.message_from_row

    def counting(**row: Any) -> Message:
        decoded.append(row["seq"])
        return real(**row)

    monkeypatch.setattr(common, "message_from_row", counting)
    monkeypatch.setattr(sqlite_store_module, "message_from_row", counting)
    path = tmp_path / "m.db"
    memory = SQLiteMemory(str(path), lambda m: 1)
    other = SQLiteMemory(str(path), lambda m: 1)
    try:
        await memory.append("s", [Message(role="user", content=f"m{i}") for i in range(40)])
        decoded.clear()  # the append's own copies
        first = await memory.snapshot("s")
        assert decoded == []  # the rows it wrote
        assert [m.content for m in first.messages] == [f"m{i}" for i in range(40)]
        assert [m.seq for m in (await other.snapshot("s")).messages] == list(range(1, 41))
        assert sorted(decoded) == list(range(1, 41))  # the other store had seen none
        [added] = await memory.append(
            "s", [Message(role="assistant", content="a", metadata={"k": [1]})]
        )
        added.metadata["k"].append(3)  # the caller's copy, not the one kept decoded
        decoded.clear()
        second = await memory.snapshot("s")
        assert decoded == []
        assert second.messages[40].metadata == {"k": [1]} and second.messages[40].seq == 41
        assert [m.model_dump() for m in second.messages[:40]] == [
            m.model_dump() for m in first.messages
        ]
        second.messages[40].metadata["k"].append(2)  # a caller's change stays its own
        second.messages[0].content = "changed"
        _, fused = await memory.append_snapshot("s", [Message(role="user", content="b")])
        assert decoded == [0]  # the copy it hands back only (numbered after the write)
        assert [m.seq for m in fused.messages[-2:]] == [41, 42]
        raw = sqlite3.connect(path)
        body = '{"content":"rewritten"}'
        raw.execute("UPDATE messages SET body = ? WHERE session_id = 's' AND seq = 2", (body,))
        raw.commit()
        raw.close()
        decoded.clear()
        third = await memory.snapshot("s")
        assert decoded == [2]
        assert [m.content for m in third.messages[:3]] == ["m0", "rewritten", "m2"]
        assert third.messages[40].metadata == {"k": [1]}
    finally:
        await memory.close()
        await other.close()


async def test_in_memory_reads_copy_only_the_mutable_parts_of_a_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A snapshot of plain text messages deep-copies none of them (strings cannot change); the
    parts a caller could change (list content, tool calls, metadata) are still copies."""
    from host_stub.messages import ToolCall, ToolCallFunction

    memory = InMemoryMemory(token_counter=lambda m: 1)
    await memory.append("s", [Message(role="user", content=f"m{i}") for i in range(50)])
    deep: list[Any] = []
    real = Message.__deepcopy__

    def counting(self: Any, memo: Any = None) -> Any:
        deep.append(type(self).__name__)
        return real(self, memo)

    from host_stub.services import MetadataEntry

    record = {"summary": "Goal: a table for 4", "facts": [{"id": "RES-1"}]}
    await memory.save_metadata("summary", "s", record)
    monkeypatch.setattr(Message, "__deepcopy__", counting)
    monkeypatch.setattr(MetadataEntry, "__deepcopy__", counting)
    snap = await memory.snapshot("s")
    assert len(snap.messages) == 50 and deep == []
    monkeypatch.setattr(Message, "__deepcopy__", real)
    assert snap.record is not None and snap.record.value == record
    snap.record.value["facts"].append("changed")  # type: ignore[index]
    again_record = (await memory.snapshot("s")).record
    assert again_record is not None and again_record.value == record

    call = ToolCall(id="c1", function=ToolCallFunction(name="f", arguments="{}"), index=0)
    await memory.append(
        "t",
        [
            Message(role="user", content=[{"type": "text", "text": "hi"}], metadata={"k": ["v"]}),
            Message(role="assistant", tool_calls=[call]),
        ],
    )
    first, second = (await memory.snapshot("t")).messages
    assert isinstance(first.content, list) and second.tool_calls
    first.content[0]["text"] = "changed"
    first.metadata["k"].append("w")
    second.tool_calls[0].function.name = "g"
    second.tool_calls.append(call)
    again = (await memory.snapshot("t")).messages
    assert again[0].content == [{"type": "text", "text": "hi"}]
    assert again[0].metadata == {"k": ["v"]}
    assert again[1].tool_calls is not None and len(again[1].tool_calls) == 1
    assert again[1].tool_calls[0].function.name == "f"


async def test_tool_calls_are_copied_without_a_deep_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool call's fields are strings: a snapshot gives new models sharing them (a deep copy
    took most of a tool-calling message's copy); an extra field holding a container is still
    copied deep, so a caller's change never reaches the store."""
    from host_stub.messages import ToolCall, ToolCallFunction

    memory = InMemoryMemory(token_counter=lambda m: 1)
    plain = ToolCall(id="c1", function=ToolCallFunction(name="f", arguments="{}"), index=0)
    nested = ToolCall(id="c2", function=ToolCallFunction(name="h", arguments="{}"), tags=["a"])
    await memory.append("s", [Message(role="assistant", tool_calls=[plain, nested])])
    deep: list[str] = []
    real = ToolCall.__deepcopy__

    def counting(self: Any, memo: Any = None) -> Any:
        deep.append(self.id)
        return real(self, memo)

    monkeypatch.setattr(ToolCall, "__deepcopy__", counting)
    (message,) = (await memory.snapshot("s")).messages
    assert deep == ["c2"]
    assert message.tool_calls is not None
    first, second = message.tool_calls
    first.function.name, first.id = "g", "x"
    first.model_extra["index"] = 5  # type: ignore[index]
    second.model_extra["tags"].append("b")  # type: ignore[index]
    (again,) = (await memory.snapshot("s")).messages
    assert again.tool_calls is not None
    assert [c.model_dump() for c in again.tool_calls] == [plain.model_dump(), nested.model_dump()]
    assert again.tool_calls[0].model_extra == {"index": 0}
    assert again.tool_calls[1].model_extra == {"tags": ["a"]}


async def test_in_memory_reads_parse_the_saved_record_without_dumping_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The summary record is read at every model call: the in-memory store keeps it as the JSON
    text it was saved as and each read parses that text (a private copy) instead of dumping and
    parsing the value; flat metadata (scalar values) is copied without a deep copy."""
    from host_stub.memory import common

    memory = InMemoryMemory(token_counter=lambda m: 1)
    record = {"summary": "Goal: a table for 4", "facts": [{"id": "RES-1"}]}
    await memory.save_metadata("summary", "s", record)
    await memory.append("s", [Message(role="user", content="hi", metadata={"k": "v", "n": 1})])
    dumps: list[Any] = []
    deep: list[Any] = []
    real_dump = common.json.dumps
    monkeypatch.setattr(common.json, "dumps", lambda *a, **k: dumps.append(a) or real_dump(*a, **k))
    monkeypatch.setattr(common.copy, "deepcopy", lambda value, memo=None: deep.append(value))
    first, second = await memory.snapshot("s"), await memory.snapshot("s")
    entry = await memory.get_metadata("summary", "s")
    assert dumps == [] and deep == []
    assert first.record is not None and second.record is not None and entry is not None
    assert first.record.value == second.record.value == entry.value == record
    first.record.value["facts"].append("changed")  # type: ignore[index]
    first.messages[0].metadata["k"] = "changed"
    again = await memory.snapshot("s")
    assert again.record is not None and again.record.value == record
    assert again.messages[0].metadata == {"k": "v", "n": 1}
    assert [e.value for e in await memory.list_metadata("summary")] == [record]


async def test_an_in_memory_append_keeps_the_json_form_without_writing_the_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An in-memory append keeps what a SQL store would read back (tuples as lists, NaN as
    null) without writing the JSON text and parsing it again."""
    from host_stub.memory import common

    memory = InMemoryMemory(token_counter=lambda m: 1)
    texts: list[Any] = []
    real_dump = common.json.dumps
    monkeypatch.setattr(common.json, "dumps", lambda *a, **k: texts.append(a) or real_dump(*a, **k))
    given_metadata = {"pair": (1, 2), "nan": float("nan"), "nested": {"x": [(3,)]}}
    [out] = await memory.append("s", [Message(role="user", content="hi", metadata=given_metadata)])
    assert texts == []
    through_json = common.message_from_row(
        role="user",
        kind="message",
        body=common.body_of(out),
        seq=1,
        epoch=0,
        tokens=1,
        archived=None,
    )
    assert out.metadata == {"pair": [1, 2], "nan": None, "nested": {"x": [[3]]}}
    assert out == through_json
    given_metadata["nested"]["x"].append(4)  # type: ignore[index]
    [stored] = await memory.get_history("s")
    assert stored.metadata["nested"] == {"x": [[3]]}


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_an_append_computes_no_search_terms(backend: str, tmp_path: Path) -> None:
    """Appends are on the turn's path, the search index is not: an append stores the message and
    computes no index terms; the next search (or archive) indexes what was stored since, each
    message's terms computed once, and finds the newest message."""
    import host_stub.memory.search_plan as search
    from host_stub.memory import inmemory
    from host_stub.memory.sqlite import schema as sqlite_schema
    from host_stub.memory.sqlite import search as sqlite_search

    memory: Any = (
        InMemoryMemory(token_counter=lambda m: 1)
        if backend == "memory"
        else SQLiteMemory(tmp_path / "m.db", token_counter=lambda m: 1)
    )
    own = search.own_terms
    calls: list[Any] = []

    def counting_own(message: Any) -> Any:
        calls.append(message.content)
        return own(message)

    try:
        with pytest.MonkeyPatch.context() as patch:
            for module in (inmemory, sqlite_schema, sqlite_search, search):
                patch.setattr(module, "own_terms", counting_own)
            await memory.append("s", [Message(role="user", content="booking reference alpha")])
            await memory.append("s", [Message(role="user", content="hotel confirmation beta")])
            assert calls == []
            hits = await memory.search("s", "alpha")
            assert [h.message.seq for h in hits][:1] == [1]
            assert calls == ["booking reference alpha", "hotel confirmation beta"]
            await memory.append("s", [Message(role="user", content="gamma seat")])
            assert [h.message.seq for h in await memory.search("s", "gamma")] == [3]
            # the message before lends its terms from the index, not by computing them again
            assert calls[2:] == ["gamma seat"]
    finally:
        await memory.close()


async def test_messages_the_last_prompt_sent_are_not_counted_again() -> None:
    """After the history moved (the oldest archived between turns), the messages the previous
    prompt sent keep their counts, and a message new to the prompt has the count the store took
    at its append: each message is counted once, when it is stored."""
    counted: list[str] = []

    llm = CountingLLM(counted)
    async with Host(IN_MEMORY, llm=llm) as host:
        for i in range(6):
            last = await host.run_turn(
                "s", f"q{i}", recorded=[Message(role="assistant", content=f"a{i}")]
            )
        previous = {str(m["content"]) for m in last.sent[-1]}
        await host.memory.trim_history("s", keep_recent=6)
        counted.clear()
        result = await host.run_turn("s", "q6", recorded=[Message(role="assistant", content="a6")])
        assert result.outcome == "replied"
        sent = [m["content"] for m in result.sent[-1] if m["role"] != "system"]
        assert sent == ["q3", "a3", "q4", "a4", "q5", "a5", "q6"]
        # by the store, at their appends (a5 was counted at its own); the prefix the first
        # changed message shares with the last prompt's is counted apart
        assert [c for c in counted if c in {"q6", "a6", "a5"}] == ["q6", "a6"]
        assert [c for c in counted if c in previous] == []
        usage = result.usage[-1]
        counted.clear()
        assert usage.message_tokens == sum(llm.count_tokens([m]) for m in result.sent[-1])


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_ascii_text_is_split_into_the_same_words_in_one_scan(text: str) -> None:
    """ASCII text (most messages) is cut into word runs by one regular-expression scan; the
    runs are those of the test per character that any other text gets."""
    from host_stub.memory import search_plan

    assert list(search_plan.word_runs(text)) == list(search_plan.word_runs_per_char(text))


def test_only_text_outside_ascii_is_tested_per_character(monkeypatch: pytest.MonkeyPatch) -> None:
    from host_stub.memory import search_plan

    seen: list[str] = []
    real = search_plan.word_runs_per_char
    monkeypatch.setattr(
        search_plan, "word_runs_per_char", lambda text: seen.append(text) or real(text)
    )
    assert search_plan.index_terms("Booked RES-4711, table_12") == [
        "book",
        "res",
        "4711",
        "table",
        "12",
    ]
    assert seen == []
    assert search_plan.index_terms("我对花生过敏 ok") == [
        "我对",
        "对花",
        "花生",
        "生过",
        "过敏",
        *"我对花生过敏",
        "ok",
    ]
    assert seen == ["我对花生过敏 ok"]


class Placeholders:
    """A plugin that shows every tool result as a one-line placeholder, as tier 1 does with old
    tool groups."""

    @hookimpl
    def prune_history(self, view: PromptView) -> dict[int, str]:
        return {m.seq: f"[result #{m.seq} left out]" for m in view.messages if m.role == "tool"}


async def test_a_replaced_message_is_counted_once_not_at_every_call() -> None:
    from host_stub.messages import ToolCall, ToolCallFunction

    counted: list[str] = []

    llm = CountingLLM(counted)
    async with Host(IN_MEMORY, llm=llm, plugins=[("prune", Placeholders())]) as host:
        call = ToolCall(id="c1", function=ToolCallFunction(name="lookup", arguments="{}"))
        await host.run_turn(
            "s",
            "find it",
            recorded=[
                Message(role="assistant", content="", tool_calls=[call]),
                Message(role="tool", content="a long result " * 50, tool_call_id="c1"),
                Message(role="assistant", content="found"),
            ],
        )
        for i in range(3):
            result = await host.run_turn(
                "s", f"q{i}", recorded=[Message(role="assistant", content=f"a{i}")]
            )
        sent = [m["content"] for m in result.sent[-1] if m["role"] == "tool"]
        (placeholder,) = sent
    assert placeholder.startswith("[result #")
    # counted when the prompt first showed it, not at each of the four calls after
    assert counted.count(placeholder) == 1


class Versioned:
    """A plugin whose block is the stored summary record's text, as the memory plugin's is;
    it keeps the views it was shown."""

    def __init__(self) -> None:
        self.views: list[PromptView] = []

    @hookimpl
    def agent_prompt(self, view: PromptView) -> dict[str, str] | None:
        self.views.append(view)
        if view.summary is None:
            return None
        return {"id": "summary", "anchor": "context", "content": view.summary.value["text"]}


NEW_BLOCK = "Summary so far: the user booked flight HAT123 to Boston and asked for a window seat."


async def _compress(host: Host, session_id: str, through: int) -> None:
    """What a compression in the background does: a new record, what it covers archived,
    through the host's store."""
    won = await host.memory.commit_compression(
        session_id, {"text": NEW_BLOCK}, expected_version=0, archive_through_seq=through, epoch=0
    )
    assert won
    await asyncio.gather(*host._warming.values())


async def test_a_compression_between_turns_gets_the_next_prompt_counted_before_the_turn() -> None:
    """An archive through the host's store outside a model call's preparation (a compression in
    the background) has the session's next prompt built at once, as a dry run: the new summary
    block and the system message it is merged into are counted then, not by the turn that sends
    them; the turn's counts are what it would have counted itself."""
    counted: list[Any] = []

    class Counting(FakeLLM):
        def count_tokens(self, messages_or_text: Any, model: str | None = None) -> int:
            counted.append(messages_or_text)
            return super().count_tokens(messages_or_text, model)

    llm = Counting(default="ok")
    plugin = Versioned()
    sends: list[Any] = []
    async with Host(IN_MEMORY, llm=llm, plugins=[("summary", plugin)]) as host:
        host.bus.connect(signals.TOKEN_USAGE, lambda sender, **usage: sends.append(usage))
        for i in range(3):
            await host.run_turn("s", f"q{i}", recorded=[Message(role="assistant", content=f"a{i}")])
        sent_before, views_before = len(sends), len(plugin.views)
        await _compress(host, "s", through=4)
        [warm] = plugin.views[views_before:]
        assert warm.dry_run and warm.summary is not None
        assert [m.content for m in warm.messages] == ["q2", "a2"]
        assert len(sends) == sent_before  # nothing signalled for the dry run
        counted.clear()
        result = await host.run_turn("s", "q3", recorded=[Message(role="assistant", content="a3")])
        texts = [str(c) for c in counted]
        assert not any(NEW_BLOCK in t for t in texts), texts
        assert len(counted) == 2  # the new messages, each once, when stored
        [usage] = result.usage
        assert usage.breakdown.summary == FakeLLM().count_tokens(NEW_BLOCK)
        assert usage.message_tokens == sum(FakeLLM().count_tokens([m]) for m in result.sent[0])


async def test_no_warm_up_for_an_archive_while_the_call_is_prepared() -> None:
    """A blocking compression (a hook that archives before the model call) is followed by the
    turn's own rebuild: no prompt is built in the background for it."""
    plugin = Versioned()
    async with Host(
        IN_MEMORY, llm=FakeLLM(default="ok"), plugins=[("trim", Trimmer()), ("v", plugin)]
    ) as host:
        for i in range(3):
            result = await host.run_turn(
                "s", f"q{i}", recorded=[Message(role="assistant", content=f"a{i}")]
            )
            assert result.usage[-1].rebuilt or i == 0
        assert not host._warming
        assert not any(v.dry_run for v in plugin.views)


async def test_no_warm_up_for_a_session_whose_turns_the_host_does_not_run() -> None:
    """A host that only compresses (a command that compresses and stops, a session another
    process chats in) builds no prompt after the archive."""
    plugin = Versioned()
    async with Host(IN_MEMORY, llm=FakeLLM(default="ok"), plugins=[("v", plugin)]) as host:
        await host.memory.append("s", [Message(role="user", content=f"m{i}") for i in range(4)])
        await host.memory.commit_compression(
            "s", {"text": NEW_BLOCK}, expected_version=0, archive_through_seq=2, epoch=0
        )
        assert not host._warming and not plugin.views


async def test_stopping_the_host_ends_a_warm_up_in_flight() -> None:
    """A prompt build in the background when the host stops is cancelled before the store
    closes; the stop raises nothing."""
    gate = asyncio.Event()

    class Slow(Versioned):
        @hookimpl
        async def prune_history(self, view: PromptView) -> None:
            if view.dry_run:
                await gate.wait()  # never set: the warm-up is still running at stop

    host = Host(IN_MEMORY, llm=FakeLLM(default="ok"), plugins=[("slow", Slow())])
    await host.start()
    await host.run_turn("s", "q", recorded=[Message(role="assistant", content="a")])
    await host.memory.commit_compression(
        "s", {"text": NEW_BLOCK}, expected_version=0, archive_through_seq=1, epoch=0
    )
    [task] = host._warming.values()
    await asyncio.sleep(0)
    await host.stop()
    assert task.cancelled() and not host._warming
