"""What ``import plugin_memory_summary`` does and does not do, checked in fresh processes without
timing anything: no litellm, no ``regex`` (every pattern is compiled on first use), no summarizer,
rules engine, output parser or identifier scanner, and no pydantic model built (their validators
are built on first use). The per-turn path (injecting an existing summary) loads none of those
four either.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import textwrap

import plugin_memory_summary
from plugin_memory_summary._patterns import LazyRegex
from plugin_memory_summary.redact import Redactor

#: Modules that ``import plugin_memory_summary`` (and ``create_plugin()``) must not load.
NOT_AT_IMPORT = (
    "litellm",
    "regex",
    "plugin_memory_summary.summarize",
    "plugin_memory_summary.rules",
    "plugin_memory_summary.prompts",
    "plugin_memory_summary.commands",
    "plugin_memory_summary.parsing",
    "plugin_memory_summary.identifiers",
)

_CHECK = """
import sys

NOT_AT_IMPORT = {not_at_import!r}


def loaded():
    return sorted(m for m in NOT_AT_IMPORT if m in sys.modules)


import plugin_memory_summary
assert loaded() == [], ("after import", loaded())

from pydantic import BaseModel

built = sorted(
    f"{{m}}.{{name}}"
    for m in list(sys.modules)
    if m.startswith(("plugin_memory_summary", "host_stub"))
    for name, value in vars(sys.modules[m]).items()
    if isinstance(value, type)
    and issubclass(value, BaseModel)
    and value.__module__ == m
    and value.__pydantic_complete__
)
assert built == [], ("models built at import", built)

plugin = plugin_memory_summary.create_plugin()
assert loaded() == [], ("after create_plugin()", loaded())
print("ok")
"""

_PER_TURN = """
import sys

from host_stub.hookspecs import PromptView
from host_stub.services import MetadataEntry
import plugin_memory_summary


class LLM:
    default_model = "fake/model"

    def max_output_tokens(self, model=None):
        return 4096

    def count_tokens(self, text, model=None):
        return len(str(text)) // 4


class Bus:
    def connect(self, name, receiver):
        pass


class Host:
    bus = Bus()


plugin = plugin_memory_summary.create_plugin()
plugin.startup(
    host=Host(),
    config=plugin_memory_summary.MemorySummaryConfig(),
    memory=None,
    llm=LLM(),
    message_archive=None,
)
record = plugin_memory_summary.SummaryRecord(text="Goal: book a table for 4", covered_up_to_seq=3)
view = PromptView(
    session_id="s",
    model="fake/model",
    context_window=8000,
    messages=[],
    summary=MetadataEntry(
        namespace="summary", key="s", value=record.model_dump(mode="json"), version=1
    ),
)
contribution = plugin.agent_prompt(view)
assert contribution is not None and "book a table for 4" in contribution.content, contribution
late = sorted(
    m
    for m in (
        "litellm",
        "plugin_memory_summary.summarize",
        "plugin_memory_summary.rules",
        "plugin_memory_summary.parsing",
        "plugin_memory_summary.identifiers",
    )
    if m in sys.modules
)
assert late == [], ("loaded by the per-turn path", late)
print("ok")
"""


def _run(code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_import_loads_no_regex_summarizer_or_litellm_and_builds_no_model() -> None:
    _run(_CHECK.format(not_at_import=NOT_AT_IMPORT))


def test_injecting_a_summary_loads_neither_the_summarizer_nor_the_rules_engine() -> None:
    _run(textwrap.dedent(_PER_TURN))


def _lazy_patterns() -> list[tuple[str, LazyRegex]]:
    found: list[tuple[str, LazyRegex]] = []
    for info in pkgutil.iter_modules(plugin_memory_summary.__path__):
        module = importlib.import_module(f"plugin_memory_summary.{info.name}")
        for name, value in vars(module).items():
            values = value if isinstance(value, list | tuple) else [value]
            found += [(f"{info.name}.{name}", v) for v in values if isinstance(v, LazyRegex)]
    found += [(f"redact.{name}", p) for name, p in Redactor()._passes]
    return found


def test_every_lazy_pattern_compiles_once() -> None:
    """Patterns are no longer compiled at import, so a broken one would only show on first use:
    compile them all here."""
    patterns = _lazy_patterns()
    assert len(patterns) > 40
    for name, lazy in patterns:
        compiled = lazy()
        assert lazy() is compiled, name
        assert lazy.compiled, name
