"""Rendering a batch of planned turns: the decoder samples their latents, the VAE decodes them into frames."""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np
import torch

from animegamer.diffusion.sampler import sample
from animegamer.diffusion.step_cache import caching
from animegamer.game.models import GameModels


class PlannedTurn(Protocol):
    """What rendering reads of a planned turn (:class:`animegamer.game.turns.TurnPlan`, which calls it)."""

    rep: torch.Tensor  # (N, D): the representation the MLLM predicted
    flow: float  # the motion scope
    seed: int  # the turn's sampler seed


def render_latents(models: GameModels, diffusion, latent_shape: Sequence[int], plans: Sequence[PlannedTurn],
                   uncond: torch.Tensor) -> torch.Tensor:
    """Decoder latents (B, T, C, H, W) of the planned turns, sampled in one batch (CFG doubles it).

    Each turn draws its noise from its own CPU generator seeded by (seed, turn): row b gets exactly
    the draws it would get sampled alone, on every device. With the step cache (``model.diffusion.cache``)
    a batch would decide together which steps to skip, so each turn is sampled alone instead: a game's
    clips never depend on which games share its batch."""
    if caching(diffusion) and len(plans) > 1:
        return torch.cat([render_latents(models, diffusion, latent_shape, [plan], uncond) for plan in plans])
    device, dtype = models.device, models.dtype
    generators = [torch.Generator(device="cpu").manual_seed(plan.seed) for plan in plans]
    shape = (len(plans), *latent_shape[1:])
    reps = torch.stack([plan.rep for plan in plans]).to(device)
    flows = torch.tensor([plan.flow for plan in plans], device=device)
    return sample(models.denoiser, shape, reps, uncond, flows, diffusion, generators, dtype=dtype)


def decode_frames(vae, latents: torch.Tensor) -> np.ndarray:
    """(B, T, H, W, 3) uint8 clips of a batch of latents, decoded one clip at a time: on an H200 the
    paper VAE's decode time grows linearly with the batch (0.76 s for 1 clip, 2.36 s for 4), so batching
    gains nothing, while a batch of 8 clips at 480x720 failed inside a 3-D convolution; one at a time,
    a game's frames are also exactly what it decodes alone."""
    clips = []
    for one in latents.split(1):
        video = vae.decode(one)  # (1, T, H, W, 3) in [0, 1]
        clips.append((video.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu())
    return torch.cat(clips).numpy()
