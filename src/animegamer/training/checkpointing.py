"""Checkpoints that survive being killed at any moment, damage and full disks, and the choice of the
one to resume from.

Files (DDP, FSDP full state dict) are written to ``<name>.partial``, fsynced, recorded (size and
sha256, :mod:`checkpoint_integrity`) then renamed: a kill while writing leaves the previous checkpoints
as they were, and a ``.partial`` never looks like a checkpoint. FSDP saves one gathered file (full
state dict) through the same :class:`AtomicCheckpointIO`. DeepSpeed writes folders itself and writes
their ``latest`` tag last, so a folder without it is incomplete; :func:`guarded_save` gives the folder
a pending record before the save and its record (file sizes) after it returns. The resumed checkpoint
is the complete one with the highest step that matches its record; damaged ones are set aside. A save
that would not fit on the disk, or that runs out of space, stops with :class:`DiskFullError`. After
every save the folder keeps the newest ``checkpoint.keep_last`` checkpoints (:func:`save_checkpoint`,
:class:`KeepLastCheckpoint`).
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from animegamer.checkpoints.safe_load import load_weights_only
# The names (re-exported: the trainer's callers read them here).
from animegamer.contracts.checkpoint_names import (CHECKPOINT_DIR, PATTERN, STEP_NAME, checkpoint_name,  # noqa: F401
                                              checkpoint_step, is_complete)
from animegamer.errors import UserError
from animegamer.training.checkpoint_integrity import (PARTIAL, RECORD_SUFFIX, damage, fsync_folder, record_path,
                                                      set_aside, write_file_record, write_folder_record,
                                                      write_pending_record)
from animegamer.training.strategies import is_deepspeed_strategy
from animegamer.training.throughput import pausing
from animegamer.utils.logging import is_global_zero

log = logging.getLogger(__name__)

KEEP_ALL = -1  # checkpoint.keep_last: never prune
# Pickle framing and the zip directory on top of the tensors' bytes: a margin, not a measurement.
SAVE_OVERHEAD = 1.05
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
SAVE_SECONDS, SAVE_GIB = "ckpt/save_s", "ckpt/save_gib"  # training-log keys of every save
# torch.save into a path (DeepSpeed's shards) reports a failed write as a RuntimeError without errno;
# a write that failed for space leaves (almost) nothing free, so less than this counts as full.
NEARLY_FULL_BYTES = 64 * 2**20


class DiskFullError(UserError, OSError):
    """A checkpoint does not fit on its disk (checked before the save, or the disk filled during it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)  # the message alone: no "[Errno 28]" in front of it
        self.errno = errno.ENOSPC


def tensor_bytes(state: Any) -> int:
    """Bytes of every tensor in a (nested) checkpoint dict: what ``torch.save`` writes, roughly."""
    if torch.is_tensor(state):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0


def ensure_free_space(path: Path, needed: int) -> None:
    """Raise :class:`DiskFullError` naming ``path`` unless its disk has ``needed`` bytes free."""
    free = shutil.disk_usage(path.parent).free
    if needed > free:
        raise DiskFullError(_disk_full_message(path, needed, free))


