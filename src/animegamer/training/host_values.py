"""Numbers for ``LightningModule.log`` that stay on the host.

Lightning turns a Python number into a tensor on the module's device: a copy from pageable memory, which
makes the host wait until the GPU's queue reaches it. ``trainer.sync_debug`` counted 8 such waits a step
from the throughput metrics alone on one H200 (11.2 waits a step in all, 3.2 without them). A CPU tensor is
logged where it is: no copy, no wait. No step got faster on one device: ``Throughput`` synchronises at
each step's bounds anyway, to time each step exactly. These values are logged without ``sync_dist``: NCCL
would refuse CPU tensors.
"""
from __future__ import annotations

from typing import Mapping

import torch


def host_scalar(value: float) -> torch.Tensor:
    """``value`` as a float64 CPU tensor (float64: Lightning keeps it as given; counts stay exact)."""
    return torch.tensor(float(value), dtype=torch.float64)


def host_scalars(metrics: Mapping[str, float]) -> dict[str, torch.Tensor]:
    return {name: host_scalar(value) for name, value in metrics.items()}
