"""The VAE's decoding options for play (``model.encoders.vae.channels_last`` / ``compile``) on a tiny
random VAE, CPU: the options change how the decode runs, not what it returns."""
from __future__ import annotations

import dataclasses

import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.models.frozen_vae import FrozenVAE

FRAMES, HEIGHT, WIDTH = 9, 32, 48


def tiny_vae_cfg(**changes):
    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    return dataclasses.replace(cfg.vae, **changes), cfg.seed


def test_channels_last_decodes_the_same_frames():
    """fp32 on the CPU: measured bitwise equal here; the bound allows another CPU's kernels to sum in
    another order (1e-5 of the [0, 1] range, at most one 8-bit level at a rounding boundary)."""
    plain_cfg, seed = tiny_vae_cfg()
    fast_cfg, _ = tiny_vae_cfg(channels_last=True)
    plain, fast = FrozenVAE(plain_cfg, seed=seed), FrozenVAE(fast_cfg, seed=seed)
    conv3d = [m for m in fast.model.modules() if isinstance(m, torch.nn.Conv3d)]
    assert conv3d and all(m.weight.is_contiguous(memory_format=torch.channels_last_3d) for m in conv3d)
    assert all(m.weight.is_contiguous() for m in plain.model.modules() if isinstance(m, torch.nn.Conv3d))
    latents = torch.randn(1, *plain.latent_shape(FRAMES, HEIGHT, WIDTH), generator=torch.Generator().manual_seed(0))
    a, b = plain.decode(latents), fast.decode(latents)
    assert a.shape == (1, FRAMES, HEIGHT, WIDTH, 3)
    assert float((a - b).abs().max()) < 1e-5
    levels = ((a * 255).round() - (b * 255).round()).abs()
    assert float(levels.max()) <= 1
    assert float(a.std()) > 0.01  # a real picture, not a constant the options could not change


def test_compile_wraps_only_the_decoder():
    cfg, seed = tiny_vae_cfg(compile=True)
    vae = FrozenVAE(cfg, seed=seed)
    assert vae.model.decoder._compiled_call_impl is not None
    assert vae.model.encoder._compiled_call_impl is None
    plain = FrozenVAE(tiny_vae_cfg()[0], seed=seed)
    assert plain.model.decoder._compiled_call_impl is None
    # in place: the state dict (what exports and loading name) is unchanged
    assert list(vae.state_dict()) == list(plain.state_dict())
