"""How each peer runs a recorded conversation for ``bench/peers.py``: LangChain v1
``SummarizationMiddleware`` (its ``before_model`` call alone, and inside LangChain's agent with a
checkpointer: ``bench/peer_agent.py``) and LangMem ``summarize_messages``, with the same fake
instant summarizer and the same token counter as ours. The peers are imported by
:func:`import_peers`, never at import: they are not dependencies of the plugin."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BUDGET,
    EXIT_NOT_INSTALLED,
    SYSTEM_PROMPT,
    TokenCounter,
    tool_pair_violations,
)
from fakes import fake_summary_text  # noqa: E402
from peer_agent import replay_agent  # noqa: E402
from replay import Step, SystemRun, step_positions  # noqa: E402

from host_stub.datasets import Conversation  # noqa: E402
from host_stub.testing import CallStats  # noqa: E402

PEER_PACKAGES = (
    "langchain",
    "langchain-core",
    "langgraph",
    "langgraph-checkpoint-sqlite",
    "langmem",
)
INSTALL_HINT = (
    "the peers (LangChain v1, LangMem) are not installed in this interpreter; install them in a "
    "separate environment inside the repository (ignored by git): python3 -m venv .benchvenv && "
    ".benchvenv/bin/pip install -e '.[bench]', then run "
    ".benchvenv/bin/python bench/peers.py"
)
KEEP_MESSAGES = 20
#: The checkpointers LangChain's agent runs with: one per kind of store ours runs on.
CHECKPOINTERS = ("in-memory", "SQLite")
LANGMEM_SUMMARY_TOKENS = 512  # the plugin's summary budget at a 4k window


def import_peers() -> dict[str, Any]:
    try:
        import sqlite3

        from langchain.agents import create_agent
        from langchain.agents.middleware import SummarizationMiddleware
        from langchain_core.language_models.chat_models import BaseChatModel
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
        from langchain_core.outputs import ChatGeneration, ChatResult
        from langchain_core.tools import BaseTool
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langmem.short_term import summarize_messages
    except ImportError as exc:
        print(f"peers not installed ({exc.name or exc}): {INSTALL_HINT}", file=sys.stderr)
        raise SystemExit(EXIT_NOT_INSTALLED) from None
    return {
        "SummarizationMiddleware": SummarizationMiddleware,
        "BaseChatModel": BaseChatModel,
        "AIMessage": AIMessage,
        "HumanMessage": HumanMessage,
        "SystemMessage": SystemMessage,
        "ToolMessage": ToolMessage,
        "ChatGeneration": ChatGeneration,
        "ChatResult": ChatResult,
        "summarize_messages": summarize_messages,
        "create_agent": create_agent,
        "BaseTool": BaseTool,
        "checkpointers": {
            "in-memory": lambda path: InMemorySaver(),
            "SQLite": lambda path: SqliteSaver(sqlite3.connect(path, check_same_thread=False)),
        },
    }


# -- LangChain message plumbing --------------------------------------------------------------------


class LCAdapter:
    """Converts the data sets to LangChain messages and counts LangChain messages with the same
    counter as the host. The counter caches nothing (``TokenCounter(cached=False)``): the
    middleware counts its state with it at every call, as it does with any counter; the host
    counts each message once, when it stores it."""

    def __init__(self, lc: dict[str, Any], counter: TokenCounter) -> None:
        self.lc = lc
        self.counter = counter
        self._ids = 0

    def next_id(self) -> str:
        self._ids += 1
        return f"m{self._ids}"

    def to_lc(self, m: dict[str, Any]) -> Any:
        lc = self.lc
        content = m.get("content") or ""
        if m["role"] == "user":
            return lc["HumanMessage"](content=content, id=self.next_id())
        if m["role"] == "system":
            return lc["SystemMessage"](content=content, id=self.next_id())
        if m["role"] == "tool":
            return lc["ToolMessage"](
                content=content, tool_call_id=m["tool_call_id"], id=self.next_id()
            )
        calls = []
        for c in m.get("tool_calls") or []:
            try:
                args = json.loads(c["function"].get("arguments") or "{}")
            except json.JSONDecodeError:
                args = {"raw": c["function"].get("arguments")}
            calls.append(
                {"name": c["function"]["name"], "args": args, "id": c["id"], "type": "tool_call"}
            )
        return lc["AIMessage"](content=content, tool_calls=calls, id=self.next_id())

    @staticmethod
    def to_openai(m: Any) -> dict[str, Any]:
        kind = m.type
        role = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}.get(
            kind, "user"
        )
        out: dict[str, Any] = {
            "role": role,
            "content": m.content if isinstance(m.content, str) else m.text,
        }
        if role == "assistant" and getattr(m, "tool_calls", None):
            out["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
                }
                for c in m.tool_calls
            ]
        if role == "tool":
            out["tool_call_id"] = m.tool_call_id
        return out

    def count(self, messages: Sequence[Any]) -> int:
        return sum(self.counter.stored(self.to_openai(m)) for m in messages)


def make_fake_model(lc: dict[str, Any], adapter: LCAdapter, log: CallStats) -> Any:
    """A LangChain chat model answering the same extractive ~300-token summary as bench_llm."""

    class FakeSummarizer(lc["BaseChatModel"]):  # type: ignore[misc, valid-type]
        @property
        def _llm_type(self) -> str:
            return "bench-fake-summarizer"

        def _generate(
            self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> Any:
            log.calls += 1
            log.input_tokens += adapter.count(messages)
            text = fake_summary_text("\n".join(str(m.content) for m in messages))
            return lc["ChatResult"](
                generations=[lc["ChatGeneration"](message=lc["AIMessage"](content=text))]
            )

    return FakeSummarizer()


def step_batches(conversation: Conversation) -> list[tuple[list[dict[str, Any]], int]]:
    """For each model call: the messages that arrived since the previous one, in order."""
    wire = [m.to_openai() for m in conversation.messages]
    out = []
    previous = 0
    for pos in step_positions(conversation):
        out.append((wire[previous:pos], pos))
        previous = pos
    return out


def split_system(conversation: Conversation) -> tuple[str, list[dict[str, Any]]]:
    """The host system prompt plus the conversation's own system messages (core memory), as one
    system prompt; the rest of the conversation."""
    wire = [m.to_openai() for m in conversation.messages]
    system = [SYSTEM_PROMPT] + [str(m["content"]) for m in wire if m["role"] == "system"]
    return "\n\n".join(system), [m for m in wire if m["role"] != "system"]


def sent_step(adapter: LCAdapter, sent: list[Any], summary_ids: set[str]) -> Step:
    wire = [adapter.to_openai(m) for m in sent]
    verbatim = sum(
        1
        for m, w in zip(sent, wire, strict=True)
        if w["role"] != "system" and str(m.id) not in summary_ids
    )
    return Step(adapter.count(sent), verbatim, tool_pair_violations(wire))


LANGCHAIN = "LangChain SummarizationMiddleware"
LANGCHAIN_AGENT = "LangChain agent"
#: What the agent rows run: the middleware in LangChain's own agent graph.
AGENT_GRAPH = "create_agent + SummarizationMiddleware"
LANGMEM = "LangMem summarize_messages"


def model_call(latency_s: float) -> None:
    """The agent's model call after a step, as long as in our host (the peers are synchronous:
    a blocking sleep). Not timed, but it lets the CPU idle between steps as a real call does,
    so every system's next step starts from the same cache and clock state."""
    if latency_s:
        time.sleep(latency_s)


