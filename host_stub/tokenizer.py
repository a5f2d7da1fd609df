"""Token counts and model windows without importing litellm.

Importing litellm costs seconds; counting tokens needs only tiktoken (installed with litellm) and
the encoding files litellm bundles. This module makes the same choices litellm makes with Hugging
Face downloads off (as :mod:`host_stub.llm` runs it), so the counts are litellm's:

* the encoding: ``o200k_base`` for OpenAI models that use it (``gpt-4o*``, ``gpt-4.1``, ``gpt-5*``,
  the ``o`` series, with or without a provider prefix), ``cl100k_base`` for every other model,
  local ones included (:func:`encoding_name_for`);
* per message: 3 tokens, plus 1 for a ``name``, plus the text of every string field and the
  arguments of every tool call; 3 more for the reply primer (:func:`count_messages`).

Encodings load from litellm's bundled directory (``TIKTOKEN_CACHE_DIR``, as litellm sets it at
import), never from the network: an encoding missing there falls back to ``cl100k_base``.
Message content that is not text (images, files) returns ``None`` from :func:`count_messages`,
and the caller asks litellm.

Model windows come from litellm's bundled price / context-window file
(``model_prices_and_context_window_backup.json``), read once on first use (:func:`catalog_limits`);
the fields the host reads are cached beside the encodings.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import json
import marshal
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_ENCODING",
    "catalog_limits",
    "count_messages",
    "count_text",
    "encoding_name_for",
    "get_encoding",
    "litellm_dir",
    "read_catalog",
    "read_spec",
]

DEFAULT_ENCODING = "cl100k_base"

#: Per-message constants of litellm's ``token_counter`` for chat models.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMER = 3

#: OpenAI releases after gpt-4o that tiktoken may not list yet (litellm's own rule).
_VERSIONED_OPENAI = re.compile(r"(?:gpt-(?:[5-9]|[1-9]\d+)|o[1-9]\d*)(?:[.-]|$)")

#: tiktoken's download URL of each encoding: the bundled file is named by its SHA-1.
_ENCODING_URLS = {
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "p50k_base": "https://openaipublic.blob.core.windows.net/encodings/p50k_base.tiktoken",
}

_lock = threading.Lock()


def litellm_dir() -> Path | None:
    """litellm's package directory, found without importing it."""
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tiktoken_cache_dir() -> str | None:
    """Where tiktoken reads encodings: ``CUSTOM_TIKTOKEN_CACHE_DIR`` if set, else the directory
    litellm bundles (litellm points ``TIKTOKEN_CACHE_DIR`` there at import; so does this)."""
    custom = os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR")
    if custom:
        return custom
    root = litellm_dir()
    return str(root / "litellm_core_utils" / "tokenizers") if root is not None else None


def _bundled(name: str, cache_dir: str | None) -> bool:
    url = _ENCODING_URLS.get(name)
    if url is None or cache_dir is None:
        return False
    return (Path(cache_dir) / hashlib.sha1(url.encode()).hexdigest()).is_file()


def _openai_name(model: str) -> str:
    """The model's last path segment, without a fine-tune prefix (``ft:gpt-4o:org`` ->
    ``gpt-4o``)."""
    name = model.rsplit("/", 1)[-1]
    if name.startswith("ft:"):
        name = name.split(":")[1]
    return name


def _tiktoken_name(model: str) -> str | None:
    import tiktoken.model

    try:
        return tiktoken.model.encoding_name_for_model(model)
    except KeyError:
        return None


_OPENAI_CHAT_MODES = frozenset({"chat", "responses"})
_TEXT_MODES = frozenset({"chat", "completion", "responses", "realtime"})
#: litellm's ``azure_llms``: Azure deployment names of OpenAI models.
_AZURE_LLMS = frozenset(
    {
        "gpt-35-turbo",
        "gpt-35-turbo-instruct",
        "azure/gpt-41",
        "azure/gpt-41-mini",
        "azure/gpt-41-nano",
    }
)


def _listed_openai(model: str) -> bool:
    """Whether litellm's catalog lists ``model`` (or a suffix of its path) as an OpenAI model,
    directly or as an Azure OpenAI deployment."""
    catalog = _load_catalog()
    segments = model.split("/")
    for start in range(len(segments)):
        suffix = "/".join(segments[start:])
        for key in (suffix, f"azure/{suffix}"):
            entry = catalog.get(key)
            if not isinstance(entry, Mapping):
                if key in _AZURE_LLMS:
                    return True
                continue
            provider = entry.get("litellm_provider")
            if provider == "openai" and not (key.startswith("ft:") and key.count(":") <= 1):
                return True
            if key in _AZURE_LLMS:
                return True
            if (
                provider == "azure"
                and entry.get("mode") in _TEXT_MODES
                and _tiktoken_name(key.rsplit("/", 1)[-1]) is not None
            ):
                return True
    name = _openai_name(model)
    entry = catalog.get(f"azure/{name}")
    return (
        isinstance(entry, Mapping)
        and entry.get("litellm_provider") == "azure"
        and entry.get("mode") in _OPENAI_CHAT_MODES
        and (entry.get("supports_pdf_input") is True or name.startswith("gpt-"))
    )


