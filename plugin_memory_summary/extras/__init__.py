"""The plugin's host-facing extras: the ``host-stub`` commands (``summary``, ``compress``,
``rebuild``, ``pin``; ``replay`` and ``demo`` with their ``report``), the chat's ``/summary`` and
``/compress``, and the plugin's section of the generated docs.

They are a plugin of their own, loaded through the ``host_stub.plugins`` entry point
``memory-summary-extras``, which names :func:`create_extension`. This is the only package of the
plugin that imports a CLI library or the host's runtime (``host_stub.cli``, ``host_stub.host``,
...); the rest uses the host's contract modules only.
"""

from __future__ import annotations

from .extensions import HostExtensions

__all__ = ["HostExtensions", "create_extension"]


def create_extension() -> HostExtensions:
    """Entry-point factory: a fresh extension instance for one host."""
    return HostExtensions()
