"""The ``http`` backend: any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, OpenAI).

Only the standard library is used (``urllib.request``), so this backend adds no dependency. HTTP
errors, timeouts and malformed responses are failed attempts (:class:`GenerationError`) that the shared
retry loop records; the API key is read from the environment, never from config files.
"""
from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import os
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, Optional

from PIL import Image

from .base import BACKEND_HTTP, FilmPaths
from .prompting import (
    IMAGE,
    TEXT,
    CaptionRequest,
    GenerationError,
    PromptCaptioner,
    ReferenceImages,
    content_parts,
    settings_version,
)

if TYPE_CHECKING:
    from animegamer.config.schema import CaptionConfig

logger = logging.getLogger(__name__)

CHAT_COMPLETIONS_PATH = "/chat/completions"
RETRY_BACKOFF_S = 1.0  # a busy server (429/503) usually recovers within seconds
ERROR_DETAIL_CHARS = 300


def image_data_url(image: Image.Image) -> str:
    """A PNG ``data:`` URL: lossless, and accepted by every OpenAI-compatible server."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def chat_request_body(request: CaptionRequest, model_name: str, max_tokens: int) -> dict[str, Any]:
    """The JSON body: one user message of text and ``image_url`` parts, deterministic decoding."""
    content: list[dict[str, Any]] = []
    for kind, value in content_parts(request):
        if kind == IMAGE:
            content.append({"type": "image_url", "image_url": {"url": image_data_url(value)}})
        else:
            assert kind == TEXT
            content.append({"type": "text", "text": value})
    return {
        "model": model_name,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }


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


class OpenAIChatGenerator:
    """Answers a :class:`CaptionRequest` through ``POST {url}/chat/completions``."""

    def __init__(
        self, url: str, model_name: str, timeout_s: float, max_tokens: int, api_key: Optional[str] = None
    ) -> None:
        self.endpoint = url.rstrip("/") + CHAT_COMPLETIONS_PATH
        self.model_name = model_name
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self.api_key = api_key

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def __call__(self, request: CaptionRequest) -> str:
        body = json.dumps(chat_request_body(request, self.model_name, self.max_tokens)).encode()
        http_request = urllib.request.Request(self.endpoint, data=body, headers=self._headers(), method="POST")
        try:
            with urllib.request.urlopen(http_request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:  # before URLError: it is a subclass
            detail = exc.read()[:ERROR_DETAIL_CHARS].decode("utf-8", "replace")
            raise GenerationError(f"HTTP {exc.code} {exc.reason} from {self.endpoint}: {detail}") from exc
        except urllib.error.URLError as exc:
            raise GenerationError(f"cannot reach {self.endpoint}: {exc.reason}") from exc
        except (OSError, http.client.HTTPException) as exc:  # read timeouts, dropped or garbled connections
            raise GenerationError(f"request to {self.endpoint} failed: {exc!r}") from exc
        return answer_text(raw)


def api_key_from_env(env_var: str) -> Optional[str]:
    """The key from ``env_var``; a missing key is fine for local servers, so it only logs."""
    if not env_var:
        return None
    key = os.environ.get(env_var)
    if not key:
        logger.info("caption http: environment variable %s is not set; sending no Authorization header", env_var)
    return key or None


def build_http_captioner(
    cfg: "CaptionConfig", film_paths: Optional[FilmPaths] = None, backoff_s: float = RETRY_BACKOFF_S
) -> PromptCaptioner:
    """The ``http`` backend for ``cfg``; no request is made until the first clip is captioned."""
    references = ReferenceImages(cfg.reference_images or None, film_paths)
    generator = OpenAIChatGenerator(
        cfg.url, cfg.model_name, cfg.timeout_s, cfg.max_new_tokens, api_key_from_env(cfg.api_key_env)
    )
    # The URL is left out: the same model behind another host or port answers the same way.
    version = settings_version(cfg.model_name, cfg.num_frames, cfg.max_new_tokens, references.fingerprint())
    return PromptCaptioner(
        name=BACKEND_HTTP,
        version=f"{cfg.model_name}@{version}",
        generate=generator,
        num_frames=cfg.num_frames,
        retries=cfg.retries,
        references=references,
        backoff_s=backoff_s,
    )