def run_langchain(
    lc: dict[str, Any],
    conversation: Conversation,
    counter: TokenCounter,
    *,
    model_latency_s: float = 0.0,
    budget: int = BUDGET,
) -> SystemRun:
    adapter, log, system, middleware = middleware_for(lc, conversation, counter, budget)
    run = SystemRun(LANGCHAIN)
    run.extra["budget"] = budget
    state: list[Any] = []
    for batch, _ in step_batches(conversation):
        state.extend(adapter.to_lc(m) for m in batch if m["role"] != "system")
        calls, start = log.calls, time.perf_counter()
        update = middleware.before_model({"messages": state}, None)
        if update:
            state = list(update["messages"][1:])  # [RemoveMessage(ALL), summary, *kept]
        run.step_times.append(time.perf_counter() - start)
        run.waited.append(log.calls > calls)
        summary_ids = {
            str(m.id) for m in state if m.additional_kwargs.get("lc_source") == "summarization"
        }
        run.steps.append(sent_step(adapter, [system, *state], summary_ids))
        model_call(model_latency_s)
    run.summarizer_calls, run.summarizer_input_tokens = log.calls, log.input_tokens
    return run


def middleware_for(
    lc: dict[str, Any], conversation: Conversation, counter: TokenCounter, budget: int
) -> tuple[LCAdapter, CallStats, Any, Any]:
    """The middleware as both LangChain rows run it on ``conversation``: it summarizes (with
    the fake summarizer, counted in the returned log) once the state passes the budget less the
    system prompt, keeping the last :data:`KEEP_MESSAGES` messages. Returns the adapter, the
    summarizer's log, the system message (outside the state, as ``create_agent`` has it) and
    the middleware."""
    adapter = LCAdapter(lc, counter)
    log = CallStats()
    system_text, _ = split_system(conversation)
    system = lc["SystemMessage"](content=system_text, id="system")
    middleware = lc["SummarizationMiddleware"](
        make_fake_model(lc, adapter, log),
        trigger=("tokens", budget - adapter.count([system])),
        keep=("messages", KEEP_MESSAGES),
        token_counter=adapter.count,
    )
    return adapter, log, system, middleware


