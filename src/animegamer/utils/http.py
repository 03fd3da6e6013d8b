"""An OpenAI-compatible chat-completions client and the retry loop every model-answer reader shares.

Used by the pipeline's ``http`` caption backend and by evaluation's MLLM judge. Only the standard
library talks to the server (``urllib.request``), so no dependency is added. HTTP errors (429, 5xx,
...), timeouts, unreachable hosts and malformed responses raise :class:`GenerationError`, which the
loop counts as a failed attempt and re-sends after a back-off; an answer the caller cannot parse is
re-asked with the parse error appended, so the model can correct itself; after the last attempt the
outcome is a failure with the last error, never a guessed value. API keys come from the environment.
"""
from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, Sequence, TypeVar, Union

if TYPE_CHECKING:
    from PIL import Image

logger = logging.getLogger(__name__)

CHAT_COMPLETIONS_PATH = "/chat/completions"
RETRY_BACKOFF_S = 1.0  # a busy server (429/503) usually recovers within seconds
ERROR_DETAIL_CHARS = 300
ANSWER_SNIPPET_CHARS = 200  # how much of a bad answer is kept in the error message

# One element of a chat message's content, in order: ("text", str) or ("image", PIL image).
TEXT = "text"
IMAGE = "image"
ContentPart = tuple[str, Union[str, "Image.Image"]]

T = TypeVar("T")


class GenerationError(RuntimeError):
    """No answer was produced (HTTP error, timeout, unreachable server): counts as one failed attempt."""


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


def answer_text(raw: bytes) -> str:
    """The assistant text of a chat-completions response; anything else is a failed attempt."""
    try:
        message = json.loads(raw)["choices"][0]["message"]
        content = message["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise GenerationError(f"malformed chat-completions response: {raw[:ERROR_DETAIL_CHARS]!r}") from exc
    if isinstance(content, list):  # some servers return content parts even for plain text
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        raise GenerationError(f"response message has no text content: {message!r}"[:ERROR_DETAIL_CHARS])
    return content


class OpenAIChatClient:
    """``POST {url}/chat/completions`` with a bearer key when one is given; one call, no retries."""

    def __init__(self, url: str, model_name: str, timeout_s: float, api_key: Optional[str] = None) -> None:
        self.endpoint = url.rstrip("/") + CHAT_COMPLETIONS_PATH
        self.model_name = model_name
        self.timeout_s = timeout_s
        self._api_key = api_key

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def complete(self, parts: Sequence[ContentPart], max_tokens: int, temperature: float = 0.0) -> str:
        """The assistant's text for one user message made of ``parts``."""
        body = json.dumps(chat_body(parts, self.model_name, max_tokens, temperature)).encode()
        request = urllib.request.Request(self.endpoint, data=body, headers=self._headers(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:  # before URLError: it is a subclass
            detail = exc.read()[:ERROR_DETAIL_CHARS].decode("utf-8", "replace")
            raise GenerationError(f"HTTP {exc.code} {exc.reason} from {self.endpoint}: {detail}") from exc
        except urllib.error.URLError as exc:
            raise GenerationError(f"cannot reach {self.endpoint}: {exc.reason}") from exc
        except (OSError, http.client.HTTPException) as exc:  # read timeouts, dropped or garbled connections
            raise GenerationError(f"request to {self.endpoint} failed: {exc!r}") from exc
        return answer_text(raw)


def api_key_from_env(env_var: str, user: str = "http") -> Optional[str]:
    """The key from ``env_var``; a missing key is fine for local servers, so it only logs (the name of
    the variable, never its value)."""
    if not env_var:
        return None
    key = os.environ.get(env_var)
    if not key:
        logger.info("%s: environment variable %s is not set; sending no Authorization header", user, env_var)
    return key or None


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
    :class:`GenerationError` re-sends the original request after ``backoff_s * attempt`` seconds.
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
