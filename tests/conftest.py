"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_openai import FakeOpenAIServer


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    """A started scripted OpenAI-compatible server (see ``tests/fake_openai.py``); stopped, with
    its threads joined, after the test."""
    with FakeOpenAIServer() as server:
        yield server


# -- the soak test's size (tests/test_soak.py) ----------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-full",
        action="store_true",
        default=False,
        help="run the fault-injection soak at full size (200 sessions x 100 turns) instead of the "
        "CI size (20 x 50); the environment variable MEMORY_SUMMARY_SOAK=full does the same",
    )


def soak_is_full(config: pytest.Config) -> bool:
    import os

    return bool(config.getoption("--soak-full")) or os.environ.get("MEMORY_SUMMARY_SOAK") == "full"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "soak: the fault-injection soak (size: --soak-full)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The full-size soak outlives the per-test timeout that guards CI: give it an hour.
    if soak_is_full(config):
        for item in items:
            if item.get_closest_marker("soak") is not None:
                item.add_marker(pytest.mark.timeout(3600))
