"""A started host for a test, as an ``async with`` block."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import signals
from ..config import HostConfig
from ..host import Host
from ..memory.inmemory import InMemoryMemory
from ..messages import Message
from .llm import FakeLLM, message_tokens

__all__ = ["HostHarness"]


class HostHarness:
    """``async with HostHarness(config) as h``: a started host (``h.host``) on ``llm`` (a
    :class:`FakeLLM` unless given) and ``memory`` (an in-memory store counting with
    :func:`message_tokens` unless given), stopped on the way out. ``config`` is a
    :class:`HostConfig` or the dict of one. ``h.statuses`` holds every ``session:compressing``
    payload and ``h.requests`` every ``session:compress`` payload sent while it runs: the
    requests others make (a plugin's own triggers call its scheduler without a signal; each
    request shows in ``h.starts()`` either way)."""

    def __init__(
        self,
        config: HostConfig | dict[str, Any] | None = None,
        *,
        llm: Any = None,
        memory: Any = None,
        plugins: Sequence[tuple[str, Any]] = (),
        **host_kwargs: Any,
    ) -> None:
        if isinstance(config, dict):
            config = HostConfig.model_validate(config)
        self.llm = llm if llm is not None else FakeLLM()
        if memory is None:
            memory = InMemoryMemory(token_counter=message_tokens)
        self.host = Host(config, memory=memory, llm=self.llm, plugins=plugins, **host_kwargs)
        self.statuses: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []

    async def __aenter__(self) -> HostHarness:
        await self.host.start()
        self.host.bus.connect(signals.SESSION_COMPRESSING, self._on_status)
        self.host.bus.connect(signals.SESSION_COMPRESS, self._on_request)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.host.stop()

    async def _on_status(self, sender: Any, **payload: Any) -> None:
        self.statuses.append(payload)

    async def _on_request(self, sender: Any, **payload: Any) -> None:
        self.requests.append(payload)

    def get_plugin(self, name: str) -> Any:
        return self.host.get_plugin(name)

    def starts(self, reason: str | None = None) -> list[dict[str, Any]]:
        """The ``start`` statuses: every compression request that began, or those of one
        ``reason`` (``auto`` for the soft watermark's)."""
        return [
            s
            for s in self.statuses
            if s["status"] == "start" and (reason is None or s["reason"] == reason)
        ]

    def finals(self, request_id: str | None = None) -> list[dict[str, Any]]:
        """The final statuses (``done``, ``error``, ``skipped``), of one request or all."""
        return [
            s
            for s in self.statuses
            if s["status"] in ("done", "error", "skipped")
            and (request_id is None or s["request_id"] == request_id)
        ]

    async def turns(
        self, session: str, n: int, start: int = 0, pad: int = 0, **kwargs: Any
    ) -> list[Any]:
        """``n`` replayed turns (a user message, a recorded reply); ``pad`` adds that many
        characters to each message."""
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
