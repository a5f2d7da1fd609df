"""Render the docs' contract and config tables from the code, so they cannot drift.

``python -m host_stub.docgen README.md docs/*.md`` rewrites every block between
``<!-- BEGIN GENERATED: <section> -->`` and ``<!-- END GENERATED: <section> -->`` in place;
with ``--check`` it changes nothing and exits 1 when a file is out of date. The host's own
sections are ``hooks``, ``signals`` and ``services``; the installed plugins add theirs through the
``docs_sections`` hook (a plugin's config table, say), rendered here whatever the plugin is.

The Aalis names (the TypeScript plugin this project ports) are listed only where the Aalis
documentation names a counterpart; everything else comes from signatures, docstrings and pydantic
models.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from . import hookspecs, services, signals

__all__ = [
    "AALIS_HOOKS",
    "AALIS_SERVICES",
    "AALIS_SIGNALS",
    "SECTIONS",
    "config_rows",
    "main",
    "plugin_sections",
    "render_config",
    "render_hooks",
    "render_readme",
    "render_section",
    "render_services",
    "render_signals",
    "sections",
]

NONE = "—"

#: Our hook -> its Aalis counterpart.
AALIS_HOOKS: dict[str, str] = {
    "startup": "`meta.inject` (services injected at start)",
    "agent_prompt": "`agent:prompt` contribution point",
    "memory_clear": "`memory:clear` (a signal there)",
}

#: Our signals that Aalis sends or listens to under the same name.
AALIS_SIGNALS: frozenset[str] = frozenset(
    {
        signals.AGENT_TURN_AFTER,
        signals.TOKEN_USAGE,
        signals.SESSION_COMPRESS,
        signals.SESSION_COMPRESSING,
    }
)

#: (service, method) -> its Aalis counterpart.
AALIS_SERVICES: dict[tuple[str, str], str] = {
    ("memory", "trim_history"): "`trimHistory`",
    ("memory", "get_metadata"): "metadata interface (read)",
    ("memory", "save_metadata"): "metadata interface (write)",
    ("message-archive", "save_message"): "`message-archive` (compression marker)",
}

#: Service name in ``plugin.toml`` -> its Protocol.
SERVICE_PROTOCOLS: dict[str, type] = {
    "memory": services.MemoryService,
    "llm": services.LLMService,
    "message-archive": services.MessageArchiveService,
}

#: Methods a service may add, which the host uses when they are there: service -> Protocols.
OPTIONAL_PROTOCOLS: dict[str, tuple[type, ...]] = {
    "memory": (services.SnapshotOnAppend, services.OpensAtStart),
}

#: Protocol attributes cannot carry a docstring; their description lives here.
SERVICE_FALLBACK_DOCS: dict[tuple[str, str], str] = {
    ("llm", "default_model"): "The host's default model (`None` when it has none).",
}


# -- text helpers ------------------------------------------------------------------------------
_ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|obj):`~?([^`]+)`")
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<=[.!?])\s+(?=[A-Z`(])")


def _markdown(text: str) -> str:
    """reStructuredText inline markup as Markdown."""
    text = _ROLE.sub(lambda m: "`" + m.group(1).rsplit(".", 1)[-1] + "`", text)
    return text.replace("``", "`")


def summary_line(obj: Any) -> str:
    """The first sentence of an object's docstring, as Markdown; ``""`` when it has none."""
    doc = inspect.getdoc(obj)
    if not doc:
        return ""
    paragraph = " ".join(line.strip() for line in doc.split("\n\n", 1)[0].splitlines())
    if paragraph.startswith(":return:"):
        paragraph = "Returns " + paragraph[len(":return:") :].strip()
    first = _SENTENCE_END.split(paragraph, maxsplit=1)[0].strip()
    if first and first[-1] not in ".!?":
        first += "."
    return _markdown(first)


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _code(text: str) -> str:
    return f"`{text}`"


# -- hooks -------------------------------------------------------------------------------------
def hookspec_functions() -> list[tuple[str, Callable[..., Any]]]:
    """The hookspecs in the order the module defines them."""
    marker = f"{hookspecs.PROJECT}_spec"
    return [
        (name, obj)
        for name, obj in vars(hookspecs).items()
        if inspect.isfunction(obj) and hasattr(obj, marker)
    ]


