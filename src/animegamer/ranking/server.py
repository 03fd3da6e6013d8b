"""The ranking page over HTTP (standard library ``http.server`` on 127.0.0.1), refusing whatever its own
page never sends.

* Every request names this server in ``Host`` (``127.0.0.1:PORT`` or ``localhost:PORT``; a name of
  another site rebound to 127.0.0.1 is refused) and, when it carries an ``Origin``, comes from this
  server's own origin: 403 otherwise.
* A rater's answers and clips are read and written with the rater's token (``TOKEN_HEADER``, or the
  ``token`` field of a clip's address), which only a page of this origin can read: 403 without it.
* An answer is a POST of ``application/json`` (415 otherwise) of at most ``MAX_BODY_BYTES`` (413),
  whose body arrives within ``timeout_s`` (408); a malformed request gets 400 with the reason, and the
  server goes on serving.
* A clip or poster answers one byte range of it (``Range: bytes=a-b``, ``bytes=a-``, ``bytes=-n``) with 206
  and ``Content-Range``, a range past its end with 416, and anything else with the whole file (200), each
  with ``Accept-Ranges: bytes``: Safari plays a clip only from a server that answers ranges.
* The scores are not served: they are in the folder's report, for whoever runs the server.
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
from http import HTTPStatus
from http.client import HTTP_PORT
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, unquote

from animegamer.config.schema import RANKING_PORT, RANKING_REQUEST_TIMEOUT_S
from animegamer.errors import UserError
from animegamer.ranking.app import (ANSWER_ROUTE, CLIP_ROUTE, CONTENT_TYPES, POSTER_ROUTE, STATE_ROUTE, TOKEN_HEADER,
                                    RankingApp)

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
HOST_NAMES = (HOST, "localhost")  # the names a browser on this machine reaches the server by
DEFAULT_PORT = RANKING_PORT
REQUEST_TIMEOUT_S = RANKING_REQUEST_TIMEOUT_S  # a request (its line, headers and body) that stalls longer is dropped
MAX_BODY_BYTES = 4096  # one answer is a few dozen bytes
MAX_QUERY_FIELDS = 8  # the page's addresses have at most 5
JSON_TYPE, JSON_CHARSET = "application/json", "utf-8"
PAGE_PATHS = ("/", "/index.html")
NONCE_BYTES = 16
# The page runs only its own script (the nonce drawn per response) and loads only from this server,
# and no other page may frame it (a framed page could be clicked through by the page around it).
PAGE_POLICY = ("default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self'; "
               "media-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = (("X-Content-Type-Options", "nosniff"), ("X-Frame-Options", "DENY"),
                    ("Referrer-Policy", "no-referrer"), ("Cache-Control", "no-store"))
_TOKEN_IN_TEXT = re.compile(r"(token=)[^&\s'\"]*")
_BYTE_RANGE = re.compile(r"bytes[ \t]*=[ \t]*([0-9]{0,30})[ \t]*-[ \t]*([0-9]{0,30})", re.IGNORECASE)
UNSATISFIABLE = (-1, -1)  # byte_range of a range that holds no byte of the file (no range starts at -1)
ACCEPT_RANGES = (("Accept-Ranges", "bytes"),)  # a clip's or poster's reply: ranges of it may be asked


def byte_range(header: Optional[str], size: int) -> Optional[tuple[int, int]]:
    """The first and last byte (inclusive) of the one range ``header`` asks of ``size`` bytes:
    ``bytes=a-b``, ``bytes=a-`` or the last n, ``bytes=-n``. None (serve the whole file, as HTTP allows)
    for no header, another unit, several ranges or a malformed one; ``UNSATISFIABLE`` (416) for a range
    that starts past the end or an empty suffix."""
    match = _BYTE_RANGE.fullmatch(header.strip()) if header else None
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if not first and not last:
        return None
    if not first:  # the last n bytes
        suffix = int(last)
        return (max(0, size - suffix), size - 1) if suffix > 0 and size > 0 else UNSATISFIABLE
    start = int(first)
    if last and int(last) < start:
        return None  # an invalid range: ignored
    if start >= size:
        return UNSATISFIABLE
    return start, min(int(last), size - 1) if last else size - 1


class Refused(Exception):
    """A request this server does not serve: answered with ``status`` and the message."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Handler(BaseHTTPRequestHandler):
    server: "RankingServer"

    def setup(self) -> None:
        self.timeout = self.server.timeout_s  # StreamRequestHandler sets it on the socket
        super().setup()

    def handle_one_request(self) -> None:
        self._replied = self._body_read = False
        super().handle_one_request()

    # ------------------------------------------------------------------ replies
    def _send(self, status: int, body: bytes, content_type: str, extra: tuple = ()) -> None:
        self._replied = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in SECURITY_HEADERS + extra:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_file(self, file: Path, content_type: str) -> None:
        """The file, or the one byte range its ``Range`` asks for (206): a browser's player (Safari's
        always) asks a clip for ranges and plays nothing from a server that answers them with the whole."""
        with file.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            # If-Range asks for a range only while the file matches a validator; none is served, so none matches
            wanted = None if self._single("If-Range") is not None else byte_range(self._single("Range"), size)
            if wanted is None:
                self._send(HTTPStatus.OK, handle.read(), content_type, ACCEPT_RANGES)
                return
            if wanted == UNSATISFIABLE:
                asked = (self._single("Range") or "")[:80]
                message = {"error": f"the range {asked!r} holds no byte of the clip's {size} bytes"}
                self._send(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, json.dumps(message).encode(), JSON_TYPE,
                           ACCEPT_RANGES + (("Content-Range", f"bytes */{size}"),))
                return
            first, last = wanted
            handle.seek(first)
            self._send(HTTPStatus.PARTIAL_CONTENT, handle.read(last - first + 1), content_type,
                       ACCEPT_RANGES + (("Content-Range", f"bytes {first}-{last}/{size}"),))

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), JSON_TYPE)

    def _serve(self, route) -> None:
        """Run ``route`` on the checked address; every failure becomes a reply, never a dropped connection."""
        try:
            self._check_host_and_origin()
            route(*self._address())
        except Refused as refused:
            self.close_connection = True
            self._discard_body()
            self._reply_if_possible(refused.status, str(refused))
        except (ConnectionError, TimeoutError) as error:  # the client left or stopped reading mid-reply
            log.debug("ranking: %s %s: connection ended (%s)", self.command, self._path_only(), error)
            self.close_connection = True
        except Exception:  # noqa: BLE001 - a fault of the server: logged, and the client told
            log.exception("ranking: %s %s failed", self.command, self._path_only())
            self.close_connection = True
            self._reply_if_possible(HTTPStatus.INTERNAL_SERVER_ERROR, "the server failed; see its log")

    def _reply_if_possible(self, status: HTTPStatus, message: str) -> None:
        if self._replied:  # a reply is under way: nothing sensible can follow it on this connection
            return
        try:
            self._json(status, {"error": message})
        except (ConnectionError, TimeoutError):
            pass

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self._serve(self._get)

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        self._serve(self._post)

    # ------------------------------------------------------------------ checks
    def _single(self, name: str) -> Optional[str]:
        values = self.headers.get_all(name) or []
        if len(values) > 1:
            raise Refused(HTTPStatus.BAD_REQUEST, f"{name} is given {len(values)} times")
        return values[0].strip() if values else None

    def _check_host_and_origin(self) -> None:
        host = (self._single("Host") or "").lower()
        if host not in self.server.hosts:
            raise Refused(HTTPStatus.FORBIDDEN, f"this server answers to {' or '.join(self.server.hosts)} only")
        origin = self._single("Origin")
        if origin is not None and origin.lower() != f"http://{host}":
            raise Refused(HTTPStatus.FORBIDDEN, "a page of another origin may not use this server")

    def _address(self) -> tuple[str, dict[str, str]]:
        """The request's path and query fields (the last of each name), decoded strictly."""
        raw = self.path
        # http.server reads the request line as latin-1: a byte above 127 shows as a non-ASCII character
        if not (raw.isascii() and raw.isprintable()):
            raise Refused(HTTPStatus.BAD_REQUEST, "the address has bytes that are not printable ASCII")
        path, _, query = raw.partition("?")
        try:
            path = unquote(path, errors="strict")
            fields = parse_qs(query, keep_blank_values=True, errors="strict", max_num_fields=MAX_QUERY_FIELDS)
        except ValueError as error:  # UnicodeDecodeError is one
            raise Refused(HTTPStatus.BAD_REQUEST, "the address is not UTF-8 text of at most "
                          f"{MAX_QUERY_FIELDS} fields") from error
        texts = [path, *fields, *(value for values in fields.values() for value in values)]
        if not all(text.isprintable() for text in texts):
            raise Refused(HTTPStatus.BAD_REQUEST, "the address has control characters (such as %00)")
        return path, {name: values[-1] for name, values in fields.items()}

    def _require_token(self, rater: Any, token: Any) -> None:
        if not self.server.app.token_matches(rater, token):
            raise Refused(HTTPStatus.FORBIDDEN, "no valid token for this rater: open the page again "
                          "(?rater=NAME) and answer there")

    def _read_body(self) -> bytes:
        if self._single("Transfer-Encoding") is not None:
            raise Refused(HTTPStatus.BAD_REQUEST, "send the answer whole, with a Content-Length")
        value = self._single("Content-Length")
        if value is None:
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "an answer needs a Content-Length")
        if not (value.isascii() and value.isdigit()):
            raise Refused(HTTPStatus.BAD_REQUEST, f"Content-Length {value[:40]!r} is not a number of bytes")
        digits = value.lstrip("0") or "0"
        if len(digits) > len(str(MAX_BODY_BYTES)) or int(digits) > MAX_BODY_BYTES:
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"an answer is at most {MAX_BODY_BYTES} bytes")
        length = int(digits)
        if length == 0:
            raise Refused(HTTPStatus.BAD_REQUEST, "the answer is empty")
        self._body_read = True
        try:
            body = self.rfile.read(length)
        except TimeoutError as error:
            raise Refused(HTTPStatus.REQUEST_TIMEOUT,
                          f"the body did not arrive within {self.server.timeout_s:g} s") from error
        if len(body) < length:
            raise Refused(HTTPStatus.BAD_REQUEST, f"the body ended after {len(body)} of its {length} bytes")
        return body

    def _discard_body(self) -> None:
        """Read a small refused body before replying: closing a socket with unread data resets the
        connection, and the client might lose the reply."""
        if self.command != "POST" or self._body_read:
            return
        self._body_read = True
        value = self.headers.get("Content-Length", "")
        if value.isascii() and value.isdigit() and len(value) <= len(str(MAX_BODY_BYTES)) \
                and int(value) <= MAX_BODY_BYTES:
            try:
                self.rfile.read(int(value))
            except (ConnectionError, TimeoutError):
                pass

    # ------------------------------------------------------------------ routes
    def _get(self, path: str, query: dict[str, str]) -> None:
        app = self.server.app
        if path in PAGE_PATHS:
            try:
                index = int(query.get("game", "0"))
            except ValueError:
                index = 0
            nonce = secrets.token_urlsafe(NONCE_BYTES)
            self._send(HTTPStatus.OK, app.page(query.get("rater"), index, nonce).encode(), "text/html; charset=utf-8",
                       (("Content-Security-Policy", PAGE_POLICY.format(nonce=nonce)),))
        elif path == f"/{STATE_ROUTE}":
            rater = query.get("rater")
            self._require_token(rater, self._single(TOKEN_HEADER))
            self._json(HTTPStatus.OK, {"answers": app.labelled_state(rater)})
        elif path in (f"/{CLIP_ROUTE}", f"/{POSTER_ROUTE}"):
            rater = query.get("rater")
            self._require_token(rater, query.get("token"))
            file = app.clip_file(path[1:], rater, query.get("game"), query.get("column"), query.get("turn"))
            if file is None:
                raise Refused(HTTPStatus.NOT_FOUND, "no such clip")
            self._send_file(file, CONTENT_TYPES[file.suffix.lower()])
        else:
            raise Refused(HTTPStatus.NOT_FOUND, f"no page {path[:200]}")

    def _post(self, path: str, query: dict[str, str]) -> None:
        if path != f"/{ANSWER_ROUTE}":
            raise Refused(HTTPStatus.NOT_FOUND, f"answers go to /{ANSWER_ROUTE}")
        if self.headers.get_content_type() != JSON_TYPE or \
                (self.headers.get_content_charset() or JSON_CHARSET) != JSON_CHARSET:
            raise Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"an answer is {JSON_TYPE} ({JSON_CHARSET})")
        body = self._read_body()
        try:
            payload = json.loads(body.decode(JSON_CHARSET))
        except RecursionError as error:
            raise Refused(HTTPStatus.BAD_REQUEST, "not an answer: JSON nested too deeply") from error
        except ValueError as error:  # json's decode errors and UnicodeDecodeError are ValueErrors
            raise Refused(HTTPStatus.BAD_REQUEST, f"not JSON ({error})") from error
        if not isinstance(payload, dict):
            raise Refused(HTTPStatus.BAD_REQUEST, "an answer is a JSON object")
        self._require_token(payload.get("rater"), self._single(TOKEN_HEADER))
        try:
            result = self.server.app.answer(payload)
        except ValueError as error:  # not a choice on this page: not stored
            raise Refused(HTTPStatus.BAD_REQUEST, str(error)) from error
        self._json(HTTPStatus.OK, result)

    # ------------------------------------------------------------------ logging
    def _path_only(self) -> str:
        return getattr(self, "path", "").partition("?")[0][:200]  # the query carries the rater's token

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        log.debug("%s %s %s %s", self.address_string(), self.command, self._path_only(), code)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("%s %s", self.address_string(), _TOKEN_IN_TEXT.sub(r"\1...", format % args))


class RankingServer(ThreadingHTTPServer):
    """The app on ``127.0.0.1:port`` (0: a free port); ``url`` is what to open. A request that stalls
    for ``timeout_s`` seconds is dropped (its body: answered 408). ``app`` may be None to bind the port
    before the app's folder is written (a port that is taken then leaves the folder untouched); it is set
    before serving."""

    daemon_threads = True

    def __init__(self, app: Optional[RankingApp], port: int = DEFAULT_PORT,
                 timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise UserError(f"the request timeout is a number of seconds > 0, got {timeout_s}")
        super().__init__((HOST, port), _Handler)
        self.app = app
        self.timeout_s = timeout_s
        bound = self.server_address[1]
        # A browser leaves the port out of Host when it is HTTP's own.
        self.hosts = tuple(f"{name}:{bound}" for name in HOST_NAMES) + (HOST_NAMES if bound == HTTP_PORT else ())

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"
