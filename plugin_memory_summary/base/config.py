"""The plugin's configuration: every knob with its default and range.

Defaults come from the seeds (Aalis's plugin for threshold / keep_recent / summary_token_ratio /
auto_compress_threshold, the Python skill for the hard watermark and ``summary_max_tokens``, the
Java design for the payload caps). ``plugin.toml`` repeats these defaults; a test keeps them equal.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .patterns import validate_patterns

__all__ = ["MemorySummaryConfig", "PayloadCaps"]


# Both models build their validators on first use (a host validating the plugin's config, or
# ``create_plugin``), not at import (``defer_build``).
#: The first words of tool names that only read (``read_only_tools``).
DEFAULT_READ_ONLY_TOOLS: tuple[str, ...] = (
    "get",
    "search",
    "list",
    "find",
    "read",
    "lookup",
    "look",
    "calculate",
    "compute",
    "think",
    "check",
    "fetch",
    "query",
    "view",
    "show",
    "count",
    "describe",
    "retrieve",
    "browse",
    "inspect",
    "preview",
    "estimate",
    "validate",
    "verify",
)


class PayloadCaps(BaseModel):
    """Caps on the structured summary (seed 002's defaults); the token budget still wins."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    summary_chars: int = Field(
        default=1400, ge=100, le=100_000, description="Characters of the prose summary."
    )
    goal_chars: int = Field(
        default=120, ge=10, le=10_000, description="Characters of the conversation goal."
    )
    list_items: int = Field(default=6, ge=1, le=100, description="Items per list field.")
    item_chars: int = Field(default=80, ge=10, le=10_000, description="Characters per list item.")
    identifiers: int = Field(
        default=1000,
        ge=0,
        le=10_000,
        description="Identifiers carried verbatim (their share of the summary budget binds first).",
    )
    timeline_items: int = Field(default=12, ge=1, le=200, description="Events on the timeline.")
    excerpt_chars: int = Field(
        default=300,
        ge=20,
        le=10_000,
        description="Characters per sentence the rules engine keeps verbatim (a longer one is kept as whole clauses).",
    )


