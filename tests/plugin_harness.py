"""Build a host with the memory-summary plugin (from its entry point), a scripted LLM and a real
store, and record what the plugin reports."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakes import ScriptedLLM, simple_count

from host_stub import signals
from host_stub.config import HostConfig
from host_stub.host import Host
from host_stub.memory.inmemory import InMemoryMemory
from host_stub.memory.sqlite import SQLiteMemory
from host_stub.messages import Message
from plugin_memory_summary import MemorySummaryPlugin


def counter(message: Message) -> int:
    return (
        4
        + simple_count(json.dumps(message.content, ensure_ascii=False))
        + (
            simple_count(json.dumps([c.model_dump() for c in message.tool_calls]))
            if message.tool_calls
            else 0
        )
    )


def json_summary(sent: list[dict[str, Any]]) -> str:
    """A summarizer that answers valid JSON naming how much transcript it saw."""
    transcript = sent[-1]["content"]
    return json.dumps(
        {
            "summary": f"Summary of {transcript.count(chr(10))} transcript lines.",
            "conversation_goal": "test goal",
            "stable_facts": ["fact A"],
            "identifiers": ["ORDER-12345"],
        }
    )


@dataclass
class Harness:
    host: Host
    llm: ScriptedLLM
    statuses: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def plugin(self) -> MemorySummaryPlugin:
        plugin: MemorySummaryPlugin = self.host.get_plugin("memory-summary")
        return plugin

    def finals(self, request_id: str | None = None) -> list[dict[str, Any]]:
        return [
            s
            for s in self.statuses
            if s["status"] in ("done", "error", "skipped")
            and (request_id is None or s["request_id"] == request_id)
        ]

    async def turns(
        self, session: str, n: int, start: int = 0, pad: int = 0, **kwargs: Any
    ) -> list[Any]:
        """``n`` replayed turns; ``pad`` adds that many characters to each message."""
        out = []
        for i in range(start, start + n):
            out.append(
                await self.host.run_turn(
                    session,
                    f"user message {i}" + " lorem" * (pad // 6),
                    recorded=[
                        Message(role="assistant", content=f"reply {i}" + " ipsum" * (pad // 6))
                    ],
                    **kwargs,
                )
            )
        return out


async def make_harness(
    plugin_config: dict[str, Any] | None = None,
    *,
    llm: ScriptedLLM | None = None,
    db: Path | None = None,
    host: dict[str, Any] | None = None,
    memory: Any = None,
) -> Harness:
    config = HostConfig.model_validate(
        {
            "host": {"model": "fake/chat", "reserve_for_reply": 0, **(host or {})},
            "plugin": {"memory-summary": plugin_config or {}},
        }
    )
    llm = llm or ScriptedLLM(default=json_summary)
    if memory is None:
        memory = (
            SQLiteMemory(db, token_counter=counter) if db else InMemoryMemory(token_counter=counter)
        )
    h = Host(config, memory=memory, llm=llm)
    harness = Harness(h, llm)

    async def on_status(sender: Any, **payload: Any) -> None:
        harness.statuses.append(payload)

    async def on_request(sender: Any, **payload: Any) -> None:
        harness.requests.append(payload)

    await h.start()
    h.bus.connect(signals.SESSION_COMPRESSING, on_status)
    h.bus.connect(signals.SESSION_COMPRESS, on_request)
    return harness
