"""An OpenAI-compatible chat-completions client and the retry loop every model-answer reader shares.

Used by the pipeline's ``http`` caption backend and by evaluation's MLLM judge. Only the standard
library talks to the server (``urllib.request``), so no dependency is added. HTTP errors (429, 5xx,
...), timeouts, unreachable hosts and malformed responses raise :class:`GenerationError`, which the
loop counts as a failed attempt and re-sends after a back-off; an answer the caller cannot parse is
re-asked with the parse error appended, so the model can correct itself; after the last attempt the
outcome is a failure with the last error, never a guessed value. A refused key (401, 403) and a spent
run budget are failures at once: asking again cannot help.

Limits: ``timeout_s`` bounds each socket operation, ``deadline_s`` the whole request (connection,
headers and body: a server that trickles bytes is cut), ``budget_s`` the time a client spends on all
its requests, and :data:`MAX_RESPONSE_BYTES` the size of an answer, read in chunks. Credentials: API keys
come from the environment (:func:`api_key_env_problems` refuses a key pasted where a variable's name
belongs), ``Authorization`` is never sent to another origin on a redirect, and every message the
client produces (errors echoing the server's body, URLs with a password or a query key) goes through
:func:`redact` before anything logs or records it.
"""
from __future__ import annotations

import base64
import functools
import http.client
import io
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterable, Mapping, Optional, Sequence, TypeVar, Union
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

if TYPE_CHECKING:
    from PIL import Image

logger = logging.getLogger(__name__)

CHAT_COMPLETIONS_PATH = "/chat/completions"
MODELS_PATH = "/models"  # GET: the models an endpoint serves (no tokens spent)
RETRY_BACKOFF_S = 1.0  # a busy server (429/503) usually recovers within seconds
ERROR_DETAIL_CHARS = 300
ANSWER_SNIPPET_CHARS = 200  # how much of a bad answer is kept in the error message
# A chat answer (a few hundred tokens of JSON) takes kilobytes: a body anywhere near this is not one.
MAX_RESPONSE_BYTES = 8 * 2**20
READ_CHUNK_BYTES = 64 * 2**10
# The server refused the credentials: the same key sent again is refused again.
REFUSED_STATUSES = (401, 403)
REDACTED = "***"
# Shorter values are not searched for in free text (they would mask the digits of a status code); in a
# URL, the password and every query value are masked whatever their length.
MIN_SECRET_CHARS = 6
# An environment variable's name: what an ``api_key_env`` setting holds (the key stays in the environment).
ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# A URL in free text: scheme, userinfo (up to the last "@" before the path), host and path, query.
_URL_IN_TEXT = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#'\"<>]*@)?"
                          r"(?P<rest>[^\s?#'\"<>]*)(?P<query>\?[^\s#'\"<>]*)?")
_SENTENCE_MARKS = ".,;:!)]}"  # after a URL in a message, these end the sentence, not the URL

# One element of a chat message's content, in order: ("text", str) or ("image", PIL image).
TEXT = "text"
IMAGE = "image"
ContentPart = tuple[str, Union[str, "Image.Image"]]

T = TypeVar("T")


