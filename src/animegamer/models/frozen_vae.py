"""The frozen CogVideoX 3-D VAE (the shared behaviour: :mod:`animegamer.models.frozen_base`)."""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from animegamer.config.schema import VAEConfig
from animegamer.models.frozen_base import (ArrayLike, FrozenModule, as_uint8_tensor, count_parameters,
                                          find_folder, resolve_path)
from animegamer.utils.randomness import seeded

logger = logging.getLogger(__name__)

# Folder name of the diffusers pipeline layout, tried after the folder itself.
_VAE_SUBFOLDERS = ("vae",)
_COGVIDEOX_DOWN_BLOCK = "CogVideoXDownBlock3D"
_COGVIDEOX_UP_BLOCK = "CogVideoXUpBlock3D"


class FrozenVAE(FrozenModule):
    """CogVideoX 3-D VAE: uint8 video <-> scaled latents in the transformer's (B, T', C, H', W') layout.

    The scale factor is read from the model's own config: CogVideoX-2b uses 1.15258426 and 5b 0.7,
    so a schema default must never override what a loaded folder says.
    """

    def __init__(
        self,
        cfg: VAEConfig,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        random_if_missing: bool = False,
    ) -> None:
        super().__init__()
        path = resolve_path(cfg.path, random_if_missing, "VAE")
        if path:
            self.model, folder = _load_vae(path, dtype)
            self.from_disk, self.source = True, str(folder)
        else:
            with seeded(seed):
                self.model = _random_vae(cfg)
            self.from_disk, self.source = False, f"random(seed={seed})"
        # nn.Module.to on the wrapper, not ModelMixin.to (which warns about fp32-pinned modules it has none of).
        self.to(dtype)  # random builds are made in float32 first, so every dtype rounds the same weights
        if cfg.tiling:
            self.model.enable_tiling()
        self.cudnn_benchmark = cfg.cudnn_benchmark
        if cfg.channels_last:
            conv3d_memory_format(self.model, torch.channels_last_3d)
        if cfg.compile:  # in place: parameter names stay; only decoding plays at a fixed shape
            self.model.decoder.compile(dynamic=False)
        configured = int(self.model.config.temporal_compression_ratio)
        if self.temporal_compression != configured:
            logger.warning(
                "VAE temporal_compression_ratio=%d but %d blocks only compress time %dx",
                configured, len(self.model.config.block_out_channels), self.temporal_compression,
            )
        self._freeze()
        logger.info(
            "VAE: %s, %d params, scaling_factor %s, compression %dx%dx%d (t x h x w)",
            self.source, count_parameters(self.model), self.scaling_factor,
            self.temporal_compression, self.spatial_compression, self.spatial_compression,
        )

    # ---- geometry, all read off the model's config
    @property
    def spatial_compression(self) -> int:
        """Every block but the last halves H and W."""
        return 2 ** (len(self.model.config.block_out_channels) - 1)

    @property
    def temporal_compression(self) -> int:
        """The first log2(ratio) downsampling blocks also halve time; the last block never downsamples."""
        levels = int(math.log2(self.model.config.temporal_compression_ratio))
        return 2 ** min(levels, len(self.model.config.block_out_channels) - 1)

    @property
    def latent_channels(self) -> int:
        return int(self.model.config.latent_channels)

    @property
    def scaling_factor(self) -> float:
        return float(self.model.config.scaling_factor)

    @property
    def _shift_factor(self) -> float:
        # CogVideoX configs have none; honoured anyway so a folder that sets one is not misread.
        shift = getattr(self.model.config, "shift_factor", None)
        return float(shift) if shift is not None else 0.0

    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """(T', C, H', W') of a clip; CogVideoX keeps the first frame alone: T' = (T - 1) / 4 + 1."""
        tc, sc = self.temporal_compression, self.spatial_compression
        if frames < 1 or (frames - 1) % tc:
            raise ValueError(f"frames must be {tc}k + 1, got {frames}")
        if height % sc or width % sc:
            raise ValueError(f"height and width must be multiples of {sc}, got {height}x{width}")
        return (frames - 1) // tc + 1, self.latent_channels, height // sc, width // sc

    # ---- encode / decode
    @torch.no_grad()
    def encode(self, video: ArrayLike, sample_seed: int | None = None) -> torch.Tensor:
        """uint8 (B, T, H, W, 3) -> scaled latents (B, T', C, H', W').

        ``sample_seed=None`` takes the posterior mode (deterministic, the default for precomputed
        features); an int draws a posterior sample from a CPU generator with that seed, so the
        draw is the same on every device.
        """
        v = as_uint8_tensor(video, 5, "(B, T, H, W, 3)")
        expected = self.latent_shape(v.shape[1], v.shape[2], v.shape[3])
        x = v.to(self.device).permute(0, 4, 1, 2, 3)  # (B, 3, T, H, W)
        x = (x.float() / 127.5 - 1.0).to(self.dtype)  # [0, 255] -> [-1, 1], scaled in float32
        dist = self.model.encode(x).latent_dist
        if sample_seed is None:
            z = dist.mode()
        else:
            z = dist.sample(generator=torch.Generator(device="cpu").manual_seed(sample_seed))
        z = (z - self._shift_factor) * self.scaling_factor  # (B, C, T', H', W')
        z = z.permute(0, 2, 1, 3, 4).contiguous()  # (B, T', C, H', W')
        if tuple(z.shape[1:]) != expected:
            raise RuntimeError(f"VAE produced latents {tuple(z.shape[1:])}, geometry says {expected}")
        return z

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Scaled latents (B, T', C, H', W') -> float video (B, T, H, W, 3) in [0, 1]."""
        if latents.ndim != 5:
            raise ValueError(f"expected latents (B, T', C, H', W'), got shape {tuple(latents.shape)}")
        z = latents.to(device=self.device, dtype=self.dtype).permute(0, 2, 1, 3, 4)  # (B, C, T', H', W')
        z = z / self.scaling_factor + self._shift_factor
        with _cudnn_benchmark(self.cudnn_benchmark):
            x = self.model.decode(z).sample  # (B, 3, T, H, W) in about [-1, 1]
        x = ((x.float() + 1.0) / 2.0).clamp(0.0, 1.0)
        return x.permute(0, 2, 3, 4, 1)  # (B, T, H, W, 3)

    forward = encode


def conv3d_memory_format(model: nn.Module, memory_format: torch.memory_format) -> None:
    """The 3-D convolutions' weights in ``memory_format``; cuDNN lays their outputs out the same way. Only
    these: the VAE's upsamplers also hold 2-D convolutions, which channels_last_3d does not apply to."""
    for module in model.modules():
        if isinstance(module, nn.Conv3d):
            module.weight.data = module.weight.data.contiguous(memory_format=memory_format)


@contextmanager
def _cudnn_benchmark(enabled: bool) -> Iterator[None]:
    """cuDNN's algorithm search switched on inside the block when ``enabled`` (restored after). The flag is
    process-wide: decodes running at the same time on other threads see it too."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = previous or enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


def _random_vae(cfg: VAEConfig) -> nn.Module:
    """CogVideoX VAE at the configured sizes; block type lists must match ``block_out_channels``."""
    from diffusers import AutoencoderKLCogVideoX

    channels = tuple(int(c) for c in cfg.block_out_channels)
    return AutoencoderKLCogVideoX(
        down_block_types=(_COGVIDEOX_DOWN_BLOCK,) * len(channels),
        up_block_types=(_COGVIDEOX_UP_BLOCK,) * len(channels),
        block_out_channels=channels,
        layers_per_block=cfg.layers_per_block,
        latent_channels=cfg.latent_channels,
        norm_num_groups=cfg.norm_num_groups,
        temporal_compression_ratio=cfg.temporal_compression_ratio,
        scaling_factor=cfg.scaling_factor,
    )


def _load_vae(path: str, dtype: torch.dtype) -> tuple[nn.Module, Path]:
    """AutoencoderKLCogVideoX from a VAE folder or a pipeline folder's vae/."""
    from diffusers import AutoencoderKLCogVideoX

    folder = find_folder(path, _VAE_SUBFOLDERS, ("config.json",))
    # diffusers raises on missing weights itself (low_cpu_mem_usage loading).
    model = AutoencoderKLCogVideoX.from_pretrained(folder, local_files_only=True, torch_dtype=dtype)
    return model, folder
