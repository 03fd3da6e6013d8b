"""FlashAttention-4's kernels in the form PyTorch's FA4 adapter calls them.

PyTorch (2.11 onwards) ships an adapter, ``torch.nn.attention._fa4``, that fills SDPA's flash kernel
with the ``_flash_attn_fwd`` / ``_flash_attn_bwd`` functions of a module it imports by name, and
unpacks them as ``out, lse`` and ``dq, dk, dv``. flash-attn-4's own functions now return more
(forward: also the probabilities, row maxima and a low-precision output of its MLA paths, ``None``
here), so the adapter fails with "too many values to unpack" when pointed at ``flash_attn.cute``
itself. This module is what ``attention_kernels.activate_fa4`` points it at instead: the same kernels,
the first results only. Imported on the GPU only, once FA4 is asked for.
"""
from __future__ import annotations

from flash_attn.cute import interface

FORWARD_RESULTS = 2  # out, logsumexp
BACKWARD_RESULTS = 3  # dq, dk, dv


def _flash_attn_fwd(*args, **kwargs):
    return tuple(interface._flash_attn_fwd(*args, **kwargs)[:FORWARD_RESULTS])


def _flash_attn_bwd(*args, **kwargs):
    return tuple(interface._flash_attn_bwd(*args, **kwargs)[:BACKWARD_RESULTS])
