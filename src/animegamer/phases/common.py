"""Pieces every phase shares: the optimiser and schedule, the step index, trainable sets."""
from __future__ import annotations

import logging
import math
from typing import Iterable

import torch
from torch import nn

from animegamer.config.schema import CONSTANT_SCHEDULE, LR_SCHEDULES, PhaseConfig
from animegamer.config.validate import choice
from animegamer.training.nonfinite import count_step
from animegamer.training.strategies import is_deepspeed_strategy, is_fsdp_strategy

log = logging.getLogger(__name__)


def compute_dtype(module: nn.Module) -> torch.dtype:
    """The dtype the module's weights compute in: float32 under autocast (bf16-mixed; FSDP casts inside
    its units), bfloat16 where an engine converted the weights themselves (DeepSpeed's bf16 mode,
    bf16-true). ``LightningModule.dtype`` misses DeepSpeed's conversion, so inputs are cast to this."""
    for param in module.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def cast_frozen(module: nn.Module, dtype: torch.dtype) -> int:
    """Hold ``module``'s frozen floating-point parameters in ``dtype`` (the trained ones keep theirs);
    returns how many were cast (``phase.frozen_bf16``)."""
    count = 0
    for param in module.parameters():
        if not param.requires_grad and param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
            count += 1
    return count


def micro_step(module, batch_idx: int) -> int:
    """The micro-batch's index in the run (optimizer steps x accumulation + position in the step):
    what a resumed run recomputes from its step alone."""
    accumulate = module.trainer.accumulate_grad_batches
    return module.global_step * accumulate + batch_idx % accumulate


def init_exports(cfg: PhaseConfig) -> list[str]:
    """The export a phase starts from (``phase.init_from``), in the model builders' list form."""
    return [cfg.init_from] if cfg.init_from else []


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


def clip_gradients(module, max_norm: float | None, max_nonfinite_in_row: int = 0) -> None:
    """Clip the trained gradients' global norm, and skip the step when it is not finite.

    ``module`` is the phase's LightningModule. Phases call this from ``configure_gradient_clipping``
    instead of Lightning's own clipping, which refuses fused AdamW under bf16-mixed (it assumes a
    gradient scaler; bf16 has none) and so crashed the first GPU step. A NaN/inf norm (a bad batch,
    a loss spike) drops every gradient, so AdamW leaves weights and moments as they were; the run
    stops once ``max_nonfinite_in_row`` steps in a row were skipped (0 = never skip, stop at once).
    Under DDP the gradients are already reduced, so every rank takes the same decision. Under DeepSpeed
    the engine holds the gradients (partitioned; ``param.grad`` is empty): it clips them to its
    ``gradient_clipping`` and skips a non-finite step itself, and the strategy counts that step
    (``strategies.rule_keeping_deepspeed``), so nothing is done here.
    """
    trainer = module._trainer
    if trainer is not None and is_deepspeed_strategy(trainer.strategy):
        return
    norm = total_grad_norm(module, max_norm)
    if norm is None:
        return
    value = float(norm)  # the step's one read of the norm: each read waits for the GPU
    finite = math.isfinite(value)
    count_step(module, finite, value, max_nonfinite_in_row)
    if not finite:
        for param in module.parameters():
            param.grad = None


def total_grad_norm(module, max_norm: float | None) -> torch.Tensor | None:
    """Global norm of the gradients (clipped to ``max_norm`` when set); FSDP shards need its own."""
    trainer = module._trainer
    strategy = trainer.strategy if trainer is not None else None
    if strategy is not None and is_fsdp_strategy(strategy):
        return strategy.model.clip_grad_norm_(max_norm or float("inf"))
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return None
    norm = torch.nn.utils.get_total_norm(grads)
    if max_norm:
        torch.nn.utils.clip_grads_with_norm_([p for p in module.parameters() if p.grad is not None], max_norm, norm)
    return norm


def lr_lambda(cfg: PhaseConfig):
    """Linear warm-up, then constant or cosine down to ``min_lr_ratio``."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == CONSTANT_SCHEDULE:
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def check_schedule(cfg: PhaseConfig) -> list[str]:
    """``phase.lr_schedule`` is one :func:`lr_lambda` follows."""
    return choice("phase.lr_schedule", cfg.lr_schedule, LR_SCHEDULES)


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
