"""``host-stub``: chat with a model, inspect and search sessions; plugins add their commands.

User mistakes (a missing file, malformed JSON, a bad config value, an unknown model, an
unreachable server) end with one line on stderr and exit code 2, never a traceback.

A plugin adds commands through its ``register_commands`` hook; the host gives each of them the
host options (``--config``, ``--db``, ``--memory``, ``--model``, ``--api-base``). What such a
command may use from here: :func:`open_host` (passed to the hook), :func:`host_config`,
:func:`option_values`, :func:`memory_origin`, :func:`preflight`, :func:`run_async` and
:class:`UserError`; ``ctx.find_root().obj["verbose"]`` is the count of ``-v``. A command
ends with another exit code than 0 by ``ctx.exit(code)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import click

from .chat import (
    SEARCH_LIMIT,
    HeldLogLines,
    ModelUnusable,
    TurnErrorsShownByChat,
    chat_loop,
    search_line,
)
from .checks import MessageRejected
from .config import ConfigError, HostConfig, load_host_config
from .host import Host
from .services import SUMMARY_NAMESPACE, SearchHit
from .session_ids import InvalidSessionId, session_id_problem
from .transcripts import TranscriptError

__all__ = [
    "UserError",
    "cli",
    "host_config",
    "host_options",
    "main",
    "memory_origin",
    "open_host",
    "option_values",
    "preflight",
    "run_async",
]

#: A store server that is down or refuses us is the user's to fix: one line, not a traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    TranscriptError,
    FileNotFoundError,
    ConnectionError,
    InvalidSessionId,
    MessageRejected,
)


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"host-stub: error: {self.message}", err=True)


#: Said after "no such store: ..." by every command that only works on what exists.
CREATED_BY = "(replay, demo or chat create one)"


def _store_not_found(exc: BaseException) -> bool:
    """Whether ``exc`` is the memory backends' ``StoreNotFound`` (a store a command that makes
    none did not find); their module is not imported for the check (the CLI starts without it)."""
    common = sys.modules.get("host_stub.memory.common")
    return common is not None and isinstance(exc, common.StoreNotFound)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader is gone (``host-stub ... | head -1``): a
    ``BrokenPipeError`` then is no error to report (click ends the command quietly, exit code 1),
    unlike one from a store's connection."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return False
    import select

    if not hasattr(select, "poll"):  # pragma: no cover - not on Linux or macOS
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def user_error(exc: BaseException) -> UserError | None:
    """The one line a user mistake or an unreachable store gets; ``None`` for anything else
    (a bug: its traceback is wanted), and for a closed standard output (nothing to say)."""
    if isinstance(exc, UserError):
        return exc
    if _store_not_found(exc):
        return UserError(f"{exc} {CREATED_BY}")
    if isinstance(exc, BrokenPipeError) and _stdout_closed():
        return None
    if isinstance(exc, USER_ERRORS):
        message = str(exc)
        return UserError(" ".join(message.split()) if "\n" in message else message)
    return None


def _set(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, _: click.Parameter, value: Any) -> Any:
        if value is not None:
            ctx.ensure_object(dict)[key] = value
        return value

    return callback


def _check_db(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """``--db`` names a SQLite file; a URL there is a mistake (it would become folders)."""
    if value is not None and "://" in value:
        raise UserError(
            f"--db takes the path of a SQLite file, not a URL ({value!r}): "
            f"use --memory {value} for a store URL"
        )
    return _set("db")(ctx, param, value)


def _check_session(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A session id given on the command line follows the one rule of every backend."""
    if value is not None:
        problem = session_id_problem(value)
        if problem is not None:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise UserError(f"invalid session id {shown}: {problem}")
    return value


