"""The frozen encoders of AnimeGamer a run builds by name: T5 v1.1 (motion text, :mod:`.frozen_t5`), CLIP ViT
(first frame, :mod:`.frozen_clip`), the CogVideoX 3-D VAE (:mod:`.frozen_vae`); what they share, seeding and
freezing included, is in :mod:`.frozen_base`."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence, Union

import torch

from animegamer.config.schema import EncodersConfig
from animegamer.models.frozen_base import FrozenModule
from animegamer.models.frozen_clip import FrozenClipVision
from animegamer.models.frozen_t5 import FrozenT5
from animegamer.models.frozen_vae import FrozenVAE

logger = logging.getLogger(__name__)

ENCODER_NAMES = ("t5", "clip", "vae")


@dataclass
class FrozenEncoders:
    """The frozen encoders one stage asked for; the others stay None."""

    t5: FrozenT5 | None = None
    clip: FrozenClipVision | None = None
    vae: FrozenVAE | None = None


def build_frozen_encoders(
    cfg: EncodersConfig,
    device: Union[str, torch.device] = "cpu",
    dtype: torch.dtype = torch.float32,
    which: Sequence[str] = ENCODER_NAMES,
    random_if_missing: bool = False,
) -> FrozenEncoders:
    """Build the encoders named in ``which``, frozen, in eval mode, on ``device`` in ``dtype``.

    Random builds use ``cfg.seed``. ``random_if_missing`` turns a configured-but-absent folder into
    a random build (benchmarks on machines without checkpoints); off by default, see resolve_path.
    """
    if isinstance(which, str):
        which = (which,)
    unknown = sorted(set(which) - set(ENCODER_NAMES))
    if unknown:
        raise ValueError(f"unknown encoders {unknown}; choose from {ENCODER_NAMES}")
    classes = {"t5": (FrozenT5, cfg.t5), "clip": (FrozenClipVision, cfg.clip), "vae": (FrozenVAE, cfg.vae)}
    built: dict[str, FrozenModule] = {}
    for name in ENCODER_NAMES:
        if name not in which:
            continue
        cls, sub_cfg = classes[name]
        encoder = cls(sub_cfg, seed=cfg.seed, dtype=dtype, random_if_missing=random_if_missing)
        encoder.to(device=device, dtype=dtype)
        encoder.eval()
        encoder.requires_grad_(False)
        built[name] = encoder
    loaded = [n for n, e in built.items() if e.from_disk]
    random = [n for n, e in built.items() if not e.from_disk]
    logger.info("frozen encoders: loaded from disk %s, random %s (seed %d)", loaded, random, cfg.seed)
    return FrozenEncoders(**built)
