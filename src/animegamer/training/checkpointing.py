"""Checkpoints that survive being killed at any moment, and the choice of the one to resume from.

Files (DDP, FSDP full state dict) are written to ``<name>.partial`` then renamed: a kill while
writing leaves the previous checkpoints as they were, and a ``.partial`` never looks like a
checkpoint. DeepSpeed writes folders itself and writes their ``latest`` tag last, so a folder
without it is incomplete. The resumed checkpoint is the complete one with the highest step.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
PATTERN = "step-{step:07d}"  # ModelCheckpoint's filename template (without .ckpt)
_STEP = re.compile(r"^step-(\d+)\.ckpt$")
PARTIAL = ".partial"
DEEPSPEED_COMPLETE = "latest"


def checkpoint_name(step: int) -> str:
    return PATTERN.format(step=step) + ".ckpt"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write-then-rename saves; loads refuse pickled code (``weights_only=True``)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + PARTIAL)
        with open(partial, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)  # atomic on POSIX: readers see the old file or the whole new one

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {path} not found")
        try:
            return torch.load(path, map_location=map_location or "cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - name the file and the reason
            raise RuntimeError(f"{path}: cannot load as a weights-only checkpoint ({error})") from error

    def remove_checkpoint(self, path) -> None:
        fs = get_filesystem(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)


def checkpoint_step(path: str | Path) -> int:
    """The step in a checkpoint's name (``step-0000060.ckpt`` -> 60)."""
    match = _STEP.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path}: not a checkpoint name like {checkpoint_name(0)}")
    return int(match.group(1))


def is_complete(path: Path) -> bool:
    if path.is_file():
        return True
    return path.is_dir() and (path / DEEPSPEED_COMPLETE).is_file()


def resume_checkpoint(folder: str | Path) -> Path | None:
    """The complete checkpoint with the highest step in ``folder``, or None."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = []
    for path in folder.iterdir():
        match = _STEP.match(path.name)
        if match is None:
            continue
        if is_complete(path):
            found.append((int(match.group(1)), path))
        else:
            log.warning("ignoring incomplete checkpoint %s (interrupted while writing)", path)
    return max(found)[1] if found else None


def clean_partials(folder: str | Path) -> None:
    """Remove the debris of a save that was killed mid-write."""
    for path in Path(folder).glob(f"*{PARTIAL}") if Path(folder).is_dir() else ():
        log.warning("removing %s left by an interrupted save", path)
        path.unlink()
