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
