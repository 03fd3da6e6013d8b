"""Pluggable caption-and-state backends of the clip-and-caption pipeline.

``build_captioner(cfg.pipeline.caption, film_paths)`` returns a :class:`Captioner`; each clip's
``captioner.caption(ClipContext(...))`` gives a :class:`CaptionResult` (``ok`` with caption + states,
or ``failed`` with the reason). Backends: ``jsonl`` (import), ``vlm`` (local transformers model),
``http`` (OpenAI-compatible server), ``none`` (caption later).
"""
from .base import (
    BACKENDS,
    CaptionResult,
    Captioner,
    ClipContext,
)
from .fields import (
    CAPTION_FIELDS,
    INSTRUCTION_TEMPLATE,
    MOTION_TEXT_TEMPLATE,
    STATE_FIELDS,
    Caption,
    States,
    build_instruction,
    build_motion_text,
    parse_caption_json,
)
from .registry import build_captioner

__all__ = [
    "BACKENDS",
    "CAPTION_FIELDS",
    "INSTRUCTION_TEMPLATE",
    "MOTION_TEXT_TEMPLATE",
    "STATE_FIELDS",
    "Caption",
    "CaptionResult",
    "Captioner",
    "ClipContext",
    "States",
    "build_captioner",
    "build_instruction",
    "build_motion_text",
    "parse_caption_json",
]
