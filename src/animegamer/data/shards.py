"""Webdataset readers for the pipeline's shard sets, safe by construction.

Arrays are ``.npy`` loaded with ``allow_pickle=False`` and json is parsed as json: no member of a
shard can run code. Training readers are resampled with a fixed number of samples per rank, which
is what keeps every DDP rank's batch count equal (webdataset 1.0.2 splits shards unevenly
otherwise, and a rank that runs out first hangs the others in the next all-reduce).
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import webdataset as wds

from animegamer.data.layout import MANIFEST  # noqa: F401 - readers import the name from here too
from animegamer.data.storage import ShardSource
from animegamer.utils.io import load_npy_bytes

NPY_SUFFIX = ".npy"


def shard_urls(folder: str | Path) -> list[str]:
    """Shard paths (URLs for a remote folder) of a shard-set folder, in the manifest's order."""
    return [path for path, _ in ShardSource(folder).shards()]


def read_manifest(folder: str | Path) -> dict:
    return ShardSource(folder).manifest()


def decode_video(data: bytes) -> np.ndarray:
    """mp4 bytes -> (T, H, W, 3) uint8 RGB with decord."""
    import decord  # loads ffmpeg's libraries: only readers that decode video need them

    reader = decord.VideoReader(io.BytesIO(data), num_threads=1)
    return reader.get_batch(list(range(len(reader)))).asnumpy()


def decode_sample(sample: dict, video: bool = True) -> dict:
    """Raw webdataset sample (bytes per extension) -> python objects, by extension."""
    out = {"__key__": sample["__key__"], "__url__": sample.get("__url__")}
    for ext, value in sample.items():
        if ext.startswith("__"):
            continue
        if ext == "json":
            out[ext] = json.loads(value)
        elif ext.endswith(NPY_SUFFIX.lstrip(".")):
            out[ext] = load_npy_bytes(value)
        elif ext == "mp4":
            out[ext] = decode_video(value) if video else value
        else:
            raise ValueError(f"{sample.get('__url__')}: {sample['__key__']}.{ext}: unknown member type")
    return out


def iter_samples(urls: Sequence[str], video: bool = True) -> Iterator[dict]:
    """Every sample of ``urls`` once, in order, decoded (precompute, evaluation, tests); none without urls."""
    if not urls:
        return
    dataset = wds.WebDataset(list(urls), shardshuffle=False, nodesplitter=None, empty_check=False)
    for sample in dataset:
        yield decode_sample(sample, video=video)


def training_dataset(urls: Sequence[str], samples_per_rank: int, shuffle_buffer: int = 100, seed: int = 0,
                     video: bool = True) -> wds.WebDataset:
    """Endless resampled stream cut into epochs of exactly ``samples_per_rank`` per rank.

    ``resampled=True`` + ``nodesplitter=None`` gives every rank (and worker) its own seeded draw over
    all shards, and ``with_epoch`` fixes how many samples one epoch has, whatever the shard sizes.
    With dataloader workers, pass ``samples_per_rank // num_workers`` per worker.
    """
    dataset = wds.WebDataset(list(urls), resampled=True, nodesplitter=None, shardshuffle=False, seed=seed)
    if shuffle_buffer > 0:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    return dataset.map(lambda s: decode_sample(s, video=video)).with_epoch(samples_per_rank)
