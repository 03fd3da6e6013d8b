"""What the framework writes is readable by whoever the umask lets read it: on a shared cluster a
team's exports, weights and shards are read by other users' jobs. ``mkdtemp`` (0700) and safetensors
(0600 files) would otherwise make them private to their writer."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from torch import nn

from animegamer.checkpoints.export import EXPORT_FILE, TRAINED_FILE, save_export
from animegamer.models import lora
from animegamer.utils.io import atomic_path, save_tensors


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_export_folder_and_its_files_follow_the_umask(tmp_path: Path, umask_022) -> None:
    module = nn.Linear(3, 2)
    folder = save_export(tmp_path / "export", module, {"phase": "a_joint"})
    assert mode(folder) == 0o755
    assert mode(folder / TRAINED_FILE) == 0o644 and mode(folder / EXPORT_FILE) == 0o644


def test_tensors_and_atomic_files_follow_the_umask(tmp_path: Path, umask_022) -> None:
    save_tensors({"w": torch.zeros(2)}, tmp_path / "w.safetensors")
    with atomic_path(tmp_path / "a.bin") as tmp:
        tmp.write_bytes(b"x")
    assert mode(tmp_path / "w.safetensors") == 0o644 and mode(tmp_path / "a.bin") == 0o644


def test_a_stricter_umask_is_kept(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        folder = save_export(tmp_path / "export", nn.Linear(3, 2), {"phase": "a_joint"})
    finally:
        os.umask(old)
    assert mode(folder) == 0o700 and mode(folder / TRAINED_FILE) == 0o600


def test_an_adapter_folder_follows_the_umask(tmp_path: Path, umask_022) -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(nn.Sequential(nn.Linear(4, 4)), LoraConfig(r=2, target_modules=["0"]),
                           adapter_name=lora.ADAPTER)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    folder = lora.save_adapter(model, tmp_path / "adapter", names)
    assert mode(folder / lora.WEIGHTS_FILE) == 0o644
