"""Training the CogVideoX 3-D VAE to reconstruct: the network side (loss, reconstruction, PSNR).

The tiny presets build the frozen VAE with random weights, which cannot give pixels back, so no pixel
metric of a generated clip means anything. :func:`trainable_vae` builds the same
``AutoencoderKLCogVideoX`` that a random build of ``model.encoders.vae`` gives (so the trained folder
loads through :class:`~animegamer.models.frozen_vae.FrozenVAE` with no code change), and
:func:`reconstruction_loss` is what it trains on: L1 + MSE on pixels in [-1, 1] plus a small KL term
that keeps the posterior a usable Gaussian for the diffusion decoder. The training loop, data and
saving are in :mod:`animegamer.toy_vae`.

Pixels travel exactly as in ``FrozenVAE``: uint8 (B, T, H, W, 3) -> [-1, 1] (B, 3, T, H, W) in, the
decoder's output mapped back to [0, 1] and rounded to uint8 out.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from animegamer.config.schema import VAEConfig
from animegamer.models.frozen_vae import FrozenVAE

UINT8_MAX = 255.0


@dataclass(frozen=True)
class LossWeights:
    l1: float = 1.0
    mse: float = 1.0
    # Small enough that reconstruction wins (the posterior stays sharp), large enough that the
    # log-variance does not run off to the clamp and the latent scale stays bounded.
    kl: float = 1e-6


def trainable_vae(cfg: VAEConfig, seed: int) -> nn.Module:
    """The random ``AutoencoderKLCogVideoX`` of ``cfg`` (exactly what a random frozen build holds), in
    train mode with gradients on."""
    model = FrozenVAE(cfg, seed=seed).model  # the frozen wrapper's build; the inner model is a plain module
    model.requires_grad_(True)
    model.train()
    return model


def vae_input(video: torch.Tensor) -> torch.Tensor:
    """uint8 (B, T, H, W, 3) -> float (B, 3, T, H, W) in [-1, 1], as ``FrozenVAE.encode`` maps it."""
    if video.dtype != torch.uint8 or video.ndim != 5 or video.shape[-1] != 3:
        raise ValueError(f"expected uint8 (B, T, H, W, 3) video, got {video.dtype} {tuple(video.shape)}")
    return video.permute(0, 4, 1, 2, 3).float() / (UINT8_MAX / 2) - 1.0


def to_uint8(decoded: torch.Tensor) -> torch.Tensor:
    """Decoder output (B, 3, T, H, W) in about [-1, 1] -> uint8 (B, T, H, W, 3), as ``FrozenVAE.decode``
    followed by rounding to 8 bits."""
    unit = ((decoded.float() + 1.0) / 2.0).clamp(0.0, 1.0)
    return (unit * UINT8_MAX).round().to(torch.uint8).permute(0, 2, 3, 4, 1)


def reconstruction_loss(model: nn.Module, video: torch.Tensor, weights: LossWeights,
                        generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Loss of one batch of uint8 clips: a posterior sample (drawn with ``generator``) decoded back.

    Returns ``loss`` (the weighted sum, with grad) and its parts ``l1``, ``mse``, ``kl`` (detached).
    The KL is averaged over latent elements, so its weight does not depend on the clip size.
    """
    x = vae_input(video)
    posterior = model.encode(x).latent_dist
    noise = torch.randn(posterior.mean.shape, generator=generator, device=generator.device)
    z = posterior.mean + posterior.std * noise.to(posterior.mean.device, posterior.mean.dtype)
    x_hat = model.decode(z).sample
    l1 = (x_hat - x).abs().mean()
    mse = (x_hat - x).pow(2).mean()
    kl = 0.5 * (posterior.mean.pow(2) + posterior.var - 1.0 - posterior.logvar).mean()
    loss = weights.l1 * l1 + weights.mse * mse + weights.kl * kl
    return {"loss": loss, "l1": l1.detach(), "mse": mse.detach(), "kl": kl.detach()}


@torch.no_grad()
def reconstruct(model: nn.Module, video: torch.Tensor) -> torch.Tensor:
    """uint8 clips -> their uint8 reconstruction through the posterior mode (what precompute stores)."""
    z = model.encode(vae_input(video)).latent_dist.mode()
    return to_uint8(model.decode(z).sample)


@torch.no_grad()
def latent_moments(model: nn.Module, video: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum and sum of squares of the posterior-mode latents of a batch, and their count, for the
    scaling factor (float64 sums: thousands of batches are added up)."""
    z = model.encode(vae_input(video)).latent_dist.mode().double()
    return torch.stack([z.sum(), z.pow(2).sum()]), torch.tensor(float(z.numel()), dtype=torch.float64)


def psnr(reference: torch.Tensor, reconstruction: torch.Tensor) -> torch.Tensor:
    """Per-clip PSNR (dB) of two uint8 (B, T, H, W, 3) batches; identical clips give +inf."""
    if reference.shape != reconstruction.shape:
        raise ValueError(f"shapes differ: {tuple(reference.shape)} vs {tuple(reconstruction.shape)}")
    error = (reference.double() - reconstruction.double()).pow(2).flatten(1).mean(dim=1)
    return 10.0 * torch.log10(UINT8_MAX**2 / error)
