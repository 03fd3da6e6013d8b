"""What the frozen encoders of AnimeGamer share (T5 v1.1 in :mod:`.frozen_t5`, CLIP ViT in :mod:`.frozen_clip`,
the CogVideoX 3-D VAE in :mod:`.frozen_vae`): finding their folders, the frozen base module.

Each encoder either loads weights from a local Hugging Face / diffusers folder (``cfg.path``, never a
hub download: ``local_files_only=True`` everywhere, never ``trust_remote_code``) or, when the path is
empty, builds random weights of the configured sizes. Random builds are seeded so that two processes
(the precompute stage and a training run, two ranks, a test and its rerun) build the same model; the
seed is applied inside a forked RNG so building an encoder never disturbs the caller's random stream,
and each encoder reseeds on its own so building one alone gives the same weights as building all three.

The modules stay frozen: parameters never require grad and ``train()`` is a no-op, because a parent
LightningModule calls ``.train()`` recursively and T5's dropout would otherwise switch on silently.
Outputs are computed under ``torch.no_grad`` (not ``inference_mode``: inference tensors cannot be
saved for backward, and training steps may feed these features straight into trainable layers).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch
from torch import nn



logger = logging.getLogger(__name__)

ArrayLike = Union[np.ndarray, torch.Tensor]


def find_folder(path: str, subfolders: Sequence[str], marker_files: Sequence[str]) -> Path:
    """Return ``path`` or its first pipeline-layout subfolder that holds one of ``marker_files``.

    Accepting both layouts means a single-model folder (``t5-v1_1-xxl/``) and a whole diffusers
    pipeline folder (``CogVideoX-2b/`` with ``text_encoder/``, ``tokenizer/``, ``vae/``) both work.
    """
    root = Path(path).expanduser()
    candidates = [root, *(root / name for name in subfolders)]
    for folder in candidates:
        if any((folder / marker).is_file() for marker in marker_files):
            return folder
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"none of {list(marker_files)} found in: {tried}")


def resolve_path(path: str, random_if_missing: bool, what: str) -> str:
    """Return the folder to load, or "" for a random build.

    A configured folder that does not exist is an error by default: silently training against random
    "frozen" features would waste a whole run. ``random_if_missing`` is for benchmarks only.
    """
    if not path or Path(path).expanduser().exists():
        return path
    if random_if_missing:
        logger.warning("%s: folder %s does not exist; building RANDOM weights instead", what, path)
        return ""
    raise FileNotFoundError(f"{what}: weights folder {path!r} does not exist (set path: '' for random weights)")


def check_loading_info(info: dict, folder: Path, what: str) -> None:
    """Fail on missing weights: transformers would otherwise initialise them randomly, and quietly."""
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise RuntimeError(f"{what}: {len(missing)} weights missing in {folder}, e.g. {missing[:5]}")


def as_uint8_tensor(x: ArrayLike, ndim: int, layout: str) -> torch.Tensor:
    """Accept numpy or torch uint8 pixels with a trailing RGB axis; anything else is a caller bug."""
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.ndim != ndim or t.shape[-1] != 3:
        shape = tuple(getattr(x, "shape", ()))
        dtype = getattr(x, "dtype", type(x))
        raise ValueError(f"expected uint8 {layout} with 3 channels, got {dtype} of shape {shape}")
    return t


def count_parameters(module: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once); works on meta tensors too."""
    return sum(p.numel() for p in module.parameters())


class FrozenModule(nn.Module):
    """Base of the frozen wrappers: no grads, always eval, device/dtype read off the weights."""

    from_disk: bool = False
    source: str = ""

    def _freeze(self) -> None:
        self.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> "FrozenModule":
        """Ignore ``mode``: a parent's ``.train()`` must not re-enable dropout in a frozen encoder."""
        return super().train(False)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

