"""Budget and token bookkeeping: the summary budget, batch sizes, token counts of the plugin's
own texts, and the injected block per record version."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from host_stub.services import LLMService

from ..base import MemorySummaryConfig, cut_text, fixed_tokens, summary_budget, tail_room_cap
from ..record import PayloadFitter, SummaryRecord
from ..safety import framing_overhead, wrap_summary_block
from ..summarizer import SpeedBook

__all__ = ["BLOCK_CACHE_SIZE", "COUNT_MEMO_SIZE", "FITTERS_KEPT", "PreparedBlock", "TokenBook"]

#: Texts whose token count ``TokenBook.count`` remembers (summaries, blocks; a few per
#: compression).
COUNT_MEMO_SIZE = 256

#: Injected blocks kept (one per session, record version and budget).
BLOCK_CACHE_SIZE = 4096

#: Records whose smaller renderings are kept for the next budget (one per session and version;
#: the most recently used).
FITTERS_KEPT = 64

BlockKey = tuple[str, int, int]


@dataclass(frozen=True)
class PreparedBlock:
    """A block rendered for a record before its commit (see ``TokenBook.prepare_block``)."""

    block: str
    tokens: int
    budget: int
    fitter: PayloadFitter | None


class TokenBook:
    """Counts with the summary model's tokenizer and remembers what it counted."""

    def __init__(self, config: MemorySummaryConfig, llm: LLMService) -> None:
        self.config = config
        self.llm = llm
        #: Token counts of recent texts, oldest first.
        self._counted: dict[str, int] = {}
        #: A background compression counts in a worker thread while the loop counts a prompt.
        self._counting = threading.Lock()
        self._blocks: dict[BlockKey, tuple[str, int]] = {}
        self._fitters: dict[tuple[str, int], PayloadFitter] = {}
        #: How fast each summary model answered so far (sizes its calls to its timeout).
        self.speed = SpeedBook()

    @property
    def recall(self) -> bool:
        """The agent has the recall tools: the block's framing says the archive is searchable."""
        return self.config.recall_tokens > 0

    def summary_model(self) -> str | None:
        return self.config.summary_model or self.llm.default_model

    def count(self, text: str) -> int:
        """Tokens of ``text`` for the summary model. A compression counts the same strings more
        than once (the rendering ``fit_to_budget`` accepted is the summary text; the previous
        summary was counted when it was written), so recent answers are kept."""
        tokens = self._counted.get(text)
        if tokens is None:
            tokens = self.llm.count_tokens(text, self.summary_model() or self.llm.default_model)
            with self._counting:
                if len(self._counted) >= COUNT_MEMO_SIZE:
                    del self._counted[next(iter(self._counted))]  # the oldest entry
                self._counted[text] = tokens
        return tokens

    def framing_tokens(self, lang: str) -> int:
        """Tokens of the block's framing around the summary text."""
        return self.count(framing_overhead(lang, self.recall))  # remembered by count

    def budget(
        self, context_window: int, breakdown: Mapping[str, int] | None = None, core: int = 0
    ) -> int:
        """The summary budget for a chat model's window (``base.decisions.summary_budget``), as a
        share of what the window leaves once the fixed parts of the prompt (system prompt,
        tool definitions, reply reserve, from the host's last usage ``breakdown``; ``core``
        system messages of the history) are in."""
        model = self.summary_model()
        max_out = self.llm.max_output_tokens(model) if model else None
        fixed = fixed_tokens(breakdown or {}) + core
        budget = summary_budget(
            max(0, context_window - fixed),
            self.config.summary_token_ratio,
            self.config.summary_max_tokens,
            max_out,
        )
        return min(budget, tail_room_cap(context_window, self.config.fill_target, fixed))

    def batch_tokens(self, budget: int) -> int:
        """Transcript tokens one summarizer call takes."""
        if self.config.batch_tokens:
            return self.config.batch_tokens
        model = self.summary_model()
        window = self.llm.context_window(model) if model else 16_000
        # Room for the prompt, the previous summary and the answer.
        return max(1000, int(window * 0.6) - 2 * budget - 1000)

    def cached_block(self, session_id: str, version: int, budget: int) -> tuple[str, int] | None:
        """The block :meth:`block` would give without rendering one (made for this budget, or
        for a larger one and fitting this one too), else ``None``."""
        key = (session_id, version, budget)
        cached = self._blocks.get(key) or self._larger_that_fits(session_id, version, budget)
        if cached is not None:
            self._blocks[key] = cached
        return cached

    def block(
        self, session_id: str, version: int, record: SummaryRecord, budget: int
    ) -> tuple[str, int]:
        """The injected block for a record version and its tokens, cut to ``budget`` with the
        same counter that measures it; cached per version so the per-turn cost does not grow
        with anything."""
        cached = self.cached_block(session_id, version, budget)
        if cached is not None:
            return cached
        block, tokens = self._render(
            record, budget, lambda: self._fitter(session_id, version, record)
        )
        self._keep((session_id, version, budget), (block, tokens))
        return block, tokens

    def prepare_block(self, record: SummaryRecord, budget: int) -> PreparedBlock:
        """The block of a record about to be committed, rendered and counted now and cached by
        nothing: until the commit makes it the session's, its version may become another
        writer's. :meth:`keep_block` keeps it once the commit succeeded."""
        fitters: list[PayloadFitter] = []

        def fitter() -> PayloadFitter:
            fitters.append(PayloadFitter(record.payload, self.count, record.lang))
            return fitters[-1]

        block, tokens = self._render(record, budget, fitter)
        return PreparedBlock(block, tokens, budget, fitters[0] if fitters else None)

    def keep_block(self, session_id: str, version: int, prepared: PreparedBlock) -> None:
        """Keep a block :meth:`prepare_block` made, as ``version``'s of the session (the commit
        of its record made it that version)."""
        self._keep((session_id, version, prepared.budget), (prepared.block, prepared.tokens))
        if prepared.fitter is not None:
            self._keep_fitter((session_id, version), prepared.fitter)

    def _keep(self, key: BlockKey, made: tuple[str, int]) -> None:
        if len(self._blocks) > BLOCK_CACHE_SIZE:
            self._blocks.clear()
        self._blocks[key] = made

    def _render(
        self, record: SummaryRecord, budget: int, fitter_of: Callable[[], PayloadFitter]
    ) -> tuple[str, int]:
        """The block for ``record`` cut to ``budget`` and its tokens (``fitter_of``: the
        record's fitter, asked for only when the whole block does not fit)."""
        wrap = functools.partial(wrap_summary_block, recall=self.recall)
        block = wrap(record.text, record.lang)
        tokens = self.count(block)
        fitter = fitter_of() if tokens > budget else None
        if fitter is not None and record.text == fitter.rendering():
            # Smaller by the record's own order of sacrifice: old excerpts and list items
            # before identifiers, whole items only.
            room = budget - self.framing_tokens(record.lang)
            block = wrap(fitter.fit(room)[1], record.lang)
            tokens = self.count(block)
        if tokens > budget:
            text = record.text
            lo, hi = 0, len(text)
            while lo < hi:  # longest prefix whose block fits
                mid = (lo + hi + 1) // 2
                if self.count(wrap(cut_text(text, mid), record.lang)) <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            block = wrap(cut_text(text, lo), record.lang)
            tokens = self.count(block)
        return block, tokens

    def _fitter(self, session_id: str, version: int, record: SummaryRecord) -> PayloadFitter:
        """The record version's fitter: the smaller renderings made for earlier budgets are
        reused (a prompt near the window's edge asks for a slightly different budget at each
        call)."""
        key = (session_id, version)
        fitter = self._fitters.get(key)
        if fitter is None:
            fitter = PayloadFitter(record.payload, self.count, record.lang)
        self._keep_fitter(key, fitter)
        return fitter

    def _keep_fitter(self, key: tuple[str, int], fitter: PayloadFitter) -> None:
        """``fitter`` as the most recently used, the least recently used ones past
        :data:`FITTERS_KEPT` dropped."""
        self._fitters.pop(key, None)
        while len(self._fitters) >= FITTERS_KEPT:
            del self._fitters[next(iter(self._fitters))]  # the least recently used
        self._fitters[key] = fitter

    def _larger_that_fits(
        self, session_id: str, version: int, budget: int
    ) -> tuple[str, int] | None:
        """A block already made for a larger budget of the same record that fits ``budget`` too:
        it is the one ``budget`` would get (the candidates shrink in one order and the largest
        that fits is taken), so a prompt that shrinks a little reuses it instead of rendering
        and counting again."""
        for (sid, ver, made_for), (block, tokens) in self._blocks.items():
            if sid == session_id and ver == version and made_for > budget and tokens <= budget:
                return block, tokens
        return None

    def forget_blocks(self) -> None:
        """Drop every cached block (a clear or a rebuild rewrote records out of turn)."""
        self._blocks.clear()
        self._fitters.clear()
