"""FSDP saves gather only what they keep (``animegamer.training.fsdp_gather``).

An H200 x2 run of phase (b) under FSDP spent about 75 s per checkpoint: the export gathered the whole
7B float32 model to host memory on every rank, and Lightning's full state dict once more on rank 0,
only to keep the LoRA and projections. Now only rank 0 unshards, and only trained tensors are copied.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_fsdp_compute import _cfg

from animegamer.training import fsdp_gather
from animegamer.training.strategies import is_fsdp_strategy, make_strategy

DRIVER = Path(__file__).with_name("fsdp_gather_driver.py")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp_gather")
    done = subprocess.run([sys.executable, str(DRIVER), str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_rank0_gets_the_trained_weights_of_fsdps_full_state_dict(two_ranks):
    first, second = two_ranks
    assert first["trainable"] > 30 and first["state_keys"] == first["full_trainable_keys"]
    assert first["state_vs_full"] == 0.0 and first["state_vs_reference"] == 0.0 and first["state_on_cpu"]
    assert second["state_keys"] == []  # rank 0 writes; the others copy nothing


def test_only_rank0_unshards_and_the_shards_come_back(two_ranks):
    first, second = two_ranks
    assert first["local_numel"] == second["local_numel"] == first["total_numel"] // 2
    assert first["inside_numel"] == first["total_numel"] and first["inside_vs_reference"] == 0.0
    assert second["inside_numel"] == second["local_numel"]  # no redundant copy on rank 1
    assert first["after_numel"] == first["local_numel"] and second["after_numel"] == second["local_numel"]


def test_the_gather_stays_on_the_device_only_when_the_whole_model_fits():
    share = fsdp_gather.DEVICE_GATHER_SHARE
    free = 100 * 2**30
    fits = int(share * free) // 4
    assert fsdp_gather.gather_on_device(fits, 4, free)
    assert not fsdp_gather.gather_on_device(fits + 1, 4, free)
    assert fsdp_gather.gather_on_device(2 * fits, 2, free) and not fsdp_gather.gather_on_device(2 * fits, 3, free)


def test_the_fsdp_preset_saves_through_the_trained_state(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(fsdp_gather, "trained_full_state", lambda root, world, rank: seen.append((root, world, rank)) or {"w": 1})
    strategy = make_strategy(_cfg(tmp_path))
    assert is_fsdp_strategy(strategy)  # gradient clipping and exports take the FSDP paths
    root = object()
    strategy._model = root
    assert strategy.lightning_module_state_dict() == {"w": 1}
    assert seen == [(root, strategy.world_size, strategy.global_rank)]


def test_exports_gather_through_the_rank0_gather(tmp_path, monkeypatch):
    import contextlib
    from types import SimpleNamespace

    from animegamer.training.strategies import full_weights

    seen = []
    monkeypatch.setattr(fsdp_gather, "whole_params", lambda root, world: seen.append((root, world)) or contextlib.nullcontext())
    strategy = make_strategy(_cfg(tmp_path))
    strategy._model = root = object()
    with full_weights(SimpleNamespace(strategy=strategy, world_size=2)):
        pass
    assert seen == [(root, 2)]
