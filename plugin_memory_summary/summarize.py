"""Turning batches of messages into a summary payload: the LLM when there is one, the rules
engine when there is none or it fails."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from host_stub.messages import Message, text_of
from host_stub.services import LLMService

from .answers import Answer, AnswerRejected, digest_excerpts, layer_answer, read_answer
from .config import MemorySummaryConfig
from .decisions import summary_growth
from .fitting import apply_caps, fit_to_budget, render_payload
from .prompts import PAYLOAD_KEYS, SMALL_PAYLOAD_KEYS, build_summary_messages
from .redact import RedactionError, Redactor
from .render import render_transcript, transcript_lang
from .rules import rules_merge
from .summary_model import SummaryPayload
from .text import cut_text

__all__ = [
    "SummarizeOutcome",
    "SummarizerError",
    "scrub_payload",
    "summarize_batches",
]

log = logging.getLogger("plugin_memory_summary")


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
    #: Batches whose merge used the model's answer.
    model_batches: int = 0


def redact_messages(messages: Sequence[Message], redactor: Redactor) -> list[Message]:
    """Copies with secrets redacted in text content and tool-call arguments."""
    out = []
    for m in messages:
        update: dict[str, object] = {}
        if isinstance(m.content, str):
            update["content"] = redactor.redact(m.content)
        elif isinstance(m.content, list):
            update["content"] = [
                {**p, "text": redactor.redact(str(p["text"]))} if p.get("type") == "text" else p
                for p in m.content
            ]
        if m.tool_calls:
            update["tool_calls"] = [
                c.model_copy(
                    update={
                        "function": c.function.model_copy(
                            update={"arguments": redactor.redact(c.function.arguments)}
                        )
                    }
                )
                for c in m.tool_calls
            ]
        out.append(m.model_copy(update=update) if update else m)
    return out


def _redacted(value: Any, redactor: Redactor) -> Any:
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, list):
        return [_redacted(v, redactor) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v, redactor) for k, v in value.items()}
    return value


def _safe_redactor(redactor: Redactor) -> Redactor:
    """The redactor without the user's patterns, for when one of those timed out: the built-in
    patterns are linear, so this one finishes."""
    return redactor if not redactor.extra_patterns else Redactor()


def _tokens_of(batch: Sequence[Message], count_tokens: Callable[[str], int]) -> int:
    """The batch's stored token counts (counted here for a message stored without one)."""
    return sum(
        m.tokens if m.tokens is not None else count_tokens(text_of(m.content)) for m in batch
    )


def scrub_payload(payload: SummaryPayload, redactor: Redactor) -> SummaryPayload:
    """``payload`` with every secret redacted from its text (pinned facts aside: the user set
    them, and they reach the summarizer redacted) and every identifier that holds one dropped:
    an identifier is carried verbatim into every later summary, so ``[REDACTED:…]`` in it would
    only be noise, and a secret in it (from a record written before a pattern existed, or a
    summarizer that made one up) would be carried for good."""
    try:
        return _scrub(payload, redactor)
    except RedactionError:
        return _scrub(payload, _safe_redactor(redactor))


