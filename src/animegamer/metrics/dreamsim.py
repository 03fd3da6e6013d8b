"""DreamSim character consistency (Table 1 / Table 3), only when its package and local weights exist.

DreamSim (Fu et al. 2023) needs the ``dreamsim`` package (plus torchvision and peft) and its own
checkpoint folder: the LoRA adapters and backbone weights that ``dreamsim.dreamsim(cache_dir=...)``
otherwise downloads, and for the DINO backbone a torch.hub cache of ``facebookresearch/dino``. When
any of it is missing ``load_dreamsim`` returns None and the caller reports
``unavailable(reason)``, never 0. Loading runs with downloads blocked, so a partial folder fails
instead of reaching the network.

Reported value: DreamSim *similarity* = 1 - DreamSim distance, mean over every (generated frame,
reference image) pair, so higher is better like CLIP-I. (The paper's values read that way:
reconstruction, Table 3, scores 0.7928 against 0.7403 for generated games in Table 1.)
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
from pathlib import Path
from typing import Iterator, Union

import numpy as np
import torch
import torch.hub as hub
import torch.nn.functional as F
from PIL import Image

from animegamer.metrics.common import Metric, available, unavailable

logger = logging.getLogger(__name__)

ArrayLike = Union[np.ndarray, torch.Tensor]
DREAMSIM_IMAGE_SIZE = 224
# What dreamsim.model.download_weights checks for, per dreamsim_type (dreamsim >= 0.2).
DREAMSIM_REQUIRED = {
    "ensemble": (
        "dino_vitb16_pretrain.pth", "dino_vitb16_lora",
        "open_clip_vitb16_pretrain.pth.tar", "open_clip_vitb16_lora",
        "clip_vitb16_pretrain.pth.tar", "clip_vitb16_lora",
    ),
    "dino_vitb16": ("dino_vitb16_pretrain.pth", "dino_vitb16_single_lora"),
    "open_clip_vitb32": ("open_clip_vitb32_pretrain.pth.tar", "open_clip_vitb32_single_lora"),
    "clip_vitb32": ("clip_vitb32_pretrain.pth.tar", "clip_vitb32_single_lora"),
}
# The DINO backbone comes through torch.hub.load('facebookresearch/dino:main') with hub dir = cache_dir.
DINO_HUB_FILES = ("facebookresearch_dino_main", "checkpoints/dino_vitbase16_pretrain.pth")
_PACKAGES = ("dreamsim", "torchvision", "peft")


class DreamSimScorer:
    """A loaded DreamSim model: frames -> embeddings, and the mean similarity of two frame sets."""

    def __init__(self, model: torch.nn.Module, device: Union[str, torch.device] = "cpu", batch_size: int = 16):
        self.model = model
        self.device = torch.device(device)
        self.batch_size = int(batch_size)

    @staticmethod
    def preprocess(frames: ArrayLike) -> torch.Tensor:
        """uint8 (N, H, W, 3) -> float (N, 3, 224, 224) in [0, 1]: DreamSim's own PIL bicubic squash."""
        arr = frames.cpu().numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
        if arr.ndim == 3:
            arr = arr[None]
        if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
            raise ValueError(f"expected uint8 (N, H, W, 3) frames, got {arr.dtype} {arr.shape}")
        size = (DREAMSIM_IMAGE_SIZE, DREAMSIM_IMAGE_SIZE)
        resized = [np.asarray(Image.fromarray(f).resize(size, Image.BICUBIC)) for f in arr]
        return torch.from_numpy(np.stack(resized)).permute(0, 3, 1, 2).float() / 255.0

    @torch.no_grad()
    def embeddings(self, frames: ArrayLike) -> torch.Tensor:
        """(N, D) DreamSim embeddings (float32, CPU); distance = 1 - cosine of two of them."""
        pixels = self.preprocess(frames)
        out = []
        for start in range(0, len(pixels), self.batch_size):
            emb = self.model.embed(pixels[start : start + self.batch_size].to(self.device))
            out.append(emb.reshape(-1, emb.shape[-1]).float().cpu())
        return torch.cat(out)

    def distance(self, generated_frames: ArrayLike, reference_frames: ArrayLike) -> float:
        """Mean DreamSim distance over every (generated frame, reference image) pair (0 = identical)."""
        gen = F.normalize(self.embeddings(generated_frames), dim=-1)
        ref = F.normalize(self.embeddings(reference_frames), dim=-1)
        return float((1.0 - gen @ ref.T).mean())

    def similarity(self, generated_frames: ArrayLike, reference_frames: ArrayLike) -> float:
        """1 - distance: the reported DreamSim value (higher is more consistent)."""
        return 1.0 - self.distance(generated_frames, reference_frames)