def _listed_non_chat(name: str) -> bool:
    catalog = _load_catalog()
    for key in (name, f"azure/{name}"):
        entry = catalog.get(key)
        if isinstance(entry, Mapping) and entry.get("mode") not in (None, *_OPENAI_CHAT_MODES):
            return True
    return False


@lru_cache(maxsize=1024)
def encoding_name_for(model: str) -> str:
    """The tiktoken encoding litellm's ``token_counter`` uses for ``model`` (Hugging Face
    tokenizers off). An OpenAI model (tiktoken knows it, it is named like a release after gpt-4o,
    or litellm's catalog lists it as OpenAI or Azure OpenAI) gets its own encoding, ``o200k_base``
    when tiktoken has none for it; every other model ``cl100k_base``. The bundled catalog is read
    only for names tiktoken does not know."""
    name = _openai_name(model or "")
    if not name:
        return DEFAULT_ENCODING
    known = _tiktoken_name(name)
    if known == "o200k_base" or (known is None and _VERSIONED_OPENAI.match(name)):
        return "o200k_base"
    if known == DEFAULT_ENCODING or not _listed_openai(model):
        return DEFAULT_ENCODING
    if known is not None:
        return known
    if "gpt-4o" in name:
        return "o200k_base"
    return DEFAULT_ENCODING if _listed_non_chat(name) else "o200k_base"


