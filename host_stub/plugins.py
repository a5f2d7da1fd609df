"""Plugin discovery and configuration on pluggy."""

from __future__ import annotations

import importlib.resources
import logging
import tomllib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, cast

import pluggy
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import hookspecs
from .config import ConfigError, HostConfig, one_line_error

__all__ = [
    "LoadedPlugin",
    "PluginManifest",
    "get_plugin_manager",
    "plugin_config",
]

log = logging.getLogger("host_stub.plugins")

KNOWN_SERVICES = ("memory", "llm", "message-archive")


class PluginManifest(BaseModel):
    """``plugin.toml``: what a plugin declares about itself."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    #: Unset: the version of the distribution that registers the plugin's entry point.
    version: str = ""
    requires: list[str] = Field(default_factory=list)
    optional: list[str] = Field(default_factory=list)
    signals: dict[str, list[str]] = Field(default_factory=dict)
    #: Memory types the plugin keeps and clears in its ``memory_clear`` hook (``clear --type``).
    memory_types: list[str] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)


@dataclass
class LoadedPlugin:
    name: str
    plugin: Any
    manifest: PluginManifest | None = None
    manifest_source: str = ""
    config: BaseModel | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def read_manifest(module_name: str) -> tuple[PluginManifest | None, str]:
    """The ``plugin.toml`` shipped in the plugin's top-level package, if any."""
    package = module_name.split(".")[0]
    try:
        resource = importlib.resources.files(package) / "plugin.toml"
        if not resource.is_file():
            return None, ""
        text = resource.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        return None, ""
    except UnicodeDecodeError:
        raise ConfigError(f"{package}/plugin.toml: invalid UTF-8 (TOML files are UTF-8)") from None
    source = f"{package}/plugin.toml"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    try:
        return PluginManifest.model_validate(
            data.get("plugin", {}) | {"config": data.get("config", {})}
        ), source
    except ValidationError as exc:
        raise ConfigError(one_line_error(source, exc, "plugin")) from None


_installed: list[Any] | None = None


def installed_plugins() -> list[Any]:
    """The entry points of the installed plugins, read once per process: every scan of the
    installed distributions costs milliseconds, and a command builds a plugin manager up to four
    times (its commands, the config checks, the models it calls, the host)."""
    global _installed
    if _installed is None:
        _installed = list(entry_points(group=hookspecs.ENTRY_POINT_GROUP))
    return _installed


def get_plugin_manager(
    config: HostConfig,
    extra_plugins: list[tuple[str, Any]] | None = None,
) -> tuple[pluggy.PluginManager, dict[str, LoadedPlugin]]:
    """A plugin manager with the host's specs, the installed plugins the config allows (each
    entry point's factory called once, so every host has its own instances) and ``extra_plugins``.
    Raises :class:`ConfigError` for a plugin that fails to load or implements an unknown hook."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    loaded: dict[str, LoadedPlugin] = {}
    allow, deny = config.plugins.allow, set(config.plugins.deny)
    for ep in installed_plugins():
        if ep.name in deny or (allow is not None and ep.name not in allow):
            continue
        try:
            factory = ep.load()
            plugin = factory() if callable(factory) else factory
        except Exception as exc:
            raise ConfigError(f"plugin {ep.name!r} ({ep.value}) failed to load: {exc}") from exc
        manifest, source = read_manifest(ep.module)
        if manifest is not None and not manifest.version and ep.dist is not None:
            manifest = manifest.model_copy(update={"version": ep.dist.version})
        pm.register(plugin, name=ep.name)
        loaded[ep.name] = LoadedPlugin(ep.name, plugin, manifest, source)
    for name, plugin in extra_plugins or []:
        if name in deny:
            continue
        pm.register(plugin, name=name)
        loaded[name] = LoadedPlugin(name, plugin, getattr(plugin, "manifest", None), name)
    missing = [n for n in (allow or []) if n not in loaded]
    if missing:
        raise ConfigError(f"{config.source}: plugins.allow: not installed: {', '.join(missing)}")
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise ConfigError(f"plugin {exc.plugin!r}: {exc}") from None
    unknown = set(config.plugin) - set(loaded)
    if unknown:
        name = sorted(unknown)[0]
        raise ConfigError(f"{config.source}: plugin.{name}: no such plugin loaded")
    return pm, loaded


def plugin_config(
    pm: pluggy.PluginManager, loaded: LoadedPlugin, config: HostConfig
) -> BaseModel | None:
    """Validate one plugin's config: ``plugin.toml`` defaults, then the host file's
    ``[plugin.<name>]``, against the schema the plugin returns from ``plugin_config_schema``."""
    impls = [
        impl
        for impl in pm.hook.plugin_config_schema.get_hookimpls()
        if impl.plugin is loaded.plugin
    ]
    overrides = config.plugin.get(loaded.name, {})
    if not impls:
        if overrides:
            raise ConfigError(f"{config.source}: plugin.{loaded.name}: plugin takes no config")
        return None
    schema = cast(type[BaseModel], impls[0].function())
    defaults = loaded.manifest.config if loaded.manifest else {}
    try:
        schema.model_validate(defaults)
    except ValidationError as exc:
        raise ConfigError(one_line_error(loaded.manifest_source, exc, "config")) from None
    try:
        return schema.model_validate({**defaults, **overrides})
    except ValidationError as exc:
        raise ConfigError(one_line_error(config.source, exc, f"plugin.{loaded.name}")) from None


def check_services(loaded: LoadedPlugin, available: set[str]) -> None:
    if loaded.manifest is None:
        return
    for service in loaded.manifest.requires:
        if service not in available:
            raise ConfigError(
                f"{loaded.manifest_source}: plugin.requires: service {service!r} not provided "
                f"by this host (has {', '.join(sorted(available))})"
            )