def _annotation(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _hook_arguments(func: Callable[..., Any]) -> str:
    parts = []
    for param in inspect.signature(func).parameters.values():
        ann = _annotation(param.annotation)
        parts.append(param.name if ann in ("", "Any") else f"{param.name}: {ann}")
    return ", ".join(_code(p) for p in parts) or NONE


def render_hooks() -> str:
    rows = []
    for name, func in hookspec_functions():
        returns = _annotation(inspect.signature(func).return_annotation) or "None"
        rows.append(
            [
                _code(name),
                _hook_arguments(func),
                _code(returns),
                summary_line(func),
                AALIS_HOOKS.get(name, NONE),
            ]
        )
    table = _table(["hook", "arguments", "returns", "what it does", "Aalis"], rows)
    view = ", ".join(_code(f) for f in hookspecs.PromptView.model_fields)
    contribution = ", ".join(_code(f) for f in hookspecs.Contribution.model_fields)
    anchors = ", ".join(_code(a) for a in hookspecs.ANCHORS)
    tool = ", ".join(_code(f) for f in hookspecs.AgentTool.model_fields)
    context = ", ".join(_code(f) for f in hookspecs.ToolContext.model_fields)
    command = ", ".join(_code(f) for f in hookspecs.ChatCommand.model_fields)
    section = ", ".join(_code(f) for f in hookspecs.DocsSection.model_fields)
    return (
        f"{table}\n\n"
        f"`view` ({summary_line(hookspecs.PromptView)[:-1].lower()}): {view}.\n"
        f"A contribution has {contribution}; anchors, in prompt order: {anchors}.\n"
        f"An agent tool has {tool}; the host calls `handler(context, **arguments)` with a "
        f"context of {context}; its return value is the tool message, an exception a tool error.\n"
        f"A chat command has {command}; a docs section has {section} (a config model becomes "
        "a table of its keys)."
    )


# -- signals -----------------------------------------------------------------------------------
def _type_name(annotation: Any) -> str:
    """A short, readable type: ``int``, ``str or unset``, ``list of str``..."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return type(args[0]).__name__
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = " or ".join(_type_name(a) for a in rest)
        return f"{inner} or unset" if len(rest) < len(args) else inner
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "table"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def _choices(annotation: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    for arg in typing.get_args(annotation):
        found = _choices(arg)
        if found:
            return found
    return None


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _payload_field(name: str, info: FieldInfo) -> str:
    choices = _choices(info.annotation)
    nested = _nested_model(info.annotation)
    text = _code(name)
    if choices:
        text += " (" + "/".join(_code(str(c)) for c in choices) + ")"
    elif nested is not None:
        text += " {" + ", ".join(nested.model_fields) + "}"
    return text


def render_signals() -> str:
    rows = []
    for name, model in signals.PAYLOADS.items():
        fields = ", ".join(_payload_field(f, info) for f, info in model.model_fields.items())
        rows.append(
            [
                _code(name),
                fields,
                summary_line(model),
                _code(name) if name in AALIS_SIGNALS else NONE,
            ]
        )
    return _table(["signal", "payload", "sent when", "Aalis"], rows)


# -- services ----------------------------------------------------------------------------------
def protocol_members(protocol: type) -> Iterator[tuple[str, Any]]:
    """Public attributes and methods of a Protocol class, in definition order."""
    for name in getattr(protocol, "__annotations__", {}):
        if not name.startswith("_"):
            yield name, None
    for name, obj in vars(protocol).items():
        if not name.startswith("_") and inspect.isfunction(obj):
            yield name, obj


def _signature(func: Callable[..., Any]) -> str:
    sig = inspect.signature(func)
    parts: list[str] = []
    star_done = False
    for param in list(sig.parameters.values())[1:]:  # self
        if param.kind is inspect.Parameter.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            star_done = True
        text = param.name
        if param.default is not inspect.Parameter.empty:
            text += f"={param.default!r}"
        parts.append(text)
    prefix = "async " if inspect.iscoroutinefunction(func) else ""
    returns = _annotation(sig.return_annotation)
    return f"{prefix}{func.__name__}({', '.join(parts)})" + (f" -> {returns}" if returns else "")


def service_protocols() -> list[tuple[str, type, bool]]:
    """Each service's Protocol, then the optional ones it may add: ``(service, Protocol,
    optional)``, in the table's order."""
    out: list[tuple[str, type, bool]] = []
    for service, protocol in SERVICE_PROTOCOLS.items():
        out.append((service, protocol, False))
        out.extend((service, extra, True) for extra in OPTIONAL_PROTOCOLS.get(service, ()))
    return out


def render_services() -> str:
    rows = []
    for service, protocol, optional in service_protocols():
        for name, func in protocol_members(protocol):
            if func is None:
                sig = f"{name}: {protocol.__annotations__[name]}"
                doc = ""
            else:
                sig = _signature(func)
                doc = summary_line(func)
            doc = doc or SERVICE_FALLBACK_DOCS.get((service, name), NONE)
            if optional and doc != NONE:
                doc = f"Optional: {doc[0].lower()}{doc[1:]}"
            rows.append(
                [_code(service), _code(sig), doc, AALIS_SERVICES.get((service, name), NONE)]
            )
    return _table(["service", "method", "what it does", "Aalis"], rows)


# -- plugin config -----------------------------------------------------------------------------
def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
        value = int(value)
    return f"{value:_}".replace("_", " ") if isinstance(value, int) else repr(value)