def dreamsim_missing(path: str, dreamsim_type: str = "ensemble") -> str:
    """Why DreamSim cannot be loaded from ``path`` ("" when everything it needs is there)."""
    missing_packages = [name for name in _PACKAGES if importlib.util.find_spec(name) is None]
    if missing_packages:
        return f"python package(s) {', '.join(missing_packages)} not installed"
    if dreamsim_type not in DREAMSIM_REQUIRED:
        return f"unknown dreamsim_type {dreamsim_type!r}; choose one of {sorted(DREAMSIM_REQUIRED)}"
    if not path:
        return "no DreamSim weights folder configured"
    root = Path(path).expanduser()
    if not root.is_dir():
        return f"DreamSim weights folder {path} not found"
    needed = list(DREAMSIM_REQUIRED[dreamsim_type])
    if "dino" in dreamsim_type or dreamsim_type == "ensemble":
        needed += DINO_HUB_FILES
    absent = [name for name in needed if not (root / name).exists()]
    if absent:
        return f"DreamSim weights incomplete in {path}: missing {', '.join(absent)}"
    return ""


@contextlib.contextmanager
def _no_downloads() -> Iterator[None]:
    """Make torch.hub's download / GitHub checks raise, so loading never reaches the network."""
    def refuse(*args, **kwargs):
        raise RuntimeError("network access is disabled while loading DreamSim (weights must be local)")

    saved = {name: getattr(hub, name) for name in ("download_url_to_file", "urlopen") if hasattr(hub, name)}
    try:
        for name in saved:
            setattr(hub, name, refuse)
        yield
    finally:
        for name, fn in saved.items():
            setattr(hub, name, fn)


def try_load_dreamsim(
    path: str, *, device: Union[str, torch.device] = "cpu", dreamsim_type: str = "ensemble"
) -> tuple[DreamSimScorer | None, str]:
    """(scorer, "") or (None, reason). Never downloads; a load failure is a reason, not a crash."""
    reason = dreamsim_missing(path, dreamsim_type)
    if reason:
        logger.info("DreamSim unavailable: %s", reason)
        return None, reason
    try:
        from dreamsim import dreamsim  # an optional dependency: its absence is a reason, checked above

        with _no_downloads():
            # dreamsim < 0.2 has no dreamsim_type argument (it only knows the ensemble).
            extra = {} if dreamsim_type == "ensemble" else {"dreamsim_type": dreamsim_type}
            model, _ = dreamsim(pretrained=True, device=str(device), cache_dir=str(Path(path).expanduser()), **extra)
    except Exception as exc:  # noqa: BLE001 - any failure of the optional third-party loader
        reason = f"DreamSim failed to load from {path}: {type(exc).__name__}: {exc}"
        logger.warning(reason)
        return None, reason
    return DreamSimScorer(model, device), ""


def load_dreamsim(
    path: str, *, device: Union[str, torch.device] = "cpu", dreamsim_type: str = "ensemble"
) -> DreamSimScorer | None:
    """The scorer, or None when the package or the local weights are missing (see dreamsim_missing)."""
    return try_load_dreamsim(path, device=device, dreamsim_type=dreamsim_type)[0]


def dreamsim_score(
    scorer: DreamSimScorer | None,
    generated_frames: ArrayLike,
    reference_frames: ArrayLike,
    reason: str = "DreamSim weights not available",
) -> Metric:
    """available(similarity) with a scorer, unavailable(reason) without one: never 0."""
    if scorer is None:
        return unavailable(reason)
    return available(scorer.similarity(generated_frames, reference_frames))
