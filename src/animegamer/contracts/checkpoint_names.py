"""A training run's checkpoint names: the folder, each checkpoint's file name by step, and when a checkpoint
is complete. Kept free of torch and Lightning, so that drivers which wait for a run's checkpoint (a kill
after step N, a benchmark's stop) can read them without loading either."""
from __future__ import annotations

import re
from pathlib import Path

CHECKPOINT_DIR = "checkpoints"
PATTERN = "step-{step:07d}"  # ModelCheckpoint's filename template (without .ckpt)
STEP_NAME = re.compile(r"^step-(\d+)\.ckpt$")
DEEPSPEED_COMPLETE = "latest"  # a DeepSpeed checkpoint folder's last file: the folder is complete once it exists


def checkpoint_name(step: int) -> str:
    return PATTERN.format(step=step) + ".ckpt"


def checkpoint_step(path: str | Path) -> int:
    """The step in a checkpoint's name (``step-0000060.ckpt`` -> 60)."""
    match = STEP_NAME.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path}: not a checkpoint name like {checkpoint_name(0)}")
    return int(match.group(1))


def is_complete(path: Path) -> bool:
    """A checkpoint file, or a DeepSpeed checkpoint folder with its last file written."""
    if path.is_file():
        return True
    return path.is_dir() and (path / DEEPSPEED_COMPLETE).is_file()
