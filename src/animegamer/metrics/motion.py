"""ACC-F / MAE-F (Table 1, motion quality): the motion level of each generated clip, measured with the
data pipeline's own flow estimator and bins, against the level the game asked for.

``animegamer.media.flow.clip_flow`` gives the mean optical-flow magnitude (output pixels per output
frame, pixels under the threshold dropped) and ``MotionBins.level`` quantises it with the same edges
the training data was labelled with (the clip shards' manifest), so a generated clip is judged
exactly as a training clip would have been labelled.
"""
from __future__ import annotations

from typing import Mapping, Sequence, Union

import numpy as np

from animegamer.config.schema import NUM_MOTION_LEVELS, MotionConfig
from animegamer.media.flow import FlowEstimator, clip_flow, make_estimator
from animegamer.media.motion_bins import LEVELS, MotionBins


def _bins(bins: Union[MotionBins, Mapping]) -> MotionBins:
    return bins if isinstance(bins, MotionBins) else MotionBins.from_json(dict(bins))


def _motion_cfg(cfg) -> MotionConfig:
    # A plain dict (e.g. read from a manifest) becomes the dataclass; dataclass / OmegaConf pass through.
    return MotionConfig(**cfg) if isinstance(cfg, dict) else cfg


def _check_clip(clip: np.ndarray, index: int) -> np.ndarray:
    clip = np.asarray(clip)
    if clip.dtype != np.uint8 or clip.ndim != 4 or clip.shape[-1] != 3 or clip.shape[0] < 2:
        raise ValueError(f"clip {index}: expected uint8 (T>=2, H, W, 3), got {clip.dtype} {clip.shape}")
    return clip


def measure_levels(
    clips: Sequence[np.ndarray],
    bins: Union[MotionBins, Mapping],
    motion_cfg,
    estimator: FlowEstimator | None = None,
) -> tuple[list[float], list[int]]:
    """(flows, levels) of uint8 (T, H, W, 3) clips, with the pipeline's estimator and bins."""
    bins, motion_cfg = _bins(bins), _motion_cfg(motion_cfg)
    estimator = estimator or make_estimator(motion_cfg)  # built once (RAFT loads weights)
    flows = [clip_flow(_check_clip(c, i), motion_cfg, estimator) for i, c in enumerate(clips)]
    return flows, [bins.level(f) for f in flows]


def confusion_matrix(measured: Sequence[int], target: Sequence[int]) -> list[list[int]]:
    """Counts [target level - 1][measured level - 1], NUM_MOTION_LEVELS x NUM_MOTION_LEVELS."""
    matrix = np.zeros((NUM_MOTION_LEVELS, NUM_MOTION_LEVELS), dtype=np.int64)
    for m, t in zip(measured, target):
        matrix[int(t) - 1, int(m) - 1] += 1
    return matrix.tolist()


def motion_accuracy(
    generated_clips: Sequence[np.ndarray],
    target_levels: Sequence[int],
    bins: Union[MotionBins, Mapping],
    motion_cfg,
    estimator: FlowEstimator | None = None,
    requested_levels: Sequence[int] | None = None,
) -> dict:
    """ACC-F (fraction of clips at exactly the target level) and MAE-F (mean |level - target|).

    Returns {"acc_f", "mae_f", "levels" (measured), "targets", "flows", "confusion"}. With
    ``requested_levels`` (the levels a game asked its renderer for: its predicted motion level), also
    "requested" and "acc_f_requested", the fraction of clips rendered at the level they were asked for:
    the renderer's own share, apart from whether the game model asked for the true level.
    """
    if len(generated_clips) != len(target_levels):
        raise ValueError(f"{len(generated_clips)} clips but {len(target_levels)} target levels")
    if not generated_clips:
        raise ValueError("no clips to measure")
    targets = [int(t) for t in target_levels]
    requested = None if requested_levels is None else [int(r) for r in requested_levels]
    for name, values in (("target", targets), ("requested", requested or [])):
        bad = [t for t in values if t not in LEVELS]
        if bad:
            raise ValueError(f"{name} levels must be in {LEVELS}, got {bad}")
    if requested is not None and len(requested) != len(targets):
        raise ValueError(f"{len(requested)} requested levels but {len(targets)} target levels")
    flows, levels = measure_levels(generated_clips, bins, motion_cfg, estimator)
    measured, wanted = np.asarray(levels), np.asarray(targets)
    out = {
        "acc_f": float(np.mean(measured == wanted)),
        "mae_f": float(np.mean(np.abs(measured - wanted))),
        "levels": levels,
        "targets": targets,
        "flows": flows,
        "confusion": confusion_matrix(levels, targets),
    }
    if requested is not None:
        out.update(requested=requested, acc_f_requested=float(np.mean(measured == np.asarray(requested))))
    return out