HOST_OPTIONS = [
    click.Option(
        ["--config", "config_path"],
        type=click.Path(dir_okay=False),
        expose_value=False,
        callback=_set("config"),
        help="Host config file (TOML).",
    ),
    click.Option(
        ["--db"],
        type=click.Path(dir_okay=False),
        expose_value=False,
        callback=_check_db,
        help="SQLite file of the memory store (shorthand for --memory sqlite:///PATH).",
    ),
    click.Option(
        ["--memory"],
        expose_value=False,
        callback=_set("memory"),
        metavar="URL",
        help="Memory store URL: sqlite:///PATH, postgresql://USER@HOST:5432/DB[?schema=S], "
        "redis://HOST:6379/0[?prefix=P:] or memory://.",
    ),
    click.Option(
        ["--model"],
        expose_value=False,
        callback=_set("model"),
        help="Chat model (any litellm model string).",
    ),
    click.Option(
        ["--api-base"],
        expose_value=False,
        callback=_set("api_base"),
        metavar="URL",
        help="Base URL of an OpenAI-compatible server (a local one that checks no key needs no "
        "API key).",
    ),
]


def host_options(command: click.Command) -> click.Command:
    """Give a command the host options (config, store, model), so they work after its name; a
    SESSION argument (or ``--session``) gets the session-id rule."""
    command.params.extend(HOST_OPTIONS)
    for param in command.params:
        if param.name in ("session", "session_id") and param.callback is None:
            param.callback = _check_session
    return command


def option_values(ctx: click.Context) -> dict[str, Any]:
    """The host options given on the command line, before or after the command's name:
    ``config``, ``db``, ``memory``, ``model``, ``api_base`` (a key is there only when given)."""
    return ctx.find_root().ensure_object(dict) | ctx.ensure_object(dict)


def host_config(ctx: click.Context) -> HostConfig:
    """The host config of a command: the config file, with the options' overrides."""
    obj = option_values(ctx)
    memory = obj.get("memory")
    if memory is None and obj.get("db"):
        memory = f"sqlite:///{obj['db']}"
    return load_host_config(
        obj.get("config"), memory=memory, model=obj.get("model"), api_base=obj.get("api_base")
    )


def memory_origin(ctx: click.Context, config: HostConfig) -> str:
    """Where the store URL came from, for errors: ``--memory``, ``--db`` or the config file."""
    obj = option_values(ctx)
    if obj.get("memory") is not None:
        return "--memory"
    if obj.get("db"):
        return "--db"
    return f"{config.source}: host.memory"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite store URL; ``None`` for another kind of store."""
    from .memory import _sqlite_path

    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "sqlite":
        return None
    return Path(_sqlite_path(url, rest))


def store_problem(url: str) -> str | None:
    """Why a command that only reads or changes what is there cannot use the store at ``url``
    (it must not create one): a SQLite file that does not exist, or a directory."""
    path = sqlite_path(url)
    if path is None or str(path) == ":memory:":
        return None
    if not path.exists():
        return f"no such store: {url} {CREATED_BY}"
    if path.is_dir():
        return f"{url}: is a directory, not a SQLite file"
    return None


@contextlib.asynccontextmanager
async def open_host(
    ctx: click.Context, *, config: HostConfig | None = None, create: bool = False, **kwargs: Any
) -> AsyncIterator[Host]:
    """The host a command runs against; config errors become one-line user errors. Unless
    ``create``, a store that does not exist is an error, not an empty new one: the store is
    opened so as to make nothing (no file, folder, schema or table)."""
    opened: Any = None  # the store opened here (Host closes it at stop, not after a failed start)
    try:
        config = config or host_config(ctx)
        if "memory" not in kwargs:
            _check_memory_url(config.host.memory, memory_origin(ctx, config))
            _check_plugins(config)  # a config error first, and before any store is touched
            if not create:
                if problem := store_problem(config.host.memory):
                    raise UserError(problem)
                from .memory import open_memory

                counter: list[Callable[[Any], int]] = []  # the host's, once the host is made
                opened = open_memory(
                    config.host.memory, lambda message: counter[0](message), create=False
                )
                kwargs["memory"] = opened
        if config.host.api_base and not config.host.api_key:
            _check_models(config, chat=False)  # a local server needs no key (see NO_KEY)
        host = Host(config, **kwargs)
        if opened is not None:
            counter.append(host.counts.message)
        try:
            await host.start()
        except BaseException:
            if opened is not None:
                with contextlib.suppress(Exception):
                    await opened.close()
            raise
    except Exception as exc:
        error = user_error(exc)
        if error is None:
            raise
        raise error from None
    try:
        yield host
    finally:
        await host.stop()


def run_async(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command's coroutine; a user mistake or an unreachable store raised in it becomes
    one line (:func:`user_error`)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return asyncio.run(func(*args, **kwargs))
        except Exception as exc:
            error = user_error(exc)
            if error is None:
                raise
            raise error from None

    return wrapper


def _show_version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    """``--version``: the version of the installed distribution that ships this package."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    shipped = packages_distributions().get(__name__.partition(".")[0]) or []
    try:
        found = version(shipped[0]) if shipped else "unknown (not installed)"
    except PackageNotFoundError:
        found = "unknown (not installed)"
    click.echo(f"host-stub, version {found}")
    ctx.exit()


