"""The frozen CLIP ViT vision tower of the first frame (the shared behaviour: :mod:`animegamer.models.frozen_base`)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from animegamer.config.schema import ClipVisionConfig
from animegamer.models.frozen_base import (ArrayLike, FrozenModule, as_uint8_tensor, check_loading_info,
                                          count_parameters, find_folder, resolve_path)
from animegamer.utils.randomness import seeded

logger = logging.getLogger(__name__)

# Folder name of the diffusers pipeline layout, tried after the folder itself.
_CLIP_SUBFOLDERS = ("image_encoder",)


class FrozenClipVision(FrozenModule):
    """CLIP ViT vision tower: penultimate-layer patch tokens, CLS dropped (paper: 196 x 768).

    The penultimate layer (``hidden_states[-2]``) is used because the last block is tuned towards
    the pooled contrastive embedding and carries less spatial detail (as in LLaVA/IP-Adapter).
    """

    def __init__(
        self,
        cfg: ClipVisionConfig,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        random_if_missing: bool = False,
    ) -> None:
        super().__init__()
        path = resolve_path(cfg.path, random_if_missing, "CLIP")
        if path:
            self.model, folder = _load_clip(path, dtype)
            self.from_disk, self.source = True, str(folder)
        else:
            with seeded(seed):
                self.model = _random_clip(cfg)
            self.from_disk, self.source = False, f"random(seed={seed})"
        self.to(dtype)  # random builds are made in float32 first, so every dtype rounds the same weights
        self.image_size = int(self.model.config.image_size)
        self.patch_size = int(self.model.config.patch_size)
        self._freeze()
        logger.info("CLIP vision: %s, %d params", self.source, count_parameters(self.model))

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def preprocess(self, frames: ArrayLike) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> float32 (B, 3, S, S), as CLIPImageProcessor (PIL backend) does it.

        Shorter side resized to S (bicubic), center crop, [0, 1], CLIP mean/std. Runs on the frames'
        device (so on GPU for GPU tensors) and agrees with PIL to one uint8 level, see _pil_bicubic.
        """
        s = self.image_size
        x = as_uint8_tensor(frames, 4, "(B, H, W, 3)").permute(0, 3, 1, 2).float()  # (B, 3, H, W)
        new_h, new_w = _shortest_edge_size(x.shape[-2], x.shape[-1], s)
        x = _pil_bicubic(x, new_h, new_w)  # (B, 3, new_h, new_w), integer-valued in [0, 255]
        top, left = (new_h - s) // 2, (new_w - s) // 2  # CLIPImageProcessor's floor split
        x = x[..., top : top + s, left : left + s] / 255.0  # (B, 3, S, S)
        mean, std = _clip_mean_std(x.device)  # (1, 3, 1, 1) each, float32
        return (x - mean) / std

    @torch.no_grad()
    def encode(self, frames: ArrayLike) -> torch.Tensor:
        """uint8 frames (B, H, W, 3) -> (B, (S / patch)^2, hidden) penultimate-layer patch tokens."""
        frames = as_uint8_tensor(frames, 4, "(B, H, W, 3)").to(self.device)
        pixels = self.preprocess(frames).to(self.dtype)
        out = self.model(pixel_values=pixels, output_hidden_states=True)
        tokens = out.hidden_states[-2]  # (B, 1 + N, hidden): CLS first
        return tokens[:, 1:]  # (B, N, hidden)

    forward = encode


def _clip_mean_std(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """CLIP's normalisation constants from transformers (never typed in), shaped (1, 3, 1, 1).

    Not buffers: a module-wide ``.to(bfloat16)`` would round them, and preprocessing stays float32.
    """
    from transformers.utils.constants import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    def as_tensor(values: Sequence[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device).view(1, 3, 1, 1)

    return as_tensor(OPENAI_CLIP_MEAN), as_tensor(OPENAI_CLIP_STD)


def _pil_bicubic(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """PIL's bicubic resize of uint8 images, in float on any device.

    torch's antialiased bicubic uses PIL's filter (a = -0.5, support scaled by the downscale
    factor); what differs is that PIL runs the horizontal pass, stores it as uint8 (clipping the
    overshoot and rounding), then runs the vertical pass. Two passes with the same rounding agree
    with PIL to one uint8 level; a single float pass is off by up to ~20 levels on sharp edges.
    """
    x = F.interpolate(x, size=(x.shape[-2], width), mode="bicubic", align_corners=False, antialias=True)
    x = x.clamp(0, 255).round()  # (B, C, H, width): PIL's uint8 intermediate image
    x = F.interpolate(x, size=(height, width), mode="bicubic", align_corners=False, antialias=True)
    return x.clamp(0, 255).round()  # (B, C, height, width)


def _shortest_edge_size(height: int, width: int, size: int) -> tuple[int, int]:
    """(h, w) with the shorter side = size and the longer one floored, as transformers computes it."""
    if height <= width:
        return size, int(size * width / height)
    return int(size * height / width), size


def _random_clip(cfg: ClipVisionConfig) -> nn.Module:
    """CLIP vision tower at the configured sizes; GELU as in OpenCLIP's laion2b ViT-B/16 (the paper's)."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        hidden_act="gelu",
    )
    return CLIPVisionModel(config)


def _load_clip(path: str, dtype: torch.dtype) -> tuple[nn.Module, Path]:
    """CLIPVisionModel from a vision-only folder, a full CLIPModel folder or a pipeline's image_encoder/."""
    from transformers import CLIPVisionModel

    folder = find_folder(path, _CLIP_SUBFOLDERS, ("config.json",))
    model, info = CLIPVisionModel.from_pretrained(
        folder, local_files_only=True, dtype=dtype, output_loading_info=True
    )
    check_loading_info(info, folder, "CLIP")
    return model, folder
