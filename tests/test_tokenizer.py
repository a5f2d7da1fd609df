"""host_stub.tokenizer counts what litellm's ``token_counter`` counts (Hugging Face tokenizers off,
as the host runs litellm) and reads the windows of litellm's bundled catalog, without importing
litellm and without the network."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Any

import pytest

from host_stub import tokenizer
from host_stub.llm import ensure_litellm

#: One name per case of litellm's choice: OpenAI models on o200k_base and on cl100k_base, with and
#: without a provider prefix, newer releases than tiktoken lists, Azure deployment names, other
#: providers and local servers (cl100k_base), and no model at all.
MODELS = [
    "",
    "gpt-4o-mini",
    "openai/gpt-4o-mini",
    "gpt-4",
    "gpt-3.5-turbo",
    "gpt-4.1",
    "gpt-5",
    "openai/gpt-5.9",
    "o1-mini",
    "o3",
    "ft:gpt-4o-mini-2024-07-18:org::abc",
    "azure/gpt-41",
    "azure/my-gpt-4o",
    "codex-mini-latest",
    "text-davinci-003",
    "text-embedding-ada-002",
    "ollama/llama3.2",
    "openai/my-local-model",
    "hosted_vllm/qwen",
    "claude-3-5-sonnet-20240620",
    "anthropic/claude-sonnet-4-5",
    "deepseek/deepseek-chat",
    "gemini/gemini-2.0-flash",
    "mistral/mistral-large-latest",
    "meta-llama/llama-3-8b",
    "cohere/command-r",
]

TEXTS = ["", "hello", "Hello 世界, 我对花生严重过敏。", "def f(x):\n    return x ** 2  # ok\n" * 5]

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Book RES-4711 for two, 19:00.", "name": "lena"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "book", "arguments": '{"ref": "RES-4711", "n": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true, "table": 12}'},
    {"role": "assistant", "content": [{"type": "text", "text": "Booked: table 12."}]},
]


@pytest.fixture(scope="module")
def litellm() -> Any:
    return ensure_litellm()


@pytest.mark.parametrize("model", MODELS)
def test_counts_equal_litellms(litellm: Any, model: str) -> None:
    for text in TEXTS:
        expected = litellm.token_counter(model=model, text=text) if text else 0
        assert tokenizer.count_text(model, text) == expected, (model, text)
    assert tokenizer.count_messages(model, MESSAGES) == litellm.token_counter(
        model=model, messages=MESSAGES
    )
    assert tokenizer.count_messages(model, MESSAGES[:1]) == litellm.token_counter(
        model=model, messages=MESSAGES[:1]
    )


def test_encoding_choice_matches_litellm_across_its_catalog(litellm: Any) -> None:
    """Every chat model in litellm's catalog, as written and with its provider prefix: the same
    encoding as litellm's for all but a few aliases litellm resolves through tables outside the
    bundled file (``gpt-*-latest`` names)."""
    probe = "Hello 世界 tokens"  # 6 tokens in cl100k_base, 3 in o200k_base
    names: set[str] = set()
    for key, value in litellm.model_cost.items():
        if not isinstance(value, dict) or value.get("mode") not in ("chat", "responses"):
            continue
        names.add(key)
        provider = value.get("litellm_provider")
        if provider and not key.startswith(f"{provider}/"):
            names.add(f"{provider}/{key}")
    differ = []
    for name in sorted(names):
        theirs = (
            "o200k_base" if litellm.token_counter(model=name, text=probe) == 3 else "cl100k_base"
        )
        if tokenizer.encoding_name_for(name) != theirs:
            differ.append(name)
    assert len(names) > 1000
    assert len(differ) <= len(names) // 100, differ[:20]


@pytest.mark.parametrize(
    ("model", "window", "max_out"),
    [
        ("gpt-4o-mini", 128000, 16384),
        ("openai/gpt-4o-mini", 128000, 16384),
        ("anthropic/claude-sonnet-4-5", 200000, 64000),
        ("claude-sonnet-4-5", 200000, 64000),
        ("openai/my-local-model", None, None),
    ],
)
def test_catalog_limits(litellm: Any, model: str, window: int | None, max_out: int | None) -> None:
    assert tokenizer.catalog_limits(model) == (window, max_out)
    if window is not None:  # what litellm's own catalog-only look-up says
        from litellm.utils import get_model_info_helper

        info = get_model_info_helper(model, catalog_only=True)
        assert (info["max_input_tokens"], info["max_output_tokens"]) == (window, max_out)


def test_content_it_cannot_count_goes_to_litellm() -> None:
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}
    assert tokenizer.count_messages("gpt-4o-mini", [image]) is None


def test_counting_imports_no_litellm_and_opens_no_socket() -> None:
    code = (
        "import socket, sys\n"
        "def refuse(*a, **k):\n"
        "    raise OSError('network used')\n"
        "socket.socket.connect = refuse\n"
        "from host_stub import tokenizer\n"
        "for model in ('gpt-4o-mini', 'openai/my-local-model', 'ollama/llama3.2', 'gpt-5'):\n"
        "    assert tokenizer.count_text(model, 'hello world') > 0\n"
        "    assert tokenizer.count_messages(model, [{'role': 'user', 'content': 'hi'}]) > 0\n"
        "    tokenizer.catalog_limits(model)\n"
        "assert 'litellm' not in sys.modules\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_missing_encoding_falls_back_to_the_bundled_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """An encoding the bundled directory lacks is never downloaded: cl100k_base counts instead."""
    monkeypatch.setattr(socket.socket, "connect", lambda *a: (_ for _ in ()).throw(OSError("net")))
    tokenizer.get_encoding.cache_clear()
    try:
        assert tokenizer.get_encoding("r50k_base").name == "cl100k_base"
    finally:
        tokenizer.get_encoding.cache_clear()


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_the_cached_tables_are_the_bundled_ones(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """An encoding read back from the cache file has the bundled file's tables, rank for rank."""
    from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS

    monkeypatch.setenv("HOST_STUB_CACHE_DIR", str(tmp_path))
    bundled = ENCODING_CONSTRUCTORS[name]()
    tokenizer.get_encoding.cache_clear()
    try:
        tokenizer.get_encoding(name)  # parses the bundled file, writes the cache
        (cached,) = tmp_path.glob(f"tiktoken-{name}-*.marshal")
        spec = tokenizer.read_spec(cached)
        assert spec is not None
        assert spec["mergeable_ranks"] == bundled["mergeable_ranks"]
        assert spec["special_tokens"] == bundled["special_tokens"]
        assert spec["pat_str"] == bundled["pat_str"]
        tokenizer.get_encoding.cache_clear()
        assert tokenizer.get_encoding(name)._mergeable_ranks == bundled["mergeable_ranks"]
    finally:
        tokenizer.get_encoding.cache_clear()


