"""The Lua scripts (``lua/*.lua``, package data): :data:`LIB`, the helpers every script starts
with, and :data:`SCRIPTS`, each script by name. Every mutation that touches more than one key, and
every read that must agree with itself, is one of them."""

from __future__ import annotations

from importlib.resources import files


def _read(name: str) -> str:
    return files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


#: Helpers every script starts with.
_LIB = _read("lib")

_SCRIPTS = {
    name: _read(name)
    for name in (
        "append",
        "read",
        "snapshot",
        "search",
        "range",
        "trim",
        "commit",
        "save_metadata",
        "acquire",
        "renew",
        "release",
        "clear",
        "delete_messages",
        "forget",
        "list_sessions",
    )
}
