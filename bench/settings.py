"""Plugin settings compared in the token-economy and retention sweeps (over the shipped
defaults), and the one recommended for a small (~4k-token) window."""

from __future__ import annotations

from typing import Any

#: name -> plugin config over its defaults. Every setting runs with the host's context window at
#: the 4,000-token budget, so the soft (0.7) and hard (0.9) watermarks are live in all of them.
SETTINGS: dict[str, dict[str, Any]] = {
    "default (t30 k20)": {},
    "t20 k10": {"threshold": 20, "keep_recent": 10},
    "t45 k30": {"threshold": 45, "keep_recent": 30},
    # The turn trigger out of reach: the soft / hard watermarks decide when and how much.
    "watermarks (soft .7, gain .2)": {"threshold": 100_000, "keep_recent": 60},
    # cooldown_s 0: a watermark compression found "blocked" (one huge newest message) is retried
    # on the next call instead of being off for 30 s while the history grows (see README).
    "watermarks (soft .8, gain .1, cooldown 0)": {
        "threshold": 100_000,
        "keep_recent": 80,
        "auto_compress_threshold": 0.8,
        "min_gain": 0.1,
        "cooldown_s": 0,
    },
    "watermarks (soft .85, hard .95, gain .1)": {
        "threshold": 100_000,
        "keep_recent": 100,
        "auto_compress_threshold": 0.85,
        "hard_compress_threshold": 0.95,
        "min_gain": 0.1,
    },
}

#: The setting recommended for a small window (chosen from the sweeps; see bench/README.md).
RECOMMENDED = "watermarks (soft .8, gain .1, cooldown 0)"
DEFAULT = "default (t30 k20)"


def quick_settings() -> dict[str, dict[str, Any]]:
    return {k: SETTINGS[k] for k in (DEFAULT, RECOMMENDED)}
