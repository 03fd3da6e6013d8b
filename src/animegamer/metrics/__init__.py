"""The paper's evaluation metrics (Table 1 / Table 3), computed; :mod:`animegamer.evaluation.report` shows them.

* ``clip_scores``: ``ClipScorer`` (CLIP-I, CLIP-T, CLIP-T^E) from a local CLIP folder or random.
* ``dreamsim``: DreamSim similarity, only with the ``dreamsim`` package and local weights.
* ``motion``: ACC-F / MAE-F with the data pipeline's own flow estimator and motion bins.
* ``states``: ACC-S / MAE-S over the ML / SC / ET / ST state values.
* ``psnr``: PSNR of a generated or reconstructed clip against its ground-truth clip (8-bit frames).
* ``baselines``: majority-class and copy-the-last-turn states, the shuffled-representation derangement.

Every model-based metric is ``available(value)`` or ``unavailable(reason)`` (value None, never 0).
Heavy modules (transformers, cv2, matplotlib) load only when their names are first used.
"""
from __future__ import annotations

import importlib

from animegamer.metrics.common import (
    Metric,
    as_metric,
    available,
    format_metric,
    is_metric,
    mean_metric,
    metric_value,
    unavailable,
)
from animegamer.metrics.states import STATE_KEYS, state_accuracy

_LAZY = {
    "ClipScorer": "animegamer.metrics.clip_scores",
    "try_load_clip": "animegamer.metrics.clip_scores",
    "DreamSimScorer": "animegamer.metrics.dreamsim",
    "dreamsim_missing": "animegamer.metrics.dreamsim",
    "dreamsim_score": "animegamer.metrics.dreamsim",
    "load_dreamsim": "animegamer.metrics.dreamsim",
    "try_load_dreamsim": "animegamer.metrics.dreamsim",
    "confusion_matrix": "animegamer.metrics.motion",
    "measure_levels": "animegamer.metrics.motion",
    "motion_accuracy": "animegamer.metrics.motion",
    "clip_psnr": "animegamer.metrics.psnr",
    "psnr": "animegamer.metrics.psnr",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Metric",
    "STATE_KEYS",
    "as_metric",
    "available",
    "format_metric",
    "is_metric",
    "mean_metric",
    "metric_value",
    "state_accuracy",
    "unavailable",
    *_LAZY,
]
