"""The plugin's parts: the host's services and the workers built on them, set once at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from host_stub.services import HostProtocol, MemoryService

from ..prompt import TokenBook
from .pipeline import Pipeline
from .scheduler import Scheduler

__all__ = ["NotStartedError", "Parts"]


class NotStartedError(RuntimeError):
    """The plugin was used before the host called its ``startup`` hook."""


@dataclass(frozen=True, slots=True)
class Parts:
    """What the plugin works with, set once by ``startup``: the host's services and the
    plugin's own workers built on them."""

    host: HostProtocol
    memory: MemoryService
    tokens: TokenBook
    pipeline: Pipeline
    scheduler: Scheduler
