"""Optical flow of a clip: its mean flow magnitude, what a motion level is measured from.

Flow is estimated on frames shrunk to ``analysis_width`` and rescaled to output-resolution pixels
per output frame, so the values (and the bin edges in the manifest) do not depend on the analysis
size. Pixels moving less than ``threshold`` are dropped from the mean: a small character running
in front of a still background must still read as fast motion.
"""
from __future__ import annotations

from typing import Callable, Protocol

import cv2
import numpy as np

from animegamer.checkpoints.safe_load import load_weights_only
from animegamer.config.schema import MotionConfig

# OpenCV Farneback parameters (pyr_scale, levels, winsize, iterations, poly_n, poly_sigma, flags):
# five pyramid levels so fast motion at low resolution is still tracked.
_FARNEBACK = dict(pyr_scale=0.5, levels=5, winsize=15, iterations=3, poly_n=5, poly_sigma=1.2, flags=0)


class FlowEstimator(Protocol):
    def __call__(self, prev_gray: np.ndarray, next_gray: np.ndarray) -> np.ndarray:
        """(H, W) uint8 twice -> (H, W, 2) float flow in pixels."""


def farneback(prev_gray: np.ndarray, next_gray: np.ndarray) -> np.ndarray:
    return cv2.calcOpticalFlowFarneback(prev_gray, next_gray, None, **_FARNEBACK)


def _raft(cfg: MotionConfig) -> FlowEstimator:
    """RAFT from torchvision with local weights (torchvision is optional: not installed by default)."""
    import torch

    try:
        from torchvision.models.optical_flow import raft_large
    except ImportError as exc:  # pragma: no cover - depends on the user's environment
        raise RuntimeError("motion.estimator=raft needs torchvision installed") from exc
    model = raft_large(weights=None)
    model.load_state_dict(load_weights_only(cfg.raft_weights, mmap=False))
    model.eval()

    def estimate(prev_gray: np.ndarray, next_gray: np.ndarray) -> np.ndarray:
        # RAFT wants (1, 3, H, W) in [-1, 1] with H, W multiples of 8.
        h, w = (prev_gray.shape[0] // 8) * 8, (prev_gray.shape[1] // 8) * 8
        pair = [torch.from_numpy(g[:h, :w]).float().div(127.5).sub(1).expand(1, 3, h, w) for g in (prev_gray, next_gray)]
        with torch.no_grad():
            flow = model(*pair)[-1][0].permute(1, 2, 0).numpy()  # (2, H, W) -> (H, W, 2)
        return flow

    return estimate


ESTIMATORS: dict[str, Callable[[MotionConfig], FlowEstimator]] = {
    "farneback": lambda cfg: farneback,
    "raft": _raft,
}


def make_estimator(cfg: MotionConfig) -> FlowEstimator:
    if cfg.estimator not in ESTIMATORS:
        raise ValueError(f"unknown flow estimator {cfg.estimator!r}; choose one of {sorted(ESTIMATORS)}")
    return ESTIMATORS[cfg.estimator](cfg)


def to_analysis_gray(frames: np.ndarray, width: int) -> tuple[list[np.ndarray], float]:
    """(T, H, W, 3) RGB -> T grayscale frames at ``width``, and the factor back to input pixels."""
    _, h, w, _ = frames.shape
    scale = min(1.0, width / w)
    size = (max(8, int(round(w * scale))), max(8, int(round(h * scale))))
    grays = [cv2.resize(cv2.cvtColor(f, cv2.COLOR_RGB2GRAY), size, interpolation=cv2.INTER_AREA) for f in frames]
    return grays, w / size[0]


def clip_flow(frames: np.ndarray, cfg: MotionConfig, estimator: FlowEstimator | None = None) -> float:
    """Mean flow magnitude (output pixels per output frame) over pixels above the threshold."""
    estimator = estimator or make_estimator(cfg)
    grays, to_output = to_analysis_gray(frames, cfg.analysis_width)
    total, count = 0.0, 0
    for prev, nxt in zip(grays[:-1], grays[1:]):
        magnitude = np.linalg.norm(estimator(prev, nxt), axis=-1) * to_output
        moving = magnitude[magnitude >= cfg.threshold]
        total += float(moving.sum())
        count += moving.size
    return total / count if count else 0.0