def _scrub(payload: SummaryPayload, redactor: Redactor) -> SummaryPayload:
    data = payload.model_dump(exclude={"identifiers", "identifier_sources", "pinned_facts"})
    clean = _redacted(data, redactor)
    dropped = {i for i in payload.identifiers if "[REDACTED:" in i or redactor.redact(i) != i}
    if clean == data and not dropped:
        return payload
    return SummaryPayload.model_validate(
        {
            **clean,
            "identifiers": [i for i in payload.identifiers if i not in dropped],
            "identifier_sources": {
                source: [i for i in ids if i not in dropped]
                for source, ids in payload.identifier_sources.items()
            },
            "pinned_facts": payload.pinned_facts,
        }
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


def _answer_tokens(budget: int, batch_tokens: int, max_out: int | None) -> int:
    """How long a digest to ask for: about a quarter of what it digests, within the summary
    budget and half the model's output limit."""
    want = min(budget, max(150, batch_tokens // 4))
    return min(want, max(64, max_out // 2)) if max_out else want


#: A model that may write fewer output tokens than this is asked for fewer fields.
SMALL_OUTPUT = 1024


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
) -> Answer:
    """One request for a digest of ``batch`` and what of its answer can be merged."""
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
    answer_tokens = _answer_tokens(budget, _tokens_of(batch, count_tokens), max_out)
    prompt = build_summary_messages(
        transcript=transcript,
        lang=lang,
        custom_prompt=config.summary_prompt,
        budget_tokens=answer_tokens,
        context=context,
        keys=SMALL_PAYLOAD_KEYS if max_out is not None and max_out < SMALL_OUTPUT else PAYLOAD_KEYS,
    )
    outcome.llm_calls += 1
    try:
        completion = await asyncio.wait_for(
            llm.complete(
                prompt,
                model=model,
                max_tokens=budget,
                temperature=config.summary_temperature,
                timeout=timeout,
            ),
            # A summarizer that ignores its timeout is cut off a little later; under a deadline
            # (a blocking compression), exactly at it.
            timeout if deadline_bound else timeout + 1.0,
        )
    except TimeoutError:
        raise SummarizerError(
            f"timed out after {timeout:.1f}s", cut_by_deadline=deadline_bound
        ) from None
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise SummarizerError(f"{type(exc).__name__}: {first_line[:120]}") from None
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
) -> SummarizeOutcome:
    """Fold ``batches`` into ``previous`` in order. Without a model, or past the deadline, the
    rules engine merges; when the model fails, ``config.fallback`` decides: ``rules`` merges this
    batch by rules, ``trim`` stops (the remaining batches are left for the caller to trim).
    ``text_budget`` (default ``budget``) is what the rendered summary is fitted to: the summary
    budget less the framing of the block it is injected in, so the block fits without a cut."""
    # A record written before a pattern existed may carry a secret as an identifier: the plain
    # text gate would then reject every answer for "losing" it, and the rules engine would carry
    # it on. It goes before anything else.
    payload = scrub_payload(previous, redactor) if previous is not None else None
    outcome = SummarizeOutcome(payload=previous or SummaryPayload(), batches_done=0, model=model)
    fit_budget = budget if text_budget is None else text_budget
    for batch in batches:
        merged: SummaryPayload | None = None
        # An extractive merge grows the summary by at most a share of what this batch adds
        # (decisions.summary_growth), so the compression frees what its plan counted on; a
        # model's answer is its own digest and is only fitted to the budget.
        now = count_tokens(render_payload(payload, lang)) if payload is not None else 0
        rules_budget = min(
            fit_budget,
            now + summary_growth(_tokens_of(batch, count_tokens), now, fit_budget),
        )
        remaining = None if deadline is None else deadline - time.monotonic()
        redacted = True
        try:
            clean = redact_messages(batch, redactor)
        except RedactionError as exc:
            # Text that could not be redacted never leaves for the summarizer. The rules engine
            # merges it locally, from text the built-in patterns did redact: what it keeps
            # (identifiers, quoted sentences) is stored and injected.
            clean, redacted = redact_messages(batch, _safe_redactor(redactor)), False
            outcome.errors.append(f"redaction failed ({exc}); the rules engine merged the batch")
            outcome.fallback = "rules"
        if model is None:
            pass  # no model configured: the rules engine is the summarizer, not a fallback
        elif not redacted:
            pass
        elif remaining is not None and remaining <= 0.05:
            outcome.fallback = "rules"
            outcome.notes.append("deadline passed: the rules engine finished the compression")
        else:
            timeout = (
                config.summary_timeout_s
                if remaining is None
                else min(config.summary_timeout_s, remaining)
            )
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
                    deadline_bound=remaining is not None and remaining < config.summary_timeout_s,
                )
            except SummarizerError as exc:
                if exc.cut_by_deadline:
                    # Past the deadline the rules engine finishes the run, whatever the fallback.
                    outcome.fallback = "rules"
                    outcome.notes.append(
                        "deadline passed: the rules engine finished the compression"
                    )
                else:
                    log.warning("summarizer failed (%s); fallback: %s", exc, config.fallback)
                    outcome.errors.append(str(exc))
                    outcome.fallback = config.fallback
                    if config.fallback == "trim":
                        break
            else:
                # The model's digest, merged by the rules engine: its lists join the previous
                # ones, its sentences compete for the record with the conversation's own.
                outcome.model_batches += 1
                outcome.notes.extend(n for n in answer.notes if n not in outcome.notes)
                # Room for at least the answer's opening sentence (and the lines around it),
                # even when the batch is too small for the growth rule to allow it.
                opening = count_tokens(answer.digest[0]) + 40 if answer.digest else 0
                merged = rules_merge(
                    layer_answer(payload, answer),
                    clean,
                    budget_tokens=min(fit_budget, max(rules_budget, now + opening)),
                    count_tokens=count_tokens,
                    caps=config.caps,
                    lang=lang,
                    digest=digest_excerpts(answer, clean, lang),
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
            merged = rules_merge(
                payload,
                clean,
                budget_tokens=rules_budget,
                count_tokens=count_tokens,
                caps=config.caps,
                lang=lang,
            )
        payload = fit_to_budget(
            apply_caps(scrub_payload(merged, redactor), config.caps),
            fit_budget,
            count_tokens,
            lang,
        )
        outcome.batches_done += 1
    outcome.payload = payload or SummaryPayload()
    return outcome
