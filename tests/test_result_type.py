"""What ``compress`` and ``rebuild`` return: a frozen result with a literal status, read-only
stats, and the mapping shape older callers used."""

from __future__ import annotations

import dataclasses
import json
import typing

import pytest
from plugin_harness import plugin_host

from host_stub.messages import Message
from plugin_memory_summary import Result, Status
from plugin_memory_summary.base.results import result


def test_a_result_is_frozen_and_its_stats_read_only() -> None:
    stats = {"messages_summarized": 3}
    r = result("done", "manual", stats)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.status = "error"  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.stats["messages_summarized"] = 9  # type: ignore[index]
    stats["messages_summarized"] = 9  # the caller's dict is not the result's
    assert r.stats["messages_summarized"] == 3


def test_the_status_literal_names_every_status() -> None:
    assert set(typing.get_args(Status)) == {"done", "error", "skipped", "lost-race"}


def test_a_result_reads_as_a_mapping_and_dumps_to_json() -> None:
    r = result("skipped", "nothing to compress", {"gain": 0.0})
    assert r["status"] == "skipped" and r["reason"] == "nothing to compress"
    assert dict(r) == {"status": "skipped", "reason": "nothing to compress", "stats": r.stats}
    assert json.loads(json.dumps(r.to_dict())) == {
        "status": "skipped",
        "reason": "nothing to compress",
        "stats": {"gain": 0.0},
    }
    with pytest.raises(KeyError):
        r["other"]


async def test_compress_and_rebuild_return_results() -> None:
    async with plugin_host({"threshold": 1000, "keep_recent": 2}) as h:
        await h.host.memory.append(
            "s",
            [
                Message(role="user" if i % 2 == 0 else "assistant", content=f"turn {i} about Oslo")
                for i in range(12)
            ],
        )
        plugin = h.plugin
        done = await plugin.compress("s")
        assert isinstance(done, Result) and done.status == "done"
        assert done.stats["messages_summarized"] > 0
        rebuilt = await plugin.rebuild("s")
        assert isinstance(rebuilt, Result)
        assert rebuilt.stats["rebuilt_from"] == done.stats["messages_summarized"]