def _disk_full_message(path: Path, needed: int | None, free: int) -> str:
    wanted = f"about {needed:,} bytes are needed" if needed else "the disk filled up during the write"
    return (f"checkpoint {path} does not fit: {wanted}, {free:,} bytes are free on its disk. Free space, "
            f"lower checkpoint.keep_last, or train into an output_dir on a larger disk; the earlier "
            f"complete checkpoints are intact and the run resumes from the newest.")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write-then-rename saves; loads refuse pickled code (``weights_only=True``)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        ensure_free_space(path, int(tensor_bytes(checkpoint) * SAVE_OVERHEAD))
        partial = path.with_name(path.name + PARTIAL)
        try:
            with open(partial, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            write_file_record(partial, path)  # the data is durable: record what it is
        except OSError as error:
            partial.unlink(missing_ok=True)
            if error.errno in OUT_OF_SPACE:
                free = shutil.disk_usage(path.parent).free
                raise DiskFullError(_disk_full_message(path, None, free)) from error
            raise
        os.replace(partial, path)  # atomic on POSIX: readers see the old file or the whole new one
        fsync_folder(path.parent)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        return load_weights_only(path, map_location=map_location or "cpu", mmap=False)

    def remove_checkpoint(self, path) -> None:
        fs = get_filesystem(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)
        record_path(path).unlink(missing_ok=True)


def complete_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints in ``folder``, oldest first (set-aside ones excluded)."""
    paths = folder.iterdir() if folder.is_dir() else ()
    return sorted((checkpoint_step(p), p) for p in paths if STEP_NAME.match(p.name) and is_complete(p))


def resume_checkpoint(folder: str | Path, set_aside_damaged: bool | None = None) -> Path | None:
    """The complete checkpoint with the highest step in ``folder`` that matches its integrity record,
    or None. Newer ones that do not match are damaged: reported, and set aside by ``set_aside_damaged``
    (default: global rank 0, from the launcher's environment; other ranks skip them alike)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    set_aside_damaged = is_global_zero() if set_aside_damaged is None else set_aside_damaged
    for path in folder.iterdir():
        if STEP_NAME.match(path.name) and not is_complete(path):
            log.warning("ignoring incomplete checkpoint %s (interrupted while writing)", path)
    newest_damaged = None
    for step, path in reversed(complete_checkpoints(folder)):
        try:
            reason = damage(path)
        except FileNotFoundError:  # another rank set it aside meanwhile
            reason = "it was set aside while being checked"
        if reason is None:
            if newest_damaged is not None:
                log.warning("resuming from %s instead: steps %d..%d (%d steps) are trained again", path,
                            step + 1, newest_damaged, newest_damaged - step)
            return path
        if newest_damaged is None:
            newest_damaged = step
        aside = set_aside(path) if set_aside_damaged and path.exists() else None
        log.warning("checkpoint %s is damaged: %s; %s", path, reason,
                    f"set aside as {aside.name}" if aside else "skipped")
    if newest_damaged is not None:
        log.warning("no intact checkpoint left: starting from step 0 (%d steps are trained again)", newest_damaged)
    return None


def prune_checkpoints(folder: Path, keep_last: int, written: Path) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints (and their records); never
    ``written``; set-aside damaged ones are neither counted nor deleted. Returns the deleted paths."""
    if keep_last == KEEP_ALL:
        return []
    found = [path for _, path in complete_checkpoints(folder)]
    doomed = [path for path in found[: max(len(found) - max(keep_last, 1), 0)] if path != written]
    for path in doomed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        record_path(path).unlink(missing_ok=True)
        log.info("removed %s (checkpoint.keep_last=%d)", path, keep_last)
    return doomed


def finish_save(trainer, path: Path, keep_last: int) -> None:
    """After ``trainer.save_checkpoint(path)`` returned (every rank's part is written): global rank 0
    records a DeepSpeed folder and prunes the folder to ``keep_last``."""
    if not trainer.is_global_zero:
        return
    if path.is_dir():
        write_folder_record(path)
    prune_checkpoints(path.parent, keep_last, path)


def ensure_room_like_previous(path: Path) -> None:
    """Before a DeepSpeed folder save (which bypasses :class:`AtomicCheckpointIO`'s check): the newest
    complete folder's size must be free."""
    found = complete_checkpoints(path.parent)
    if found and found[-1][1].is_dir():
        ensure_free_space(path, sum(p.stat().st_size for p in found[-1][1].rglob("*") if p.is_file()))


@contextmanager
def guarded_save(trainer, path: Path) -> Iterator[None]:
    """Around every save (every rank). A file has its checks in :class:`AtomicCheckpointIO`; a folder the
    engine writes itself (DeepSpeed) gets them here: the newest folder's size must be free; global rank 0
    writes a pending record first (``checkpoint_integrity``), so a folder cut short after ``latest``
    never counts as intact; and a disk that fills during the save stops with :class:`DiskFullError`,
    the incomplete folder removed by global rank 0 (every earlier checkpoint is kept)."""
    if not is_deepspeed_strategy(trainer.strategy):
        yield
        return
    ensure_room_like_previous(path)
    if trainer.is_global_zero:
        write_pending_record(path)
    try:
        yield
    except (OSError, RuntimeError) as error:
        if not _out_of_space(error, path):
            raise
        if trainer.is_global_zero:
            shutil.rmtree(path, ignore_errors=True)
            record_path(path).unlink(missing_ok=True)
        raise DiskFullError(_disk_full_message(path, None, shutil.disk_usage(path.parent).free)) from error


def _out_of_space(error: OSError | RuntimeError, path: Path) -> bool:
    if isinstance(error, OSError):
        return error.errno in OUT_OF_SPACE
    return shutil.disk_usage(path.parent).free < NEARLY_FULL_BYTES


@contextmanager
def timed_save(trainer, path: Path) -> Iterator[None]:
    """A save's wall time, every rank's writes included (Lightning's save ends at a barrier): global
    rank 0 logs it with the checkpoint's size and puts both in the training log (``ckpt/save_s``,
    ``ckpt/save_gib``), so save times can be read per run and compared across world sizes."""
    started = time.perf_counter()
    with pausing(trainer):  # not the next step's data wait
        yield
    if not trainer.is_global_zero:
        return
    seconds, gib = time.perf_counter() - started, checkpoint_bytes(path) / 2**30
    log.info("saved %s in %.1f s (%.2f GiB)", path.name, seconds, gib)
    for logger in trainer.loggers:
        logger.log_metrics({SAVE_SECONDS: seconds, SAVE_GIB: gib}, step=trainer.global_step)
        logger.save()  # the run's last save comes after fit has flushed its loggers for the last time


def checkpoint_bytes(path: Path) -> int:
    """The bytes a checkpoint takes on disk: a file, or every file of an engine's folder."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0


def save_checkpoint(trainer, path: Path, keep_last: int) -> None:
    """The full training state to ``path`` (every rank calls it), then :func:`finish_save`."""
    with timed_save(trainer, path), guarded_save(trainer, path):
        trainer.save_checkpoint(str(path), weights_only=False)
    finish_save(trainer, path, keep_last)


class KeepLastCheckpoint(ModelCheckpoint):
    """The periodic ``step-N.ckpt`` saves, pruned by :func:`prune_checkpoints` like every other save
    (Lightning's own top-k only knows the saves it made itself)."""

    def __init__(self, folder: Path, every_n_steps: int, keep_last: int) -> None:
        super().__init__(dirpath=str(folder), every_n_train_steps=every_n_steps, monitor="step", mode="max",
                         save_top_k=0 if keep_last == 0 else -1, filename=PATTERN, auto_insert_metric_name=False)
        self.keep_last = keep_last

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        with timed_save(trainer, Path(filepath)), guarded_save(trainer, Path(filepath)):
            super()._save_checkpoint(trainer, filepath)
        finish_save(trainer, Path(filepath), self.keep_last)


def clean_partials(folder: str | Path) -> None:
    """Remove the debris of a save that was killed mid-write (and records without their checkpoint)."""
    folder = Path(folder)
    for path in folder.glob(f"*{PARTIAL}") if folder.is_dir() else ():
        log.warning("removing %s left by an interrupted save", path)
        path.unlink()
    for path in folder.glob(f"*{RECORD_SUFFIX}") if folder.is_dir() else ():
        if not path.with_name(path.name[: -len(RECORD_SUFFIX)]).exists():
            path.unlink()
