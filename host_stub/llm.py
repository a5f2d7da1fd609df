"""The reference host's :class:`~host_stub.services.LLMService`, built on litellm.

litellm is imported lazily (it costs seconds): importing this module does not import it, and
neither does counting tokens or looking up a model's window; the first model call does, through
:func:`ensure_litellm`, which first makes litellm offline-safe:

* ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (unless already set) so the bundled price / context-window
  map is used instead of fetching a remote one at import;
* ``litellm.disable_hf_tokenizer_download = True`` so ``token_counter`` never downloads a Hugging
  Face tokenizer (it would for names containing ``llama-2``, ``llama-3``, ``replicate``,
  ``command-r`` ...): counting falls back to the bundled tiktoken encoding;
* litellm's "give feedback / get help" debug prints are suppressed and telemetry is off.

Token counts come from :mod:`host_stub.tokenizer`: tiktoken with the encoding litellm picks for the
model and litellm's per-message arithmetic, from the encodings litellm bundles (message content
that is not text, such as an image, is left to litellm). Model windows come from litellm's bundled
catalog file, read without importing litellm; a name the file lacks goes to litellm's catalog-only
look-up (``catalog_only``: litellm's public ``get_model_info`` would otherwise ask a running Ollama
server (``/api/show``) or the Hugging Face hub, synchronously). Models neither knows get their
window, max output and prices from ``model_overrides`` (the host config's
``[host.models."<model>"]`` tables), else the configured defaults, with one warning per model that
names the setting to add.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import warnings
from collections.abc import AsyncIterator, Mapping, Sequence
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from . import tokenizer
from .calibration import Calibration
from .messages import Message, text_of
from .services import Completion, LLMUsage

__all__ = [
    "NO_KEY",
    "LiteLLMService",
    "ModelOverride",
    "ReplyTooLongError",
    "ensure_litellm",
    "missing_api_key",
]

logger = logging.getLogger(__name__)

_litellm: ModuleType | None = None
_import_lock = threading.Lock()

#: Providers whose litellm ``get_model_info`` makes a blocking network call for models missing
#: from the catalog; only used if the catalog-only look-up is unavailable.
_NETWORK_MODEL_INFO_PROVIDERS = frozenset({"ollama", "ollama_chat", "huggingface", "lemonade"})

#: Extra seconds the outer ``asyncio.wait_for`` guard allows beyond litellm's own timeout, so
#: litellm's ``Timeout`` normally surfaces first and the guard only catches what escapes it.
_GUARD_GRACE_S = 1.0


#: Longest reply text accepted by default: far beyond any model's output limit (about 128k
#: tokens, some 500,000 characters), so only a faulty or hostile server reaches it.
DEFAULT_MAX_REPLY_CHARS = 1_000_000


#: The API key sent to an ``api_base`` server when none is set: a server that checks no key
#: accepts it; one that does answers 401, which is reported in one line.
NO_KEY = "no-key"


def missing_api_key(litellm: ModuleType, model: str, api_base: str | None) -> list[str]:
    """The environment variables holding an API key that ``model``'s provider wants and that are
    not set (empty when none is missing, or when litellm cannot tell)."""
    try:
        env = litellm.validate_environment(model=model, api_base=api_base)
    except Exception:  # litellm could not tell: let the first call say it
        return []
    missing = list(env.get("missing_keys") or [])
    if env.get("keys_in_environment") or not all(k.endswith("_API_KEY") for k in missing):
        return []
    return missing


class ReplyTooLongError(ValueError):
    """The reply's text is longer than ``max_reply_chars``: it is refused before its tokens are
    counted (a count runs on the event loop), and the caller treats it as a failed call."""


def ensure_litellm() -> ModuleType:
    """Import litellm once, offline-safe (see the module docstring), and return the module."""
    global _litellm
    if _litellm is not None:
        return _litellm
    with _import_lock:
        if _litellm is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm

            litellm.disable_hf_tokenizer_download = True
            litellm.suppress_debug_info = True
            if hasattr(litellm, "telemetry"):
                litellm.telemetry = False
            _prebuild()
            _litellm = litellm
    return _litellm


#: pydantic's advisory about litellm's own TypedDicts with ``ReadOnly`` items. litellm emits it
#: from inside a call the first time a lazily built model or lazily imported module builds its
#: schema (the first ``acompletion``, the first streamed chunk). litellm adds a global "ignore"
#: filter for it at import, but test runners reset the filters per test (pytest does), and with
#: warnings as errors litellm turns it into a failed call, for whichever call came first.
_READONLY_ADVISORY = r"Items? .* on TypedDict class .* (is|are) using the `ReadOnly` qualifier"

#: Modules litellm imports on the first ``acompletion`` whose import emits that advisory.
_LAZY_MODULES = ("litellm.llms.github_copilot.per_user_auth",)


def _prebuild() -> None:
    """Import litellm's lazily imported call-path modules and build its response models now,
    silencing only pydantic's ``ReadOnly`` advisory (a few ms)."""
    import importlib

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_READONLY_ADVISORY, category=UserWarning)
        for name in _LAZY_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # another litellm layout: it imports the module itself later
                logger.debug("could not pre-import %s", name, exc_info=True)
        try:
            types = importlib.import_module("litellm.types.utils")
        except Exception:
            return
        for obj in list(vars(types).values()):
            if (
                isinstance(obj, type)
                and issubclass(obj, BaseModel)
                and obj.__module__ == types.__name__
                and not obj.__pydantic_complete__
            ):
                try:
                    obj.model_rebuild()
                except Exception:  # best effort: litellm builds it on first use otherwise
                    logger.debug("could not prebuild %s", obj.__name__, exc_info=True)


