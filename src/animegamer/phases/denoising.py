"""The denoising training loss both decoder phases share: draw t and noise, noise the latents,
predict the velocity, CogVideoX's loss. Only what the decoder is conditioned on differs."""
from __future__ import annotations

from typing import Callable

import torch

from animegamer.diffusion.loss import add_noise, cogvideox_v_loss
from animegamer.utils.randomness import SampleRandom

# Validation timesteps: fixed, so the validation loss is comparable from step to step.
VAL_TIMESTEPS = (100, 300, 500, 700, 900)

Denoiser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x_t, t) -> velocity


def denoising_loss(denoise: Denoiser, latents: torch.Tensor, draw: SampleRandom,
                   alphas_cumprod: torch.Tensor, num_train_timesteps: int, dtype: torch.dtype,
                   t: torch.Tensor | None = None) -> torch.Tensor:
    """Loss of ``denoise`` on clean ``latents`` (B, T, C, H, W); ``t`` drawn uniformly unless given."""
    latents = latents.float()
    if t is None:
        t = draw.randint(num_train_timesteps)
    t = t.to(latents.device)
    noise = draw.randn(tuple(latents.shape[1:])).to(latents.device)  # no-op when drawn on the device
    x_t = add_noise(latents, noise, t, alphas_cumprod)
    return cogvideox_v_loss(denoise(x_t.to(dtype), t), latents, x_t, t, alphas_cumprod)


def validation_draw(seed: int, t_value: int, batch_idx: int, batch_size: int, device) -> SampleRandom:
    """Fixed noise per (timestep, validation sample): the validation curve compares like with like."""
    return SampleRandom(seed * 1_000 + t_value, range(batch_idx * batch_size, (batch_idx + 1) * batch_size), device)


class AlphasCumprod:
    """alpha_bar on the module's device, kept in float64 (not a buffer: Lightning's bf16-true would
    cast it, and alpha_bar_0 = 0.9975 rounds to 1.0)."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values

    def on(self, device: torch.device) -> torch.Tensor:
        if self.values.device != device:
            self.values = self.values.to(device)
        return self.values
