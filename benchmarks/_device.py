"""Helpers the GPU benchmarks share."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def building(device: str, dtype: torch.dtype):
    """Build weights directly on the device in the target dtype (a 7B model in float32 on CPU is slow)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)