def run_langchain_agent(
    lc: dict[str, Any],
    conversation: Conversation,
    counter: TokenCounter,
    *,
    checkpointer: str,
    model_latency_s: float = 0.0,
    budget: int = BUDGET,
) -> SystemRun:
    """The middleware inside LangChain's own agent (``create_agent``) with a checkpointer
    (``"in-memory"`` or ``"SQLite"``, a file in a temporary directory): the whole step a
    LangChain user's agent waits for between model calls (see ``bench/peer_agent.py``)."""
    adapter, log, system, middleware = middleware_for(lc, conversation, counter, budget)
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        saver = lc["checkpointers"][checkpointer](str(Path(tmp) / "checkpoints.db"))
        replay = replay_agent(
            lc,
            conversation.messages,
            to_lc=adapter.to_lc,
            system_prompt=system.content,
            middleware=middleware,
            checkpointer=saver,
            summarizer_calls=lambda: log.calls,
            model_latency_s=model_latency_s,
            thread_id=conversation.name,
        )
        if hasattr(saver, "conn"):
            saver.conn.close()
    run = SystemRun(agent_row(checkpointer))
    run.extra["budget"] = budget
    run.step_times, run.waited = replay.step_times, replay.waited
    for sent in replay.sent:
        summary_ids = {
            str(m.id) for m in sent if m.additional_kwargs.get("lc_source") == "summarization"
        }
        run.steps.append(sent_step(adapter, sent, summary_ids))
    run.summarizer_calls, run.summarizer_input_tokens = log.calls, log.input_tokens
    return run


def run_langmem(
    lc: dict[str, Any],
    conversation: Conversation,
    counter: TokenCounter,
    *,
    model_latency_s: float = 0.0,
    budget: int = BUDGET,
) -> SystemRun:
    adapter = LCAdapter(lc, counter)
    log = CallStats()
    model = make_fake_model(lc, adapter, log)
    system_text, _ = split_system(conversation)
    messages: list[Any] = [lc["SystemMessage"](content=system_text, id="system")]
    running = None
    run = SystemRun(LANGMEM)
    run.extra["budget"] = budget
    for batch, _ in step_batches(conversation):
        messages.extend(adapter.to_lc(m) for m in batch if m["role"] != "system")
        calls, start = log.calls, time.perf_counter()
        result = lc["summarize_messages"](
            messages,
            running_summary=running,
            model=model,
            max_tokens=budget,
            max_summary_tokens=LANGMEM_SUMMARY_TOKENS,
            token_counter=adapter.count,
        )
        running = result.running_summary
        run.step_times.append(time.perf_counter() - start)
        run.waited.append(log.calls > calls)
        sent = result.messages
        summary_ids = {
            str(m.id)
            for m in sent
            if m.type == "system" and running is not None and running.summary in str(m.content)
        }
        run.steps.append(sent_step(adapter, sent, summary_ids))
        model_call(model_latency_s)
    run.summarizer_calls, run.summarizer_input_tokens = log.calls, log.input_tokens
    return run


def agent_row(checkpointer: str) -> str:
    """The label of LangChain's agent with one of :data:`CHECKPOINTERS`."""
    return f"{LANGCHAIN_AGENT}, {checkpointer} checkpointer ({AGENT_GRAPH})"
