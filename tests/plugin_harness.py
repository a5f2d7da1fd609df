"""A host with the memory-summary plugin (from its entry point), a fake LLM and a real store,
recording what the plugin reports: ``async with plugin_host({"threshold": 10}) as h``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from host_stub.memory.sqlite import SQLiteMemory
from host_stub.testing import FakeLLM, HostHarness, message_tokens
from plugin_memory_summary import PLUGIN_NAME, MemorySummaryPlugin
from plugin_memory_summary.summarizer.parsing import carries_instructions


def json_summary(sent: list[dict[str, Any]]) -> str:
    """A summarizer that answers valid JSON saying only what its transcript said (a grounding
    check drops what a batch does not say): its digest is the batch's last assistant reply,
    which the record renders as ``Summary: reply N`` (the rules engine alone never keeps a
    two-word reply); the identifier it names, ``ORDER-12345``, no message holds."""
    transcript = sent[-1]["content"]
    replies = [
        line.split(": ", 1)[1] for line in transcript.splitlines() if line.startswith("assistant: ")
    ]
    # Not a reply that gives orders (a hostile conversation's): an answer carrying one is refused.
    replies = [r for r in replies if not carries_instructions(r)]
    last = replies[-1] if replies else "no reply"
    return json.dumps(
        {
            "summary": last,
            "conversation_goal": "test goal",
            "stable_facts": [last],
            "identifiers": ["ORDER-12345"],
        }
    )


#: What :func:`json_summary`'s answer puts in the record.
MODEL_DIGEST = "Summary: reply"


class Harness(HostHarness):
    """:class:`HostHarness` with the plugin at hand."""

    llm: FakeLLM

    @property
    def plugin(self) -> MemorySummaryPlugin:
        plugin: MemorySummaryPlugin = self.get_plugin(PLUGIN_NAME)
        return plugin


def plugin_host(
    plugin_config: dict[str, Any] | None = None,
    *,
    llm: FakeLLM | None = None,
    db: Path | None = None,
    host: dict[str, Any] | None = None,
    memory: Any = None,
) -> Harness:
    """A host (model ``fake/chat``, no reply reserve, ``host`` overriding) with the plugin
    configured by ``plugin_config``, the summarizer ``llm`` (answering :func:`json_summary`
    unless given) and ``memory`` (a SQLite file at ``db``, else in memory). Use it in an
    ``async with`` block: the host starts on entry and stops on the way out."""
    config = {
        "host": {"model": "fake/chat", "reserve_for_reply": 0, **(host or {})},
        "plugin": {PLUGIN_NAME: plugin_config or {}},
    }
    if memory is None and db is not None:
        memory = SQLiteMemory(db, token_counter=message_tokens)
    return Harness(config, llm=llm or FakeLLM(default=json_summary), memory=memory)
