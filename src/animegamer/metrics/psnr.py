"""PSNR of a generated (or reconstructed) clip against its ground-truth clip, on 8-bit frames.

Both clips are (T, H, W, 3) uint8 arrays as the game and the clip shards hold them; the PSNR is
``10 * log10(255^2 / MSE)`` with the MSE over every pixel of the clip (torchmetrics' implementation,
data range 255), so one clip gives one number and a benchmark reports the mean over clips in dB.
An identical clip has an infinite PSNR, which no mean survives: every value is capped at
``PSNR_CAP_DB`` (a clip identical to its truth scores exactly the cap).
"""
from __future__ import annotations

import numpy as np
import torch

from animegamer.metrics.common import Metric, available, unavailable

PIXEL_RANGE = 255.0  # 8-bit frames
# Above any lossy reconstruction: one grey level of error on every pixel is 48.1 dB, and the smallest
# non-zero error of an 8-bit clip of 16 frames of 64 x 64 (one level on one value) is 101.1 dB.
PSNR_CAP_DB = 100.0


def psnr(frames: np.ndarray, truth: np.ndarray) -> float:
    """PSNR in dB (at most ``PSNR_CAP_DB``) of ``frames`` against ``truth``, two uint8 arrays of one shape."""
    frames, truth = np.asarray(frames), np.asarray(truth)
    if frames.shape != truth.shape:
        raise ValueError(f"PSNR needs clips of one shape: generated {frames.shape}, truth {truth.shape}")
    for name, clip in (("generated", frames), ("truth", truth)):
        if clip.dtype != np.uint8:
            raise TypeError(f"PSNR reads 8-bit frames: the {name} clip is {clip.dtype}")
    # Imported here: torchmetrics' functional package loads scipy and transformers, seconds that a command
    # refused by its checks should not pay.
    from torchmetrics.functional.image import peak_signal_noise_ratio

    # float64: the difference of uint8 tensors would wrap around.
    value = peak_signal_noise_ratio(torch.from_numpy(frames).double(), torch.from_numpy(truth).double(),
                                    data_range=PIXEL_RANGE)
    return min(float(value), PSNR_CAP_DB)


def clip_psnr(frames: np.ndarray, truth: np.ndarray | None) -> Metric:
    """``psnr`` as a metric; unavailable (with the reason) without a truth clip or when the shapes differ
    (a renderer trained at another clip size than the benchmark's clips)."""
    if truth is None:
        return unavailable("no ground-truth clip")
    if np.shape(frames) != np.shape(truth):
        return unavailable(f"generated clip {tuple(np.shape(frames))} vs truth {tuple(np.shape(truth))}")
    return available(psnr(frames, truth))
