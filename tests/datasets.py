"""Where the shared data sets are: ``$MEMORY_SUMMARY_DATA`` or ``../shared/data`` from the
repository root. Read at run time, never copied in. When ``CI=true`` a missing set fails."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return Path(os.environ.get("MEMORY_SUMMARY_DATA", ROOT.parent / "shared" / "data"))


def require(relative: str) -> Path:
    path = data_dir() / relative
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"data set missing in CI: {path}")
        pytest.skip(f"data set not found: {path} (set MEMORY_SUMMARY_DATA)")
    return path


def load_json(relative: str) -> Any:
    return json.loads(require(relative).read_text(encoding="utf-8"))
