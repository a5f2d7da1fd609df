"""The whole plugin contract: twelve hooks, the prompt view, a contribution, an agent tool, a
chat command and a docs section.

Implement any subset, with any subset of a hook's arguments (pluggy passes only the ones you
name: that is how a plugin asks for services). Plain ``def`` or ``async def`` both work; the host
awaits what is awaitable. Mark implementations with :data:`hookimpl`.

The rule between hooks and signals: anything whose answer the host uses is a hook; a signal
(:mod:`host_stub.signals`) only tells observers, and the host ignores what its receivers return.
"""

# Specs are bodies without code (a docstring): their return annotations document the contract.
# mypy: disable-error-code="empty-body"

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal

import pluggy
from pydantic import BaseModel, ConfigDict

from .messages import Message
from .services import (
    HostProtocol,
    LLMService,
    MemoryService,
    MessageArchiveService,
    MetadataEntry,
)

if TYPE_CHECKING:  # the CLI's library loads with the CLI, not with the contract
    import click

PROJECT = "host_stub"
#: Entry-point group a plugin registers itself in; the entry point names a factory.
ENTRY_POINT_GROUP = "host_stub.plugins"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Anchor = Literal["identity", "knowledge", "context", "turn-context", "turn-hint"]
ANCHORS: tuple[Anchor, ...] = ("identity", "knowledge", "context", "turn-context", "turn-hint")


# Both models build their validators on first use, not at import (``defer_build``).
class PromptView(BaseModel):
    """One consistent read of a session, taken before a model call."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    session_id: str
    model: str
    #: The model's window in the host's token counts: divided by the calibration ratio (see
    #: ``token:usage``), so ``usage_ratio`` is the provider's usage.
    context_window: int
    messages: list[Message]
    summary: MetadataEntry | None = None
    epoch: int = 0
    dry_run: bool = False
    usage_ratio: float = 0.0
    breakdown: dict[str, int] = {}


class Contribution(BaseModel):
    """A piece of system prompt placed at ``anchor``; the host keeps one per ``id``."""

    model_config = ConfigDict(defer_build=True)

    id: str
    anchor: Anchor
    content: str


class ToolContext(BaseModel):
    """Where an agent tool runs: the session of the turn, the model's call id, the model."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    session_id: str
    call_id: str = ""
    model: str = ""


class AgentTool(BaseModel):
    """A tool a plugin adds to the agent: listed to the model next to the host's own tools.

    ``parameters`` is the JSON schema of the arguments object. The host calls
    ``handler(context, **arguments)`` (plain or async) with a :class:`ToolContext`; what it
    returns (text, or anything JSON can encode) becomes the tool message, and an exception it
    raises becomes a tool error the model sees, never a failed turn.
    """

    model_config = ConfigDict(frozen=True, defer_build=True, arbitrary_types_allowed=True)

    name: str
    description: str
    parameters: dict[str, Any]
    handler: Callable[..., Any]


class ChatCommand(BaseModel):
    """A slash command a plugin adds to ``host-stub chat``.

    ``/name`` runs ``handler(argument)`` (plain or async; ``argument`` is the rest of the line,
    ``""`` when ``takes_argument`` is false) and the chat shows the text it returns, if any.
    """

    model_config = ConfigDict(frozen=True, defer_build=True, arbitrary_types_allowed=True)

    name: str
    help: str
    handler: Callable[..., Any]
    takes_argument: bool = False


class DocsSection(BaseModel):
    """A block of generated documentation a plugin contributes: the text between
    ``<!-- BEGIN GENERATED: name -->`` and its ``END`` marker (``python -m host_stub.docgen``).

    Either ``config``, a pydantic model rendered as a table of its keys (type, default, range,
    description) with one more column per entry of ``columns`` (header -> key -> cell), or
    ready ``markdown``.
    """

    model_config = ConfigDict(frozen=True, defer_build=True, arbitrary_types_allowed=True)

    name: str
    config: type[BaseModel] | None = None
    columns: dict[str, dict[str, str]] = {}
    markdown: str = ""


@hookspec
def startup(
    host: HostProtocol,
    config: BaseModel | None,
    memory: MemoryService,
    llm: LLMService,
    message_archive: MessageArchiveService | None,
) -> None:
    """Start the plugin with its validated config and the services it names; may be async."""


@hookspec
def plugin_config_schema() -> type[BaseModel]:
    """:return: the pydantic model the host validates this plugin's config against."""


@hookspec
def register_commands(
    cli: click.Group,
    open_host: Callable[..., AbstractAsyncContextManager[HostProtocol]],
) -> None:
    """Add click commands to ``cli``; ``open_host(ctx)`` (the command's click context) is an
    async context manager for a host built from the host options."""


@hookspec
def plugin_models(config: BaseModel, default_model: str | None) -> list[str]:
    """:return: the models this plugin calls with its validated ``config`` (``default_model`` is
    the host's), which the CLI checks before it starts a host."""


@hookspec
def docs_sections() -> list[DocsSection] | DocsSection | None:
    """:return: generated documentation blocks of this plugin (its config table, say)."""


@hookspec
def chat_commands(
    session_id: str, notify: Callable[[str], None]
) -> list[ChatCommand] | ChatCommand | None:
    """:return: slash commands for ``host-stub chat`` on ``session_id``; asked once, after
    ``startup``; ``notify(line)`` shows a line before the next prompt. May be async."""


@hookspec
def agent_prompt(view: PromptView) -> list[Contribution] | Contribution | None:
    """:return: system-prompt contributions for this model call; may be async. A view with
    ``dry_run`` is a prompt built and not sent (a token report; the host building a session's
    next prompt after a compression archived part of it, to count it before the turn needs it)."""


@hookspec
def agent_tools() -> list[AgentTool] | AgentTool | None:
    """:return: tools to add to the agent's tool loop; asked once, after ``startup``."""


@hookspec
def prune_history(view: PromptView) -> dict[int, str] | None:
    """:return: what the prompt shows instead of some history messages, by seq (a tool result
    as a one-line placeholder, say); the stored messages stay whole, and a message keeps its
    role and tool-call pairing. Asked before ``agent_prompt``; where plugins disagree on a
    message, the first answer wins. May be async."""


@hookspec
def before_model_call(view: PromptView) -> None:
    """Awaited before each model call (a blocking compression happens here)."""


@hookspec
def memory_clear(
    scope: Literal["session", "all"], session_id: str | None, types: list[str] | None
) -> dict[str, Any] | None:
    """:return: what this plugin cleared of its own memory types, ``{type: what it cleared}``
    (``None``: nothing of its types); the host merges the answers into what ``Host.clear``
    reports. Called after the host cleared the history; ``scope`` ``all`` (``session_id``
    ``None``) means every session, ``types`` ``None`` every type. May be async."""


@hookspec
def shutdown() -> None:
    """Drain or cancel background work; may be async."""