class ModelOverride(BaseModel):
    """What the host knows about a model litellm's catalog lacks (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context_window: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, gt=0)
    input_cost_per_token: float | None = Field(default=None, ge=0)
    output_cost_per_token: float | None = Field(default=None, ge=0)


def _to_openai(messages: Sequence[Message | Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, Message):
            out.append(m.to_openai())
        elif isinstance(m, Mapping):
            out.append(dict(m))
        else:
            raise TypeError(f"expected Message or dict, got {type(m).__name__}")
    return out


def _tool_calls_of(message: Any) -> list[dict[str, Any]] | None:
    """The message's tool calls as plain OpenAI-shaped dicts (``None`` when there are none)."""
    calls = getattr(message, "tool_calls", None)
    if not calls:
        return None
    out: list[dict[str, Any]] = []
    for call in calls:
        if hasattr(call, "model_dump"):
            call = call.model_dump()
        elif not isinstance(call, Mapping):
            call = dict(call)
        fn = call.get("function") or {}
        if hasattr(fn, "model_dump"):
            fn = fn.model_dump()
        args = fn.get("arguments")
        if args is None:
            args = ""
        elif not isinstance(args, str):
            args = json.dumps(args)
        out.append(
            {
                "id": call.get("id") or "",
                "type": call.get("type") or "function",
                "function": {"name": fn.get("name") or "", "arguments": args},
            }
        )
    return out


def _count_text(model: str, text: str) -> int:
    return tokenizer.count_text(model, text)


