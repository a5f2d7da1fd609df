"""Turning batches of messages into a summary payload: the LLM when there is one, the rules
engine when there is none or it fails."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from host_stub.messages import Message, text_of
from host_stub.services import LLMService

from ..base import MemorySummaryConfig, cut_middle, cut_text, split_batches, summary_growth
from ..record import SummaryPayload, apply_caps, fit_to_budget, render_payload
from ..safety import RedactionError, Redactor, redact_messages, safe_redactor, scrub_payload
from .answers import Answer, AnswerRejected, digest_excerpts, layer_answer, read_answer
from .ledger import actions_text
from .prompts import build_summary_messages, request_keys
from .rules import rules_merge
from .speed import CallLimits, Sample, SpeedBook, timeout_reason
from .transcript import render_transcript, transcript_lang

__all__ = [
    "SummarizeOutcome",
    "SummarizerError",
    "scrub_payload",
    "summarize_batches",
]

log = logging.getLogger("plugin_memory_summary")

_R = TypeVar("_R")


class SummarizerError(Exception):
    """The summarizer's answer cannot be stored (the reason is the message, never its text)."""

    def __init__(self, reason: str, *, cut_by_deadline: bool = False) -> None:
        super().__init__(reason)
        #: The call ran out of the run's deadline, not of its own timeout: not a failure.
        self.cut_by_deadline = cut_by_deadline


@dataclass
class SummarizeOutcome:
    payload: SummaryPayload
    #: How many of the batches the payload covers (the rest could not be summarized).
    batches_done: int
    model: str | None = None
    cost: float = 0.0
    llm_calls: int = 0
    input_tokens: int = 0
    fallback: str | None = None
    #: Why the summarizer's answers were not used (each one made the fallback run).
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Calls whose answer the merge used.
    model_batches: int = 0
    #: Seconds each summarizer call took (a timed-out one: until it was given up on).
    latencies: list[float] = field(default_factory=list)


def _tokens_of(batch: Sequence[Message], count_tokens: Callable[[str], int]) -> int:
    """The batch's stored token counts (counted here for a message stored without one)."""
    return sum(
        m.tokens if m.tokens is not None else count_tokens(text_of(m.content)) for m in batch
    )


def _context(previous: SummaryPayload | None, lang: str) -> str:
    """A few lines of the previous summary for the first request of a run: its overview line
    and the goal (the whole summary would cost more than the part being digested)."""
    if previous is None:
        return ""
    lines = [line for line in previous.summary.strip().split("\n")[-2:] if line.strip()]
    if previous.conversation_goal:
        lines.append(("目标：" if lang.startswith("zh") else "Goal: ") + previous.conversation_goal)
    return cut_text("\n".join(lines), 400)


#: Longest provider error kept in a reason (its start and its end: the numbers come last).
ERROR_CHARS = 240


_PROVIDER_MESSAGE = re.compile(r"""['"]message['"]\s*:\s*(['"])(.+?)\1\s*[,}]""")
_WRAPPERS = re.compile(r"^(?:(?:[\w.]+(?:Error|Exception)\w*|Error code: \d+)\s*[:-]\s*)+")


def error_line(message: str) -> str:
    """A provider's error on one line: the server's own message when the error wraps one (the
    client's class names and status prefixes left out), cut in the middle when long."""
    line = " ".join(message.split())
    found = _PROVIDER_MESSAGE.search(line)
    text = found.group(2) if found else _WRAPPERS.sub("", line)
    return cut_middle(text or line, ERROR_CHARS)


def _next_chunk(
    rest: list[Message], limits: CallLimits | None, count_tokens: Callable[[str], int]
) -> tuple[list[Message], list[Message]]:
    """The part of ``rest`` the next call digests (all of it unless ``limits`` say less; a tool
    call stays with its results) and what is left."""
    if limits is None or _tokens_of(rest, count_tokens) <= limits.batch_tokens:
        return rest, []
    first = split_batches(rest, limits.batch_tokens)[0]
    return first, rest[len(first) :]


