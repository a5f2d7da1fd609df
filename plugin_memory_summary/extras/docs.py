"""The plugin's part of the generated docs: its config table, contributed through the
``docs_sections`` hook (``python -m host_stub.docgen docs/configuration.md`` renders it)."""

from __future__ import annotations

from host_stub.hookspecs import DocsSection

from ..base import MemorySummaryConfig

__all__ = ["AALIS_CONFIG", "docs_sections"]

#: Our config key -> the Aalis config field(s) (the TypeScript plugin this project ports).
AALIS_CONFIG: dict[str, str] = {
    "threshold": "`threshold`",
    "keep_recent": "`keepRecent`",
    "summary_token_ratio": "`summaryTokenRatio`",
    "auto_compress_threshold": "`autoCompressThreshold`",
    "summary_prompt": "`summaryPrompt`",
    "summary_model": "`summaryModelMode` + `summaryLLM`",
}


def docs_sections() -> list[DocsSection]:
    """``config``: every key of ``[plugin.memory-summary]``, with its Aalis counterpart."""
    return [DocsSection(name="config", config=MemorySummaryConfig, columns={"Aalis": AALIS_CONFIG})]