class GenerationError(RuntimeError):
    """No answer was produced (HTTP error, timeout, unreachable server): counts as one failed attempt.
    ``retryable=False`` (refused credentials, a spent budget): the retry loop stops at once. ``status``:
    the HTTP status of an error answer; ``unreachable``: no connection was made (refused, unknown host,
    no route, a connection timeout)."""

    def __init__(self, message: str, retryable: bool = True, status: Optional[int] = None,
                 unreachable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.unreachable = unreachable


# --------------------------------------------------------------------------- secrets
def _redact_url(match: "re.Match[str]") -> str:
    query = match["query"] or ""
    kept = query[len(query.rstrip(_SENTENCE_MARKS)):]  # "...?key=abc: not found": the colon is the sentence's
    query = query[: len(query) - len(kept)]
    if len(query) > 1:
        query = "?" + "&".join(f"{part.split('=', 1)[0]}={REDACTED}" if "=" in part else REDACTED
                               for part in query[1:].split("&"))
    return f"{match['scheme']}{REDACTED + '@' if match['userinfo'] else ''}{match['rest']}{query}{kept}"


def _redacted(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return _URL_IN_TEXT.sub(_redact_url, value)
    if isinstance(value, Mapping):
        return {key: _redacted(item, secrets) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(item, secrets) for item in value]
    return value


def redact(value: Any, secrets: Iterable[Optional[str]] = ()) -> Any:
    """``value`` fit to log or record: each of ``secrets`` (an API key, a password; those shorter than
    :data:`MIN_SECRET_CHARS` are left), and the user, password and query values of every URL in it,
    replaced by :data:`REDACTED`. A string is redacted, a mapping or list item by item (a resolved
    config), anything else is returned as it is."""
    known = sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)
    return _redacted(value, known)


def url_secrets(url: str) -> list[str]:
    """The secrets a URL carries: its password and its query values, as written and decoded."""
    parts = urlsplit(url)
    values = [parts.password or ""] + [value for _, value in parse_qsl(parts.query, keep_blank_values=True)]
    values += [part.split("=", 1)[1] for part in parts.query.split("&") if "=" in part]
    return [v for value in values for v in (value, unquote(value)) if v]


def api_key_env_problems(key: str, env_var: str) -> list[str]:
    """``key`` (a config key such as ``evaluation.judge.api_key_env``) must name an environment variable
    or be empty: a key pasted there would be written wherever the config is recorded. The message does
    not repeat the value."""
    if env_var and not ENV_VAR_NAME.fullmatch(env_var):
        return [f"{key} must name an environment variable (letters, digits, _), not hold a key: export the key "
                "in that variable instead"]
    return []


def client_setting_problems(prefix: str, node: Any) -> list[str]:
    """The settings every config of an :class:`OpenAIChatClient` has (``api_key_env``, ``timeout_s``,
    ``deadline_s``, ``budget_s``), checked alike for the judge and the caption backend."""
    problems = api_key_env_problems(f"{prefix}.api_key_env", node.api_key_env)
    problems += [f"{prefix}.{name}={getattr(node, name)} must be > 0" for name in ("timeout_s", "deadline_s")
                 if not getattr(node, name) > 0]
    if not node.budget_s >= 0:
        problems.append(f"{prefix}.budget_s={node.budget_s} must be >= 0 (0: no limit)")
    return problems


def api_key_from_env(env_var: str, user: str = "http") -> Optional[str]:
    """The key from ``env_var``; a missing key is fine for local servers, so it only logs (the name of
    the variable, never its value)."""
    if not env_var:
        return None
    key = os.environ.get(env_var)
    if not key:
        _note_no_key(user, env_var)
    return key or None


@functools.lru_cache(maxsize=None)
def _note_no_key(user: str, env_var: str) -> None:
    # Once per process: the pre-flight's probe and the client it checks both read the key.
    logger.info("%s: environment variable %s is not set; sending no Authorization header", user, env_var)


# --------------------------------------------------------------------------- the request
def image_data_url(image: "Image.Image") -> str:
    """A PNG ``data:`` URL: lossless, and accepted by every OpenAI-compatible server."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def chat_body(parts: Sequence[ContentPart], model_name: str, max_tokens: int, temperature: float = 0.0) -> dict:
    """The JSON body: one user message of text and ``image_url`` parts."""
    content: list[dict[str, Any]] = []
    for kind, value in parts:
        if kind == IMAGE:
            content.append({"type": "image_url", "image_url": {"url": image_data_url(value)}})
        elif kind == TEXT:
            content.append({"type": "text", "text": value})
        else:
            raise ValueError(f"unknown content part kind {kind!r}; use {TEXT!r} or {IMAGE!r}")
    return {"model": model_name, "messages": [{"role": "user", "content": content}], "temperature": temperature,
            "max_tokens": max_tokens}


def answer_text(raw: bytes, redact_text: Callable[[str], str] = str) -> str:
    """The assistant text of a chat-completions response; anything else is a failed attempt, its message
    quoting the response through ``redact_text`` before it is cut (a secret is never cut in half)."""
    try:
        message = json.loads(raw)["choices"][0]["message"]
        content = message["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        quoted = redact_text(raw.decode("utf-8", "replace"))[:ERROR_DETAIL_CHARS]
        raise GenerationError(f"malformed chat-completions response: {quoted!r}") from exc
    if isinstance(content, list):  # some servers return content parts even for plain text
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        quoted = redact_text(repr(message))
        raise GenerationError(f"response message has no text content: {quoted}"[:ERROR_DETAIL_CHARS])
    return content


class _Watchdog:
    """Ends a request at its deadline. A socket timeout bounds each read only, so a server sending a
    byte now and then would hold a request for ever: at the deadline every socket the request opened is
    shut down, which wakes the read blocked on it."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.fired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._fire) if seconds is not None else None
        if self._timer is not None:
            self._timer.daemon = True

    def __enter__(self) -> "_Watchdog":
        if self._timer is not None:
            self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.fired:  # connected after the deadline
                _shut(sock)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        # The plain socket's shutdown: an SSL socket's own would also unwrap it under the blocked reader.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


class _Watched:
    """A connection that hands its socket to the request's :class:`_Watchdog` once connected."""

    def __init__(self, *args: Any, watchdog: _Watchdog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watchdog = watchdog

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self._watchdog.watch(self.sock)  # type: ignore[attr-defined]


class _WatchedHTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class _WatchedHTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_WatchedHTTPConnection, req, watchdog=self._watchdog)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._watchdog = watchdog

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_WatchedHTTPSConnection, req, context=self._context, watchdog=self._watchdog)


