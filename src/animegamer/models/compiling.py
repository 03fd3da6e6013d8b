"""Regional compilation: ``torch.compile`` each transformer block rather than the whole model.

Blocks share one code object, so Dynamo compiles a block once and reuses the graph for every layer
(parameters enter as inputs), in seconds rather than the minutes of a whole 7B graph. The block's
``forward`` is replaced by its compiled self (an instance attribute), so parameter names and state
dicts do not change, hooks and activation checkpointing (:mod:`.recompute`) wrap the compiled call
from outside, and the Python and launch overhead of each block's many small kernels (norms, rotary,
LoRA branches) is fused away. ``dynamic=True``: training batches change their padded length from step
to step.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


def compile_blocks(blocks: Iterable[nn.Module], dynamic: bool = True) -> int:
    """Compile every block's ``forward`` in place; returns how many were compiled."""
    count = 0
    for block in blocks:
        block.forward = torch.compile(block.forward, dynamic=dynamic)
        count += 1
    return count
