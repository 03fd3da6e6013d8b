"""Selective activation checkpointing: recompute every k-th transformer block in backward.

Full checkpointing (every block) saves the most memory and costs a whole extra forward; checkpointing
every k-th block keeps the activations of the others, trading memory back for speed. The wrapper is an
instance attribute over the block's own ``forward``, so parameter names and state dicts do not change.
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterable, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_ORIGINAL = "_animegamer_forward"


@contextlib.contextmanager
def cpu_threads(count: int):
    """Torch's CPU thread count set to ``count`` inside, restored after (per calling thread)."""
    previous = torch.get_num_threads()
    if previous != count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


def forward_state(extra: Optional[Callable[[], ContextManager]] = None) -> Callable:
    """``context_fn`` for ``torch.utils.checkpoint``: the recomputation runs with the CPU thread count its
    forward saw, inside ``extra()`` (e.g. the configured attention kernels) when given.

    Why the thread count: on CUDA, backward (and so the recomputation) runs on the autograd engine's
    device thread, whose count need not be the main thread's: Lightning lowers the main thread's for
    multi-process strategies (DeepSpeed included, one process or more). ``torch.compile`` guards on that count, so a compiled block recomputed there
    ran a second graph, compiled separately; once a batch shape led the two compilations to different
    fusions, the two saved their tensors in different orders and the checkpoint's check stopped the
    run (phase (b), 2026-12-01, ``benchmarks/compile_checkpoint_probe.py``).
    """

    def context_fn():
        threads = torch.get_num_threads()

        @contextlib.contextmanager
        def recomputing():
            with cpu_threads(threads), (extra() if extra is not None else contextlib.nullcontext()):
                yield

        return contextlib.nullcontext(), recomputing()

    return context_fn


def checkpoint_options(context_fn: Optional[Callable] = None) -> dict:
    """Keyword arguments of ``torch.utils.checkpoint.checkpoint`` for every recomputed block: non-reentrant,
    and ``context_fn`` (:func:`forward_state`) when given."""
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
    ``context_fn`` around each recomputation. Returns how many blocks are wrapped.

    The wrapper goes around whatever ``forward`` the block has now, a compiled one included
    (:func:`animegamer.models.compiling.compile_blocks`): the checkpoint stays outside the compiled
    graph, where it runs the same way whatever Dynamo supports inside one.
    """
    if every < 0:
        raise ValueError(f"every must be >= 0, got {every}")
    wrapped = 0
    for index, block in enumerate(blocks):
        if _ORIGINAL in vars(block):  # unwrap first: calling this again replaces the selection
            original = vars(block).pop(_ORIGINAL)
            if original is None:  # the class's own forward
                del block.forward
            else:
                block.forward = original
        if every and index % every == 0:
            setattr(block, _ORIGINAL, vars(block).get("forward"))
            block.forward = _recomputed(block.forward, context_fn)
            wrapped += 1
    return wrapped
