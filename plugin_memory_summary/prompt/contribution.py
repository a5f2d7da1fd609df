"""What the plugin adds to each prompt: tier 1's replacements and the summary block, fitted
together to the window (``prompt_fit``) once per prompt.

It reads the pipeline's config, token book and pruning memo (:class:`PromptSources`), never the
compression itself: the prompt side sits below the pipeline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from host_stub.hookspecs import Contribution, PromptView
from host_stub.messages import Message

from ..base import MemorySummaryConfig, fixed_tokens
from ..record import read_record
from .prompt_fit import Fit, fit_prompt
from .pruning import result_limit
from .state import SessionState
from .tokens import TokenBook

__all__ = ["PromptSources", "fitted_replacements", "summary_contribution"]

#: A summary block given fewer tokens than its framing and this many is left out.
MIN_BLOCK_TEXT = 48


class PromptSources(Protocol):
    """What the prompt side reads of the compression pipeline (``pipeline.Pipeline``)."""

    @property
    def config(self) -> MemorySummaryConfig: ...

    @property
    def tokens(self) -> TokenBook: ...

    @property
    def prune_memo(self) -> dict[tuple[object, ...], tuple[str, int]]: ...


def _key(view: PromptView) -> tuple[object, ...]:
    newest = view.messages[-1].seq if view.messages else None
    version = view.summary.version if view.summary is not None else 0
    return (len(view.messages), newest, version, view.epoch, view.context_window)


def _full_block(
    view: PromptView, state: SessionState, tokens: TokenBook, name: str
) -> tuple[str, int] | None:
    """The summary block at its full budget (cached per record version and budget)."""
    if view.summary is None:
        return None
    budget = tokens.budget(view.context_window, state.breakdown, state.core_tokens)
    cached = tokens.cached_block(view.session_id, view.summary.version, budget)
    if cached is None:
        record = read_record(view.summary, view.epoch)
        if record is None or record.stale or not record.text:
            return None
        cached = tokens.block(view.session_id, view.summary.version, record, budget)
    return cached


def _shown_counter(
    view: PromptView, state: SessionState, tokens: TokenBook
) -> Callable[[Message, str], int]:
    """A message's tokens shown as a text, counted as the host counts it (remembered per
    session: the same placeholders and cuts come back on every call)."""
    memo = state.shown_tokens

    def count(message: Message, text: str) -> int:
        key = (message.seq, len(text), hash(text))
        known = memo.get(key)
        if known is None:
            if len(memo) >= 512:
                memo.clear()
            shown = message.model_copy(update={"content": text})
            known = memo[key] = tokens.llm.count_tokens([shown], view.model)
        return known

    return count


def _soft_mark(config: MemorySummaryConfig, window: int) -> int | None:
    """The tokens at which a compression would start (the soft mark, else the hard one)."""
    if config.strategy != "summary":
        return None
    mark = config.auto_compress_threshold if config.soft_enabled else None
    if mark is None and config.hard_enabled:
        mark = config.hard_compress_threshold
    return None if mark is None else int(mark * window) - 1


def _fit(view: PromptView, state: SessionState, pipeline: PromptSources, name: str) -> Fit:
    key = _key(view)
    if state.fit is not None and state.fit[0] == key:
        return state.fit[1]
    config, tokens = pipeline.config, pipeline.tokens
    summary = config.strategy == "summary"
    block = _full_block(view, state, tokens, name) if summary else None
    share = config.tool_result_max_share
    keep = config.prune_keep_tool_groups
    fit = fit_prompt(
        view.messages,
        window=view.context_window,
        fixed=fixed_tokens(state.breakdown),
        block_tokens=block[1] if block else 0,
        keep_tool_groups=len(view.messages) if keep is None else keep,
        max_result_tokens=result_limit(view.context_window, share) if share else None,
        count_tokens=tokens.count,
        recall=tokens.recall,
        memo=pipeline.prune_memo,
        count_shown=_shown_counter(view, state, tokens),
        prune_to=_soft_mark(config, view.context_window),
    )
    state.fit = (key, fit)
    return fit


def fitted_replacements(
    view: PromptView, state: SessionState, pipeline: PromptSources, name: str
) -> dict[int, str]:
    """Tier 1's replacements, deeper when the prompt would not fit the window."""
    if pipeline.config.strategy == "off":
        return {}
    return _fit(view, state, pipeline, name).replacements


def summary_contribution(
    view: PromptView, state: SessionState, pipeline: PromptSources, name: str
) -> Contribution | None:
    """The summary block, smaller (its least important items left out) when the prompt would
    not fit the window at its full size; none when even its framing would not."""
    if pipeline.config.strategy != "summary" or view.summary is None:
        return None
    tokens = pipeline.tokens
    full = _full_block(view, state, tokens, name)
    if full is None:
        return None
    fit = _fit(view, state, pipeline, name)
    if fit.block_budget is None or fit.block_budget >= full[1]:
        return Contribution(id=name, anchor="context", content=full[0])
    # Budgets rounded down to 32 tokens: a shrinking prompt reuses the same few blocks (found
    # without reading the record again).
    budget = fit.block_budget - fit.block_budget % 32
    value = view.summary.value or {}
    lang = value.get("lang")
    known = tokens.cached_block(view.session_id, view.summary.version, budget)
    if (
        known is not None
        and isinstance(lang, str)
        and fit.block_budget >= tokens.framing_tokens(lang) + MIN_BLOCK_TEXT
    ):
        return Contribution(id=name, anchor="context", content=known[0])
    record = read_record(view.summary, view.epoch)
    if record is None:
        return None
    if fit.block_budget < tokens.framing_tokens(record.lang) + MIN_BLOCK_TEXT:
        return None
    block, _ = tokens.block(view.session_id, view.summary.version, record, budget)
    return Contribution(id=name, anchor="context", content=block)
