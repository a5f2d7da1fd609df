"""What the plugin adds to ``host-stub chat``: ``/summary``, ``/compress``, and a line for every
compression of the chat's session (``[memory: 24 messages summarized, ...]``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from host_stub import signals
from host_stub.hookspecs import ChatCommand

if TYPE_CHECKING:
    from ..plugin import MemorySummaryPlugin

__all__ = ["chat_commands", "run_key"]


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def run_key(status: str, stats: dict[str, Any]) -> tuple[Any, ...]:
    """What tells one compression run from another in its final status: the same run reported
    to two requests has the same stats (where its record ends, its tokens, its duration)."""
    keys = ("covered_up_to_seq", "messages_archived", "tokens_before", "tokens_after")
    return (status, *(stats.get(k) for k in keys), stats.get("duration_s"))


def chat_commands(
    plugin: MemorySummaryPlugin, session_id: str, notify: Callable[[str], None]
) -> list[ChatCommand]:
    """The chat commands on ``session_id``; every compression of it that summarized or archived
    messages is announced through ``notify``."""
    from .report import compression_event, compression_line

    announced = [0]
    #: Runs announced: every request a run served (the one that started it, those that joined
    #: it) reports its result, and a run is announced once.
    seen: set[tuple[Any, ...]] = set()

    async def on_status(sender: Any, **payload: Any) -> None:
        if payload["session_id"] != session_id or payload["status"] not in ("done", "error"):
            return
        event = compression_event(0, payload)
        if event is None:
            return
        stats = payload.get("stats") or {}
        run = run_key(payload["status"], stats)
        if run in seen:
            return
        seen.add(run)
        event = dataclasses.replace(event, trigger=str(stats.get("trigger") or ""))
        announced[0] += 1
        notify(f"[memory: {compression_line(event)}]")

    plugin.host.bus.connect(signals.SESSION_COMPRESSING, on_status)

    async def summary(argument: str) -> str:
        return await plugin.get_conversation_summary(session_id) or "(no summary yet)"

    async def compress(argument: str) -> str | None:
        before = announced[0]
        result = await plugin.compress(session_id)
        if result.status == "done" and announced[0] > before:
            return None  # its compression line says it
        reason = _one_line(result.reason)
        return f"[compress: {result.status}{': ' + reason if reason else ''}]"

    return [
        ChatCommand(name="/summary", help="show the session's summary", handler=summary),
        ChatCommand(name="/compress", help="compress the session now", handler=compress),
    ]
