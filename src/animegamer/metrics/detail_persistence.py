"""Whether a clip's fine detail moves with its content or stays fixed to the screen.

A renderer can move a clip's coarse content (what a latent pixel holds) and still paint the detail finer
than that at the same screen positions in every frame, where its sampling noise put it ("texture
sticking"). The optical flow the pipeline measures then follows the still detail and reads far less speed
than the latents move. The persistence of fine detail tells the two apart: the correlation, over the
frame, of the detail finer than ``sigma`` (the frame minus its Gaussian blur) between the first and the last
frame. A panning clip's detail leaves its place within a few pixels of travel (near 0); detail fixed to the
screen keeps it (near 1), as does a still clip.

Measured on frames (``sigma``: one latent pixel in output pixels, the VAE's spatial compression) and on
latents (``sigma`` in latent pixels, each channel apart), it says on which side of the VAE the detail stops
moving.
"""
from __future__ import annotations

import cv2
import numpy as np
import torch


def _fine(image: np.ndarray, sigma: float) -> np.ndarray:
    """``image`` (H, W) minus its Gaussian blur at ``sigma`` px: the detail finer than ``sigma``, mean 0."""
    image = image.astype(np.float32)
    detail = image - cv2.GaussianBlur(image, (0, 0), sigma)
    return detail - detail.mean()


def fine_detail_correlation(first: np.ndarray, last: np.ndarray, sigma: float) -> float:
    """Pearson's correlation of the fine detail of two equally shaped stacks of images (..., H, W), each image
    filtered apart, pooled over all of them. ValueError when either holds no fine detail at all."""
    if first.shape != last.shape or first.ndim < 2:
        raise ValueError(f"expected two equally shaped image stacks (..., H, W), got {first.shape} and {last.shape}")
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    a, b = (np.stack([_fine(x, sigma) for x in stack.reshape(-1, *stack.shape[-2:])]).astype(np.float64)
            for stack in (first, last))
    scale = float(np.sqrt((a ** 2).sum() * (b ** 2).sum()))
    if scale == 0:
        raise ValueError("a frame without fine detail: its persistence is undefined")
    return float((a * b).sum() / scale)


def frame_persistence(frames: np.ndarray, sigma: float) -> float:
    """Fine-detail persistence of uint8 frames (T, H, W, 3), on their luma, first frame against last."""
    if frames.ndim != 4 or frames.shape[0] < 2 or frames.shape[-1] != 3:
        raise ValueError(f"expected RGB frames (T >= 2, H, W, 3), got shape {frames.shape}")
    first, last = (cv2.cvtColor(np.ascontiguousarray(frames[i]), cv2.COLOR_RGB2GRAY) for i in (0, -1))
    return fine_detail_correlation(first, last, sigma)


def latent_persistence(latents: torch.Tensor, sigma: float = 1.0) -> float:
    """Fine-detail persistence of one latent clip (T', C, H, W), every channel filtered apart, first latent
    frame against last."""
    if latents.ndim != 4 or latents.shape[0] < 2:
        raise ValueError(f"expected one latent clip (T' >= 2, C, H, W), got shape {tuple(latents.shape)}")
    values = latents.detach().float().cpu().numpy()
    return fine_detail_correlation(values[0], values[-1], sigma)
