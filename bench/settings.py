"""Plugin settings compared in the token-economy and retention sweeps (over the shipped
defaults)."""

from __future__ import annotations

from typing import Any

#: name -> plugin config over its defaults. Every setting runs with the host's context window at
#: the 4,000-token budget.
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    # The seeds' values, this plugin's defaults before the window-filling ones: a message-count
    # trigger, 20 messages kept, a summary of 5% of the window.
    "seed values (t30 k20, 5% summary)": {
        "threshold": 30,
        "keep_recent": 20,
        "summary_token_ratio": 0.05,
        "summary_max_tokens": 2000,
        "auto_compress_threshold": 0.7,
        "min_gain": 0.2,
    },
}

#: The shipped defaults need no tuning for a small window: the one to quote.
DEFAULT = "default"
RECOMMENDED = DEFAULT


def quick_settings() -> dict[str, dict[str, Any]]:
    return dict(SETTINGS)
