"""The ``none`` backend: clips are cut now and captioned later (e.g. by importing a jsonl file)."""
from __future__ import annotations

from .base import BACKEND_NONE, CaptionResult, ClipContext

DISABLED_REASON = "captioning disabled"
NONE_VERSION = "0"


class NoneCaptioner:
    """Marks every clip as failed with :data:`DISABLED_REASON`, so no clip looks captioned by accident."""

    name = BACKEND_NONE
    version = NONE_VERSION
    needs_frames = False

    def caption(self, ctx: ClipContext) -> CaptionResult:
        return CaptionResult.failure(DISABLED_REASON, self.name, self.version, attempts=0)
