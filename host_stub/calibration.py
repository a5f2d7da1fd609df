"""Token-count calibration: how many tokens the provider counts for each token the host counts.

The host counts every prompt with one tokenizer (:mod:`host_stub.tokenizer`); the model's own
tokenizer may count more or less (a local Llama or Qwen server, a Claude model). After each model
call that reports its usage, the LLM service compares the provider's ``prompt_tokens`` with its own
count of the same request and keeps, per model, a bounded and smoothed ratio. The host divides the
model's window (and the reply reserve) by it, so the usage ratio it reports in ``token:usage``, the
watermark the plugin compares with its thresholds, is the provider's usage, in the host's tokens.

Two guards keep a server's usage report from wrecking the budgets (a server that always says
``prompt_tokens=100``, or one that counts only the part of the prompt its cache did not hold):

* a report far from the host's own count (a ratio outside :data:`PLAUSIBLE_LOW` to
  :data:`PLAUSIBLE_HIGH`) is not the same prompt counted by another tokenizer: it is ignored,
  with one warning per model;
* the ratio applied to the window (:func:`applied_ratio`) is never under 1: calibration may only
  make the host count more conservatively than its own tokenizer, so by that tokenizer no prompt
  built to fit the calibrated window passes the configured one.

Everything here is pure and synchronous; :class:`Calibration` is safe to share between threads.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Calibration",
    "ModelCalibration",
    "applied_ratio",
    "calibrated_window",
    "next_ratio",
    "plausible",
]

log = logging.getLogger(__name__)

#: A ratio outside these bounds is clamped to them: a provider that counts half or twice as many
#: tokens as tiktoken is already far off, and one bad usage report must not wreck the budgets.
MIN_RATIO = 0.5
MAX_RATIO = 2.0
#: Weight of a new observation after the first (exponential smoothing): noise in one call's
#: usage moves the ratio by at most half of it.
ALPHA = 0.5
#: Prompts the host counted under this many tokens say more about the chat template than about
#: the tokenizer: they are not used.
MIN_TOKENS = 32
#: Reported / counted ratios outside these bounds are not another tokenizer's count of the same
#: prompt (tokenizers differ by tens of percent, not by halves): such a report is ignored.
PLAUSIBLE_LOW = 0.7
PLAUSIBLE_HIGH = 1.5


def plausible(observed: float) -> bool:
    """Whether ``reported / counted`` can be another tokenizer's count of the same prompt."""
    return PLAUSIBLE_LOW <= observed <= PLAUSIBLE_HIGH


def applied_ratio(ratio: float) -> float:
    """The ratio the window and the reply reserve are divided by: ``ratio``, but never under 1 (a
    provider that counts fewer tokens than the host never makes the host fill more than the
    configured window by its own count)."""
    return max(1.0, ratio)


def next_ratio(
    previous: float,
    samples: int,
    observed: float,
    *,
    alpha: float = ALPHA,
    low: float = MIN_RATIO,
    high: float = MAX_RATIO,
) -> float:
    """The ratio after one more observation: the first one (``samples == 0``) replaces the prior
    1.0, later ones are smoothed in with weight ``alpha``; always within ``[low, high]``."""
    clamped = min(high, max(low, observed))
    if samples <= 0:
        return clamped
    return min(high, max(low, previous + alpha * (clamped - previous)))


def calibrated_window(window: int, ratio: float) -> int:
    """``window`` provider tokens expressed in the host's tokens."""
    return max(1, round(window / ratio)) if window > 0 else window


@dataclass(frozen=True)
class ModelCalibration:
    """The state for one model: the current ratio, how many calls fed it, and the last raw
    observation (``reported / counted`` before clamping)."""

    ratio: float = 1.0
    samples: int = 0
    last_observed: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ratio": round(self.ratio, 4),
            "samples": self.samples,
            "last_observed": None if self.last_observed is None else round(self.last_observed, 4),
        }


class Calibration:
    """Per-model ratios of provider-reported prompt tokens to host-counted ones."""

    def __init__(self, *, min_tokens: int = MIN_TOKENS, warned: set[str] | None = None) -> None:
        self.min_tokens = min_tokens
        self._models: dict[str, ModelCalibration] = {}
        self._lock = threading.Lock()
        #: Models whose implausible report was already warned about (a set shared with another
        #: :class:`Calibration` fed by the same server says it once for both).
        self.warned = warned if warned is not None else set()

    def observe(self, model: str, counted: int, reported: int) -> ModelCalibration | None:
        """Feed one call: the host's count of the request and the provider's ``prompt_tokens``.
        Returns the new state, or ``None`` when the call is not used (too small a prompt, no
        usage, or a report too far from the host's count to be the same prompt: see
        :func:`plausible`; the first one of a model is warned about)."""
        if counted < self.min_tokens or reported <= 0:
            return None
        observed = reported / counted
        if not plausible(observed):
            self._implausible(model, counted, reported)
            return None
        with self._lock:
            old = self._models.get(model, ModelCalibration())
            new = ModelCalibration(
                ratio=next_ratio(old.ratio, old.samples, observed),
                samples=old.samples + 1,
                last_observed=observed,
            )
            self._models[model] = new
        return new

    def _implausible(self, model: str, counted: int, reported: int) -> None:
        with self._lock:
            if model in self.warned:
                return
            self.warned.add(model)
        log.warning(
            "model %r: the server reported prompt_tokens=%d for a prompt of %d tokens (the "
            "host's count): an implausible ratio of %.2f (outside %.1f-%.1f), ignored; such "
            "reports do not calibrate the token counts",
            model,
            reported,
            counted,
            reported / counted,
            PLAUSIBLE_LOW,
            PLAUSIBLE_HIGH,
        )

    def ratio(self, model: str | None) -> float:
        """Provider tokens per host token for ``model`` (1.0 until a call has reported usage)."""
        if not model:
            return 1.0
        state = self._models.get(model)
        return state.ratio if state is not None else 1.0

    def get(self, model: str) -> ModelCalibration | None:
        return self._models.get(model)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every calibrated model, for reports: ``{model: {ratio, samples, last_observed}}``."""
        with self._lock:
            return {name: state.as_dict() for name, state in sorted(self._models.items())}