def _answer_tokens(budget: int, batch_tokens: int, max_out: int | None) -> int:
    """How long a digest to ask for: about a quarter of what it digests, within the summary
    budget and half the model's output limit."""
    want = min(budget, max(150, batch_tokens // 4))
    return min(want, max(64, max_out // 2)) if max_out else want


async def _llm_answer(
    previous: SummaryPayload | None,
    batch: Sequence[Message],
    *,
    llm: LLMService,
    model: str,
    config: MemorySummaryConfig,
    budget: int,
    lang: str,
    timeout: float,
    outcome: SummarizeOutcome,
    redactor: Redactor,
    count_tokens: Callable[[str], int],
    first: bool,
    deadline_bound: bool = False,
    speed: SpeedBook | None = None,
    max_tokens: int | None = None,
    pause: Callable[[], Awaitable[object]] | None = None,
) -> Answer:
    """One request for a digest of ``batch`` and what of its answer can be merged.
    ``max_tokens``: the most the answer may take (default ``budget``); ``speed`` is fed the
    call's time; ``pause`` is awaited once the answer is in, before the work on it."""
    transcript = render_transcript(
        batch,
        tool_truncate_chars=config.tool_truncate_chars,
        message_truncate_chars=config.message_truncate_chars,
        lang=transcript_lang(lang),
    )
    # The previous summary leaves for the summarizer too (once per run): a user's edit, or a
    # record written before a redact pattern was added, may hold a secret.
    try:
        context = redactor.redact(_context(previous, lang)) if first else ""
    except RedactionError as exc:
        raise SummarizerError(f"redaction of the previous summary failed: {exc}") from None
    max_out = llm.max_output_tokens(model)
    limit = budget if max_tokens is None else min(budget, max_tokens)
    batch_tokens = _tokens_of(batch, count_tokens)
    answer_tokens = _answer_tokens(limit, batch_tokens, max_out)
    # The request's shape follows the model (its window, its output limit, what its speed
    # allows), not the summary budget.
    model_limit = min(max_tokens or max_out or budget, max_out or budget)
    keys = request_keys(model_limit, llm.context_window(model))
    prompt = build_summary_messages(
        transcript=transcript,
        lang=lang,
        custom_prompt=config.summary_prompt,
        budget_tokens=answer_tokens,
        context=context,
        keys=keys,
    )
    prompt_tokens = sum(count_tokens(m["content"]) for m in prompt)
    outcome.llm_calls += 1
    started = time.monotonic()
    try:
        completion = await asyncio.wait_for(
            llm.complete(
                prompt,
                model=model,
                max_tokens=limit,
                temperature=config.summary_temperature,
                timeout=timeout,
            ),
            # A summarizer that ignores its timeout is cut off a little later; under a deadline
            # (a blocking compression), exactly at it.
            timeout if deadline_bound else timeout + 1.0,
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if not isinstance(exc, TimeoutError) and "timeout" not in type(exc).__name__.lower():
            raise SummarizerError(f"{type(exc).__name__}: {error_line(str(exc))}") from None
        waited = time.monotonic() - started
        outcome.latencies.append(waited)
        if speed is not None and not deadline_bound:
            # What was waited, not the timeout: a client that gave up sooner says less.
            sample = Sample(prompt_tokens, batch_tokens, limit, waited, timed_out=True)
            speed.timed_out(model, sample, limit)
        raise SummarizerError(
            timeout_reason(timeout, speed.speed(model) if speed is not None else None),
            cut_by_deadline=deadline_bound,
        ) from None
    elapsed = time.monotonic() - started
    outcome.latencies.append(elapsed)
    if pause is not None:
        await pause()
    if speed is not None:
        written = completion.usage.completion_tokens or count_tokens(completion.text or "")
        speed.observe(model, Sample(prompt_tokens, batch_tokens, written, elapsed))
    outcome.cost += completion.cost or 0.0
    outcome.input_tokens += completion.usage.prompt_tokens
    text = completion.text or ""
    # Parsing, the gate and the identifier scan are linear but slow per character, and they run
    # on the event loop: an answer far beyond the budget is refused by its length alone.
    if len(text) > config.summary_reply_max_chars:
        raise SummarizerError(
            f"answer too long ({len(text):,} characters; "
            f"summary_reply_max_chars is {config.summary_reply_max_chars:,})"
        )
    cut_off = completion.finish_reason == "length"
    source = "\n".join(
        [transcript, *(text_of(m.content) for m in batch)]
        + ([render_payload(previous, lang), *previous.pinned_facts] if previous else [])
    )
    try:
        return read_answer(
            text,
            cut_off=cut_off,
            instructions="\n".join(
                [prompt[0]["content"], *prompt[1]["content"].split("<transcript>")[:1]]
            ),
            source=source,
        )
    except AnswerRejected as exc:
        why = f"answer rejected: {exc}"
        if cut_off:
            why = f"answer cut off (finish_reason=length) and {why}"
        raise SummarizerError(why) from None


async def _in_thread(fn: Callable[..., _R], /, *args: Any, **kwargs: Any) -> _R:
    """``fn(*args, **kwargs)`` in a worker thread: the rules engine's merge and the final fit
    of a background run (pure functions, tens to hundreds of milliseconds on a large batch) do
    not hold the event loop, so the host's turns are served meanwhile."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def _inline(fn: Callable[..., _R], /, *args: Any, **kwargs: Any) -> _R:
    """``fn(*args, **kwargs)`` on the loop (a blocking run: the turn waits for it anyway)."""
    return fn(*args, **kwargs)


async def summarize_batches(
    previous: SummaryPayload | None,
    batches: Sequence[Sequence[Message]],
    *,
    llm: LLMService,
    model: str | None,
    config: MemorySummaryConfig,
    budget: int,
    lang: str,
    redactor: Redactor,
    count_tokens: Callable[[str], int],
    deadline: float | None = None,
    text_budget: int | None = None,
    speed: SpeedBook | None = None,
    pause: Callable[[], Awaitable[object]] | None = None,
) -> SummarizeOutcome:
    """Fold ``batches`` into ``previous`` in order. Without a model, or past the deadline, the
    rules engine merges; when the model fails, ``config.fallback`` decides: ``rules`` merges this
    batch by rules, ``trim`` stops (the remaining batches are left for the caller to trim).
    ``text_budget`` (default ``budget``) is what the rendered summary is fitted to: the summary
    budget less the framing of the block it is injected in, so the block fits without a cut.
    ``speed``: the summarizer's measured speed; a batch larger than what one call can digest
    in ``summary_timeout_s`` at that speed is digested in several calls (``speed.call_limits``),
    and no call is sent while the server still works on one given up on. ``pause`` is awaited
    after each answer, before the CPU work on it (a background run lets the host's turns go
    first: see ``Pipeline``)."""
    # A record written before a pattern existed may carry a secret as an identifier: the plain
    # text gate would then reject every answer for "losing" it, and the rules engine would carry
    # it on. It goes before anything else.
    payload = scrub_payload(previous, redactor) if previous is not None else None
    off_loop = _in_thread if pause is not None else _inline
    outcome = SummarizeOutcome(payload=previous or SummaryPayload(), batches_done=0, model=model)
    fit_budget = budget if text_budget is None else text_budget
    stop = False
    for batch in batches:
        rest = list(batch)
        # What the batch is folded into: with ``trim``, a batch whose call fails is not covered,
        # so nothing of it may stay (not the answers of its earlier calls either).
        before_batch = payload
        while rest and not stop:
            limits = (
                speed.limits(model, timeout_s=config.summary_timeout_s, max_tokens=budget)
                if speed is not None and model is not None
                else None
            )
            chunk, rest = _next_chunk(rest, limits, count_tokens)
            merged: SummaryPayload | None = None
            # An extractive merge grows the summary by at most a share of what this batch adds
            # (decisions.summary_growth), so the compression frees what its plan counted on; a
            # model's answer is its own digest and is only fitted to the budget.
            now = count_tokens(render_payload(payload, lang)) if payload is not None else 0
            # ... but never less than what says the batch's actions: no action is dropped to
            # keep the growth share.
            growth = summary_growth(_tokens_of(chunk, count_tokens), now, fit_budget)
            actions = count_tokens(actions_text(chunk, config.read_only_tools))
            rules_budget = min(fit_budget, now + max(growth, actions))
            remaining = None if deadline is None else deadline - time.monotonic()
            redacted = True
            try:
                clean = redact_messages(chunk, redactor)
            except RedactionError as exc:
                # Text that could not be redacted never leaves for the summarizer. The rules engine
                # merges it locally, from text the built-in patterns did redact: what it keeps
                # (identifiers, quoted sentences) is stored and injected.
                clean, redacted = redact_messages(chunk, safe_redactor(redactor)), False
                outcome.errors.append(
                    f"redaction failed ({exc}), the rules engine merged the batch"
                )
                outcome.fallback = "rules"
            if model is None:
                pass  # no model configured: the rules engine is the summarizer, not a fallback
            elif not redacted:
                pass
            elif remaining is not None and remaining <= 0.05:
                outcome.fallback = "rules"
                outcome.notes.append("deadline passed: the rules engine finished the compression")
            else:
                busy = speed.busy_for(model) if speed is not None else 0.0
                if busy > 0 and (remaining is None or remaining - busy > 1.0):
                    # The server still works on a call given up on: no new one queued behind it.
                    await asyncio.sleep(busy)
                    remaining = None if deadline is None else deadline - time.monotonic()
                timeout = (
                    config.summary_timeout_s
                    if remaining is None
                    else min(config.summary_timeout_s, remaining)
                )
                bound = remaining is not None and remaining < config.summary_timeout_s
                try:
                    answer = await _llm_answer(
                        payload,
                        clean,
                        llm=llm,
                        model=model,
                        config=config,
                        budget=budget,
                        lang=lang,
                        timeout=timeout,
                        outcome=outcome,
                        redactor=redactor,
                        count_tokens=count_tokens,
                        first=outcome.llm_calls == 0,
                        deadline_bound=bound,
                        speed=speed,
                        max_tokens=limits.max_tokens if limits is not None else None,
                        pause=pause,
                    )
                except SummarizerError as exc:
                    if exc.cut_by_deadline:
                        # Past the deadline the rules engine finishes the run, whatever the
                        # fallback.
                        outcome.fallback = "rules"
                        outcome.notes.append(
                            "deadline passed: the rules engine finished the compression"
                        )
                    else:
                        log.warning("summarizer failed (%s); fallback: %s", exc, config.fallback)
                        outcome.errors.append(str(exc))
                        outcome.fallback = config.fallback
                        if config.fallback == "trim":
                            stop = True
                            payload = before_batch
                            break
                else:
                    # The model's digest, merged by the rules engine: its lists join the previous
                    # ones, its sentences compete for the record with the conversation's own.
                    outcome.model_batches += 1
                    outcome.notes.extend(n for n in answer.notes if n not in outcome.notes)
                    # Room for at least the answer's opening sentence (and the lines around it)
                    # beside the batch's actions, even when the batch is too small for the
                    # growth rule to allow it.
                    opening = count_tokens(answer.digest[0]) + 40 if answer.digest else 0
                    answer_budget = min(fit_budget, max(rules_budget, now + opening + actions))
                    merged = await off_loop(
                        rules_merge,
                        layer_answer(payload, answer),
                        clean,
                        budget_tokens=answer_budget,
                        fill=answer_budget < fit_budget,
                        count_tokens=count_tokens,
                        caps=config.caps,
                        lang=lang,
                        digest=digest_excerpts(answer, clean, lang),
                        read_only_tools=config.read_only_tools,
                    )
                    if answer.payload.conversation_goal:
                        # The model read the whole part: its goal over the newest request's words.
                        goal = cut_text(
                            answer.payload.conversation_goal,
                            config.caps.goal_chars,
                            marker_counts=True,
                        )
                        merged = merged.model_copy(update={"conversation_goal": goal})
            if merged is None:
                merged = await off_loop(
                    rules_merge,
                    payload,
                    clean,
                    budget_tokens=rules_budget,
                    count_tokens=count_tokens,
                    caps=config.caps,
                    lang=lang,
                    read_only_tools=config.read_only_tools,
                    # A summary still growing takes the whole share of the batch the plan allows
                    # it. At its full budget the record keeps the estimate's margin: filling that
                    # too made compressions more frequent (LoCoMo at 4,000 tokens: 233 instead
                    # of 208) and kept no more of the conversation.
                    fill=rules_budget < fit_budget,
                )
            payload = await off_loop(
                fit_to_budget,
                apply_caps(scrub_payload(merged, redactor), config.caps),
                fit_budget,
                count_tokens,
                lang,
            )
        if stop:
            break
        outcome.batches_done += 1
    outcome.payload = payload or SummaryPayload()
    return outcome
