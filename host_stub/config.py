"""Host configuration (TOML) and the one-line errors a bad file gets."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "ConfigError",
    "HostConfig",
    "HostSection",
    "ModelOverride",
    "PluginsSection",
    "load_host_config",
    "one_line_error",
    "read_toml",
]


class ConfigError(ValueError):
    """A bad configuration file or value; the message is one line naming file and key."""


class ModelOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context_window: int = Field(gt=0)
    max_output_tokens: int = Field(default=4096, gt=0)
    input_cost_per_token: float = Field(default=0.0, ge=0)
    output_cost_per_token: float = Field(default=0.0, ge=0)


class HostSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: Store URL: ``sqlite:///path.db`` (default), ``memory://``.
    memory: str = "sqlite:///host-stub.db"
    #: Chat model (any litellm model string); ``None`` means replay-only.
    model: str | None = None
    api_base: str | None = None
    api_key: str | None = None
    system_prompt: str = "You are a helpful assistant."
    #: Merge the head system messages into one (for chat templates that allow only one).
    merge_system_messages: bool = False
    #: Tokens kept free for the reply when measuring context usage.
    reserve_for_reply: int = Field(default=1024, ge=0)
    #: Overrides the chat model's context window (e.g. to simulate a small window).
    context_window: int | None = Field(default=None, gt=0)
    #: Correct the usage ratio with the provider's reported prompt tokens (per model, bounded,
    #: smoothed): see host_stub/calibration.py.
    calibrate_tokens: bool = True
    llm_timeout_s: float = Field(default=60.0, gt=0)
    llm_retries: int = Field(default=0, ge=0, le=10)
    #: A reply with longer text is refused (a failed call) before it is counted or parsed.
    llm_max_reply_chars: int = Field(default=1_000_000, ge=1_000)
    max_tool_iterations: int = Field(default=8, ge=1, le=100)
    #: Characters one message may hold (content plus tool-call arguments); 0 = no limit. An
    #: over-long message from outside is refused before anything is stored; a tool's output
    #: is cut to it.
    max_message_chars: int = Field(default=200_000, ge=0)
    models: dict[str, ModelOverride] = Field(default_factory=dict)


class PluginsSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: Entry-point names to load; ``None`` loads every installed plugin.
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)


class HostConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: HostSection = Field(default_factory=HostSection)
    plugins: PluginsSection = Field(default_factory=PluginsSection)
    #: Per-plugin config, keyed by the plugin's entry-point name; validated by the plugin's schema.
    plugin: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: Where this config came from, for error messages.
    source: str = Field(default="<defaults>", exclude=True)


def one_line_error(source: str, error: ValidationError, prefix: str = "") -> str:
    """``file: key: reason`` for the first error, plus a count of the others."""
    first = error.errors()[0]
    key = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "")
    reason = first["msg"]
    if first["type"] == "extra_forbidden":
        reason = "unknown key"
    elif "input" in first and first["type"] not in ("missing",) and first["loc"]:
        reason = f"{reason} (got {first['input']!r})"
    more = len(error.errors()) - 1
    tail = f" (and {more} more)" if more else ""
    return f"{source}: {key or '<root>'}: {reason}{tail}"


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            raw = fh.read()
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: invalid UTF-8 (TOML files are UTF-8)") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def load_host_config(path: str | Path | None, **overrides: Any) -> HostConfig:
    """Read a host config file (or defaults when ``path`` is None); ``overrides`` set keys of
    ``[host]`` (from the command line) after the file."""
    data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        data = read_toml(Path(path))
    host = dict(data.get("host", {}) or {})
    host.update({k: v for k, v in overrides.items() if v is not None})
    data["host"] = host
    try:
        config = HostConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(one_line_error(source, exc)) from None
    config.source = source
    return config
