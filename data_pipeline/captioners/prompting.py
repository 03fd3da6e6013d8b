"""What the model-based backends (``vlm``, ``http``) share: the prompt, the images, the retry/parse loop.

A backend only supplies a :data:`TextGenerator` — "answer this request with text" — so the loop that
parses, re-asks with the parse error and gives up with ``status="failed"`` is written once and can be
tested with a scripted fake generator.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from PIL import Image

from animegamer.contracts.states import ENTERTAINMENT, SOCIAL, STAMINA, STATE_ALLOWED_VALUES
from animegamer.media.video import pick_frames
# GenerationError stays importable from here, where the caption backends' retry rules are described.
from animegamer.utils.http import IMAGE, TEXT, ContentPart, GenerationError, answer_with_retries  # noqa: F401

from .base import CaptionResult, ClipContext, FilmPaths
from .fields import (
    ADVERB,
    CHARACTER,
    ENVIRONMENT,
    MOTION,
    STATES,
    TIME_OF_DAY,
    parse_caption_json,
)

logger = logging.getLogger(__name__)

VERSION_HEX_CHARS = 12
REFERENCE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg")
DEFAULT_REFERENCE_STEM = "default"

# Shown to the model next to each key; the keys themselves come from fields.py.
FIELD_DESCRIPTIONS: dict[str, str] = {
    CHARACTER: "the main character's name, or a short description if unknown (e.g. \"Sosuke\")",
    MOTION: "the character's main action as a short verb phrase (e.g. \"talk\", \"run along the beach\")",
    ADVERB: "one adverb describing how the action is done (e.g. \"softly\", \"quickly\")",
    ENVIRONMENT: "the setting (e.g. \"seaside village\", \"forest\")",
    TIME_OF_DAY: "the time of day (e.g. \"morning\", \"noon\", \"evening\", \"night\")",
}
STATE_DESCRIPTIONS: dict[str, str] = {
    SOCIAL: "1 if the character talks to or interacts with another character, else 0",
    ENTERTAINMENT: "1 if the action is entertaining or playful for the character, else 0",
    STAMINA: "1 if the action restores stamina (resting, eating, sleeping), -1 if it spends stamina",
}

PROMPT_HEADER = "You annotate a short clip from an animated film for a game-model training set."
FRAMES_LABEL = "The clip's {count} frames, in temporal order:"
REFERENCE_LABEL = (
    "Reference image of the main character (it is NOT a frame of the clip; use it only to recognise the character):"
)
PROMPT_FOOTER = "Answer with ONLY one JSON object, no other text, with exactly these keys:"
RETRY_SUFFIX = (
    "\n\nYour previous answer could not be used: {error}\n"
    "Answer again with ONLY the JSON object described above."
)


def build_prompt() -> str:
    """The instruction text after the images: every key, what it means and its allowed values."""
    lines = [PROMPT_HEADER, PROMPT_FOOTER]
    lines += [f'- "{key}": string, {desc}' for key, desc in FIELD_DESCRIPTIONS.items()]
    lines.append(f'- "{STATES}": object with exactly these integer keys:')
    for key, desc in STATE_DESCRIPTIONS.items():
        allowed = " or ".join(str(v) for v in STATE_ALLOWED_VALUES[key])
        lines.append(f'    - "{key}": {allowed}; {desc}')
    example = {
        CHARACTER: "Sosuke", MOTION: "talk", ADVERB: "softly", ENVIRONMENT: "seaside village",
        TIME_OF_DAY: "evening", STATES: {SOCIAL: 1, ENTERTAINMENT: 0, STAMINA: -1},
    }
    lines.append(f"Example answer: {json.dumps(example)}")
    return "\n".join(lines)


PROMPT = build_prompt()


# --------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class CaptionRequest:
    """What a generator must answer: clip frames, an optional reference image and the prompt text."""

    prompt: str
    frames: tuple[Image.Image, ...]
    reference: Optional[Image.Image] = None

    def with_feedback(self, error: str) -> "CaptionRequest":
        """The same request with the last parse error appended, so the model can correct itself."""
        return replace(self, prompt=self.prompt + RETRY_SUFFIX.format(error=error))


def content_parts(request: CaptionRequest) -> list[ContentPart]:
    """The request as an ordered text/image sequence; the label before each image says what it is."""
    parts: list[ContentPart] = []
    if request.reference is not None:
        parts += [(TEXT, REFERENCE_LABEL), (IMAGE, request.reference)]
    parts.append((TEXT, FRAMES_LABEL.format(count=len(request.frames))))
    parts += [(IMAGE, frame) for frame in request.frames]
    parts.append((TEXT, request.prompt))
    return parts


TextGenerator = Callable[[CaptionRequest], str]


# --------------------------------------------------------------------------- reference images
class ReferenceImages:
    """Character reference pictures from a folder: ``<film>.png``/``.jpg`` if present, else ``default``.

    Loaded once per film: the same picture accompanies every clip of a film.
    """

    def __init__(self, folder: str | Path | None, film_paths: Optional[FilmPaths] = None) -> None:
        self.folder = Path(folder) if folder else None
        self._film_paths = film_paths
        self._cache: dict[str, Optional[Image.Image]] = {}

    def candidate_stems(self, film_id: str) -> list[str]:
        """The film id, then the film's file stem (users name pictures after their files), then default."""
        stems = [film_id]
        if self._film_paths and film_id in self._film_paths:
            stems.append(Path(self._film_paths[film_id]).stem)
        stems.append(DEFAULT_REFERENCE_STEM)
        return list(dict.fromkeys(stems))

    def path_for(self, film_id: str) -> Optional[Path]:
        if self.folder is None:
            return None
        for stem in self.candidate_stems(film_id):
            for suffix in REFERENCE_SUFFIXES:
                candidate = self.folder / f"{stem}{suffix}"
                if candidate.is_file():
                    return candidate
        return None

    def get(self, film_id: str) -> Optional[Image.Image]:
        if film_id not in self._cache:
            path = self.path_for(film_id)
            self._cache[film_id] = Image.open(path).convert("RGB") if path else None
            logger.info("film %s: reference image %s", film_id, path or "none")
        return self._cache[film_id]

    def fingerprint(self) -> str:
        """Hash of the folder's image files, so changing a reference picture changes the version."""
        digest = hashlib.sha256()
        if self.folder is not None:
            for file in sorted(self.folder.iterdir()):
                if file.is_file() and file.suffix.lower() in REFERENCE_SUFFIXES:
                    digest.update(file.name.encode() + b"\0" + file.read_bytes())
        return digest.hexdigest()


