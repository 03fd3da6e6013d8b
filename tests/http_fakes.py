"""Fake HTTP servers on 127.0.0.1 for the tests: :class:`LocalServer`, the one way a test serves HTTP
(a free port, a daemon thread, every request handed to one function), and on it a fake
OpenAI-compatible chat-completions server, shared by the judge's and the http caption backend's tests: scripted answers and errors, and the ways a server can misbehave that the
client must survive (a body trickled byte by byte, no answer at all, a huge body, a redirect).

A script entry is ``(status, text)`` or ``(status, text, delay_s)``: 200 answers a chat completion whose
message is ``text``, any other status sends ``text`` as the body. An entry may also be a callable
``(handler, server) -> None`` that writes the whole response itself (:func:`trickle`, :func:`silent`,
:func:`huge`, :func:`redirect`). Once the script is spent, every request gets ``otherwise``. Every
request is recorded (method, path, headers, JSON body or None).
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Iterator

import pytest

HOLD_S = 30.0  # how long a silent answer waits at most (the server's shutdown ends it sooner)
HUGE_CHUNK = 64 * 1024
PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def chat_json(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()


def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None,
          length: int | None = None) -> bool:
    """Status, headers and ``body``; False once the client has gone. ``length``: the announced size
    (None: ``len(body)``; -1: none announced, the body ends when the connection closes)."""
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        if length != -1:
            handler.send_header("Content-Length", str(len(body) if length is None else length))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)
        handler.wfile.flush()
        return True
    except OSError:  # the client gave up (its deadline, its cap)
        return False


class LocalServer:
    """A ``ThreadingHTTPServer`` on 127.0.0.1 at a free port: each request of ``methods`` goes to
    ``answer(handler)`` (``handler.command`` says which method), nothing is logged to stderr. Serving
    starts on ``start()`` or entering it as a context manager, and ends on ``close()`` or leaving it."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], None], methods: Iterable[str] = ("GET", "POST"),
                 protocol_version: str = BaseHTTPRequestHandler.protocol_version) -> None:
        def handle(handler: BaseHTTPRequestHandler) -> None:
            answer(handler)

        def quiet(handler: BaseHTTPRequestHandler, *args: Any) -> None:  # tests assert on requests, not stderr
            pass

        members: dict[str, Any] = {f"do_{method}": handle for method in methods}
        handler = type("Handler", (BaseHTTPRequestHandler,),
                       {**members, "log_message": quiet, "protocol_version": protocol_version})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def start(self) -> "LocalServer":
        self.thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


class FakeChatServer:
    """The endpoint: ``url`` is its base URL (``.../v1``), as a judge or caption config takes it. POSTs are
    answered, and GETs too (a redirected POST arrives as a GET)."""

    def __init__(self, script: list[Any], delay_s: float = 0.0, otherwise: Any = (500, "script exhausted")) -> None:
        self.script = list(script)
        self.delay_s = delay_s
        self.otherwise = otherwise
        self.requests: list[dict[str, Any]] = []
        self.sent_bytes = 0  # what the misbehaving answers managed to write
        self.closing = threading.Event()
        self.local = LocalServer(self.answer)
        self.port = self.local.port
        self.url = self.url_on("127.0.0.1")

    def url_on(self, host: str) -> str:
        """The base URL through another name of this machine (``localhost``: another origin)."""
        return f"http://{host}:{self.port}/v1"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length)) if length else None
        self.requests.append({"method": handler.command, "path": handler.path, "headers": dict(handler.headers),
                              "body": body})
        entry = self.script.pop(0) if self.script else self.otherwise
        if callable(entry):
            entry(handler, self)
            return
        status, text, *delay = entry
        time.sleep(delay[0] if delay else self.delay_s)
        _send(handler, status, chat_json(text) if status == 200 else text.encode())

    def __enter__(self) -> "FakeChatServer":
        self.local.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.closing.set()
        self.local.close()


Behaviour = Callable[[BaseHTTPRequestHandler, FakeChatServer], None]


def trickle(text: str, interval_s: float) -> Behaviour:
    """A 200 whose headers come at once and whose body comes one byte every ``interval_s``: each read
    gets a byte well within any socket timeout."""
    def behaviour(handler: BaseHTTPRequestHandler, server: FakeChatServer) -> None:
        body = chat_json(text)
        if not _send(handler, 200, b"", length=len(body)):
            return
        for byte in body:
            if server.closing.wait(interval_s):
                return
            if not _send_bytes(handler, server, bytes([byte])):
                return
    return behaviour


def silent(handler: BaseHTTPRequestHandler, server: FakeChatServer) -> None:
    """Reads the request and never answers (until the server shuts down)."""
    server.closing.wait(HOLD_S)


def huge(total_bytes: int, announce: bool, text: str) -> Behaviour:
    """A 200 of ``total_bytes``: JSON whitespace, then a valid answer ``text`` (so only the size is wrong).
    ``announce``: with its Content-Length; else the body ends when the connection closes."""
    def behaviour(handler: BaseHTTPRequestHandler, server: FakeChatServer) -> None:
        tail = chat_json(text)
        if not _send(handler, 200, b"", length=total_bytes if announce else -1):
            return
        left = total_bytes - len(tail)
        while left > 0:
            if not _send_bytes(handler, server, b" " * min(HUGE_CHUNK, left)):
                return
            left -= HUGE_CHUNK
        _send_bytes(handler, server, tail)
    return behaviour


def redirect(location: str, status: int = 302) -> Behaviour:
    def behaviour(handler: BaseHTTPRequestHandler, server: FakeChatServer) -> None:
        _send(handler, status, b"", headers={"Location": location})
    return behaviour


def _send_bytes(handler: BaseHTTPRequestHandler, server: FakeChatServer, data: bytes) -> bool:
    try:
        handler.wfile.write(data)
        handler.wfile.flush()
    except OSError:
        return False
    server.sent_bytes += len(data)
    return True


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """urllib honours proxy variables; the local fake must be reached directly (import it into a test
    module to apply it there)."""
    for var in PROXY_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    yield