def _origin(url: str) -> Optional[tuple[str, str, Optional[int]]]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a port: no origin to compare
        return None
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme)


class _SameOriginCredentials(urllib.request.HTTPRedirectHandler):
    """urllib copies every header onto a redirect's request: ``Authorization`` is kept only when the
    redirect stays on the same scheme, host and port, so a key never reaches a host it was not meant for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        origin = _origin(req.full_url)
        if new is not None and (origin is None or _origin(new.full_url) != origin):
            new.remove_header("Authorization")
        return new


class OpenAIChatClient:
    """``POST {url}/chat/completions``; one call, no retries (:meth:`models`: ``GET {url}/models``). The
    key, when one is given, is sent as a bearer token; without one, a user and password in ``url`` are
    sent as basic credentials (never in the URL requested or shown).

    Limits (None: no limit): ``timeout_s`` per socket operation, ``deadline_s`` per request (body
    included), ``budget_s`` over every request of this client (a run), ``max_response_bytes`` per answer
    (default :data:`MAX_RESPONSE_BYTES`). ``settings`` (e.g. ``evaluation.judge``) names the config
    node in messages. Every message is redacted (:func:`redact`) with the key and the URL's secrets."""

    def __init__(self, url: str, model_name: str, timeout_s: float, api_key: Optional[str] = None, *,
                 deadline_s: Optional[float] = None, budget_s: Optional[float] = None,
                 max_response_bytes: Optional[int] = None, settings: str = "") -> None:
        parts = urlsplit(url)
        self._parts = parts
        self._url = self._address(CHAT_COMPLETIONS_PATH)
        self._headers = {"Content-Type": "application/json"}
        secrets = [api_key or "", *url_secrets(url)]
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        elif parts.username or parts.password:
            user_pass = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
            basic = base64.b64encode(user_pass.encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {basic}"
            secrets.append(basic)
        self._secrets = tuple(secrets)
        self.endpoint = self.redact(self._url)  # what messages show
        self.model_name = model_name
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.budget_s = budget_s
        self.max_response_bytes = max_response_bytes or MAX_RESPONSE_BYTES
        self.settings = settings
        self.spent_s = 0.0  # seconds spent on requests so far (what budget_s bounds)

    def _address(self, path: str) -> str:
        """``path`` under the endpoint's base URL, with its query and without its user and password."""
        parts = self._parts
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path.rstrip("/") + path,
                           parts.query, ""))

    def redact(self, text: str) -> str:
        """``text`` without this client's key and URL secrets (:func:`redact`)."""
        return redact(text, self._secrets)

    @property
    def budget_exhausted(self) -> bool:
        return self.budget_s is not None and self.spent_s >= self.budget_s

    def _setting(self, name: str) -> str:
        return f"{self.settings}.{name}" if self.settings else name

    def _error(self, message: str, retryable: bool = True, **details: Any) -> GenerationError:
        return GenerationError(self.redact(message), retryable, **details)

    def complete(self, parts: Sequence[ContentPart], max_tokens: int, temperature: float = 0.0) -> str:
        """The assistant's text for one user message made of ``parts``."""
        if self.budget_exhausted:
            raise self._error(f"the run's request budget of {self.budget_s:g} s ({self._setting('budget_s')}) is "
                              "spent: no request sent", retryable=False)
        body = json.dumps(chat_body(parts, self.model_name, max_tokens, temperature)).encode()
        limit, by_budget = self.deadline_s, False
        if self.budget_s is not None and (limit is None or self.budget_s - self.spent_s < limit):
            limit, by_budget = self.budget_s - self.spent_s, True
        started = time.monotonic()
        try:
            raw = self._send(urllib.request.Request(self._url, data=body, headers=self._headers, method="POST"),
                             self.endpoint, limit, by_budget)
        finally:
            self.spent_s += time.monotonic() - started
        return answer_text(raw, self.redact)

    def models(self) -> list[str]:
        """``GET {url}/models``: the ids of the models the endpoint serves. A cheap request (no tokens
        spent, outside the run's budget) that tells an unreachable endpoint, a refused key or a wrong
        path (:class:`GenerationError` with ``unreachable`` or ``status``) before any work; an answer
        that is not a model list gives ``[]``."""
        address = self._address(MODELS_PATH)
        request = urllib.request.Request(address, headers=self._headers, method="GET")
        raw = self._send(request, self.redact(address), self.deadline_s, by_budget=False)
        try:
            listed = json.loads(raw)["data"]
            return [str(model["id"]) for model in listed if isinstance(model, dict) and "id" in model]
        except (ValueError, KeyError, TypeError):
            return []

    def _send(self, request: urllib.request.Request, shown: str, limit: Optional[float], by_budget: bool) -> bytes:
        """The body of the answer to ``request`` (``shown``: its URL as messages show it)."""
        timeout = self.timeout_s if limit is None else min(self.timeout_s, limit)
        watchdog = _Watchdog(limit)
        opener = urllib.request.build_opener(_WatchedHTTPHandler(watchdog), _WatchedHTTPSHandler(watchdog),
                                             _SameOriginCredentials())
        error: Optional[GenerationError] = None
        raw = b""
        started = time.monotonic()
        with watchdog:
            try:
                with opener.open(request, timeout=timeout) as response:
                    raw = self._read(response, shown)
            except GenerationError as exc:
                error = exc
            except urllib.error.HTTPError as exc:  # before URLError: it is a subclass
                error = self._http_error(exc, shown)
            except urllib.error.URLError as exc:  # no connection made, or the request not sent
                error = self._error(f"cannot reach {shown}: {exc.reason}", unreachable=True)
            except (OSError, http.client.HTTPException) as exc:  # read timeouts, dropped or garbled connections
                error = self._error(f"request to {shown} failed: {exc!r}")
        # Whatever the cut connection raised (or a body cut short), the limit ended it; so did a socket
        # timeout of the limit's length that came before the watchdog.
        if watchdog.fired or (error is not None and limit is not None and time.monotonic() - started >= limit):
            if by_budget:
                logger.warning("%s: the run's request budget of %g s is spent", shown, self.budget_s)
                raise self._error(f"the run's request budget of {self.budget_s:g} s ({self._setting('budget_s')}) "
                                  f"ran out during a request to {shown}", retryable=False)
            raise self._error(f"no complete answer from {shown} within the request deadline of {limit:g} s "
                              f"({self._setting('deadline_s')})")
        if error is not None:
            raise error
        return raw

    def _read(self, response: http.client.HTTPResponse, shown: str) -> bytes:
        """The body, in chunks, refused past ``max_response_bytes`` (announced or as it arrives)."""
        cap = self.max_response_bytes
        announced = response.headers.get("Content-Length", "")
        if announced.isdigit() and int(announced) > cap:
            raise self._error(f"the answer from {shown} announces {int(announced)} bytes, over the cap of "
                              f"{cap} bytes on an answer; not read")
        chunks, size = [], 0
        while chunk := response.read(min(READ_CHUNK_BYTES, cap + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                raise self._error(f"the answer from {shown} exceeds the cap of {cap} bytes on an answer; "
                                  "reading stopped")
        return b"".join(chunks)

    def _http_error(self, exc: urllib.error.HTTPError, shown: str) -> GenerationError:
        longest_secret = max((len(secret) for secret in self._secrets), default=0)
        try:  # redacted before it is cut: a secret is never cut in half
            detail = self.redact(exc.read(ERROR_DETAIL_CHARS + longest_secret).decode("utf-8", "replace"))
        except (OSError, http.client.HTTPException):
            detail = ""
        finally:
            exc.close()
        head = f"HTTP {exc.code} {exc.reason} from {shown}"
        if exc.code in REFUSED_STATUSES:
            return self._error(f"{head}: the endpoint refused the credentials (the key in the environment variable "
                               f"{self._setting('api_key_env')} names, or the URL's user and password); not retried: "
                               f"{detail[:ERROR_DETAIL_CHARS]}", retryable=False, status=exc.code)
        return self._error(f"{head}: {detail[:ERROR_DETAIL_CHARS]}", status=exc.code)


# --------------------------------------------------------------------------- the retry loop
@dataclass(frozen=True)
class Outcome(Generic[T]):
    """The parsed answer (``value``) after ``attempts`` tries, or ``value=None`` with the last ``error``."""

    value: Optional[T]
    attempts: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.value is not None


def snippet(answer: str) -> str:
    """An answer on one line, cut to :data:`ANSWER_SNIPPET_CHARS` (for error messages)."""
    flat = " ".join(answer.split())
    return flat if len(flat) <= ANSWER_SNIPPET_CHARS else flat[:ANSWER_SNIPPET_CHARS] + "..."


def answer_with_retries(
    generate: Callable[[Optional[str]], str],
    parse: Callable[[str], T],
    retries: int,
    label: str,
    backoff_s: float = 0.0,
) -> Outcome[T]:
    """Ask up to ``retries + 1`` times; return the first answer ``parse`` accepts, else a failure.

    ``generate(feedback)`` asks the model: ``feedback`` is None for the original request, or the last
    parse error (``parse`` raises ``ValueError`` with a message fit to be shown to the model). A
    :class:`GenerationError` re-sends the original request after ``backoff_s * attempt`` seconds, unless
    it is not ``retryable``: then the outcome is a failure after that attempt.
    """
    attempts = retries + 1
    feedback: Optional[str] = None
    last_error = ""
    for attempt in range(1, attempts + 1):
        try:
            answer = generate(feedback)
        except GenerationError as exc:
            last_error = f"attempt {attempt}/{attempts}: request failed: {exc}"
            logger.warning("%s: %s", label, last_error)
            if not exc.retryable:
                return Outcome(None, attempt, last_error)
            feedback = None
            if backoff_s > 0 and attempt < attempts:
                time.sleep(backoff_s * attempt)
            continue
        try:
            value = parse(answer)
        except ValueError as exc:
            last_error = f"attempt {attempt}/{attempts}: unusable answer: {exc}; answer was: {snippet(answer)!r}"
            logger.debug("%s: %s", label, last_error)
            feedback = str(exc)
            continue
        return Outcome(value, attempt)
    return Outcome(None, attempts, last_error)
