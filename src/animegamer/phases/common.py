"""Pieces every phase shares: the optimiser and schedule, step-seeded randomness, trainable sets."""
from __future__ import annotations

import logging
import math
from typing import Iterable

import torch
from torch import nn

from animegamer.config.schema import PhaseConfig

log = logging.getLogger(__name__)

LR_SCHEDULES = ("constant", "cosine")


def step_seed(seed: int, step: int, rank: int) -> int:
    """A seed that depends only on (seed, step, rank)."""
    return ((seed * 1_000_003 + step) * 1_009 + rank) % 2**63


def step_generator(seed: int, step: int, rank: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator that depends only on (seed, step, rank).

    All randomness of a training step (timesteps, noise, CFG dropout) comes from it, so a resumed
    run redraws exactly what the uninterrupted run drew, with no RNG state in the checkpoint.
    """
    generator = torch.Generator(device=device)
    generator.manual_seed(step_seed(seed, step, rank))
    return generator


def set_trainable(module: nn.Module, names: Iterable[str]) -> list[str]:
    """Freeze everything, then unfreeze exactly ``names``; returns them sorted. Unknown names raise."""
    wanted = set(names)
    params = dict(module.named_parameters())
    missing = wanted - params.keys()
    if missing:
        raise KeyError(f"no such parameters: {sorted(missing)[:5]} ...")
    for name, param in params.items():
        param.requires_grad_(name in wanted)
    return sorted(wanted)


def keep_trained(checkpoint: dict, trainable: Iterable[str], prefix: str = "model.") -> None:
    """Drop frozen weights from a Lightning checkpoint: they are rebuilt from the config on resume."""
    keep = set(trainable)
    checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k.removeprefix(prefix) in keep}


def trainable_names(module: nn.Module) -> list[str]:
    return sorted(n for n, p in module.named_parameters() if p.requires_grad)


def clip_gradients(module: nn.Module, max_norm: float | None) -> None:
    """Clip the trainable gradients' global norm.

    Phases call this from ``configure_gradient_clipping`` instead of Lightning's own clipping, which
    refuses fused AdamW under bf16-mixed (it assumes a gradient scaler; bf16 has none) and so crashed
    the first GPU step.
    """
    if max_norm:
        torch.nn.utils.clip_grad_norm_([p for p in module.parameters() if p.grad is not None], max_norm)


def lr_lambda(cfg: PhaseConfig):
    """Linear warm-up, then constant or cosine down to ``min_lr_ratio``."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def make_optimizer(module: nn.Module, cfg: PhaseConfig) -> dict:
    """AdamW over the trainable parameters (fused kernels on GPU), weight decay off for 1-D tensors."""
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    decay = [p for n, p in params if p.ndim > 1]
    no_decay = [p for n, p in params if p.ndim <= 1]
    fused = all(p.is_cuda for _, p in params) and bool(params)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused or None,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