class LiteLLMService:
    """:class:`~host_stub.services.LLMService` on litellm: any litellm model string works
    (``gpt-4o-mini``, ``ollama/llama3.2``, ``openai/<name>`` with ``api_base`` for any
    OpenAI-compatible server)."""

    def __init__(
        self,
        *,
        default_model: str | None = None,
        api_base: str | None = None,
        api_key: str | None = None,
        num_retries: int = 0,
        drop_params: bool = True,
        timeout: float = 60,
        model_overrides: Mapping[str, ModelOverride | Mapping[str, Any]] | None = None,
        default_context_window: int = 8192,
        default_max_output_tokens: int = 4096,
        mock_response: str | None = None,
        max_reply_chars: int = DEFAULT_MAX_REPLY_CHARS,
    ) -> None:
        if num_retries < 0:
            raise ValueError("num_retries must be >= 0")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        if default_context_window <= 0 or default_max_output_tokens <= 0:
            raise ValueError("default_context_window and default_max_output_tokens must be > 0")
        if max_reply_chars <= 0:
            raise ValueError("max_reply_chars must be > 0")
        #: Replies with longer text raise :class:`ReplyTooLongError`.
        self.max_reply_chars = max_reply_chars
        self.default_model = default_model
        self.api_base = api_base
        self.api_key = api_key
        self.num_retries = num_retries
        self.drop_params = drop_params
        self.timeout = float(timeout)
        self.model_overrides: dict[str, ModelOverride] = {
            name: o if isinstance(o, ModelOverride) else ModelOverride.model_validate(o)
            for name, o in (model_overrides or {}).items()
        }
        self.default_context_window = default_context_window
        self.default_max_output_tokens = default_max_output_tokens
        #: Only for tests and demos: litellm answers with this text without any HTTP call.
        self.mock_response = mock_response
        self._info_cache: dict[str, tuple[int | None, int | None]] = {}
        self._placeholder_keys: dict[str, str | None] = {}
        #: Windows the server itself reported (llama.cpp ``/props``, vLLM ``/v1/models``).
        self.server_windows: dict[str, int] = {}
        #: Provider tokens per counted token, per model (see :mod:`host_stub.calibration`).
        self.calibration = Calibration()
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    # -- model resolution ------------------------------------------------------------------------
    def _model(self, model: str | None) -> str:
        name = model or self.default_model
        if not name:
            raise ValueError(
                "no model given and LiteLLMService has no default_model: pass model=... or set "
                "default_model (any litellm model string, e.g. 'gpt-4o-mini' or "
                "'openai/<name>' with api_base)"
            )
        return name

    def _call_kwargs(
        self,
        model: str,
        messages: list[dict[str, Any]],
        max_tokens: int | None,
        temperature: float | None,
        timeout: float,
        tools: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "num_retries": self.num_retries,
            "drop_params": self.drop_params,
            "timeout": timeout,
        }
        if self.api_base:
            kwargs["api_base"] = self.api_base
        api_key = self.api_key or self._placeholder_key(model)
        if api_key:
            kwargs["api_key"] = api_key
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        if temperature is not None:
            kwargs["temperature"] = temperature
        if tools:
            kwargs["tools"] = tools
        if self.mock_response is not None:
            kwargs["mock_response"] = self.mock_response
        return kwargs

    def _placeholder_key(self, model: str) -> str | None:
        """:data:`NO_KEY` for a model behind ``api_base`` whose provider wants an API key that
        is not set (a local server checks none; one that does answers 401); else ``None``."""
        if not self.api_base or self.mock_response is not None:
            return None
        if model not in self._placeholder_keys:
            self._placeholder_keys[model] = (
                NO_KEY if missing_api_key(ensure_litellm(), model, self.api_base) else None
            )
        return self._placeholder_keys[model]

    def _guard(self, timeout: float) -> float:
        """Outer bound for one call: every attempt litellm may make, plus a grace period."""
        return timeout * (self.num_retries + 1) + _GUARD_GRACE_S

    # -- calls -----------------------------------------------------------------------------------
    async def complete(
        self,
        messages: Sequence[Message | dict[str, Any]],
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion:
        """One chat completion. litellm's exceptions propagate: they all subclass
        ``openai.APIError`` (``litellm.Timeout``, ``litellm.BadRequestError``,
        ``litellm.InternalServerError`` for a 5xx or a body that is not JSON ...); a call that
        outlives litellm's own timeout (every attempt plus a grace second) raises the builtin
        :class:`TimeoutError`."""
        name = self._model(model)
        litellm = ensure_litellm()
        wire = _to_openai(messages)
        t = float(timeout if timeout is not None else self.timeout)
        kwargs = self._call_kwargs(name, wire, max_tokens, temperature, t, tools)
        response = await asyncio.wait_for(litellm.acompletion(**kwargs), self._guard(t))
        completion = self._completion(response, name, wire)
        if self._reported(response):
            self._calibrate(name, wire, tools, completion.usage.prompt_tokens)
        return completion

    async def stream(
        self,
        messages: Sequence[Message | dict[str, Any]],
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[str | Completion]:
        """Yield text deltas (``str``) as they arrive, then one final :class:`Completion` with the
        whole text, finish reason, tool calls and usage. ``timeout`` bounds the wait for the first
        response and for each later chunk."""
        name = self._model(model)
        litellm = ensure_litellm()
        wire = _to_openai(messages)
        t = float(timeout if timeout is not None else self.timeout)
        kwargs = self._call_kwargs(name, wire, max_tokens, temperature, t, tools)
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
        response = await asyncio.wait_for(litellm.acompletion(**kwargs), self._guard(t))
        chunks: list[Any] = []
        parts: list[str] = []
        received = 0
        iterator = response.__aiter__()
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(iterator.__anext__(), t + _GUARD_GRACE_S)
                except StopAsyncIteration:
                    break
                chunks.append(chunk)
                for choice in getattr(chunk, "choices", None) or []:
                    delta = getattr(choice, "delta", None)
                    text = getattr(delta, "content", None) if delta is not None else None
                    if text:
                        parts.append(text)
                        received += len(text)
                        if received > self.max_reply_chars:
                            raise self._too_long(received)
                        yield text
        finally:
            close = getattr(response, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception:  # best effort: the stream is done or abandoned
                    logger.debug("closing the litellm stream failed", exc_info=True)
        built = litellm.stream_chunk_builder(chunks, messages=wire) if chunks else None
        if built is None:
            usage = self._counted_usage(name, wire, "".join(parts))
            yield Completion(text="".join(parts), usage=usage, model=name)
            return
        completion = self._completion(built, name, wire)
        if completion.text != "".join(parts) and parts:
            completion = completion.model_copy(update={"text": "".join(parts)})
        if any(self._reported(chunk) for chunk in chunks):
            self._calibrate(name, wire, tools, completion.usage.prompt_tokens)
        else:  # litellm's own estimate of the usage, not the provider's
            usage = completion.usage.model_copy(update={"estimated": True})
            completion = completion.model_copy(update={"usage": usage})
        yield completion

    # -- calibration -----------------------------------------------------------------------------
    @staticmethod
    def _reported(response: Any) -> bool:
        """Whether the provider sent the prompt's token count (not litellm's estimate of it)."""
        usage = getattr(response, "usage", None)
        return bool(usage is not None and getattr(usage, "prompt_tokens", None))

    def _calibrate(
        self,
        model: str,
        wire: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        reported: int,
    ) -> None:
        """Compare the provider's prompt tokens with this service's count of the same request
        (messages and tool definitions, as the host counts them) and feed the model's ratio."""
        counted = self.count_tokens(wire, model)
        if tools:
            counted += self.count_tokens(json.dumps(tools), model)
        self.calibration.observe(model, counted, reported)

    # -- response -> Completion ------------------------------------------------------------------
    def _too_long(self, size: int) -> ReplyTooLongError:
        return ReplyTooLongError(
            f"reply too long: {size:,} characters (max_reply_chars is {self.max_reply_chars:,})"
        )

    def _completion(self, response: Any, model: str, wire: list[dict[str, Any]]) -> Completion:
        choices = getattr(response, "choices", None) or []
        choice = choices[0] if choices else None
        message = getattr(choice, "message", None) if choice is not None else None
        text = getattr(message, "content", None) or ""
        if not isinstance(text, str):
            text = text_of(text)
        if len(text) > self.max_reply_chars:
            raise self._too_long(len(text))
        finish_reason = getattr(choice, "finish_reason", None) if choice is not None else None
        raw_usage = getattr(response, "usage", None)
        if raw_usage is not None and (
            getattr(raw_usage, "prompt_tokens", None)
            or getattr(raw_usage, "completion_tokens", None)
        ):
            prompt = int(getattr(raw_usage, "prompt_tokens", 0) or 0)
            completion_tokens = int(getattr(raw_usage, "completion_tokens", 0) or 0)
            total = int(getattr(raw_usage, "total_tokens", 0) or (prompt + completion_tokens))
            usage = LLMUsage(
                prompt_tokens=prompt, completion_tokens=completion_tokens, total_tokens=total
            )
        else:
            usage = self._counted_usage(model, wire, text)
        return Completion(
            text=text,
            finish_reason=finish_reason,
            usage=usage,
            cost=self._cost(response, model, usage),
            model=model,
            tool_calls=_tool_calls_of(message),
        )

    def _counted_usage(self, model: str, wire: list[dict[str, Any]], text: str) -> LLMUsage:
        prompt = self.count_tokens(wire, model) if wire else 0
        out = self.count_tokens(text, model) if text else 0
        return LLMUsage(
            prompt_tokens=prompt, completion_tokens=out, total_tokens=prompt + out, estimated=True
        )

    def _cost(self, response: Any, model: str, usage: LLMUsage) -> float | None:
        override = self.model_overrides.get(model)
        if override is not None and (
            override.input_cost_per_token is not None or override.output_cost_per_token is not None
        ):
            return usage.prompt_tokens * (
                override.input_cost_per_token or 0.0
            ) + usage.completion_tokens * (override.output_cost_per_token or 0.0)
        litellm = ensure_litellm()
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:
            try:  # the server may report another name than the one we asked for
                cost = litellm.completion_cost(completion_response=response, model=model)
            except Exception:
                return None
        return float(cost) if cost is not None else None

    # -- model windows ---------------------------------------------------------------------------
    def context_window(self, model: str | None = None) -> int:
        """Input tokens the model accepts: override, then what the server reported
        (:meth:`probe_server_window`), then litellm's catalog, then the default."""
        name = self._model(model)
        override = self.model_overrides.get(name)
        if override is not None and override.context_window is not None:
            return override.context_window
        served = self.server_windows.get(name)
        if served is not None:
            return served
        window, _ = self._catalog_info(name)
        if window is not None:
            return window
        self._warn_default(name)
        return self.default_context_window

    def max_output_tokens(self, model: str | None = None) -> int:
        """Tokens the model may generate: override, then litellm's catalog, then the default."""
        name = self._model(model)
        override = self.model_overrides.get(name)
        if override is not None and override.max_output_tokens is not None:
            return override.max_output_tokens
        _, out = self._catalog_info(name)
        if out is not None:
            return out
        self._warn_default(name)
        return self.default_max_output_tokens

    def knows_window(self, model: str) -> bool:
        """Whether the window of ``model`` comes from somewhere (override, server, catalog)
        rather than the default; looks nothing up on the network."""
        override = self.model_overrides.get(model)
        if override is not None and override.context_window is not None:
            return True
        return model in self.server_windows or self._catalog_info(model)[0] is not None

    async def probe_server_window(self, model: str, *, timeout: float = 2.0) -> int | None:
        """Ask the ``api_base`` server for the window it runs ``model`` with: llama.cpp's
        ``/props`` (``n_ctx``), then vLLM's ``/v1/models`` (``max_model_len``). Remembered for
        :meth:`context_window`; ``None`` (and nothing remembered) when neither says. Only the
        configured ``api_base`` is asked, each request bounded by ``timeout``."""
        if not self.api_base:
            return None
        window = await asyncio.to_thread(
            server_window, self.api_base, model, api_key=self.api_key, timeout=timeout
        )
        if window is not None:
            self.server_windows[model] = window
            logger.info(
                "model %r: context window %d, as the server at %s reports",
                model,
                window,
                self.api_base,
            )
        return window

    def _warn_default(self, model: str) -> None:
        with self._lock:
            if model in self._warned:
                return
            self._warned.add(model)
        logger.warning("%s", unknown_window_hint(model, self.default_context_window))

    def _catalog_info(self, model: str) -> tuple[int | None, int | None]:
        with self._lock:
            if model in self._info_cache:
                return self._info_cache[model]
        info = self._lookup(model)
        window: int | None = None
        out: int | None = None
        if info:
            window = _positive(info.get("max_input_tokens")) or _positive(info.get("max_tokens"))
            out = _positive(info.get("max_output_tokens")) or _positive(info.get("max_tokens"))
        with self._lock:
            self._info_cache[model] = (window, out)
        return window, out

    def _lookup(self, model: str) -> Mapping[str, Any] | None:
        entry = tokenizer.catalog_entry(model)
        if entry is not None:
            return entry
        # Not under its own name in the bundled file (an alias, a routed name): ask litellm.
        litellm = ensure_litellm()
        try:
            from litellm.utils import get_model_info_helper

            return get_model_info_helper(model, catalog_only=True)
        except TypeError:  # an older helper without catalog_only: use the public API, carefully
            pass
        except ImportError:
            pass
        except Exception:  # ModelNotMappedError and friends: litellm does not know it
            return None
        try:
            provider = litellm.get_llm_provider(model)[1]
        except Exception:
            provider = None
        if provider in _NETWORK_MODEL_INFO_PROVIDERS:
            return None
        try:
            return litellm.get_model_info(model)
        except Exception:
            return None

    # -- tokens ----------------------------------------------------------------------------------
    def count_tokens(
        self,
        messages_or_text: str | Sequence[Message | dict[str, Any]],
        model: str | None = None,
    ) -> int:
        """Tokens of a text or of chat messages (with litellm's per-message overhead), with the
        model's tokenizer when it is bundled, else the bundled ``cl100k_base``; never reaches the
        network."""
        name = model or self.default_model or ""
        if isinstance(messages_or_text, str):
            return _count_text(name, messages_or_text) if messages_or_text else 0
        wire = _to_openai(messages_or_text)
        if not wire:
            return 0
        counted = tokenizer.count_messages(name, wire)
        if counted is not None:
            return counted
        # Content only litellm can count (an image, a file): import it now.
        litellm = ensure_litellm()
        try:
            return int(
                litellm.token_counter(model=name, messages=wire, use_default_image_token_count=True)
            )
        except Exception:
            # A content block litellm cannot count: count the text of every message instead.
            logger.debug("token_counter failed on messages; counting their text", exc_info=True)
            total = 0
            for m in wire:
                total += 4 + _count_text(name, text_of(m.get("content")))
                for call in m.get("tool_calls") or []:
                    fn = call.get("function") or {}
                    total += _count_text(name, f"{fn.get('name', '')}{fn.get('arguments', '')}")
            return total


def _get_json(url: str, api_key: str | None, timeout: float) -> Any:
    import urllib.request

    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            if response.status != 200:
                return None
            return json.loads(response.read(1_000_000))
    except (OSError, ValueError):
        return None


def server_urls(api_base: str) -> tuple[str, str]:
    """The llama.cpp ``/props`` URL (at the server root) and the ``/models`` URL (beside
    ``/chat/completions``) of an OpenAI-compatible ``api_base``."""
    from urllib.parse import urlsplit, urlunsplit

    base = api_base.rstrip("/")
    parts = urlsplit(base)
    root = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    path = parts.path[: -len("/v1")] if parts.path.endswith("/v1") else parts.path
    return f"{root}{path}/props", f"{base}/models"


def window_from_props(body: Any) -> int | None:
    """llama.cpp's ``/props``: ``default_generation_settings.n_ctx`` (or a top-level
    ``n_ctx``)."""
    if not isinstance(body, Mapping):
        return None
    settings = body.get("default_generation_settings")
    if isinstance(settings, Mapping) and _positive(settings.get("n_ctx")):
        return _positive(settings.get("n_ctx"))
    return _positive(body.get("n_ctx"))


def window_from_models(body: Any, model: str) -> int | None:
    """vLLM's ``/v1/models``: ``max_model_len`` of the entry whose id is ``model`` (with or
    without its provider prefix), or of the only entry."""
    if not isinstance(body, Mapping) or not isinstance(body.get("data"), list):
        return None
    entries = [e for e in body["data"] if isinstance(e, Mapping)]
    names = {model, model.split("/", 1)[-1]}
    chosen = [e for e in entries if e.get("id") in names] or (entries if len(entries) == 1 else [])
    return _positive(chosen[0].get("max_model_len")) if chosen else None


def server_window(
    api_base: str, model: str, *, api_key: str | None = None, timeout: float = 2.0
) -> int | None:
    """The window the server at ``api_base`` reports for ``model`` (blocking; see
    :meth:`LiteLLMService.probe_server_window`)."""
    props, models = server_urls(api_base)
    window = window_from_props(_get_json(props, api_key, timeout))
    if window is None:
        window = window_from_models(_get_json(models, api_key, timeout), model)
    return window


def unknown_window_hint(model: str, assumed: int) -> str:
    """The one line for a model whose context window nobody knows: the exact setting to add."""
    return (
        f"model {model!r} has no known context window (litellm does not list it): assuming "
        f'{assumed:,} tokens; add `[host.models."{model}"] context_window = N` to the host '
        "config (--config FILE) to use its real one"
    )


def _positive(value: Any) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None
