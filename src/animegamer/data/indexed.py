"""Random access into webdataset shards, and a step-indexed sampler for exact resume.

Training streams with webdataset cannot say where they stopped; this map-style view of the same tar
shards can. The index is the tar headers' member offsets (read once, no payload is touched), so any
sample is one seek and one read. :class:`StepSampler` makes the sample order a pure function of
(seed, epoch, rank) and starts at any step, so a resumed run reads exactly what the uninterrupted
run would have read next.
"""
from __future__ import annotations

import hashlib
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from torch.utils.data import Dataset, Sampler

from animegamer.data.shards import decode_sample, shard_urls


@dataclass(frozen=True)
class SampleLocation:
    shard: str
    key: str
    members: tuple[tuple[str, int, int], ...]  # (extension, data offset, size)


def index_shard(path: str) -> list[SampleLocation]:
    """Member offsets of one tar shard, grouped by sample key (webdataset naming: key.ext)."""
    grouped: dict[str, list[tuple[str, int, int]]] = {}
    with tarfile.open(path, "r:") as tar:
        for info in tar:
            if not info.isfile():
                continue
            key, _, ext = info.name.partition(".")
            grouped.setdefault(key, []).append((ext, info.offset_data, info.size))
    return [SampleLocation(path, key, tuple(members)) for key, members in grouped.items()]


def key_fraction(key: str) -> float:
    """A stable number in [0, 1) per key: held-out splits that never move between runs."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


class IndexedShardDataset(Dataset):
    """Map-style dataset over a shard folder; ``transform`` turns a decoded sample into tensors."""

    def __init__(self, folder: str | Path, transform: Callable[[dict], dict], keep: Callable[[str], bool] | None = None,
                 video: bool = True, allow_empty: bool = False) -> None:
        self.locations = [loc for url in shard_urls(folder) for loc in index_shard(url)
                          if keep is None or keep(loc.key)]
        if not self.locations and not allow_empty:
            raise ValueError(f"{folder}: no samples selected")
        self.transform = transform
        self.video = video

    def __len__(self) -> int:
        return len(self.locations)

    def keys(self) -> list[str]:
        return [loc.key for loc in self.locations]

    def raw(self, index: int) -> dict:
        loc = self.locations[index]
        sample = {"__key__": loc.key, "__url__": loc.shard}
        with open(loc.shard, "rb") as f:
            for ext, offset, size in loc.members:
                f.seek(offset)
                sample[ext] = f.read(size)
        return decode_sample(sample, video=self.video)

    def __getitem__(self, index: int) -> dict:
        return self.transform(self.raw(index))


class StepSampler(Sampler[int]):
    """Indices for this rank from global sample ``start`` on; epochs are seeded permutations.

    Every rank takes the same number of indices per epoch (the permutation's tail that does not
    divide by the world size is dropped), so ranks never disagree on the number of batches.
    """

    def __init__(self, num_samples: int, seed: int, rank: int = 0, world_size: int = 1, start: int = 0,
                 total: int | None = None, with_position: bool = False) -> None:
        # with_position: yield (index, position) so the dataset can seed per-draw randomness (e.g.
        # phase (b)'s window choice) from the position, which a resumed run reproduces.
        self.with_position = with_position
        self.num_samples, self.seed, self.rank, self.world_size = num_samples, seed, rank, world_size
        self.per_rank_epoch = num_samples // world_size
        if self.per_rank_epoch == 0:
            raise ValueError(f"{num_samples} samples cannot feed {world_size} ranks")
        self.start = start  # samples this rank already consumed
        self.total = total  # samples this rank will consume in all (None = endless)

    def _epoch_order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(self.num_samples, generator=generator).tolist()
        return order[self.rank : self.per_rank_epoch * self.world_size : self.world_size]

    def __iter__(self) -> Iterator[int]:
        # Continues where the previous iteration stopped: a trainer that restarts iteration (a new
        # "epoch" after a resume) must not replay samples.
        while self.total is None or self.start < self.total:
            epoch, offset = divmod(self.start, self.per_rank_epoch)
            for index in self._epoch_order(epoch)[offset:]:
                if self.total is not None and self.start >= self.total:
                    return
                self.start += 1
                yield (index, self.start - 1) if self.with_position else index

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("an endless sampler has no length")
        return max(0, self.total - self.start)


def split_keys(keys: Sequence[str], val_fraction: float) -> tuple[set[str], set[str]]:
    val = {k for k in keys if key_fraction(k) < val_fraction}
    return set(keys) - val, val
