"""Test helpers for options that need a GPU: the tiny phase (a2) config, and a pretend CUDA device
(availability, compute capability, name) for the validation passes that read them."""
from __future__ import annotations

import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config


def tiny_cfg(*overrides: str):
    """Phase (a2) at the tiny preset's sizes, random weights (as benchmarks/phase_a.py --tiny)."""
    return OmegaConf.to_object(compose_config("train", ["experiment=paper_a_joint", "model.decoder.path=''",
                                                        "phase.init_from=''", "logger=none", "model=tiny",
                                                        *overrides]))


def fake_gpu(monkeypatch, capability: tuple[int, int], name: str = "test GPU") -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
