"""What a replay report holds: the compressions, the context per turn, the summary at the end."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from host_stub.prompt import PrefixReuse, reuse_shares

__all__ = ["CompressionEvent", "ReplayReport", "RunSeries", "compression_event"]


@dataclass
class CompressionEvent:
    """One compression that archived messages, as the plugin reported it."""

    turn: int
    status: str
    trigger: str
    reason: str
    messages_summarized: int = 0
    messages_archived: int = 0
    tokens_before: int | None = None
    tokens_after: int | None = None
    summary_tokens: int | None = None
    model: str | None = None
    fallback: str | None = None
    cost: float = 0.0
    duration_s: float = 0.0
    #: Summarizer calls, those whose answer the merge used, and the seconds each took.
    llm_calls: int = 0
    answers_used: int = 0
    llm_seconds: list[float] = field(default_factory=list)

    @property
    def fell_back(self) -> bool:
        """A model was asked and failed (or the deadline passed): the fallback wrote it."""
        return self.model is not None and self.fallback is not None


@dataclass
class RunSeries:
    """One replay: the context measured per turn and the compressions."""

    context: list[int] = field(default_factory=list)
    #: Per turn, the context the turn would have needed with nothing compressed (see above).
    uncompressed: list[int] = field(default_factory=list)
    compressions: list[CompressionEvent] = field(default_factory=list)
    #: Final statuses that archived nothing, by status (``skipped``, ``error``).
    other_statuses: dict[str, int] = field(default_factory=dict)
    #: Per model call after a session's first: (prompt tokens reused from the previous prompt's
    #: prefix, prompt tokens), from ``token:usage``.
    prefix: list[tuple[int, int]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def max(self) -> int:
        return max(self.context, default=0)

    @property
    def mean(self) -> float:
        return sum(self.context) / len(self.context) if self.context else 0.0

    def over(self, limit: int) -> int:
        return sum(1 for c in self.context if c > limit)

    @property
    def prefix_reuse(self) -> tuple[float, float] | None:
        """Share of prompt tokens reused from the previous prompt: pooled, median per call."""
        return reuse_shares(PrefixReuse(*p) for p in self.prefix)


@dataclass
class ReplayReport:
    title: str
    session_id: str
    messages: int
    turns: int
    tool_results: int
    context_window: int
    summary_model: str | None
    auto_mark: float | None
    hard_mark: float | None
    with_plugin: RunSeries
    without_plugin: RunSeries | None
    #: How the baseline was obtained: ``computed``, ``replay`` or ``off``.
    baseline: str = "computed"
    summary: str | None = None
    summary_tokens: int = 0
    summary_messages: int = 0
    summary_compressions: int = 0
    summary_lang: str | None = None
    summary_cost: float = 0.0
    active: int = 0
    archived: int = 0
    #: Event markers the plugin wrote (one per compression); the store counts them as messages.
    markers: int = 0
    plugin_loaded: bool = True
    seconds: float = 0.0
    store: str = ""
    #: Facts stated early (label -> text): which the final summary still holds verbatim.
    facts_kept: dict[str, str] = field(default_factory=dict)
    facts_lost: dict[str, str] = field(default_factory=dict)
    #: How the chat model's token counts were calibrated (``Host.calibration_report()``).
    calibration: dict[str, Any] = field(default_factory=dict)

    @property
    def fell_back(self) -> list[CompressionEvent]:
        return [e for e in self.with_plugin.compressions if e.fell_back]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        runs = (("with_plugin", self.with_plugin), ("without_plugin", self.without_plugin))
        for key, series in runs:
            if series is not None:
                out[key].update(
                    max=series.max,
                    mean=round(series.mean, 1),
                    over_window=series.over(self.context_window),
                    prefix_reuse=series.prefix_reuse,
                )
        out["fell_back"] = len(self.fell_back)
        return out


def compression_event(turn: int, payload: dict[str, Any]) -> CompressionEvent | None:
    stats = payload.get("stats") or {}
    summarized = int(stats.get("messages_summarized") or 0)
    archived = int(stats.get("messages_archived") or 0)
    if not (summarized or archived):
        return None
    return CompressionEvent(
        turn=turn,
        status=payload["status"],
        trigger=str(stats.get("trigger") or payload.get("reason") or ""),
        reason=str(payload.get("reason") or ""),
        messages_summarized=summarized,
        messages_archived=archived,
        tokens_before=stats.get("tokens_before"),
        tokens_after=stats.get("tokens_after"),
        summary_tokens=stats.get("summary_tokens"),
        model=stats.get("model"),
        fallback=stats.get("fallback"),
        cost=float(stats.get("cost") or 0.0),
        duration_s=float(stats.get("duration_s") or 0.0),
        llm_calls=int(stats.get("llm_calls") or 0),
        answers_used=int(stats.get("answers_used") or 0),
        llm_seconds=[float(t) for t in stats.get("llm_seconds") or []],
    )
