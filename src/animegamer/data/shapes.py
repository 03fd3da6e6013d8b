"""The shapes of the arrays a shard folder holds, read from its first sample's tar and npy headers (nothing
is loaded), against the sizes of the model a run builds: wrong data fails in the pre-flight, not after
the model is built."""
from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np

from animegamer.data.storage import ShardSource


def _first_sample_shapes(folder) -> dict[str, tuple] | None:
    """``.npy`` member shapes of the first sample of the first shard: tar and npy headers only.
    ``folder``: a path or an ``animegamer.data.storage.ShardSource`` (a URL reads headers by range)."""
    try:
        source = folder if isinstance(folder, ShardSource) else ShardSource(folder)
        shards = source.shards()
        if not shards:
            return None
        shapes: dict[str, tuple] = {}
        first = None
        with source.open(shards[0].path) as f, tarfile.open(fileobj=f, mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                sample, _, ext = Path(info.name).name.partition(".")
                if first is None:
                    first = sample
                elif sample != first:
                    break
                if ext.endswith("npy"):
                    handle = tar.extractfile(info)
                    version = np.lib.format.read_magic(handle)
                    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                              else np.lib.format.read_array_header_2_0)
                    shapes[ext] = tuple(header(handle)[0])
        return shapes
    except Exception:  # noqa: BLE001 - unreadable data is the data checks' business, not the config's
        return None


def check_shard_shapes(folder, expected: dict[str, tuple]) -> list[str]:
    """The data a phase reads against the sizes of the model it builds (first sample only); ``folder``
    as in :func:`_first_sample_shapes`."""
    shapes = _first_sample_shapes(folder) if expected else None
    problems = []
    for member, want in expected.items():
        got = (shapes or {}).get(member)
        if got is None:
            continue
        if len(got) != len(want) or any(w is not None and g != w for g, w in zip(got, want)):
            shown = "(" + ", ".join("*" if w is None else str(w) for w in want) + ")"
            problems.append(f"{folder}: {member} has shape {got} but this config's model needs {shown} "
                            f"(data written with other encoder / model sizes)")
    return problems
