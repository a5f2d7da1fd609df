"""``bench/peers.py`` times the plugin's own code on the turn path by wrapping its entry points
(``PLUGIN_ENTRY_POINTS``) and the host's dispatch of them (``instrument``). A hook or receiver
left out of either makes the plugin's figures smaller than what the plugin costs a turn."""

from __future__ import annotations

import inspect

from bench_modules import load_bench

from host_stub import hookspecs
from host_stub.hookspecs import hookimpl
from plugin_memory_summary.plugin import MemorySummaryPlugin

peers = load_bench("peers")


def prompt_hooks_of_the_plugin() -> set[str]:
    """The plugin's hooks the host calls while it builds a prompt: those given the prompt's
    view (the others run at start or stop, or for commands, tools and docs)."""
    marker = hookimpl.project_name + "_impl"
    return {
        name
        for name, fn in inspect.getmembers(MemorySummaryPlugin, inspect.isfunction)
        if hasattr(fn, marker) and "view" in inspect.signature(getattr(hookspecs, name)).parameters
    }


def test_every_hook_on_the_turn_path_is_timed_as_the_plugins_code() -> None:
    on_turn = prompt_hooks_of_the_plugin()
    assert {"agent_prompt", "prune_history", "before_model_call"} <= on_turn
    assert on_turn <= set(peers.PLUGIN_ENTRY_POINTS)


def test_every_turn_receiver_is_timed_as_the_plugins_code() -> None:
    for name in ("_on_turn_after", "_on_token_usage", "_on_session_compress"):
        assert name in peers.PLUGIN_ENTRY_POINTS


def prompt_dispatchers() -> set[str]:
    """The host's methods that call the plugins' hooks while a prompt is built."""
    from host_stub.host import Host

    return {
        name
        for name, fn in inspect.getmembers(Host, inspect.iscoroutinefunction)
        if "pm.hook." in inspect.getsource(fn)
        and name not in ("start", "stop", "clear")  # clear: the memory_clear hook, no prompt
        and not name.startswith("_register")
    }


def test_the_host_path_times_the_dispatch_of_every_prompt_hook() -> None:
    assert {"_collect_contributions", "_pruned", "_before_model_call"} <= prompt_dispatchers()
    assert prompt_dispatchers() <= set(peers.HOST_PATH)

    class FakeBus:
        async def send(self, *args: object, **kwargs: object) -> None:
            return None

    class FakeHost:
        bus = FakeBus()

        async def _collect_contributions(self, view: object) -> list[object]:
            return []

        async def _pruned(self, view: object, history: list[object]) -> list[object]:
            return history

        async def _before_model_call(self, view: object) -> None:
            return None

    host = FakeHost()
    originals = {name: getattr(host, name) for name in peers.HOST_PATH}
    peers.instrument(host, [])
    for name, original in originals.items():
        assert getattr(host, name) is not original, f"{name} is not timed"


def test_every_system_runs_each_conversation_before_the_next_in_a_turning_order() -> None:
    systems = ["ours", "ours, in memory", "LangChain"]
    order = list(peers.interleaved(4, systems))
    assert [i for i, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    by_conversation = [[label for i, label in order if i == c] for c in range(4)]
    assert by_conversation[0] == systems
    assert by_conversation[1] == ["ours, in memory", "LangChain", "ours"]
    assert by_conversation[3] == systems  # back to the first order after a full turn
    assert list(peers.interleaved(2, [])) == []
