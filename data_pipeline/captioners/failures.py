"""How many of a run's clips could not be captioned, why, and whether the run goes on.

After the caption steps, the run's clips are tallied per backend: failures are summarised at WARNING
(counts, the first distinct reasons, redacted, and what to check for that backend), and a run with a
smaller captioned share than ``caption.min_captioned_share`` stops with :class:`CaptionsFailedError`
(exit 2) once what it did is written, so the same command resumes it. Backend ``none`` captions
nothing by design: it is never warned about or stopped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Optional

from animegamer.errors import UserError
from animegamer.media.captions import STATUS_OK
from animegamer.utils.http import redact

from .base import BACKEND_HTTP, BACKEND_JSONL, BACKEND_NONE, BACKEND_VLM

if TYPE_CHECKING:
    from animegamer.config.schema import CaptionConfig

SETTINGS = "pipeline.caption"
SHOWN_REASONS = 3  # distinct failure reasons a summary quotes

ADVICE = {
    BACKEND_HTTP: (f"Check the server behind {SETTINGS}.url: is it up, serving {SETTINGS}.model_name, answering "
                   f"within {SETTINGS}.deadline_s (and the run within {SETTINGS}.budget_s)? The same command run "
                   f"again asks again for the failed clips only ({SETTINGS}.retry_failed)"),
    BACKEND_VLM: (f"Check the model in {SETTINGS}.model_path (an image-text-to-text model that answers the prompt "
                  f"with JSON) and {SETTINGS}.max_new_tokens; the model answers a clip the same way again, so "
                  f"change the model or a caption setting to try again"),
    BACKEND_JSONL: (f"Check that the records of the caption file ({SETTINGS}.path) name the films (file name, stem "
                    f"or path) and cover the clips' midpoints; an edited file re-captions the clips"),
    BACKEND_NONE: "Captioning is off (backend none): caption the clips later, e.g. by importing a jsonl file",
}


class CaptionsFailedError(UserError):
    """Fewer clips than ``caption.min_captioned_share`` could be captioned; what the run did is kept."""


@dataclass
class CaptionTally:
    """One backend's outcome over a run's clips: ``reasons`` maps each distinct failure reason to the
    keys of its clips, in the order first met."""

    backend: str
    clips: int = 0
    captioned: int = 0
    reasons: dict[str, list[str]] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        return self.clips - self.captioned

    def to_json(self) -> dict:
        return {"backend": self.backend, "clips": self.clips, "captioned": self.captioned, "failed": self.failed,
                "reasons": [{"reason": reason, "clips": len(keys), "first_clip": keys[0]}
                            for reason, keys in self.reasons.items()]}


def tally_captions(captions: Iterable[tuple[str, dict]],
                   secrets: Iterable[Optional[str]] = ()) -> dict[str, CaptionTally]:
    """Backend name -> its tally, from (clip key, caption fields as staged) pairs; reasons redacted
    (:func:`animegamer.utils.http.redact`, with ``secrets``)."""
    secrets = list(secrets)
    tallies: dict[str, CaptionTally] = {}
    for key, fields in captions:
        outcome = fields["captioner"]
        tally = tallies.setdefault(outcome["name"], CaptionTally(outcome["name"]))
        tally.clips += 1
        if outcome["status"] == STATUS_OK:
            tally.captioned += 1
        else:
            tally.reasons.setdefault(redact(outcome["error"], secrets), []).append(key)
    return tallies


def caption_secrets(cfg: "CaptionConfig") -> list[Optional[str]]:
    """What a failure reason must not show: the caption key from the environment (when one is named)."""
    return [os.environ.get(cfg.api_key_env)] if cfg.api_key_env else []


def summary(tally: CaptionTally) -> str:
    """Counts, the first distinct reasons and the backend's advice, on one line."""
    shown = "; ".join(f"{len(keys)} clip(s) like {keys[0]}: {reason}"
                      for reason, keys in list(tally.reasons.items())[:SHOWN_REASONS])
    more = len(tally.reasons) - SHOWN_REASONS
    more_text = f"; and {more} other reason(s)" if more > 0 else ""
    return (f"captions ({tally.backend}): {tally.failed} of {tally.clips} clips failed, {tally.captioned} captioned; "
            f"first reasons: {shown}{more_text}. {ADVICE.get(tally.backend, '')}")


def stop_reason(tallies: dict[str, CaptionTally], min_share: float) -> Optional[str]:
    """Why the run stops (None: it goes on): a backend that captioned less than ``min_share`` of its clips."""
    for tally in tallies.values():
        if tally.backend == BACKEND_NONE or not tally.clips or tally.captioned >= min_share * tally.clips:
            continue
        return (f"only {tally.captioned} of {tally.clips} clips captioned, below {SETTINGS}.min_captioned_share="
                f"{min_share:g}: {summary(tally)}. What the run did is written: run the same command again once "
                f"the cause is fixed, or set {SETTINGS}.min_captioned_share=0 to go on with uncaptioned clips")
    return None
