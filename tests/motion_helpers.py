"""Synthetic clips whose motion is known: a smooth texture translated by whole pixels per frame."""
from __future__ import annotations

import numpy as np


def smooth_texture(height: int, width: int, seed: int = 0, cutoff: float = 0.08) -> np.ndarray:
    """Low-passed noise, periodic by construction (FFT), so np.roll shifts it without a seam.
    ``cutoff``: the Gaussian low-pass's width in cycles per pixel (smaller: coarser texture)."""
    rng = np.random.default_rng(seed)
    spectrum = np.fft.fft2(rng.standard_normal((height, width)))
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.fftfreq(width)[None, :]
    image = np.real(np.fft.ifft2(spectrum * np.exp(-(fx**2 + fy**2) / (2 * cutoff**2))))
    gray = ((image - image.min()) / (image.max() - image.min()) * 255).round().astype(np.uint8)
    return np.stack([gray, np.roll(gray, 7, axis=0), 255 - gray], axis=-1)  # (H, W, 3)


def shifted_clip(texture: np.ndarray, pixels_per_frame: int, frames: int = 9) -> np.ndarray:
    """(frames, H, W, 3): the texture moved right by ``pixels_per_frame`` each frame."""
    return np.stack([np.roll(texture, pixels_per_frame * i, axis=1) for i in range(frames)])
