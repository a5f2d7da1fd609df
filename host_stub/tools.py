"""A small tool registry for the agent loop."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .bus import await_me_maybe

__all__ = ["Tool", "ToolRegistry"]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any]
    #: A plugin's tool: ``function(context, **arguments)`` gets a ``ToolContext`` first.
    takes_context: bool = False

    def definition(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(
        self,
        name: str,
        function: Callable[..., Any],
        description: str = "",
        parameters: dict[str, Any] | None = None,
        *,
        takes_context: bool = False,
    ) -> None:
        self._tools[name] = Tool(
            name,
            description,
            parameters or {"type": "object", "properties": {}},
            function,
            takes_context,
        )

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def definitions(self) -> list[dict[str, Any]]:
        return [tool.definition() for tool in self._tools.values()]

    def __bool__(self) -> bool:
        return bool(self._tools)

    async def run(self, name: str, arguments: str, context: Any = None) -> tuple[str, bool]:
        """Run a tool; return ``(result text, is_error)``. Errors never raise. A plugin's tool
        gets ``context`` (a ``ToolContext``) before its arguments."""
        tool = self._tools.get(name)
        if tool is None:
            return f"unknown tool {name!r}", True
        try:
            args = json.loads(arguments) if arguments.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
            call = tool.function(context, **args) if tool.takes_context else tool.function(**args)
            result = await await_me_maybe(call)
        except Exception as exc:  # a tool's failure is the model's information, not ours
            return f"{type(exc).__name__}: {exc}", True
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False), False
