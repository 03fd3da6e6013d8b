"""Classifier-free guidance on two devices: the unconditional branch on the decoder's device, the
conditional one on a replica of the decoder on a second GPU, both at once (``model.decoder.cfg_parallel``).

Each branch computes what it computes in the batched path (:class:`~animegamer.diffusion.sampler.BatchedCFG`):
the same inputs cast to the same dtype, the same timestep and flow, one sample instead of a batch of two;
the guided velocity is formed on the first device in float32. A batch of one may take other kernels than
a batch of two, so the result can differ from the batched one in the last bits (tests/test_cfg_parallel.py
measures it on the CPU).

Concurrency comes from CUDA's asynchronous launches, from one Python thread: the step queues branch 0 on
device 0 and branch 1 on device 1 with nothing in between that waits for a device (no ``.item()``, no
copy to the host). Cross-device copies wait on the device, not the host. Threads are not used: SDPA's
kernel preference (``attention_kernels``) is process-wide state that one thread's exit would reset under
the other.
"""
from __future__ import annotations

import copy
import logging
from typing import Optional, Sequence

import torch
from torch import nn

from animegamer.config.validate import ConfigError, choice
from animegamer.diffusion.cfg_parallel_setting import CFG_PARALLEL_CHOICES, CFG_PARALLEL_OFF, CFG_PARALLEL_ON, KEY
from animegamer.diffusion.sampler import DenoiseFn, VelocityPredictor, guide

logger = logging.getLogger(__name__)

CFG_DEVICES = 2  # one per guidance branch


def check_cfg_parallel(dec) -> list[str]:
    """``model.decoder.cfg_parallel``: auto | on | off (whether two GPUs are visible is checked at load)."""
    return choice(KEY, str(dec.cfg_parallel), CFG_PARALLEL_CHOICES)


def cfg_devices(setting: str, device: torch.device | str) -> Optional[tuple[torch.device, torch.device]]:
    """The two devices of the guidance branches for a decoder on ``device``, or None for one device.

    ``auto``: two when ``device`` is a CUDA device and another CUDA device is visible; ``on``: two, and a
    :class:`ConfigError` when fewer than two CUDA devices are visible or the models are not on CUDA;
    ``off``: one.
    """
    problems = choice(KEY, str(setting), CFG_PARALLEL_CHOICES)
    if problems:
        raise ConfigError(problems)
    if setting == CFG_PARALLEL_OFF:
        return None
    device = torch.device(device)
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type != "cuda" or visible < CFG_DEVICES:
        if setting == CFG_PARALLEL_ON:
            raise ConfigError([f"{KEY}=on runs the two guidance branches on two CUDA devices, but the models are "
                               f"on {device} and {visible} CUDA device(s) are visible (CUDA_VISIBLE_DEVICES); "
                               f"use {KEY}=auto or off"])
        return None
    first = device.index if device.index is not None else torch.cuda.current_device()
    second = next(i for i in range(visible) if i != first)
    return torch.device("cuda", first), torch.device("cuda", second)


def replicate(decoder: nn.Module, device: torch.device | str) -> nn.Module:
    """A frozen copy of ``decoder`` on ``device``, compiled as the original when it is a compiled
    ``MotionScopeDecoder`` (a deep copy drops ``nn.Module.compile``'s wrapper)."""
    replica = copy.deepcopy(decoder).to(device).eval().requires_grad_(False)
    transformer = getattr(replica, "transformer", None)
    cfg = getattr(replica, "cfg", None)
    if transformer is not None and cfg is not None and getattr(cfg, "compile", False):
        transformer.compile(dynamic=False, mode=cfg.compile_mode)
    logger.info("decoder replica on %s for the conditional guidance branch", device)
    return replica


class TwoDeviceCFG(VelocityPredictor):
    """Branch 0 (unconditional) on ``primary``'s device, branch 1 (conditional) on ``replica``'s device.

    ``devices``: (first, second); the latents, the representation and the flow are on the first, where
    the guided velocity is returned. Without guidance (``uncond`` None) the one branch runs on the first.
    """

    def __init__(self, primary: DenoiseFn, replica: DenoiseFn, devices: Sequence[torch.device | str]) -> None:
        if len(devices) != CFG_DEVICES:
            raise ValueError(f"TwoDeviceCFG needs {CFG_DEVICES} devices, got {list(devices)}")
        self.primary, self.replica = primary, replica
        self.devices = tuple(torch.device(d) for d in devices)
        self.uses_cuda_graphs = any(bool(getattr(f, "uses_cuda_graphs", False)) for f in (primary, replica))

    def __call__(self, latents, timestep, cond, uncond, flow, guidance, dtype):
        first, second = self.devices
        t_first = torch.full((latents.shape[0],), timestep, dtype=torch.long, device=first)
        if uncond is None:
            return self.primary(latents.to(dtype), t_first, cond.to(dtype), flow).float()
        # Device 1's inputs are copied first: a copy queued after branch 0 on device 0's stream would wait
        # for the whole of branch 0, and device 1 with it.
        x_second = latents.to(device=second, dtype=dtype)
        rep_second = cond.to(device=second, dtype=dtype)
        flow_second = None if flow is None else flow.to(second)
        t_second = torch.full((latents.shape[0],), timestep, dtype=torch.long, device=second)
        v_uncond = self.primary(latents.to(dtype), t_first, uncond.to(device=first, dtype=dtype), flow)
        v_cond = self.replica(x_second, t_second, rep_second, flow_second)
        return guide(v_uncond.float(), v_cond.to(first).float(), guidance)


def two_device_predictor(decoder: nn.Module, replica: Optional[nn.Module]) -> "nn.Module | TwoDeviceCFG":
    """What the sampler gets for a decoder and its optional replica: the decoder alone (branches batched)
    or both, one branch each."""
    if replica is None:
        return decoder
    first = next(decoder.parameters()).device
    second = next(replica.parameters()).device
    return TwoDeviceCFG(decoder, replica, (first, second))
