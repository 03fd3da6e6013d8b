"""Selective activation checkpointing: recompute every k-th transformer block in backward.

Full checkpointing (every block) saves the most memory and costs a whole extra forward; checkpointing
every k-th block keeps the activations of the others, trading memory back for speed. The wrapper is an
instance attribute over the block's own ``forward``, so parameter names and state dicts do not change.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_ORIGINAL = "_animegamer_forward"


def checkpoint_options(context_fn: Optional[Callable] = None) -> dict:
    """Keyword arguments of ``torch.utils.checkpoint.checkpoint`` for every recomputed block: non-reentrant,
    and ``context_fn`` (e.g. :func:`animegamer.models.attention_kernels.recompute_context`) when given."""
    return {"use_reentrant": False, **({"context_fn": context_fn} if context_fn is not None else {})}


def _recomputed(forward, context_fn: Optional[Callable]):
    options = checkpoint_options(context_fn)

    def run(*args, **kwargs):
        if torch.is_grad_enabled():  # no graph, nothing to save: inference runs the block as is
            return checkpoint(forward, *args, **options, **kwargs)
        return forward(*args, **kwargs)

    return run


def checkpoint_every(blocks: Iterable[nn.Module], every: int, context_fn: Optional[Callable] = None) -> int:
    """Recompute blocks 0, k, 2k, ... in backward (``every`` = k >= 1; 0 removes the wrappers), with
    ``context_fn`` around each recomputation. Returns how many blocks are wrapped."""
    if every < 0:
        raise ValueError(f"every must be >= 0, got {every}")
    wrapped = 0
    for index, block in enumerate(blocks):
        if hasattr(block, _ORIGINAL):  # unwrap first: calling this again replaces the selection
            del block.forward
            delattr(block, _ORIGINAL)
        if every and index % every == 0:
            setattr(block, _ORIGINAL, block.forward)
            block.forward = _recomputed(getattr(block, _ORIGINAL), context_fn)
            wrapped += 1
    return wrapped
