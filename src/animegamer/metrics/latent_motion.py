"""How far the content of a latent clip moves sideways between latent frames, measured on the latents
themselves: a check on ACC-F that does not go through the VAE's decoder and the optical-flow estimator
(a washed-out generated texture shows less pixel flow than it moves).

The shift between two latent frames is the horizontal translation, searched on a grid of sub-pixel
steps, that best maps one onto the next (mean squared difference over the columns both frames keep).
A causal VAE encodes the first frame alone, so the first pair spans fewer frames than the others and is
skipped when there are more.
"""
from __future__ import annotations

import math

import torch

MAX_SHIFT = 6.0  # latent px per latent frame searched either way (the fastest known-answer pan: ~4.6)
SHIFT_STEP = 0.125


def shifted(frame: torch.Tensor, shift: float) -> torch.Tensor:
    """``frame`` (..., W) moved right by ``shift`` px (wrapping), linear between whole-pixel shifts."""
    whole = math.floor(shift)
    frac = shift - whole
    return torch.roll(frame, whole, -1) * (1 - frac) + torch.roll(frame, whole + 1, -1) * frac


def _margin(max_shift: float) -> int:
    """Columns at each side that a wrapped shift of up to ``max_shift`` px fills: left out of comparisons."""
    return math.ceil(max_shift)


def frame_shift(first: torch.Tensor, second: torch.Tensor, max_shift: float = MAX_SHIFT,
                step: float = SHIFT_STEP) -> float:
    """The horizontal shift (latent px, + to the right) that best maps ``first`` (C, H, W) onto ``second``;
    compared away from the ``ceil(max_shift)`` columns at each side that a wrapped shift would fill."""
    margin = _margin(max_shift)
    width = first.shape[-1]
    if width <= 2 * margin:
        raise ValueError(f"latent width {width} leaves no columns to compare at a search of +-{max_shift} px")
    candidates = torch.arange(-max_shift, max_shift + step / 2, step)
    inner = slice(margin, width - margin)
    errors = torch.stack([(shifted(first, float(s))[..., inner] - second[..., inner]).float().square().mean()
                          for s in candidates])
    return float(candidates[int(errors.argmin())])


def clip_speed(latents: torch.Tensor, max_shift: float = MAX_SHIFT) -> float:
    """The mean absolute sideways speed (latent px per latent frame) of one latent clip (T', C, H, W)."""
    if latents.ndim != 4 or latents.shape[0] < 2:
        raise ValueError(f"expected one latent clip (T' >= 2, C, H, W), got shape {tuple(latents.shape)}")
    first = 1 if latents.shape[0] > 2 else 0  # the causal VAE's first latent frame is one frame alone
    shifts = [frame_shift(latents[t], latents[t + 1], max_shift) for t in range(first, latents.shape[0] - 1)]
    return abs(sum(shifts) / len(shifts))


def latent_motion(generated: list[torch.Tensor], truth: list[torch.Tensor]) -> dict:
    """Per clip, the sideways speed of the generated latents and of the clip's own (true) latents, and the
    ratio of their means (1: the generated clips move as far as the true ones; 0: still). Latents too
    narrow or too short to measure give no speeds and the reason."""
    narrow = [tuple(x.shape) for x in (*generated, *truth) if x.ndim != 4 or x.shape[0] < 2
              or x.shape[-1] <= 2 * _margin(MAX_SHIFT)]
    if narrow:
        return {"generated": [], "truth": [], "ratio": None,
                "reason": f"latents of shape {narrow[0]} (T', C, H, W) are too short or narrow to measure"}
    gen = [clip_speed(x) for x in generated]
    true = [clip_speed(x) for x in truth]
    mean_true = sum(true) / len(true) if true else 0.0
    return {"generated": gen, "truth": true,
            "ratio": (sum(gen) / len(gen)) / mean_true if gen and mean_true > 0 else None}