# --------------------------------------------------------------------------- the loop
def caption_with_retries(
    generate: TextGenerator,
    request: CaptionRequest,
    retries: int,
    captioner: str,
    version: str,
    backoff_s: float = 0.0,
) -> CaptionResult:
    """Ask up to ``retries + 1`` times; return the first strictly parsed answer, else a failure.

    The retry rules are ``animegamer.utils.http.answer_with_retries``'s: a parse error is appended to
    the next prompt (the model gets to fix its own answer); a :class:`GenerationError` re-sends the
    original request after ``backoff_s * attempt`` seconds. The failure keeps the last error: values
    are never invented for a clip the model could not do.
    """
    ask = lambda feedback: generate(request if feedback is None else request.with_feedback(feedback))
    outcome = answer_with_retries(ask, parse_caption_json, retries, captioner, backoff_s)
    if outcome.ok:
        caption, states = outcome.value
        return CaptionResult.success(caption, states, captioner, version, attempts=outcome.attempts)
    return CaptionResult.failure(outcome.error, captioner, version, attempts=outcome.attempts)


# --------------------------------------------------------------------------- shared captioner
def settings_version(*parts: object) -> str:
    """Short hash of everything that shapes a model backend's answers (model, prompt, settings)."""
    digest = hashlib.sha256()
    for part in (PROMPT, RETRY_SUFFIX, REFERENCE_LABEL, FRAMES_LABEL) + parts:
        digest.update(str(part).encode() + b"\0")
    return digest.hexdigest()[:VERSION_HEX_CHARS]


def frames_to_images(frames: np.ndarray, count: int) -> tuple[Image.Image, ...]:
    return tuple(Image.fromarray(frame) for frame in pick_frames(frames, count))


class PromptCaptioner:
    """A captioner driven by a text generator: picks frames, adds the reference, runs the loop."""

    needs_frames = True

    def __init__(
        self,
        name: str,
        version: str,
        generate: TextGenerator,
        num_frames: int,
        retries: int,
        references: Optional[ReferenceImages] = None,
        backoff_s: float = 0.0,
    ) -> None:
        self.name = name
        self.version = version
        self.generate = generate
        self.num_frames = num_frames
        self.retries = retries
        self.references = references or ReferenceImages(None)
        self.backoff_s = backoff_s

    def build_request(self, ctx: ClipContext) -> CaptionRequest:
        return CaptionRequest(PROMPT, frames_to_images(ctx.frames, self.num_frames), self.references.get(ctx.film_id))

    def caption(self, ctx: ClipContext) -> CaptionResult:
        if len(ctx.frames) == 0:
            return CaptionResult.failure("clip has no frames", self.name, self.version, attempts=0)
        request = self.build_request(ctx)
        result = caption_with_retries(self.generate, request, self.retries, self.name, self.version, self.backoff_s)
        if result.ok:
            logger.debug("clip %s: captioned after %d attempt(s)", ctx.clip_key, result.attempts)
        else:
            logger.info("clip %s: caption failed after %d attempt(s): %s", ctx.clip_key, result.attempts, result.error)
        return result