def _range(info: FieldInfo) -> str:
    choices = _choices(info.annotation)
    if choices:
        return " / ".join(_code(str(c)) for c in choices)
    low: tuple[str, str] | None = None
    high: tuple[str, str] | None = None
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge):
            low = ("≤", _number(item.ge))
        elif isinstance(item, annotated_types.Gt):
            low = ("<", _number(item.gt))
        elif isinstance(item, annotated_types.Le):
            high = ("≤", _number(item.le))
        elif isinstance(item, annotated_types.Lt):
            high = ("<", _number(item.lt))
    if low and high:
        return f"{low[1]} {low[0]} x {high[0]} {high[1]}"
    if low:
        return {"≤": "≥", "<": ">"}[low[0]] + f" {low[1]}"
    if high:
        return f"{high[0]} {high[1]}"
    return NONE


def _default(info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, str):
        return _code(f'"{value}"')
    if isinstance(value, list):
        return _code("[]") if not value else _code(repr(value))
    return _code(repr(value))


def config_rows(
    model: type[BaseModel], prefix: str = ""
) -> Iterator[tuple[str, FieldInfo, type[BaseModel]]]:
    """Every leaf key of a config model (nested models flattened as ``<field>.<name>``)."""
    for name, info in model.model_fields.items():
        nested = _nested_model(info.annotation)
        if nested is not None:
            yield from config_rows(nested, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info, model


def render_config(model: type[BaseModel], columns: dict[str, dict[str, str]] | None = None) -> str:
    """A config model as a table: key, type, default, range, what it does, then one column per
    entry of ``columns`` (header -> key -> cell; a key without a cell gets ``—``)."""
    extra = columns or {}
    rows = []
    for key, info, _ in config_rows(model):
        rows.append(
            [
                _code(key),
                _type_name(info.annotation),
                _default(info),
                _range(info),
                _markdown(info.description or NONE),
                *(cells.get(key, NONE) for cells in extra.values()),
            ]
        )
    return _table(["key", "type", "default", "range", "what it does", *extra], rows)


def render_section(section: hookspecs.DocsSection) -> str:
    """What a plugin's section renders to: its config table, or its markdown."""
    if section.config is not None:
        return render_config(section.config, section.columns)
    return section.markdown


def plugin_sections() -> dict[str, hookspecs.DocsSection]:
    """The sections the installed plugins contribute through ``docs_sections``, by name. Two
    plugins naming the same section (or a host section) is an error."""
    from .config import HostConfig
    from .plugins import get_plugin_manager

    pm, _ = get_plugin_manager(HostConfig())
    found: dict[str, hookspecs.DocsSection] = {}
    for impl in pm.hook.docs_sections.get_hookimpls():
        value = impl.function()
        items = value if isinstance(value, list) else ([] if value is None else [value])
        for item in items:
            section = hookspecs.DocsSection.model_validate(item)
            if section.name in SECTIONS or section.name in found:
                raise ValueError(
                    f"plugin {impl.plugin_name!r}: docs section {section.name!r} is taken"
                )
            found[section.name] = section
    return found


# -- the docs ----------------------------------------------------------------------------------
#: The host's own sections.
SECTIONS: dict[str, Callable[[], str]] = {
    "hooks": render_hooks,
    "signals": render_signals,
    "services": render_services,
}


def sections() -> dict[str, Callable[[], str]]:
    """Every section: the host's and the installed plugins'."""
    found: dict[str, Callable[[], str]] = dict(SECTIONS)
    for name, section in plugin_sections().items():
        found[name] = lambda section=section: render_section(section)  # type: ignore[misc]
    return found


_BLOCK = re.compile(
    r"(<!-- BEGIN GENERATED: (?P<name>[\w-]+) -->\n)"
    r"(?P<body>.*?)"
    r"(<!-- END GENERATED: (?P=name) -->)",
    re.DOTALL,
)


def render_readme(text: str) -> str:
    """``text`` with every generated block replaced by its freshly rendered content. Raises
    ``ValueError`` for an unknown section or a marker without its partner."""
    begins = re.findall(r"<!-- BEGIN GENERATED: ([\w-]+) -->", text)
    ends = re.findall(r"<!-- END GENERATED: ([\w-]+) -->", text)
    if begins != ends:
        raise ValueError(f"unbalanced GENERATED markers: begins {begins}, ends {ends}")
    known = sections() if set(begins) - set(SECTIONS) else SECTIONS
    unknown = sorted(set(begins) - set(known))
    if unknown:
        raise ValueError(f"unknown GENERATED section(s): {', '.join(unknown)}")

    def replace(match: re.Match[str]) -> str:
        body = known[match.group("name")]().rstrip("\n") + "\n"
        return match.group(1) + body + match.group(4)

    return _BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m host_stub.docgen", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("files", type=Path, nargs="+", help="Markdown files with GENERATED markers")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a file is out of date"
    )
    args = parser.parse_args(argv)
    status = 0
    for path in args.files:
        try:
            text = path.read_text(encoding="utf-8")
            rendered = render_readme(text)
        except (OSError, ValueError) as exc:
            print(f"docgen: error: {path}: {exc}", file=sys.stderr)
            return 2
        if rendered == text:
            continue
        if args.check:
            print(
                f"docgen: {path} is out of date; run: python -m host_stub.docgen {path}",
                file=sys.stderr,
            )
            status = 1
            continue
        path.write_text(rendered, encoding="utf-8")
        print(f"docgen: rewrote {path}")
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
