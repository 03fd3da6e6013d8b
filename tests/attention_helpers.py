"""Test helper: record the SDPA kernel orders that checkpoint recomputations enter."""
from __future__ import annotations

import contextlib


def recording_kernel_contexts(monkeypatch) -> list:
    """Patch ``attention_kernels`` where ``recompute_context`` looks it up; the returned list gets each
    order when its context is *entered* (checkpoint builds the contexts in forward, enters the
    recomputation's one in backward)."""
    import animegamer.models.attention_kernels as kernels

    entered: list = []
    real = kernels.attention_kernels

    @contextlib.contextmanager
    def recording(names, on_cuda, module=None):
        entered.append(list(names))
        with real(names, on_cuda, module):
            yield

    monkeypatch.setattr(kernels, "attention_kernels", recording)
    return entered