@click.group()
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """Reference host for conversation-memory plugins."""
    # Plugins read the count: a log line their command already shows another way may be left
    # out unless -v is given.
    ctx.ensure_object(dict)["verbose"] = verbose
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


for _option in HOST_OPTIONS:
    cli.params.append(_option)


# -- one-line messages and pre-flight checks -------------------------------------------------------
def _check_memory_url(url: str, origin: str = "host.memory") -> None:
    """A memory URL no backend understands (or whose driver is not installed) is a user error
    before anything runs, naming where the URL came from; nothing is opened here."""
    from .memory import open_memory

    try:
        open_memory(url, lambda message: 0)
    except (ValueError, NotImplementedError, ModuleNotFoundError) as exc:
        raise UserError(f"{origin}: {exc}") from None


def _check_plugins(config: HostConfig) -> None:
    """Every plugin's config is valid: checked before any store is opened, so a config error
    leaves no file behind."""
    from .plugins import get_plugin_manager, plugin_config

    pm, loaded = get_plugin_manager(config)
    for item in loaded.values():
        plugin_config(pm, item, config)


def preflight(config: HostConfig, *, origin: str = "host.memory", chat: bool = False) -> None:
    """Everything a command checks before it starts a host, each a one-line :class:`UserError`:
    the store URL (``origin`` names where it came from), every plugin's config, and the models
    the command will call (see :func:`_check_models`)."""
    _check_memory_url(config.host.memory, origin)
    _check_plugins(config)
    _check_models(config, chat=chat)


def plugin_models(config: HostConfig) -> list[str]:
    """The models the plugins will call, as their ``plugin_models`` hooks say given their
    validated config (the host's model stands for a plugin's default)."""
    from .plugins import get_plugin_manager, plugin_config

    pm, loaded = get_plugin_manager(config)
    models: list[str] = []
    for item in loaded.values():
        caller = pm.subset_hook_caller(
            "plugin_models", remove_plugins=[p.plugin for p in loaded.values() if p is not item]
        )
        for found in caller(
            config=plugin_config(pm, item, config), default_model=config.host.model
        ):
            models += [m for m in found or [] if m]
    return models


