"""LangChain's ``SummarizationMiddleware`` inside the agent it is made for: a real
``langchain.agents.create_agent`` graph with a checkpointer, replaying a recorded conversation.

``bench/peers.py`` times the middleware's ``before_model`` call alone; a LangChain user's agent
waits for more between two model calls: the tool node, the state update, the checkpoint write and
the middleware's node. This replays the same steps through that graph so the whole step can be set
beside our whole host turn:

- the chat model answers each call with the next recorded assistant message (after the untimed
  model-call duration); its tools answer with the recorded results of the calls it made;
- a step's time runs from the end of the previous model call (or the start of the graph's run)
  to the start of the next, and a run's tail (after its last model call) goes to that call, as
  in our host; a step is waiting when the middleware called its summarizer in it;
- a turn's user message goes in with the turn's first run; a turn without a model call does
  not run the graph (our host makes no call for it either): its message goes in with the next
  run; a turn whose replies hold several answers without tool calls runs the graph once per
  answer; a turn that ends on tool results stops at the model call that would follow (our host
  makes none; the middleware's node before it still runs, and may summarize there).

LangChain is not a dependency of the plugin: the caller passes the classes (see
``peer_runs.import_peers``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from host_stub.messages import Message
from host_stub.transcripts import split_turns

__all__ = ["AgentTurn", "agent_turns", "call_key", "replay_agent"]


def call_key(name: str, arguments: str | None) -> tuple[str, str]:
    """A tool call as the agent's tool sees it: its name and its parsed arguments, in one
    canonical text (the tool is given the parsed arguments, not the call's id)."""
    try:
        args: Any = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        args = {"raw": arguments}
    return name, json.dumps(args, sort_keys=True)


@dataclass
class AgentTurn:
    """One recorded turn as the agent replays it: the user's messages it starts with (system
    messages are the agent's system prompt, not state), the model's answers in order, and the
    tools' recorded results by :func:`call_key` (first asked, first answered)."""

    inputs: list[Message]
    answers: list[Message]
    results: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def agent_turns(messages: Sequence[Message]) -> list[AgentTurn]:
    """The recorded conversation as agent turns (the host's grouping, ``split_turns``)."""
    turns = []
    for inputs, recorded in split_turns(list(messages)):
        by_id = {m.tool_call_id: m.content for m in recorded if m.role == "tool"}
        turn = AgentTurn(
            [m for m in inputs if m.role != "system"],
            [m for m in recorded if m.role == "assistant"],
        )
        for m in recorded:
            for call in m.tool_calls or []:
                content = by_id.get(call.id)
                key = call_key(call.function.name, call.function.arguments)
                turn.results.setdefault(key, []).append(
                    content if isinstance(content, str) else json.dumps(content)
                )
        turns.append(turn)
    return turns


@dataclass
class AgentReplay:
    """What a replay measured: per model call the messages sent, the step's time and whether
    it waited for the summarizer."""

    sent: list[list[Any]] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    waited: list[bool] = field(default_factory=list)


class _TurnOver(Exception):
    """The graph asked for a model call the recording does not have (the turn ended on tool
    results): the run stops there; its state up to the tool results is checkpointed."""


def replay_agent(
    lc: dict[str, Any],
    messages: Sequence[Message],
    *,
    to_lc: Any,
    system_prompt: str,
    middleware: Any,
    checkpointer: Any,
    summarizer_calls: Any,
    model_latency_s: float = 0.0,
    thread_id: str = "bench",
) -> AgentReplay:
    """Replay ``messages`` through ``create_agent(model, tools, middleware=[middleware],
    checkpointer=checkpointer)``. ``to_lc`` converts an OpenAI-format dict to a LangChain
    message; ``summarizer_calls()`` is how many calls the middleware's summarizer has
    answered so far."""
    out = AgentReplay()
    turns = agent_turns(messages)
    names = sorted({c.function.name for m in messages for c in (m.tool_calls or [])})
    current: list[AgentTurn] = []
    mark = {"since": 0.0, "calls": 0}

    def start_step() -> None:
        mark["since"], mark["calls"] = time.perf_counter(), summarizer_calls()

    class Replayer(lc["BaseChatModel"]):  # type: ignore[misc, valid-type]
        @property
        def _llm_type(self) -> str:
            return "bench-recorded-replies"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(
            self, sent: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> Any:
            now = time.perf_counter()
            answers = current[0].answers
            if not answers:
                raise _TurnOver
            out.step_times.append(now - mark["since"])
            out.waited.append(summarizer_calls() > mark["calls"])
            out.sent.append(list(sent))
            reply = to_lc(answers.pop(0).to_openai())
            if model_latency_s:
                time.sleep(model_latency_s)  # the model call: not timed
            start_step()
            return lc["ChatResult"](generations=[lc["ChatGeneration"](message=reply)])

    class Recorded(lc["BaseTool"]):  # type: ignore[misc, valid-type]
        description: str = "answers with the recorded result"

        def _run(self, *args: Any, **kwargs: Any) -> str:
            queue = current[0].results.get((self.name, json.dumps(kwargs, sort_keys=True)))
            return queue.pop(0) if queue else ""

    agent = lc["create_agent"](
        Replayer(),
        [Recorded(name=name) for name in names],
        system_prompt=system_prompt,
        middleware=[middleware],
        checkpointer=checkpointer,
    )
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": 100_000}
    waiting: list[Any] = []  # user messages of turns without a model call, not yet sent
    for turn in turns:
        waiting.extend(to_lc(m.to_openai()) for m in turn.inputs)
        if not turn.answers:
            continue
        current[:] = [turn]
        while turn.answers:
            start_step()
            calls = len(out.step_times)
            try:
                agent.invoke({"messages": waiting}, config)
            except _TurnOver:
                pass
            else:
                if len(out.step_times) == calls:
                    raise RuntimeError(
                        f"{thread_id}: the agent ended a run without calling its model"
                    )
                out.step_times[-1] += time.perf_counter() - mark["since"]  # the run's tail
            waiting = []
    return out
