"""SDPA kernel preference, shared by the decoder and the MLLM (``model.*.attention_backends``)."""
from __future__ import annotations

import contextlib
from typing import Sequence

ATTENTION_BACKENDS = ("cudnn", "flash", "efficient", "math")  # the names configs use


def attention_kernels(names: Sequence[str], on_cuda: bool):
    """SDPA's kernels in the configured order of preference (CUDA only; CPU, or no names, keeps
    PyTorch's own choice)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not on_cuda or not names:
        return contextlib.nullcontext()
    kernels = dict(zip(ATTENTION_BACKENDS, (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                                            SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)))
    return sdpa_kernel([kernels[n] for n in names], set_priority=True)
