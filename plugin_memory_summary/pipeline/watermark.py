"""The hard watermark: a compression before the model call, planned on the prompt's own view."""

from __future__ import annotations

import logging
import time

from host_stub.hookspecs import PromptView
from host_stub.services import Snapshot

from ..base import Result, after_compression, core_tokens, hard_triggered
from ..prompt import SessionState
from .pipeline import Pipeline
from .scheduler import Scheduler

__all__ = ["compress_before_call"]

log = logging.getLogger("plugin_memory_summary")


async def compress_before_call(
    view: PromptView, state: SessionState, pipeline: Pipeline, scheduler: Scheduler
) -> None:
    """Compress, blocking, when the view is past the hard mark and a compression can help;
    never raises (a failed compression costs the compression, not the turn)."""
    config = pipeline.config
    if not hard_triggered(view.usage_ratio, config.hard_compress_threshold, dry_run=view.dry_run):
        return
    newest = view.messages[-1].seq if view.messages else None
    if time.monotonic() < state.cooldown_until and state.blocked_seq == newest:
        return
    # The same pre-flight the run makes, on the prompt's own view: when it says no compression
    # could help, the call goes on without a store read or a lease.
    window = view.context_window
    state.core_tokens = core_tokens(view.messages)
    budget = pipeline.tokens.budget(window, state.breakdown, state.core_tokens)
    plan = pipeline.plan(view.messages, "hard", state.breakdown, window, budget)
    if plan.skip is not None:
        if plan.blocked is not None:
            pipeline.cool_down(view.session_id, state, plan.blocked, newest)
        await scheduler.report_skipped(view.session_id, "hard", plan.skip, view.usage_ratio)
        return

    def look_again(joined: Result) -> bool:
        """After joining a run planned on an older snapshot: is the view still over the mark,
        with something a compression could still do?"""
        covered = joined.stats.get("covered_up_to_seq")
        if joined.status != "done" or covered is None:
            return True
        left, breakdown = after_compression(
            view.messages,
            state.breakdown,
            covered_up_to_seq=covered,
            summary_tokens=joined.stats.get("block_tokens", budget),
        )
        ratio = sum(breakdown.values()) / window
        if not hard_triggered(ratio, config.hard_compress_threshold, dry_run=False):
            return False
        return pipeline.plan(left, "hard", breakdown, window, budget).skip is None

    try:
        await scheduler.request(
            view.session_id,
            "hard",
            usage_ratio=view.usage_ratio,
            deadline_s=config.hard_deadline_s,
            look_again=look_again,
            snapshot=Snapshot.model_construct(
                session_id=view.session_id,
                epoch=view.epoch,
                messages=view.messages,
                record=view.summary,
            ),
        )
    except Exception:  # never fail the turn
        log.exception("hard compression of %s failed", view.session_id)