def _check_models(config: HostConfig, *, chat: bool) -> None:
    """Pre-flight for the models a command will call (the plugins' models, and with ``chat``
    the chat model; without a plugin that calls one, the host's model): one clear line now
    instead of a failure later. litellm must know the provider; a provider that needs an API
    key must have it, except behind an ``api_base`` (a local server that checks no key): there
    the host sends the placeholder key :data:`~host_stub.llm.NO_KEY` (set in
    ``config``); an ``api_base`` must accept connections."""
    called = plugin_models(config)
    wanted: list[str | None] = (
        [config.host.model, *called] if chat else [*called] or [config.host.model]
    )
    models = [m for m in dict.fromkeys(wanted) if m]
    if not models:
        return
    from .llm import NO_KEY, ensure_litellm, missing_api_key

    litellm = ensure_litellm()
    api_base = config.host.api_base
    for model in models:
        try:
            litellm.get_llm_provider(model=model, api_base=api_base)
        except Exception:
            raise UserError(
                f"unknown model {model!r}: litellm cannot tell its provider; write "
                f"provider/model (e.g. openai/{model.rsplit('/', 1)[-1]} with --api-base URL "
                "for an OpenAI-compatible server)"
            ) from None
        if config.host.api_key:
            continue
        missing = missing_api_key(litellm, model, api_base)
        if missing:
            if api_base:
                config.host.api_key = NO_KEY
                continue
            keys = " or ".join(missing)
            raise UserError(
                f"model {model!r} needs {keys}, which is not set: export it (any value for a "
                "local server that checks no key) or set api_key in the [host] config"
            )
    if api_base:
        _check_reachable(api_base)


def _check_reachable(url: str) -> None:
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--api-base {url!r}: expected an http:// or https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname, port), timeout=5).close()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise UserError(f"cannot reach --api-base {url}: {reason}") from None


# -- chat (the loop: host_stub.chat) ---------------------------------------------------------------
@host_options
@cli.command()
@click.option(
    "--session",
    "session_id",
    default="chat",
    show_default=True,
    help="Session id: a stored session resumes with its history and summary.",
)
@click.pass_context
@run_async
async def chat(ctx: click.Context, session_id: str) -> None:
    """Chat with a model (streaming); plugins work as the chat grows (a memory plugin
    summarizes). Commands: /search QUERY, /clear, /help, /quit, and the plugins' (/help)."""
    config = host_config(ctx)
    if not config.host.model:
        raise UserError("chat needs a model: --model M (any litellm model string)")
    preflight(config, origin=memory_origin(ctx, config), chat=True)
    quiet = TurnErrorsShownByChat()
    logging.getLogger("host_stub.host").addFilter(quiet)
    held = HeldLogLines()
    handlers = held.attach()
    try:
        async with open_host(ctx, config=config, create=True) as host:
            try:
                await chat_loop(host, session_id, held, handlers)
            except ModelUnusable as exc:
                raise UserError(str(exc)) from None
    finally:
        logging.getLogger("host_stub.host").removeFilter(quiet)
        held.release(handlers)
        for handler in handlers:
            handler.removeFilter(held)


@host_options
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@run_async
async def sessions(ctx: click.Context, as_json: bool) -> None:
    """List the sessions in the store."""
    async with open_host(ctx) as host:
        items = await host.memory.list_sessions()
    if as_json:
        click.echo(json.dumps([s.model_dump(mode="json") for s in items]))
        return
    if not items:
        click.echo("no sessions")
    for s in items:
        click.echo(
            f"{s.session_id}: {s.active} active, {s.archived} archived, "
            f"last seq {s.last_seq}, epoch {s.epoch}"
        )


def search_item(hit: SearchHit) -> dict[str, Any]:
    """One match as ``search --json`` prints it."""
    from .memory.search_plan import search_text

    message = hit.message
    return {
        "seq": message.seq,
        "role": message.role,
        "status": "active" if message.archived is None else f"archived ({message.archived})",
        "date": None if hit.stored_at is None else hit.stored_at.isoformat(timespec="seconds"),
        "score": round(hit.score, 6),
        "text": search_text(message),
    }


@host_options
@cli.command()
@click.argument("session")
@click.argument("query")
@click.option(
    "--role",
    type=click.Choice(["user", "assistant", "tool", "system"]),
    help="Only messages of this role.",
)
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=SEARCH_LIMIT,
    show_default=True,
    help="Most matches to show.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@run_async
