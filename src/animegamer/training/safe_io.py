"""Refuse checkpoints that would run code when loaded, before any strategy reads them.

Single-device and DDP resumes go through :class:`~animegamer.training.checkpointing.AtomicCheckpointIO`,
which loads with ``torch.load(weights_only=True)``. Two strategies bypass the CheckpointIO plugin:
FSDP reads a full-state-dict file with Lightning's ``_lazy_load`` (a plain ``pickle.Unpickler``),
and DeepSpeed reads its folder with its own ``torch.load``. :func:`ensure_weights_only` checks the
file, or every pickle file of a folder, with the weights-only unpickler (memory-mapped: tensors are
not read), so a pickled payload fails here with the file named and never executes.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterable, Sequence

import torch

from animegamer.checkpoints.safe_load import load_weights_only
from animegamer.errors import UnsafeCheckpointError

__all__ = ["PICKLE_SUFFIXES", "UnsafeCheckpointError", "ensure_weights_only"]

PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")


def _pickle_files(path: Path) -> Iterable[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in PICKLE_SUFFIXES)


def ensure_weights_only(path: str | Path, safe_globals: Sequence = ()) -> None:
    """Raise :class:`UnsafeCheckpointError` unless every pickle file at ``path`` loads weights-only.

    ``safe_globals``: extra classes/functions a trusted writer is known to pickle (e.g. an engine's
    own loss-scaler class), allowed for this check only. A missing path raises FileNotFoundError.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    allowed = torch.serialization.safe_globals(list(safe_globals)) if safe_globals else contextlib.nullcontext()
    with allowed:
        for file in _pickle_files(path):
            load_weights_only(file)  # memory-mapped: tensors are not read
