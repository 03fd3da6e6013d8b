"""The pre-flight probe of the ``http`` caption endpoint: one cheap request before any clip is cut.

A wrong host, port or path, or a refused key, would otherwise fail every clip of the run, each after
its retries and back-offs. ``caption.probe`` chooses the check:

* ``models`` (default): ``GET {url}/models``, which spends no tokens. No connection within
  ``probe_timeout_s`` (refused, unknown host, no route), a refused key (401, 403) or a path the server
  does not serve (404) refuse the run; any other trouble (a slow answer, a 5xx) is logged and the run
  goes on, each clip's request meeting its own limits. A list without ``model_name`` is warned about
  only: some servers take aliases of the names they list.
* ``connect``: a TCP connection to the URL's host and port only, for servers without ``/models``
  (made directly, not through a proxy).
* ``off``: no check.
"""
from __future__ import annotations

import http.client
import logging
import socket
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from animegamer.utils.http import (
    MODELS_PATH,
    REFUSED_STATUSES,
    GenerationError,
    OpenAIChatClient,
    api_key_from_env,
    redact,
)

from .base import BACKEND_HTTP, PROBE_CONNECT, PROBE_OFF
from .http import SETTINGS

if TYPE_CHECKING:
    from animegamer.config.schema import CaptionConfig

logger = logging.getLogger(__name__)

DEFAULT_PORTS = {"http": http.client.HTTP_PORT, "https": http.client.HTTPS_PORT}
# The connection must come within probe_timeout_s (the socket timeout), the whole answer within this
# many times that: a connection timeout then reads as "unreachable", not as a slow answer.
PROBE_DEADLINE_FACTOR = 2.0
SKIP_HINT = f"{SETTINGS}.probe=off skips this check"
LISTED_MODELS = 10  # model names a warning shows


def probed(cfg: "CaptionConfig") -> bool:
    """Whether :func:`probe_problems` sends anything: the http backend, its probe not off."""
    return cfg.backend == BACKEND_HTTP and cfg.probe != PROBE_OFF


def probe_problems(cfg: "CaptionConfig") -> list[str]:
    """Why the run cannot caption through ``cfg``'s endpoint (empty: go on)."""
    if not probed(cfg):
        return []
    if cfg.probe == PROBE_CONNECT:
        return _connect_problems(cfg)
    return _models_problems(cfg)


def _where(cfg: "CaptionConfig") -> str:
    return f"{SETTINGS}.url={redact(cfg.url)}"


def _connect_problems(cfg: "CaptionConfig") -> list[str]:
    parts = urlsplit(cfg.url)
    try:
        address = (parts.hostname or "", parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 0))
    except ValueError as error:  # a port that is not a number
        return [f"{_where(cfg)}: {error}"]
    try:
        with socket.create_connection(address, timeout=cfg.probe_timeout_s):
            pass
    except OSError as error:
        return [f"{_where(cfg)}: cannot connect to {address[0]}:{address[1]} ({error}; {SETTINGS}.probe_timeout_s="
                f"{cfg.probe_timeout_s:g} s): is the server running, on that host and port? ({SKIP_HINT})"]
    logger.info("%s accepts connections", _where(cfg))
    return []


def _models_problems(cfg: "CaptionConfig") -> list[str]:
    client = OpenAIChatClient(cfg.url, cfg.model_name, cfg.probe_timeout_s,
                              api_key_from_env(cfg.api_key_env, "caption http"),
                              deadline_s=PROBE_DEADLINE_FACTOR * cfg.probe_timeout_s, settings=SETTINGS)
    try:
        served = client.models()
    except GenerationError as error:
        if error.unreachable:
            return [f"{_where(cfg)}: {error}: is the server running, on that host and port? ({SKIP_HINT})"]
        if error.status in REFUSED_STATUSES:
            return [f"{_where(cfg)}: {error}"]
        if error.status == HTTPStatus.NOT_FOUND:
            return [f"{_where(cfg)}: {error}: the server serves no {MODELS_PATH} there. Is the path right "
                    f"(OpenAI-compatible servers answer under .../v1)? For a server without {MODELS_PATH}, set "
                    f"{SETTINGS}.probe=connect"]
        logger.warning("caption endpoint check (%s.probe): %s; going on, each clip's request has its own limits",
                       SETTINGS, error)
        return []
    if served and cfg.model_name not in served:
        logger.warning("%s lists the models %s, not %s.model_name=%s: unless the server takes it as another "
                       "name, every clip will fail", _where(cfg), ", ".join(served[:LISTED_MODELS]), SETTINGS,
                       cfg.model_name)
    else:
        logger.info("%s answers (%d models listed)", _where(cfg), len(served))
    return []
