"""The latent-space speed check: known translations of a smooth random latent clip are measured back."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from animegamer.metrics.latent_motion import clip_speed, frame_shift, latent_motion, shifted


def _moving(speed: float, frames: int = 5, width: int = 24, seed: int = 0) -> torch.Tensor:
    """(frames, 4, 8, width): a smooth texture moving left by ``speed`` px per frame."""
    g = torch.Generator().manual_seed(seed)
    canvas = torch.randn(4, 8, width * 3, generator=g)
    canvas = F.avg_pool2d(F.pad(canvas[None], (1, 1, 1, 1), mode="circular"), 3, 1)[0]
    return torch.stack([shifted(canvas, -speed * t)[..., :width] for t in range(frames)])


@pytest.mark.parametrize("speed", [0.0, 0.25, 0.8, 2.0, 4.5])
def test_known_speeds_are_measured_back(speed: float) -> None:
    assert clip_speed(_moving(speed)) == pytest.approx(speed, abs=0.13)


def test_direction_is_signed_per_pair_and_speed_is_its_magnitude() -> None:
    clip = _moving(2.0)
    assert frame_shift(clip[1], clip[2]) == pytest.approx(-2.0, abs=0.13)
    assert clip_speed(clip.flip(0)) == pytest.approx(2.0, abs=0.13)  # the same clip played backwards


def test_ratio_compares_generated_with_true_clips_and_bad_shapes_are_refused() -> None:
    still = [_moving(0.0, seed=s) for s in range(2)]
    moving = [_moving(2.0, seed=s) for s in range(2)]
    assert latent_motion(still, moving)["ratio"] == pytest.approx(0.0, abs=0.05)
    assert latent_motion(moving, moving)["ratio"] == pytest.approx(1.0)
    assert latent_motion(moving, still)["ratio"] is None  # nothing true to compare with
    assert "too short or narrow" in latent_motion([torch.zeros(5, 4, 8, 12)], moving[:1])["reason"]
    with pytest.raises(ValueError, match="latent clip"):
        clip_speed(torch.zeros(1, 4, 8, 24))
    with pytest.raises(ValueError, match="no columns"):
        frame_shift(torch.zeros(4, 8, 12), torch.zeros(4, 8, 12))
