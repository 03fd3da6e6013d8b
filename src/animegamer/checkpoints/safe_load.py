"""Reading weight files a user hands us without running anything from them.

Every weights file is read by one of two readers. Pickle-based files (Lightning checkpoints, official
``.pt`` / ``.bin`` releases, RAFT weights) go through :func:`load_weights_only`: torch's weights-only
unpickler, which refuses any global outside its allow-list before constructing it. Exports and
adapters are safetensors and go through :func:`load_safetensors` / :func:`safetensors_keys`, which
never unpickle: a pickle put in their place is refused as not safetensors. Either refusal is an
:class:`~animegamer.errors.UnsafeCheckpointError` naming the file, which entry points print as a
message with exit code 2 (:mod:`animegamer.errors`).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from safetensors import SafetensorError, safe_open

from animegamer.errors import UnsafeCheckpointError

if TYPE_CHECKING:  # torch is imported where a file is read: the clip pipeline's workers import this
    import torch  # module (for the optional RAFT flow weights) and otherwise never start torch

SAFETENSORS_SUFFIX = ".safetensors"


def refusal(path: str | Path, error: BaseException) -> UnsafeCheckpointError:
    """The error for a pickle file that does not load weights-only (``error``: torch's reason)."""
    return UnsafeCheckpointError(
        f"{path}: refused: it does not load as weights only (tensors and plain containers); loading it fully "
        f"could run code from the file. Use only checkpoints this project or the model's publisher wrote. "
        f"({type(error).__name__}: {error})")


def load_weights_only(path: str | Path, map_location: Any = "cpu", mmap: bool = True) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, nothing constructed
    from another global. ``mmap``: map the file instead of reading it (a large checkpoint is not held
    twice; the legacy non-zip format, which cannot be mapped, is read). A file that does not load is
    refused with :class:`UnsafeCheckpointError`; a missing one raises FileNotFoundError."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        if mmap:
            try:
                return torch.load(path, map_location=map_location, weights_only=True, mmap=True)
            except RuntimeError as error:
                if "mmap" not in str(error):
                    raise
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 - any refusal (pickled code, a damaged file) names the file
        raise refusal(path, error) from error


def _not_safetensors(path: Path, error: BaseException) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{path}: not a safetensors file ({type(error).__name__}: {error}); exports and adapters are read as "
        f"safetensors only and never unpickled: write it again with the project's export")


def load_safetensors(path: str | Path, keep: Optional[Callable[[str], bool]] = None) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file on CPU (only those whose name ``keep`` accepts, the rest
    unread). A file that is not safetensors (e.g. a pickle put in its place) is refused unread."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {key: handle.get_tensor(key) for key in handle.keys() if keep is None or keep(key)}
    except SafetensorError as error:
        raise _not_safetensors(path, error) from error


def safetensors_keys(path: str | Path) -> list[str]:
    """The tensor names of a safetensors file (its header only); refused like :func:`load_safetensors`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except SafetensorError as error:
        raise _not_safetensors(path, error) from error
