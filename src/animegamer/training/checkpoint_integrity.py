"""Integrity records of checkpoints: what a complete checkpoint was when written, checked before resuming.

Each checkpoint ``step-N.ckpt`` gets a sidecar ``step-N.ckpt.integrity.json``, written atomically once
the checkpoint's data is durable: for a file its size and sha256; for a DeepSpeed folder the size of
every file in it (hashing every shard of a 7B run at each save would cost minutes). A checkpoint that
no longer matches its record (cut short by a crash or an interrupted copy, bits flipped) is damaged:
it is set aside as ``step-N.ckpt.damaged`` (never deleted) and an older intact one is used. A
checkpoint without a record (written before records existed) is accepted as it is.

A DeepSpeed folder gets a pending record before its save starts, replaced by the sizes once every
rank's part is written: DeepSpeed's ``latest`` marker (what makes a folder look complete) is written by
rank 0 before the other ranks are known to have finished their shards, so a folder still pending is
damaged, never resumed.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from animegamer.utils.io import first_free, read_json, sha256_file

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".integrity.json"
PARTIAL = ".partial"  # a file being written; never read, removed by a restart
DAMAGED_SUFFIX = ".damaged"
_SELF = "."  # the record's key for a checkpoint that is a single file
_PENDING = "pending"  # the record's key while a folder is being written


def record_path(checkpoint: str | Path) -> Path:
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.name + RECORD_SUFFIX)


def write_atomically(path: Path, text: str) -> None:
    """``path`` holds the old text or the whole new one, durably, whenever the process dies."""
    partial = path.with_name(path.name + PARTIAL)
    try:
        with open(partial, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_record(data: Path, checkpoint: Path) -> None:
    """Record the (fsynced) file ``data`` as what ``checkpoint`` must be: size and sha256."""
    entry = {"size": data.stat().st_size, "sha256": sha256_file(data)}
    write_atomically(record_path(checkpoint), json.dumps({"files": {_SELF: entry}}))


def write_folder_record(checkpoint: Path) -> None:
    """Record the size of every file in the complete checkpoint folder (after fsyncing them)."""
    files = {}
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[str(path.relative_to(checkpoint))] = {"size": path.stat().st_size}
    write_atomically(record_path(checkpoint), json.dumps({"files": files}))


def write_pending_record(checkpoint: Path) -> None:
    """Mark the folder ``checkpoint`` as being written (before the engine starts writing it)."""
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(record_path(checkpoint), json.dumps({_PENDING: True}))


def damage(checkpoint: Path) -> str | None:
    """How ``checkpoint`` differs from its record, or None (it matches, or it has no record)."""
    record = record_path(checkpoint)
    if not record.is_file():
        return None
    try:
        content = read_json(record)
        if content.get(_PENDING):
            return "its save did not finish (its integrity record was never written)"
        files = content["files"]
    except (ValueError, KeyError, AttributeError) as error:
        return f"its integrity record {record.name} is unreadable ({error})"
    for name, entry in files.items():
        path = checkpoint if name == _SELF else checkpoint / name
        if not path.is_file():
            return f"{path.name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{path.name} has {size} bytes, {entry['size']} were written"
        if "sha256" in entry and sha256_file(path) != entry["sha256"]:
            return f"{path.name} has the size written but not the content (sha256 differs)"
    return None


def set_aside(checkpoint: Path) -> Path:
    """Rename a damaged checkpoint (and its record) to ``<name>.damaged`` (``.damaged-2``, ... when taken)."""
    target = first_free(lambda n: checkpoint.with_name(checkpoint.name + DAMAGED_SUFFIX + (f"-{n}" if n > 1 else "")))
    os.replace(checkpoint, target)
    if record_path(checkpoint).exists():
        os.replace(record_path(checkpoint), record_path(target))
    return target
