"""A small scripted OpenAI-compatible chat-completions server for tests.

Start it in a background thread on ``127.0.0.1`` (a free port), point any OpenAI-compatible client
at :attr:`FakeOpenAIServer.base_url`, script the replies, then inspect the request bodies::

    with FakeOpenAIServer() as server:
        server.enqueue("hello", Reply.tool_calls([...]), Reply.error(500), Reply.hang(5))
        ...  # client calls
        assert server.requests[0]["model"] == "fake-model"

Served paths: ``POST /v1/chat/completions`` and ``POST /chat/completions``. Each request takes the
next scripted reply from the queue (or the default reply when the queue is empty). A reply is a
:class:`Reply`, a plain ``str`` (a text reply), a ``dict`` (sent verbatim as the JSON body) or a
callable receiving the parsed request body and returning any of those. A request with
``"stream": true`` gets a server-sent-event stream (``data: {chunk}`` lines, then
``data: [DONE]``) built from the same reply.

``stop()`` (or leaving the ``with`` block) wakes every hanging reply, shuts the server down, closes
its socket and joins every thread it started.

The server counts the requests it is serving: :attr:`FakeOpenAIServer.in_flight` now,
:attr:`FakeOpenAIServer.peak_in_flight` at most, and :attr:`FakeOpenAIServer.spans` (when each
one arrived and was done with). A request the client gave up on still counts until its reply is
over (a ``hang`` or a ``slow`` reply goes on, as a real server that does not notice does).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAIServer", "Reply"]

_PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass
class Reply:
    """One scripted reply. Build it with the class methods."""

    kind: str = "text"  # text | error | hang | garbage | raw | slow
    content: str | None = ""
    finish_reason: str = "stop"
    calls: list[dict[str, Any]] | None = None  # tool calls (the constructor is ``tool_calls``)
    usage: dict[str, int] | None = None
    status: int = 200
    body: Any = None
    seconds: float | None = None
    chunks: list[str] | None = None
    model: str | None = None

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def text(
        cls,
        content: str | None,
        *,
        finish_reason: str = "stop",
        usage: dict[str, int] | None = None,
        chunks: list[str] | None = None,
        model: str | None = None,
    ) -> Reply:
        """A normal assistant message. ``chunks`` fixes how a stream splits the content."""
        return cls(
            kind="text",
            content=content,
            finish_reason=finish_reason,
            usage=usage,
            chunks=chunks,
            model=model,
        )

    @classmethod
    def length(cls, content: str, **kw: Any) -> Reply:
        """A reply cut off by the token limit (``finish_reason="length"``)."""
        return cls.text(content, finish_reason="length", **kw)

    @classmethod
    def empty(cls, **kw: Any) -> Reply:
        """An assistant message whose content is the empty string."""
        return cls.text("", **kw)

    @classmethod
    def tool_calls(
        cls,
        calls: list[dict[str, Any]],
        *,
        content: str | None = None,
        usage: dict[str, int] | None = None,
    ) -> Reply:
        """An assistant message calling tools. ``calls`` items may be full OpenAI tool calls or
        the short form ``{"name": ..., "arguments": dict | str, "id": optional}``."""
        full: list[dict[str, Any]] = []
        for i, call in enumerate(calls):
            if "function" in call:
                full.append({"id": f"call_{i}", "type": "function", **call})
                continue
            args = call.get("arguments", {})
            full.append(
                {
                    "id": call.get("id", f"call_{i}"),
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        return cls(
            kind="text", content=content, finish_reason="tool_calls", calls=full, usage=usage
        )

    @classmethod
    def error(
        cls,
        status: int = 500,
        message: str = "internal error",
        *,
        type: str = "server_error",  # noqa: A002 - OpenAI's field name
        code: str | None = None,
    ) -> Reply:
        """An HTTP error status with an OpenAI-style error body."""
        return cls(
            kind="error",
            status=status,
            body={"error": {"message": message, "type": type, "param": None, "code": code}},
        )

    @classmethod
    def hang(cls, seconds: float | None = None) -> Reply:
        """Send nothing for ``seconds`` (``None``: until the server stops), then close."""
        return cls(kind="hang", seconds=seconds)

    @classmethod
    def slow(cls, reply: Any, seconds: float) -> Reply:
        """``reply`` (a :class:`Reply` or a text), sent after ``seconds`` of work (cut short only
        when the server stops): the server goes on with it even if the client gave up."""
        inner = reply if isinstance(reply, Reply) else cls.text(reply)
        return cls(kind="slow", body=inner, seconds=seconds)

    @classmethod
    def garbage(
        cls, body: bytes | str = b"<html>this is not json</html>", status: int = 200
    ) -> Reply:
        """A body that is not JSON (in a stream: a ``data:`` line that is not JSON)."""
        return cls(kind="garbage", body=body, status=status)

    @classmethod
    def raw(cls, body: dict[str, Any], status: int = 200) -> Reply:
        """Send ``body`` verbatim as JSON."""
        return cls(kind="raw", body=body, status=status)


@dataclass
class _Recorded:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class _State:
    queue: deque[Any] = field(default_factory=deque)
    requests: list[Any] = field(default_factory=list)
    recorded: list[_Recorded] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    default: Any = "ok"
    model: str = "fake-model"
    counter: int = 0
    #: Counts a request's prompt tokens for replies without scripted usage (the provider's
    #: tokenizer); ``None``: about four characters a token.
    count_prompt: Any = None
    #: What ``GET /props`` (llama.cpp) and ``GET /v1/models`` (vLLM) report as the window.
    n_ctx: int | None = None
    max_model_len: int | None = None
    #: Requests being served now, the most served at once, and (arrival, done) of each one
    #: (``done`` is ``None`` while it is served), on ``time.monotonic``.
    in_flight: int = 0
    peak_in_flight: int = 0
    spans: list[list[float | None]] = field(default_factory=list)


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


def _prompt_tokens(body: Any) -> int:
    try:
        return sum(_estimate_tokens(json.dumps(m.get("content"))) for m in body.get("messages", []))
    except Exception:
        return 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeOpenAI/1.0"
    timeout = 30  # a stuck client connection cannot keep a handler thread forever

    # quiet: tests read server.requests instead of the access log
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    @property
    def state(self) -> _State:
        return self.server.state  # type: ignore[attr-defined]

    # -- plumbing -----------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.close_connection = True

    def _send_json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.rstrip("/")
        if path in ("/v1/models", "/models"):
            entry: dict[str, Any] = {"id": self.state.model}
            if self.state.max_model_len is not None:
                entry["max_model_len"] = self.state.max_model_len
            self._send_json(200, {"object": "list", "data": [entry]})
        elif path == "/props" and self.state.n_ctx is not None:
            self._send_json(200, {"default_generation_settings": {"n_ctx": self.state.n_ctx}})
        else:
            self._send_json(404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in _PATHS:
            self._send_json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
            return
        try:
            body: Any = json.loads(raw or b"{}")
        except ValueError:
            body = raw.decode("utf-8", "replace")
        state = self.state
        span: list[float | None] = [time.monotonic(), None]
        with state.lock:
            state.requests.append(body)
            state.recorded.append(
                _Recorded(path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            reply = state.queue.popleft() if state.queue else state.default
            state.counter += 1
            n = state.counter
            state.in_flight += 1
            state.peak_in_flight = max(state.peak_in_flight, state.in_flight)
            state.spans.append(span)
        try:
            if callable(reply) and not isinstance(reply, Reply):
                reply = reply(body)
            self._reply(reply, body, n)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            pass  # the client gave up (timeout): nothing to do
        except Exception as exc:  # a broken script: tell the test instead of dropping the socket
            with state.lock:
                state.errors.append(exc)
            self._send_json(
                599, {"error": {"message": f"fake server script error: {exc!r}", "type": "fake"}}
            )
        finally:
            with state.lock:
                state.in_flight -= 1
                span[1] = time.monotonic()

    # -- replies ------------------------------------------------------------------------------
    def _reply(self, reply: Any, body: Any, n: int) -> None:
        if isinstance(reply, str):
            reply = Reply.text(reply)
        elif isinstance(reply, dict):
            reply = Reply.raw(reply)
        if not isinstance(reply, Reply):
            raise TypeError(f"unsupported scripted reply: {reply!r}")
        stream = isinstance(body, dict) and bool(body.get("stream"))
        if reply.kind == "slow":
            self.state.stopping.wait(reply.seconds)
            reply = reply.body
        if reply.kind == "hang":
            self.state.stopping.wait(reply.seconds)
            self.close_connection = True
            return
        if reply.kind == "error":
            self._send_json(reply.status, reply.body)
            return
        if reply.kind == "raw":
            self._send_json(reply.status, reply.body)
            return
        if reply.kind == "garbage":
            data = reply.body if isinstance(reply.body, bytes) else str(reply.body).encode()
            if stream:
                self._send(reply.status, b"data: " + data + b"\n\n", "text/event-stream")
            else:
                self._send(reply.status, data, "text/html")
            return
        model = reply.model or (body.get("model") if isinstance(body, dict) else None)
        model = model or self.state.model
        count = self.state.count_prompt or _prompt_tokens
        usage = reply.usage or {
            "prompt_tokens": count(body),
            "completion_tokens": _estimate_tokens(reply.content or ""),
        }
        usage = {**usage}
        usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
        if stream:
            self._stream(reply, body, model, usage, n)
            return
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.calls:
            message["tool_calls"] = reply.calls
        self._send_json(
            200,
            {
                "id": f"chatcmpl-fake-{n}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": reply.finish_reason,
                        "logprobs": None,
                    }
                ],
                "usage": usage,
            },
        )

    def _stream(self, reply: Reply, body: dict[str, Any], model: str, usage: dict, n: int) -> None:
        base = {
            "id": f"chatcmpl-fake-{n}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
            }

        events: list[dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
        content = reply.content or ""
        pieces = reply.chunks if reply.chunks is not None else _split(content)
        events += [chunk({"content": p}) for p in pieces]
        for i, call in enumerate(reply.calls or []):
            fn = call["function"]
            args = fn.get("arguments", "")
            half = len(args) // 2
            head = {"index": i, "id": call["id"], "type": "function"}
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {**head, "function": {"name": fn["name"], "arguments": args[:half]}}
                        ]
                    }
                )
            )
            events.append(
                chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]})
            )
        events.append(chunk({}, reply.finish_reason))
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            events.append({**base, "choices": [], "usage": usage})

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _split(text: str) -> list[str]:
    """Split into word-ish pieces (keeping the spaces) so a stream has several deltas."""
    if not text:
        return []
    pieces: list[str] = []
    current = ""
    for ch in text:
        current += ch
        if ch == " " or len(current) >= 8:
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # handler threads are joined by server_close()
    block_on_close = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:  # quiet disconnects
        pass


class FakeOpenAIServer:
    """A scripted OpenAI-compatible server on ``127.0.0.1`` running in a background thread."""

    def __init__(
        self,
        default_reply: Any = "ok",
        *,
        model: str = "fake-model",
        count_prompt: Any = None,
        n_ctx: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        """``count_prompt(body) -> int`` is the provider's tokenizer (the ``prompt_tokens`` of
        unscripted usage); ``n_ctx`` / ``max_model_len`` are reported by ``GET /props`` (as
        llama.cpp does) and ``GET /v1/models`` (as vLLM does)."""
        self._state = _State(
            default=default_reply,
            model=model,
            count_prompt=count_prompt,
            n_ctx=n_ctx,
            max_model_len=max_model_len,
        )
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> FakeOpenAIServer:
        if self._server is not None:
            return self
        self._state.stopping.clear()
        server = _Server(("127.0.0.1", 0), _Handler)
        server.state = self._state  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai"
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        self._state.stopping.set()  # wake hanging replies
        server.shutdown()
        server.server_close()  # joins the handler threads
        if thread is not None:
            thread.join()
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses ----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    # -- scripting ----------------------------------------------------------------------------
    def enqueue(self, *replies: Any) -> None:
        """Queue replies, served in order (one per request)."""
        with self._state.lock:
            self._state.queue.extend(replies)

    @property
    def default_reply(self) -> Any:
        return self._state.default

    @default_reply.setter
    def default_reply(self, reply: Any) -> None:
        self._state.default = reply

    @property
    def pending(self) -> int:
        """Replies still queued."""
        with self._state.lock:
            return len(self._state.queue)

    def reset(self) -> None:
        """Drop queued replies and recorded requests."""
        with self._state.lock:
            self._state.queue.clear()
            self._state.requests.clear()
            self._state.recorded.clear()

    # -- inspection ---------------------------------------------------------------------------
    @property
    def requests(self) -> list[Any]:
        """Every request body received (parsed JSON; the raw text when it was not JSON)."""
        with self._state.lock:
            return list(self._state.requests)

    @property
    def last_request(self) -> Any:
        with self._state.lock:
            if not self._state.requests:
                raise AssertionError("the fake server received no request")
            return self._state.requests[-1]

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised by scripted replies (a callable that failed, a bad reply object)."""
        with self._state.lock:
            return list(self._state.errors)

    def request_headers(self, index: int = -1) -> dict[str, str]:
        """Headers of a request (the last by default), names lower-cased."""
        with self._state.lock:
            return dict(self._state.recorded[index].headers)

    def request_paths(self) -> list[str]:
        with self._state.lock:
            return [r.path for r in self._state.recorded]

    @property
    def in_flight(self) -> int:
        """Requests being served now (one the client gave up on counts until its reply ends)."""
        with self._state.lock:
            return self._state.in_flight

    @property
    def peak_in_flight(self) -> int:
        """The most requests served at once so far."""
        with self._state.lock:
            return self._state.peak_in_flight

    @property
    def spans(self) -> list[tuple[float, float | None]]:
        """``(arrived, done)`` of each request, in arrival order (``time.monotonic``; ``done``
        is ``None`` while it is served)."""
        with self._state.lock:
            return [(float(a or 0.0), b) for a, b in self._state.spans]
