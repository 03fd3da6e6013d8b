"""The caption backends by name: :func:`build_captioner` builds the one ``caption.backend`` names.

Every backend module is imported here. A backend that needs a heavy optional dependency imports it
when it loads its model (``vlm``: torch and transformers), so a jsonl or http run never pays for it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .base import BACKEND_HTTP, BACKEND_JSONL, BACKEND_VLM, Captioner, FilmPaths, validate_caption_config
from .http import build_http_captioner
from .jsonl import JsonlCaptioner
from .none import NoneCaptioner
from .vlm import build_vlm_captioner

if TYPE_CHECKING:  # the schema pulls in Hydra; backends only read plain attributes from it
    from animegamer.config.schema import CaptionConfig


def build_captioner(
    cfg: "CaptionConfig", film_paths: Optional[FilmPaths] = None, warn_unknown_films: bool = True
) -> Captioner:
    """Build the backend named by ``cfg.backend``.

    ``film_paths`` maps the pipeline's film ids to their video files, so caption records and reference
    images may name a film by file name or stem instead of its id. ``warn_unknown_films``: the jsonl
    backend warns about records naming none of ``film_paths`` (off where only some films are known).
    """
    validate_caption_config(cfg)
    if cfg.backend == BACKEND_JSONL:
        return JsonlCaptioner(cfg.path, film_paths=film_paths, warn_unknown_films=warn_unknown_films)
    if cfg.backend == BACKEND_VLM:
        return build_vlm_captioner(cfg, film_paths=film_paths)
    if cfg.backend == BACKEND_HTTP:
        return build_http_captioner(cfg, film_paths=film_paths)
    return NoneCaptioner()
