"""Chat notices (issue 17, point 8): a compression that ``/compress`` joined is announced once."""

from __future__ import annotations

import asyncio
from typing import Any

from plugin_harness import json_summary, plugin_host

from host_stub.messages import Message
from host_stub.testing import FakeLLM
from plugin_memory_summary.extras.chat import chat_commands

CONFIG = {"threshold": 1000, "keep_recent": 2, "auto_compress_threshold": 0, "recall_tokens": 0}


async def test_a_compression_compress_joined_is_announced_once() -> None:
    llm = FakeLLM(default=json_summary)
    gate = asyncio.Event()
    answer = llm.complete

    async def held(*args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        return await answer(*args, **kwargs)

    llm.complete = held  # type: ignore[method-assign]
    async with plugin_host(CONFIG, llm=llm) as h:
        for i in range(4):
            reply = [Message(role="assistant", content=f"Noted, item {i} is on the list.")]
            await h.host.run_turn("s", f"Please remember item {i} for the trip.", recorded=reply)
        notices: list[str] = []
        commands = {c.name: c for c in chat_commands(h.plugin, "s", notices.append)}
        running = asyncio.create_task(h.plugin.compress("s", "auto"))
        await asyncio.sleep(0.05)
        joined = asyncio.create_task(commands["/compress"].handler(""))
        await asyncio.sleep(0.05)
        gate.set()
        first, shown = await asyncio.gather(running, joined)
    assert first["status"] == "done", first
    assert len(notices) == 1, notices
    assert notices[0].startswith("[memory: ") and shown is None


def test_log_lines_wait_for_the_end_of_a_streaming_reply() -> None:
    import io
    import logging

    from host_stub.chat import HeldLogLines

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    log = logging.getLogger("plugin_memory_summary")
    held = HeldLogLines()
    handlers = held.attach()
    try:
        out.write("assistant> ")
        held.holding = True
        out.write("Hello")
        log.warning("summarizer failed (timed out)")
        out.write(" there.")
        assert out.getvalue() == "assistant> Hello there."
        out.write("\n")
        held.release(handlers)
        log.warning("after the reply")
    finally:
        root.removeHandler(handler)
    assert out.getvalue() == (
        "assistant> Hello there.\n"
        "WARNING plugin_memory_summary: summarizer failed (timed out)\n"
        "WARNING plugin_memory_summary: after the reply\n"
    )
