"""SDPA kernel preference, shared by the decoder and the MLLM (``model.*.attention_backends``)."""
from __future__ import annotations

import contextlib
from typing import Callable, Optional, Sequence

from torch import nn

ATTENTION_BACKENDS = ("cudnn", "flash", "efficient", "math")  # the names configs use
ON_CUDA = "_attention_inputs_on_cuda"  # module attribute: did the last forward run on CUDA inputs


def attention_kernels(names: Sequence[str], on_cuda: bool, module: Optional[nn.Module] = None):
    """SDPA's kernels in the configured order of preference (CUDA only; CPU, or no names, keeps
    PyTorch's own choice). ``module``: remember ``on_cuda`` there for :func:`recompute_context`."""
    if module is not None:
        setattr(module, ON_CUDA, on_cuda)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not on_cuda or not names:
        return contextlib.nullcontext()
    kernels = dict(zip(ATTENTION_BACKENDS, (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                                            SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)))
    return sdpa_kernel([kernels[n] for n in names], set_priority=True)


def recompute_context(names: Sequence[str], module: nn.Module) -> Optional[Callable]:
    """``context_fn`` for ``torch.utils.checkpoint`` (``None`` when ``names`` is empty).

    A checkpointed block recomputes its forward during backward, outside the ``attention_kernels``
    block its first forward ran in; without this the recomputation would pick PyTorch's own kernel,
    and a kernel that saves other tensors than the first one fails the checkpoint's check. Eager only:
    under ``torch.compile`` the kernel is chosen when the graph is traced, and ``context_fn`` must be
    a dispatch mode there.
    """
    if not names:
        return None

    def context_fn():
        # where the forward's inputs were (set by the module as it enters attention_kernels)
        return contextlib.nullcontext(), attention_kernels(names, getattr(module, ON_CUDA, False))

    return context_fn
