"""Webdataset readers for the pipeline's shard sets, safe by construction.

Arrays are ``.npy`` loaded with ``allow_pickle=False`` and json is parsed as json: no member of a
shard can run code. Shards come from their folder's manifest through :meth:`ShardSource.shards`
(plain file names of the folder only) and reach webdataset as opened files, never as path strings:
webdataset's own openers hand a string to ``gopen``, which runs a ``pipe:`` one in a shell. A shard
read to its end is checked against the sha256 its manifest records. Training readers are resampled
with a fixed number of samples per rank, which is what keeps every DDP rank's batch count equal
(webdataset 1.0.2 splits shards unevenly otherwise, and a rank that runs out first hangs the others
in the next all-reduce).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator, Sequence, Union

import numpy as np
import webdataset as wds
from webdataset.compat import check_empty
from webdataset.tariterators import group_by_keys, tar_file_expander

from animegamer.contracts.shards import JSON, MP4, NPY_SUFFIX
from animegamer.data.storage import Shard, ShardSource
from animegamer.media.video import decode_mp4
from animegamer.utils.io import load_npy_bytes

# What the readers take: shards of a manifest (:func:`folder_shards`), or paths the caller chose itself.
ShardLike = Union[Shard, str, Path]


def folder_shards(folder: str | Path | ShardSource) -> list[Shard]:
    """The shards of a shard-set folder (or URL), in the manifest's order, names checked."""
    return (folder if isinstance(folder, ShardSource) else ShardSource(folder)).shards()


def shard_urls(folder: str | Path) -> list[str]:
    """Shard paths (URLs for a remote folder) of a shard-set folder, in the manifest's order, names checked.
    The readers take :func:`folder_shards` instead: those carry the sha256 to check."""
    return [shard.path for shard in folder_shards(folder)]


def read_manifest(folder: str | Path) -> dict:
    return ShardSource(folder).manifest()


def decode_sample(sample: dict, video: bool = True) -> dict:
    """Raw webdataset sample (bytes per extension) -> python objects, by extension."""
    out = {"__key__": sample["__key__"], "__url__": sample.get("__url__")}
    for ext, value in sample.items():
        if ext.startswith("__"):
            continue
        if ext == JSON:
            out[ext] = json.loads(value)
        elif ext.endswith(NPY_SUFFIX.lstrip(".")):
            out[ext] = load_npy_bytes(value)
        elif ext == MP4:
            out[ext] = decode_mp4(value) if video else value
        else:
            raise ValueError(f"{sample.get('__url__')}: {sample['__key__']}.{ext}: unknown member type")
    return out


class ShardStreams:
    """The pipeline stage that opens each shard the shard list names (``{"url": path}``) as a file
    (:meth:`Shard.stream`) for webdataset's tar expander, in place of webdataset's openers (which give the
    path to ``gopen``). A shard's digest is checked when the expander asks for the next one, that is once
    it has read the shard to its end. Picklable, for DataLoader workers."""

    def __init__(self, shards: Iterable[Shard]) -> None:
        self.shards = {shard.path: shard for shard in shards}

    def __call__(self, sources: Iterable[dict]) -> Iterator[dict]:
        for source in sources:
            url = source["url"]
            with self.shards[url].stream() as stream:
                yield {"url": url, "stream": stream}


class ShardPipeline(wds.DataPipeline, wds.FluidInterface):
    """A webdataset pipeline with the fluid methods (``shuffle``, ``map``, ...) of ``wds.WebDataset``."""


def _as_shard(shard: ShardLike) -> Shard:
    return shard if isinstance(shard, Shard) else Shard.at(shard)


def shard_samples(shards: Sequence[ShardLike], resampled: bool = False) -> ShardPipeline:
    """Raw webdataset samples of ``shards``: the stages of ``wds.WebDataset(paths, nodesplitter=None,
    shardshuffle=False, resampled=resampled)`` (split by DataLoader worker, tar members grouped by key)
    with each shard opened by :class:`ShardStreams` instead of by path."""
    shards = [_as_shard(shard) for shard in shards]
    paths = [shard.path for shard in shards]
    listing = wds.ResampledShards(paths) if resampled else wds.SimpleShardList(paths)
    stages = [listing, wds.split_by_worker, ShardStreams(shards), wds.pipelinefilter(tar_file_expander)(),
              wds.pipelinefilter(group_by_keys)()]
    return ShardPipeline(*stages, check_empty if resampled else None)


def iter_samples(shards: Sequence[ShardLike], video: bool = True) -> Iterator[dict]:
    """Every sample of ``shards`` once, in order, decoded (precompute, evaluation, tests); none without
    shards. Pass :func:`folder_shards` of a folder (its manifest's sha256 are checked) or paths."""
    if not shards:
        return
    for sample in shard_samples(shards):
        yield decode_sample(sample, video=video)


def training_dataset(shards: Sequence[ShardLike], samples_per_rank: int, shuffle_buffer: int = 100, seed: int = 0,
                     video: bool = True) -> ShardPipeline:
    """Endless resampled stream cut into epochs of exactly ``samples_per_rank`` per rank.

    Resampling with no node splitter gives every rank (and worker) its own draw over all shards, and
    ``with_epoch`` fixes how many samples one epoch has, whatever the shard sizes.
    With dataloader workers, pass ``samples_per_rank // num_workers`` per worker.
    """
    dataset = shard_samples(shards, resampled=True)
    if shuffle_buffer > 0:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    return dataset.map(lambda s: decode_sample(s, video=video)).with_epoch(samples_per_rank)
