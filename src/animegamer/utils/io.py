"""Atomic file writes, content hashes and safe array (de)serialisation shared by every stage."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

_HASH_CHUNK = 1 << 20
_FILE_MODE = 0o666
_DIR_MODE = 0o777


def _umask() -> int:
    """The process's umask, read without setting it where Linux tells it (setting it, even back at
    once, lets another thread create a file under mask 0 in between)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def first_free(name_for: Callable[[int], Path], start: int = 1) -> Path:
    """The first of ``name_for(start)``, ``name_for(start + 1)``, ... that does not exist: where an earlier
    file or folder is kept beside its successor (``.superseded-N``, ``.attempt-N``, ``.damaged-N``)."""
    n = start
    while (path := name_for(n)).exists():
        n += 1
    return path


def out_dir_problem(out_dir: str | Path) -> str | None:
    """Why ``out_dir`` cannot become an output folder (it, or a folder it would sit in, is a file), or None."""
    path = Path(out_dir)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or existing.is_dir():
        return None
    return f"{path} is a file, not a folder" if existing == path else f"{path}: {existing} is a file, not a folder"


def sha256_file(path: str | os.PathLike, limit: int | None = None) -> str:
    """Hex sha256 of a file's bytes (the first ``limit`` bytes when given)."""
    digest = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            chunk = f.read(_HASH_CHUNK if remaining is None else min(_HASH_CHUNK, remaining))
            if not chunk:
                break
            digest.update(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``path``; rename it into place only if the block succeeds.

    A process killed inside the block leaves at most a ``.tmp-*`` file, never a truncated ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _FILE_MODE & ~_umask())  # mkstemp's 0600 would hide shards from other users
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def share(folder: Path) -> None:
    """``folder`` and what it holds readable as the umask allows: ``mkdtemp`` makes folders 0700 and
    safetensors (diffusers' ``save_pretrained`` too) files 0600, which would hide exports from other users."""
    mask = _umask()
    for root, _, files in os.walk(folder):
        os.chmod(root, _DIR_MODE & ~mask)
        for name in files:
            os.chmod(os.path.join(root, name), _FILE_MODE & ~mask)


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Like :func:`atomic_path` for a folder: built under a temp name, renamed when complete (:func:`share`d)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        yield tmp
        share(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def save_tensors(tensors: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file``, readable as the umask allows: safetensors creates its files 0600,
    which on a shared cluster hides weights and exports from everyone but their writer."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, _FILE_MODE & ~_umask())


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def read_json(path: str | os.PathLike) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())


def read_json_object(path: str | os.PathLike, required: Iterable[str] = ()) -> dict:
    """The JSON object at ``path`` holding every ``required`` key; raises ValueError (not JSON), TypeError (not
    an object) or KeyError (the missing keys), for the caller to name the file in its own words."""
    record = read_json(path)
    if not isinstance(record, dict):
        raise TypeError(f"a {type(record).__name__}, not an object")
    missing = [key for key in required if key not in record]
    if missing:
        raise KeyError(", ".join(missing))
    return record


def read_json_if_exists(path: str | os.PathLike) -> Any:
    """:func:`read_json`, or None where there is no such file."""
    return read_json(path) if Path(path).is_file() else None


def npy_bytes(array: np.ndarray) -> bytes:
    """Serialise an array as ``.npy`` (never pickled; object arrays are refused)."""
    if array.dtype == object:
        raise TypeError("object arrays cannot be stored: they would need pickle")
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def load_npy_bytes(data: bytes) -> np.ndarray:
    """Inverse of :func:`npy_bytes`; a pickled payload raises instead of executing code."""
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as error:
        if "pickle" in str(error):  # numpy's messages for object arrays and for raw pickle streams
            raise ValueError(f"refused an .npy payload that holds pickled Python objects (arrays are read "
                             f"without pickle, so a data file cannot run code): {error}") from error
        raise


def clean_stale_temps(folder: str | os.PathLike) -> int:
    """Remove ``.tmp-*`` leftovers of a killed run; returns how many were removed."""
    folder = Path(folder)
    if not folder.exists():
        return 0
    removed = 0
    for stale in folder.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
        removed += 1
    return removed