async def search(
    ctx: click.Context, session: str, query: str, role: str | None, limit: int, as_json: bool
) -> None:
    """Search a session's messages, archived and active; best matches first."""
    if not query.strip():
        raise UserError("the query is empty: give the words to look for")
    async with open_host(ctx) as host:
        known = {s.session_id for s in await host.memory.list_sessions()}
        if session not in known:
            raise UserError(f"unknown session {session!r} in {host.config.host.memory}")
        hits = await host.memory.search(session, query, role=role, limit=limit)
    if as_json:
        click.echo(json.dumps([search_item(h) for h in hits], ensure_ascii=False))
        return
    if not hits:
        click.echo(f"nothing found for {query!r} in session {session!r}")
    for hit in hits:
        click.echo(search_line(hit, query))


@host_options
@cli.command()
@click.argument("session", required=False)
@click.option(
    "--all", "all_sessions", is_flag=True, help="Clear every session (instead of naming one)."
)
@click.option(
    "--type",
    "types",
    multiple=True,
    metavar="TYPE",
    help="Only this memory type (repeatable): history, or a plugin's (summary).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was cleared as JSON.")
@click.pass_context
@run_async
async def clear(
    ctx: click.Context,
    session: str | None,
    all_sessions: bool,
    types: tuple[str, ...],
    as_json: bool,
) -> None:
    """Clear a session's memory (history and what plugins keep, e.g. its summary)."""
    if not session and not all_sessions:
        raise UserError("name a SESSION or pass --all")
    if session and all_sessions:
        raise UserError("name a SESSION or pass --all, not both (--all clears every session)")
    async with open_host(ctx) as host:
        known_types = memory_types(host)
        for kind in types:
            if kind not in known_types:
                raise UserError(
                    f"unknown --type {kind!r}: this host clears {', '.join(known_types)}"
                )
        if session:
            # A mistyped name must not create an empty session (clearing bumps its epoch).
            known = {s.session_id for s in await host.memory.list_sessions()}
            if session not in known and not await host.memory.get_metadata(
                SUMMARY_NAMESPACE, session
            ):  # a session's summary record (pinned facts) may come before its first message
                raise UserError(f"unknown session {session!r} in {host.config.host.memory}")
        results = await host.clear(session, list(types) or None)
    if as_json:
        click.echo(json.dumps(results, default=str))
    else:
        click.echo(clear_line(session, results))


def memory_types(host: Host) -> list[str]:
    """The memory types ``clear --type`` takes: the host's history, and those the loaded plugins
    keep (``memory_types`` in their ``plugin.toml``)."""
    kept = [
        t for item in host.plugins.values() if item.manifest for t in item.manifest.memory_types
    ]
    return list(dict.fromkeys(["history", *kept]))


def clear_line(session: str | None, results: dict[str, Any]) -> str:
    """``cleared session 'trip': history, summary`` (``cleared 3 sessions: ...`` for --all)."""
    if session is not None:
        what = f"session {session!r}"
    else:
        count = max(
            (int(v.get("sessions", 0)) for v in results.values() if isinstance(v, dict)), default=0
        )
        what = f"{count} session{'' if count == 1 else 's'}"
    return f"cleared {what}: {', '.join(results) or 'nothing'}"


def _register_plugin_commands() -> None:
    """Plugins add commands through ``register_commands``; they get the host options too."""
    from .plugins import get_plugin_manager

    try:
        pm, _ = get_plugin_manager(HostConfig())
    except ConfigError as exc:
        click.echo(f"host-stub: warning: {exc}", err=True)
        return
    before = dict(cli.commands)
    pm.hook.register_commands(cli=cli, open_host=open_host)
    for name, command in cli.commands.items():
        if before.get(name) is not command:
            host_options(command)


def main(argv: list[str] | None = None) -> int:
    _register_plugin_commands()
    try:
        # A command that ends with ``ctx.exit(code)`` exits with that code.
        code = cli.main(args=argv, prog_name="host-stub", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except Exception as exc:  # raised outside run_async (a plugin command's own asyncio.run)
        if isinstance(exc, BrokenPipeError) and _stdout_closed():
            # What click does when it sees it: end quietly (nothing more goes to the pipe).
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        error = user_error(exc)
        if error is None:
            raise
        error.show()
        return error.exit_code
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