class MemorySummaryConfig(BaseModel):
    """Configuration of the ``memory-summary`` plugin (``[plugin.memory-summary]`` in a host
    config file)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    strategy: Literal["summary", "window", "off"] = Field(
        default="summary",
        description="`summary` summarizes and archives; `window` only archives old messages; `off` does nothing.",
    )
    threshold: int | None = Field(
        default=None,
        ge=2,
        le=100_000,
        description="Also compress after a turn once this many active messages (markers excluded) exist; unset = off (the watermarks decide).",
    )
    keep_recent: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="At most this many newest messages kept verbatim after a compression (must be < threshold); unset = as many as fit the fill target.",
    )
    keep_recent_tokens: int | None = Field(
        default=None,
        ge=1,
        description="If set, the kept window also holds at most this many tokens.",
    )
    summary_token_ratio: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description=(
            "Summary budget as a share of the chat model's context window less its fixed parts "
            "(at least 512 tokens), and at most 90% of what the fill target leaves them: a dense "
            "summary keeps more facts per token than old verbatim turns."
        ),
    )
    summary_max_tokens: int = Field(
        default=8000,
        ge=0,
        le=1_000_000,
        description="Cap on the summary budget; 0 = no cap.",
    )
    auto_compress_threshold: float = Field(
        default=0.85,
        ge=0,
        le=1,
        description="Soft watermark: context usage ratio that starts a background compression; 0 = off.",
    )
    hard_compress_threshold: float = Field(
        default=0.9,
        ge=0,
        le=10,
        description="Hard watermark: usage ratio that compresses before the model call; 0 or >= 1 = off.",
    )
    hard_deadline_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Deadline of a blocking compression; past it the rules engine finishes it.",
    )
    debounce_turns: int = Field(
        default=3,
        ge=0,
        le=10_000,
        description="Turns (user messages) between two turn-triggered compressions.",
    )
    min_gain: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="A watermark compression must be able to free this share of the context window; it cuts down to the fill target (the mark less this share).",
    )
    cooldown_s: float = Field(
        default=30.0,
        ge=0,
        le=86_400,
        description="After a watermark compression that could not bring usage under the mark, wait this long.",
    )
    summary_prompt: str = Field(
        default="",
        description="System prompt for the summarizer; empty = built-in (Chinese or English).",
    )
    summary_model: str | None = Field(
        default=None,
        description="Model for summaries (any litellm model); unset = the host's default model.",
    )
    summary_timeout_s: float = Field(
        default=60.0, gt=0, le=3600, description="Timeout of one summarizer call."
    )
    summary_temperature: float = Field(
        default=0.3,
        ge=0,
        le=2,
        description="Summarizer temperature (dropped for models that refuse it).",
    )
    summary_reply_max_chars: int = Field(
        default=100_000,
        ge=1_000,
        le=10_000_000,
        description=(
            "Longest summarizer answer that is parsed; a longer one is unusable output "
            "(the fallback runs) and is never stored."
        ),
    )
    tool_truncate_chars: int = Field(
        default=200,
        ge=10,
        le=100_000,
        description="Tool arguments and results are cut to this many characters in the transcript.",
    )
    message_truncate_chars: int = Field(
        default=4000,
        ge=100,
        le=1_000_000,
        description="Any one message is cut to this many characters in the transcript.",
    )
    batch_tokens: int = Field(
        default=0,
        ge=0,
        description="Transcript tokens per summarizer call; 0 = derived from the summarizer's window.",
    )
    max_batches_per_run: int = Field(
        default=4,
        ge=1,
        le=1000,
        description="Batches folded per run; a larger backlog is folded over several runs, oldest first.",
    )
    fallback: Literal["rules", "trim"] = Field(
        default="rules",
        description="On summarizer failure: `rules` merges extractively without an LLM; `trim` only archives.",
    )
    max_concurrent_summaries: int = Field(
        default=4,
        ge=1,
        le=1000,
        description=(
            "Background compressions summarizing at once in this process (hard ones bypass it); "
            "a run takes its place before the lease and gives it back before the commit."
        ),
    )
    shutdown_grace_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="At shutdown, background compressions get this long to finish before they are cancelled.",
    )
    lease_ttl_s: float = Field(
        default=6.0,
        gt=0,
        le=86_400,
        description=(
            "Expiry of the cross-process compression lease unless renewed: a live run renews it "
            "every third of this, however long it takes, so a crashed process's lease is taken "
            "over within this many seconds, and a run that stalls longer loses the lease and its "
            "commit is refused."
        ),
    )
    redact_patterns: list[str] = Field(
        default_factory=list,
        description="Extra regular expressions redacted before text reaches the summarizer (built-ins always run).",
    )
    language: Literal["auto", "zh", "en"] = Field(
        default="auto",
        description="Language of the summary prompt; `auto` follows the conversation.",
    )
    recall_tokens: int = Field(
        default=1500,
        ge=0,
        le=100_000,
        description=(
            "Cap (tokens) on one result of the agent's `memory_search` and `memory_expand` "
            "tools; 0 = no such tools."
        ),
    )
    prune_keep_tool_groups: int | None = Field(
        default=3,
        ge=0,
        le=100_000,
        description=(
            "Tier 1, before any summary: the results of every tool-call group but the newest "
            "this many are shown in the prompt as a one-line placeholder (the stored message "
            "stays whole; `memory_expand` reopens it); unset = never."
        ),
    )
    tool_result_max_share: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description=(
            "Tier 1: one tool result takes at most this share of the context window in the "
            "prompt, cut with a note of what was left out (stored whole); 0 = no limit."
        ),
    )
    read_only_tools: list[str] = Field(
        default_factory=lambda: list(DEFAULT_READ_ONLY_TOOLS),
        description=(
            "Tools that only read: a tool whose name is listed, or starts with a listed word "
            "(`get_user_details` by `get`), leaves in the summary only the values of its result "
            "that a later step used; every other tool call is an action in the summary's ledger."
        ),
    )
    caps: PayloadCaps = Field(default_factory=PayloadCaps)

    @field_validator("read_only_tools")
    @classmethod
    def _check_tools(cls, names: list[str]) -> list[str]:
        cleaned = [n.strip() for n in names]
        if any(not n for n in cleaned):
            raise ValueError("read_only_tools holds an empty name")
        return cleaned

    @field_validator("redact_patterns")
    @classmethod
    def _check_patterns(cls, patterns: list[str]) -> list[str]:
        validate_patterns(patterns)
        return patterns

    @model_validator(mode="after")
    def _check_relations(self) -> MemorySummaryConfig:
        if (
            self.keep_recent is not None
            and self.threshold is not None
            and self.keep_recent >= self.threshold
        ):
            raise ValueError(
                f"keep_recent ({self.keep_recent}) must be smaller than threshold ({self.threshold})"
            )
        soft, hard = self.auto_compress_threshold, self.hard_compress_threshold
        if soft > 0 and 0 < hard < 1 and soft >= hard:
            raise ValueError(
                f"auto_compress_threshold ({soft}) must be below hard_compress_threshold ({hard})"
            )
        return self

    @property
    def fill_target(self) -> float:
        """Share of the window a compression cuts the prompt down to (the summary at its full
        budget included): the soft mark (else the hard one) less ``min_gain``."""
        mark = (
            self.auto_compress_threshold
            if self.soft_enabled
            else (self.hard_compress_threshold if self.hard_enabled else 0.7)
        )
        return max(0.1, mark - self.min_gain)

    @property
    def hard_enabled(self) -> bool:
        return 0 < self.hard_compress_threshold < 1

    @property
    def soft_enabled(self) -> bool:
        return self.auto_compress_threshold > 0