def test_a_damaged_cache_file_is_parsed_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A cache file cut short, holding too few ranks or other keys is not used: the bundled file
    is parsed again and the cache rewritten."""
    import marshal

    monkeypatch.setenv("HOST_STUB_CACHE_DIR", str(tmp_path))
    text = "Hello 世界, 我对花生严重过敏。"
    tokenizer.get_encoding.cache_clear()
    try:
        expected = len(tokenizer.get_encoding("cl100k_base").encode(text))
        (cached,) = tmp_path.glob("tiktoken-cl100k_base-*.marshal")
        good = cached.read_bytes()
        spec = marshal.loads(good)
        few = dict(spec, mergeable_ranks={b"a": 0, b"b": 1})
        other = {"ranks": spec["mergeable_ranks"], "pat_str": spec["pat_str"]}
        for damaged in (good[: len(good) // 2], marshal.dumps(few), marshal.dumps(other)):
            cached.write_bytes(damaged)
            assert tokenizer.read_spec(cached) is None
            tokenizer.get_encoding.cache_clear()
            assert len(tokenizer.get_encoding("cl100k_base").encode(text)) == expected
            assert tokenizer.read_spec(cached) is not None  # rewritten
    finally:
        tokenizer.get_encoding.cache_clear()


def test_the_cached_catalog_gives_the_windows_and_encodings_of_the_bundled_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The catalog read back from the cache answers every model as the bundled file does: the
    window, the output limit and the encoding choice; a damaged cache file is parsed again."""
    import json

    monkeypatch.setenv("HOST_STUB_CACHE_DIR", str(tmp_path))
    root = tokenizer.litellm_dir()
    assert root is not None
    full = json.loads((root / "model_prices_and_context_window_backup.json").read_text("utf-8"))
    names = [n for n, e in full.items() if n != "sample_spec" and isinstance(e, dict)]
    assert len(names) > 1000

    def answers() -> list[Any]:
        tokenizer.encoding_name_for.cache_clear()
        return [(tokenizer.catalog_limits(n), tokenizer.encoding_name_for(n)) for n in names]

    monkeypatch.setattr(tokenizer, "_catalog", full)  # the whole file, as parsed
    expected = answers()
    monkeypatch.setattr(tokenizer, "_catalog", None)
    written = answers()  # parses the file, writes the cache
    (cached,) = tmp_path.glob("catalog-*.marshal")
    monkeypatch.setattr(tokenizer, "_catalog", None)
    read_back = answers()  # from the cache
    assert written == expected and read_back == expected
    cached.write_bytes(cached.read_bytes()[:1000])
    monkeypatch.setattr(tokenizer, "_catalog", None)
    assert answers() == expected
    assert tokenizer.read_catalog(cached) is not None  # rewritten
    tokenizer.encoding_name_for.cache_clear()
