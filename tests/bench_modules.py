"""Scripts of ``bench/`` loaded by the tests of their pure parts: ``bench/`` is not a package, so
each is loaded from its file (as ``bench_<name>``). A script that puts ``bench/`` on the path
(every one that imports ``common``) makes its siblings importable by their own names."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

__all__ = ["BENCH", "load_bench"]

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py``, run once more on each call."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