def cache_dir() -> Path:
    """Where parsed encodings are kept between runs: ``$HOST_STUB_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/host-stub``, else ``~/.cache/host-stub``."""
    explicit = os.environ.get("HOST_STUB_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "host-stub"


def _spec_cache_path(name: str, source: Path) -> Path:
    """The cache file of one encoding, keyed by the bundled file (path, size, mtime), tiktoken's
    version and the interpreter's (marshal's format is the interpreter's)."""
    import tiktoken

    stat = source.stat()
    key = (
        f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{tiktoken.__version__}|{sys.version_info[:2]}"
    )
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return cache_dir() / f"tiktoken-{name}-{digest}.marshal"


def _valid_spec(spec: Any) -> bool:
    if not isinstance(spec, dict) or set(spec) != {"pat_str", "mergeable_ranks", "special_tokens"}:
        return False
    ranks = spec["mergeable_ranks"]
    return (
        isinstance(spec["pat_str"], str)
        and isinstance(spec["special_tokens"], dict)
        and isinstance(ranks, dict)
        and len(ranks) > 1000
        and all(
            isinstance(k, bytes) and isinstance(v, int)
            for k, v in itertools.islice(ranks.items(), 64)
        )
    )


def read_spec(path: Path) -> dict[str, Any] | None:
    try:
        # marshal.load(file) reads in small pieces: several times slower than one read.
        spec = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return spec if _valid_spec(spec) else None


def _write_marshal(path: Path, value: Any) -> None:
    """Best effort, atomic (a reader never sees half a file); an unwritable cache is skipped."""
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                marshal.dump(value, fh)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        pass


@lru_cache(maxsize=8)
def get_encoding(name: str) -> Any:
    """The tiktoken encoding ``name`` from the bundled files (``cl100k_base`` if they lack it).
    Parsing the bundled file takes most of the load (about 150 ms for ``o200k_base``), so the
    parsed tables are kept in :func:`cache_dir` as a marshal file and read from there next time."""
    import tiktoken

    with _lock:
        directory = tiktoken_cache_dir()
        if directory is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = directory
        if not _bundled(name, directory):
            name = DEFAULT_ENCODING
            if not _bundled(name, directory):
                raise RuntimeError(
                    f"the tiktoken encoding {name} is not in {directory}: reinstall litellm"
                )
        assert directory is not None
        source = Path(directory) / hashlib.sha1(_ENCODING_URLS[name].encode()).hexdigest()
        path = _spec_cache_path(name, source)
        spec = read_spec(path)
        if spec is None:
            from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS

            built = ENCODING_CONSTRUCTORS[name]()
            spec = {k: built[k] for k in ("pat_str", "mergeable_ranks", "special_tokens")}
            _write_marshal(path, spec)
        return tiktoken.Encoding(name, **spec)


#: Texts up to this many characters are cached (encoding, text) -> count; longer ones are counted
#: each time, so the cache cannot pin megabytes of tool output.
_CACHED_TEXT_CHARS = 8192


@lru_cache(maxsize=8192)
def _count_cached(encoding: str, text: str) -> int:
    return len(get_encoding(encoding).encode(text, disallowed_special=()))


def count_text(model: str, text: str) -> int:
    """Tokens of ``text`` with the encoding litellm would use for ``model``."""
    if not text:
        return 0
    name = encoding_name_for(model)
    if len(text) <= _CACHED_TEXT_CHARS:
        return _count_cached(name, text)
    return len(get_encoding(name).encode(text, disallowed_special=()))


def count_messages(model: str, messages: Sequence[Mapping[str, Any]]) -> int | None:
    """Tokens of OpenAI-format chat messages, as litellm's ``token_counter`` counts them; ``None``
    when a message holds content this cannot count (an image, a file: ask litellm)."""
    if not messages:
        return 0
    total = REPLY_PRIMER
    for message in messages:
        total += TOKENS_PER_MESSAGE
        for key, value in message.items():
            if value is None:
                continue
            if key in ("tool_calls", "function_call"):
                calls = [value] if key == "function_call" else value
                if not isinstance(calls, list):
                    return None
                for call in calls:
                    fn = call.get("function", call) if key == "tool_calls" else call
                    if not isinstance(fn, Mapping):
                        return None
                    total += count_text(model, str(fn.get("arguments", "")))
            elif isinstance(value, str):
                total += count_text(model, value)
                if key == "name":
                    total += TOKENS_PER_NAME
            elif key == "content" and isinstance(value, list):
                for block in value:
                    if isinstance(block, str):
                        total += count_text(model, block)
                    elif isinstance(block, Mapping) and block.get("type") == "text":
                        total += count_text(model, str(block.get("text") or ""))
                    else:
                        return None
    return total


# -- model windows -------------------------------------------------------------------------------

_catalog: dict[str, Any] | None = None

#: The fields of litellm's catalog entries the host reads (windows, provider, mode); the rest
#: (prices and the like) is left out of the cached copy.
CATALOG_FIELDS = (
    "litellm_provider",
    "mode",
    "max_input_tokens",
    "max_tokens",
    "max_output_tokens",
    "supports_pdf_input",
)


def _catalog_cache_path(source: Path) -> Path:
    stat = source.stat()
    key = f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{sys.version_info[:2]}|{CATALOG_FIELDS}"
    return cache_dir() / f"catalog-{hashlib.sha1(key.encode()).hexdigest()[:16]}.marshal"


def reduce_catalog(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The catalog with only :data:`CATALOG_FIELDS` of each entry (no ``sample_spec``)."""
    return {
        name: {k: entry[k] for k in CATALOG_FIELDS if k in entry}
        for name, entry in data.items()
        if name != "sample_spec" and isinstance(entry, Mapping)
    }


def read_catalog(path: Path) -> dict[str, dict[str, Any]] | None:
    try:
        data = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        return None
    return data


def _load_catalog() -> dict[str, Any]:
    """litellm's bundled catalog, :data:`CATALOG_FIELDS` of each entry. Parsing the 3 MB file
    takes tens of milliseconds, so the reduced copy is kept in :func:`cache_dir` (keyed by the
    file's path, size and mtime) and read from there next time."""
    global _catalog
    if _catalog is None:
        with _lock:
            if _catalog is None:
                root = litellm_dir()
                data: dict[str, Any] = {}
                if root is not None:
                    path = root / "model_prices_and_context_window_backup.json"
                    try:
                        cached = _catalog_cache_path(path)
                    except OSError:
                        cached = None
                    found = read_catalog(cached) if cached is not None else None
                    if found is not None:
                        data = found
                    else:
                        try:
                            data = reduce_catalog(json.loads(path.read_text(encoding="utf-8")))
                        except (OSError, ValueError, AttributeError):
                            data = {}
                        if cached is not None and data:
                            _write_marshal(cached, data)
                _catalog = data
    return _catalog


def _positive(value: Any) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def catalog_entry(model: str) -> Mapping[str, Any] | None:
    """litellm's bundled catalog entry for ``model``: the name as written, else without its
    provider prefix when the entry belongs to that provider."""
    catalog = _load_catalog()
    entry = catalog.get(model)
    if isinstance(entry, Mapping):
        return entry
    provider, sep, rest = model.partition("/")
    if sep:
        entry = catalog.get(rest)
        if isinstance(entry, Mapping) and entry.get("litellm_provider") in (
            provider,
            f"text-completion-{provider}",
        ):
            return entry
    return None


def catalog_limits(model: str) -> tuple[int | None, int | None]:
    """(input window, max output tokens) of ``model`` in litellm's bundled catalog, ``None`` for
    what it does not say."""
    entry = catalog_entry(model)
    if entry is None:
        return None, None
    window = _positive(entry.get("max_input_tokens")) or _positive(entry.get("max_tokens"))
    out = _positive(entry.get("max_output_tokens")) or _positive(entry.get("max_tokens"))
    return window, out
