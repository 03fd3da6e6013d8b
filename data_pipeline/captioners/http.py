"""The ``http`` backend: any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, OpenAI).

The client and its retry rules are ``animegamer.utils.http``'s (shared with evaluation's MLLM judge):
HTTP errors, timeouts and malformed responses are failed attempts (:class:`GenerationError`) that the
retry loop records; a refused key (401, 403) fails the clip at once. Each request has a deadline
(``caption.deadline_s``) and a worker process's requests a budget (``caption.budget_s``, off by
default): a clip past either fails with that reason. The API key is read from the environment, never
from config files, and failure reasons (what the shards keep) are redacted by the client.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from animegamer.utils.http import RETRY_BACKOFF_S, OpenAIChatClient, api_key_from_env

from .base import BACKEND_HTTP, FilmPaths
from .prompting import CaptionRequest, PromptCaptioner, ReferenceImages, content_parts, settings_version

if TYPE_CHECKING:
    from animegamer.config.schema import CaptionConfig

logger = logging.getLogger(__name__)


SETTINGS = "pipeline.caption"  # the config node, as messages name it


class OpenAIChatGenerator:
    """Answers a :class:`CaptionRequest` through ``POST {url}/chat/completions``, deterministically."""

    def __init__(self, client: OpenAIChatClient, max_tokens: int) -> None:
        self.client = client
        self.max_tokens = max_tokens

    def __call__(self, request: CaptionRequest) -> str:
        return self.client.complete(content_parts(request), self.max_tokens, temperature=0.0)


def build_http_captioner(
    cfg: "CaptionConfig", film_paths: Optional[FilmPaths] = None, backoff_s: float = RETRY_BACKOFF_S
) -> PromptCaptioner:
    """The ``http`` backend for ``cfg``; no request is made until the first clip is captioned."""
    references = ReferenceImages(cfg.reference_images or None, film_paths)
    client = OpenAIChatClient(
        cfg.url,
        cfg.model_name,
        cfg.timeout_s,
        api_key_from_env(cfg.api_key_env, "caption http"),
        deadline_s=cfg.deadline_s,
        budget_s=cfg.budget_s or None,
        settings=SETTINGS,
    )
    generator = OpenAIChatGenerator(client, cfg.max_new_tokens)
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
