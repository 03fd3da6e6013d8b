"""The contract between the clip pipeline and any caption backend, and the check of its settings
(:mod:`.registry` builds the backend they name).

A backend turns a :class:`ClipContext` into a :class:`CaptionResult`. Per-clip problems (no record,
unparseable model answer, HTTP error) become ``status="failed"`` results so one bad clip never stops a
film; configuration problems (missing file, unknown backend) raise at construction time instead.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol, runtime_checkable

import numpy as np

from animegamer.media.captions import STATUS_FAILED, STATUS_OK
from animegamer.utils.http import client_setting_problems

from .fields import Caption, States

if TYPE_CHECKING:  # the schema pulls in Hydra; backends only read plain attributes from it
    from animegamer.config.schema import CaptionConfig

logger = logging.getLogger(__name__)

BACKEND_JSONL = "jsonl"
BACKEND_VLM = "vlm"
BACKEND_HTTP = "http"
BACKEND_NONE = "none"
BACKENDS: tuple[str, ...] = (BACKEND_JSONL, BACKEND_VLM, BACKEND_HTTP, BACKEND_NONE)
# Backends whose failures can pass (a server down, overloaded or out of budget): a run again asks once
# more for their failed clips (``caption.retry_failed``). The others answer a clip the same way again
# for the same version: jsonl reads the same file, vlm decodes greedily, none is off.
RETRIED_BACKENDS: tuple[str, ...] = (BACKEND_HTTP,)
# How the http endpoint is checked before any work (``caption.probe``; captioners/probe.py).
PROBE_MODELS, PROBE_CONNECT, PROBE_OFF = "models", "connect", "off"
PROBES: tuple[str, ...] = (PROBE_MODELS, PROBE_CONNECT, PROBE_OFF)

FilmPaths = Mapping[str, "str | Path"]


@dataclass
class ClipContext:
    """Everything a backend may look at for one clip: where it is in its film and its frames.

    ``frames`` is the decoded clip, uint8 (T, H, W, 3). Backends with ``needs_frames = False`` ignore
    it, so the pipeline may pass an empty (0, H, W, 3) array to them.
    """

    film_id: str
    clip_key: str
    start_s: float
    end_s: float
    frames: np.ndarray

    def __post_init__(self) -> None:
        if self.end_s < self.start_s:
            raise ValueError(f"clip {self.clip_key!r}: end_s {self.end_s} < start_s {self.start_s}")
        frames = self.frames
        if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
            desc = f"{frames.dtype} {frames.shape}" if isinstance(frames, np.ndarray) else type(frames).__name__
            raise ValueError(f"clip {self.clip_key!r}: frames must be uint8 (T, H, W, 3), got {desc}")

    @property
    def midpoint_s(self) -> float:
        """The time that decides which imported caption record a clip belongs to."""
        return 0.5 * (self.start_s + self.end_s)


@dataclass
class CaptionResult:
    """One clip's caption outcome; ``caption``/``states`` are set only when ``status == "ok"``.

    A failed result never carries placeholder values: downstream code must see the failure, not
    train on invented captions.
    """

    status: str
    captioner: str
    captioner_version: str
    caption: Optional[Caption] = None
    states: Optional[States] = None
    error: str = ""
    attempts: int = 0

    def __post_init__(self) -> None:
        if self.status not in (STATUS_OK, STATUS_FAILED):
            raise ValueError(f"status must be {STATUS_OK!r} or {STATUS_FAILED!r}, got {self.status!r}")
        if self.status == STATUS_OK and self.caption is None:
            raise ValueError("an ok result needs a caption")
        if self.status == STATUS_FAILED and (self.caption is not None or self.states is not None):
            raise ValueError("a failed result must not carry caption or states")
        if self.status == STATUS_FAILED and not self.error:
            raise ValueError("a failed result needs an error message")

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @classmethod
    def success(
        cls, caption: Caption, states: Optional[States], captioner: str, version: str, attempts: int = 1
    ) -> "CaptionResult":
        return cls(STATUS_OK, captioner, version, caption=caption, states=states, attempts=attempts)

    @classmethod
    def failure(cls, error: str, captioner: str, version: str, attempts: int = 0) -> "CaptionResult":
        return cls(STATUS_FAILED, captioner, version, error=error, attempts=attempts)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (what the shard writer stores next to each clip)."""
        return {
            "status": self.status,
            "caption": self.caption.to_dict() if self.caption is not None else None,
            "states": self.states.to_dict() if self.states is not None else None,
            "error": self.error,
            "captioner": self.captioner,
            "captioner_version": self.captioner_version,
            "attempts": self.attempts,
        }


@runtime_checkable
class Captioner(Protocol):
    """A caption backend. ``version`` changes whenever its output for the same clip could change."""

    name: str
    version: str
    needs_frames: bool  # False: the pipeline may skip decoding frames for this backend

    def caption(self, ctx: ClipContext) -> CaptionResult: ...


# --------------------------------------------------------------------------- films
def film_aliases(film_id: str, film_paths: Optional[FilmPaths]) -> list[str]:
    """Names by which captions/reference images may refer to a film, most specific first.

    Users write caption files by hand; they know "ep01.mkv" or "ep01", not the pipeline's film id.
    """
    aliases = [film_id]
    if film_paths and film_id in film_paths:
        path = Path(film_paths[film_id])
        aliases += [str(path), path.name, path.stem]
    return list(dict.fromkeys(aliases))  # de-duplicate, keep order


# --------------------------------------------------------------------------- settings
def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def validate_caption_config(cfg: "CaptionConfig") -> None:
    """Fail before any clip is processed when the config cannot work for its backend."""
    _require(cfg.backend in BACKENDS, f"unknown caption backend {cfg.backend!r}; choose one of {list(BACKENDS)}")
    _require(cfg.num_frames >= 1, f"caption.num_frames must be >= 1, got {cfg.num_frames}")
    _require(cfg.retries >= 0, f"caption.retries must be >= 0, got {cfg.retries}")
    _require(cfg.max_new_tokens >= 1, f"caption.max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
    _require(0.0 <= cfg.min_captioned_share <= 1.0,
             f"caption.min_captioned_share must be in [0, 1] (0: never stop), got {cfg.min_captioned_share}")
    _require(cfg.probe in PROBES, f"caption.probe={cfg.probe!r} is not one of {list(PROBES)}")
    _require(cfg.probe_timeout_s > 0, f"caption.probe_timeout_s must be > 0, got {cfg.probe_timeout_s}")
    client_problems = client_setting_problems("caption", cfg)  # the judge's config is checked alike
    _require(not client_problems, "; ".join(client_problems))
    if cfg.backend == BACKEND_JSONL:
        _require(bool(cfg.path), "caption.path must name a .jsonl file or a folder of them for backend=jsonl")
    if cfg.backend == BACKEND_VLM:
        _require(bool(cfg.model_path), "caption.model_path must name a local model folder for backend=vlm")
        _require(Path(cfg.model_path).is_dir(), f"caption.model_path {cfg.model_path!r} is not a folder")
    if cfg.backend == BACKEND_HTTP:
        _require(bool(cfg.url), "caption.url must be set (e.g. http://host:8000/v1) for backend=http")
        _require(bool(cfg.model_name), "caption.model_name must be set for backend=http")
    if cfg.backend in (BACKEND_VLM, BACKEND_HTTP) and cfg.reference_images:
        folder = Path(cfg.reference_images)
        _require(folder.is_dir(), f"caption.reference_images {cfg.reference_images!r} is not a folder")

