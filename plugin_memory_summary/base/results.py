"""What a compression request returns: a frozen result with a literal status."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

__all__ = ["LOST_RACE", "Result", "Status", "result"]

#: The status of an attempt whose commit lost the compare-and-set (never reported).
LOST_RACE: Final = "lost-race"

#: A compression's final status; ``lost-race`` stays inside the scheduler (never returned).
Status = Literal["done", "error", "skipped", "lost-race"]


@dataclass(frozen=True, slots=True)
class Result(Mapping[str, Any]):
    """A compression's final status: what ``compress`` and ``rebuild`` return.

    Frozen, its ``stats`` a read-only view. Also a read-only mapping of its three fields
    (``result["status"]``, ``dict(result)`` for JSON), the shape these results had in 0.1."""

    status: Status
    reason: str = ""
    stats: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __getitem__(self, key: str) -> Any:
        if key not in _RESULT_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_RESULT_KEYS)

    def __len__(self) -> int:
        return len(_RESULT_KEYS)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready with ``default=str``): the stats copied."""
        return {"status": self.status, "reason": self.reason, "stats": dict(self.stats)}


_RESULT_KEYS = ("status", "reason", "stats")


def result(status: Status, reason: str, stats: Mapping[str, Any] | None = None) -> Result:
    """A :class:`Result` holding a snapshot of ``stats`` (later changes to it do not show)."""
    return Result(status, reason, MappingProxyType(dict(stats or {})))
