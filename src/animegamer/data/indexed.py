"""Random access into webdataset shards, and a step-indexed sampler for exact resume.

Training streams with webdataset cannot say where they stopped; this map-style view of the same tar
shards can. The index is the tar headers' member offsets (read once, no payload is touched), so any
sample is one seek and one read. :class:`StepSampler` makes the sample order a pure function of
(seed, epoch, rank) and starts at any step, so a resumed run reads exactly what the uninterrupted
run would have read next.
"""
from __future__ import annotations

import hashlib
import logging
import os
import signal
import tarfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from animegamer.contracts.shards import SKIPPED
from animegamer.data.shards import decode_sample
from animegamer.data.storage import RemoteReadError, Shard, ShardSource
from animegamer.errors import InvalidInputError

log = logging.getLogger(__name__)

# SKIPPED, the batch key listing the bad samples a batch's items replaced: [{"shard", "key", "reason"}, ...].
# Workers are separate processes, so this is how the main process (``BadDataBudget``) learns about them.
WHOLE_SHARD = "*"  # the key of a bad-item record that stands for a whole unreadable shard
TAR_END = 2 * tarfile.BLOCKSIZE  # a complete tar ends with two zero blocks


@dataclass(frozen=True)
class SampleLocation:
    shard: str
    key: str
    members: tuple[tuple[str, int, int], ...]  # (extension, data offset, size)


def _scan_tar(f: BinaryIO, path: str) -> list[list]:
    """[key, [[extension, data offset, size], ...]] per sample of the tar file ``f``, in tar order; only
    the member headers are read (webdataset naming: key.ext)."""
    grouped: dict[str, list[list]] = {}
    with tarfile.open(fileobj=f, mode="r:") as tar:
        for info in tar:
            if not info.isfile():
                continue
            key, _, ext = info.name.partition(".")
            grouped.setdefault(key, []).append([ext, info.offset_data, info.size])
        end = tar.offset
    # tarfile stops quietly at a truncated or corrupt header past the first: without the end-of-archive
    # marker where the listing stopped, the listing is incomplete.
    if grouped:
        f.seek(end)
        tail = f.read(TAR_END)
        if len(tail) < TAR_END or tail.count(0) != TAR_END:
            raise tarfile.ReadError(f"truncated or corrupt tar: no end-of-archive marker at byte {end}")
    return [[key, members] for key, members in grouped.items()]


def index_shard(path: str, source: ShardSource | None = None, entry: Mapping | None = None) -> list[SampleLocation]:
    """Member offsets of one tar shard, grouped by sample key. A shard of a remote ``source`` is indexed
    once per version and cached (``entry``: its manifest entry, see :meth:`ShardSource.cached`)."""
    source = ShardSource(str(Path(path).parent)) if source is None else source
    samples = source.cached(path, entry or {}, lambda f: _scan_tar(f, path))
    return [SampleLocation(path, key, tuple((ext, offset, size) for ext, offset, size in members))
            for key, members in samples]


REMOTE_INDEX_THREADS = 8  # remote shards indexed at once: each scan is a chain of small requests


def _index_or_error(source: ShardSource, shard: Shard) -> list[SampleLocation] | Exception:
    try:
        return index_shard(shard.path, source, shard.entry)
    except (tarfile.TarError, OSError, EOFError) as error:
        return error


class BadSample(ValueError):
    """Raised by a sample check: the sample is bad (the message says why) and is skipped."""


def check_finite(sample: Mapping) -> None:
    """No NaN or inf in any float array of a decoded sample."""
    for ext, value in sample.items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc" and not np.isfinite(value).all():
            raise BadSample(f"{ext}: {int((~np.isfinite(value)).sum())} non-finite values (NaN/inf)")


class ExpectArrays:
    """Per-phase check: each named member is an array of the given rank (int) or shape (tuple, None =
    any size). A picklable class, so DataLoader workers can carry it."""

    def __init__(self, spec: Mapping[str, int | tuple]) -> None:
        self.spec = dict(spec)

    def __call__(self, sample: Mapping) -> None:
        for ext, want in self.spec.items():
            value = sample.get(ext)
            if not isinstance(value, np.ndarray):
                raise BadSample(f"{ext}: missing or not an array")
            pattern = (None,) * want if isinstance(want, int) else tuple(want)
            if value.ndim != len(pattern) or any(w is not None and w != d for w, d in zip(pattern, value.shape)):
                shown = tuple("*" if w is None else w for w in pattern)
                raise BadSample(f"{ext}: shape {value.shape}, expected {shown}")


def array_shapes(sample: Mapping) -> tuple:
    """The (member, shape, dtype) of every array of a decoded sample: what a good sample shares."""
    return tuple(sorted((ext, v.shape, v.dtype.str) for ext, v in sample.items() if isinstance(v, np.ndarray)))


def key_fraction(key: str) -> float:
    """A stable number in [0, 1) per key: held-out splits that never move between runs."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


class IndexedShardDataset(Dataset):
    """Map-style dataset over a shard folder; ``transform`` turns a decoded sample into tensors.

    With ``skip_bad`` (training), bad data is skipped instead of failing the run: a shard that cannot be
    indexed (truncated or corrupt tar, missing file) is left out and listed in ``bad_items``; a sample
    that fails to decode, to pass ``check`` or :func:`check_finite`, to match the arrays' shapes of the
    first good samples, or to transform, is replaced by the next good index (i+1, i+2, ... mod len), a
    pure function of the index, so a resumed run reads the same substitutes. The replaced samples are
    listed in the returned dict under :data:`SKIPPED` for ``BadDataBudget`` to count. Without it (the
    default, for look-ups by key) any such failure raises.
    """

    REFERENCE_SAMPLES = 3  # the shapes of a good sample: the most common among the first good ones

    def __init__(self, folder: str | Path | ShardSource, transform: Callable[[dict], dict],
                 keep: Callable[[str], bool] | None = None, video: bool = True, allow_empty: bool = False,
                 skip_bad: bool = False, check: Callable[[dict], None] | None = None,
                 members: Sequence[str] | None = None) -> None:
        # ``folder``: a local folder, or a ShardSource (a URL with its retry settings, see data.storage).
        # ``members``: the extensions read (None: all), e.g. ("json",) reads no video.
        self.source = folder if isinstance(folder, ShardSource) else ShardSource(folder)
        self.members = None if members is None else frozenset(members)
        self.folder, self.skip_bad, self.check = self.source.folder, skip_bad, check
        self.bad_items: list[dict] = []  # shards left out at indexing: {"shard", "key": "*", "reason"}
        self.locations = []
        indexed = 0  # samples in the folder's readable shards, before ``keep``
        # Names checked (ShardNameError): a manifest naming a path elsewhere is refused, never skipped. The
        # recorded sha256 is not checked here: this reader never reads a shard whole (the streaming readers do).
        shards = self.source.shards()
        if self.source.remote:
            with ThreadPoolExecutor(REMOTE_INDEX_THREADS) as pool:
                results = list(pool.map(partial(_index_or_error, self.source), shards))
        else:
            results = [_index_or_error(self.source, shard) for shard in shards]
        for url, locations in zip((shard.path for shard in shards), results):
            if isinstance(locations, Exception):
                error = locations
                if not skip_bad:
                    raise error
                record = {"shard": url, "key": WHOLE_SHARD, "reason": f"unreadable shard: {error}"}
                log.warning("skipping shard %s: %s", url, record["reason"])
                self.bad_items.append(record)
                continue
            indexed += len(locations)
            self.locations += [loc for loc in locations if keep is None or keep(loc.key)]
        if not self.locations and not allow_empty:
            why = (f"none of its {indexed} samples is on this side of the held-out split (whole shots are held "
                   f"out below data.val_fraction: change it, or add footage with more shots)") if indexed else \
                "it holds no sample (run the pipeline step that writes it again, with more captioned clips)"
            raise InvalidInputError(f"{self.folder}: no samples selected: {why}")
        self.transform = transform
        self.video = video
        self._reference: tuple | None = None
        self._bad: dict[int, str] = {}  # index -> reason, this process's memory of bad samples

    def __len__(self) -> int:
        return len(self.locations)

    def keys(self) -> list[str]:
        return [loc.key for loc in self.locations]

    def raw(self, index: int) -> dict:
        loc = self.locations[index]
        members = [m for m in loc.members if self.members is None or m[0] in self.members]
        sample = {"__key__": loc.key, "__url__": loc.shard}
        if not members:
            return decode_sample(sample, video=self.video)
        # One read spanning the sample's members (one range request for a remote shard).
        start = min(offset for _, offset, _ in members)
        span = self.source.read_range(loc.shard, start, max(offset + size for _, offset, size in members))
        for ext, offset, size in members:
            sample[ext] = span[offset - start: offset - start + size]
        return decode_sample(sample, video=self.video)

    def _checked(self, index: int) -> dict:
        """The decoded sample ``index`` if it passes the checks (shapes apart); raises otherwise."""
        sample = self.raw(index)
        check_finite(sample)
        if self.check is not None:
            self.check(sample)
        return sample

    def reference_shapes(self) -> tuple:
        """Array shapes of a good sample: the most common among the first good samples in index order
        (the same in every process, so the choice of substitutes is too)."""
        if self._reference is None:
            found = []
            for index in range(len(self)):
                if len(found) == self.REFERENCE_SAMPLES:
                    break
                try:
                    found.append(array_shapes(self._checked(index)))
                except Exception:  # noqa: BLE001 - a bad sample is no reference; __getitem__ reports it
                    continue
            counts = Counter(found)
            self._reference = max(found, key=lambda shapes: (counts[shapes], -found.index(shapes))) if found else ()
        return self._reference

    def _good(self, index: int):
        if index in self._bad:
            raise BadSample(self._bad[index])
        sample = self._checked(index)
        reference, shapes = self.reference_shapes(), array_shapes(sample)
        if reference and shapes != reference:
            raise BadSample(f"array shapes {_shapes_text(shapes)} differ from a good sample's {_shapes_text(reference)}")
        return self.transform(sample)

    def __getitem__(self, index: int):
        if not self.skip_bad:
            return self.transform(self.raw(index))
        skipped = []
        for attempt in range(len(self)):
            current = (index + attempt) % len(self)
            try:
                item = self._good(current)
            except RemoteReadError:
                raise  # the storage failed, not the sample: skipping would change what the run reads
            except Exception as error:  # noqa: BLE001 - whatever breaks a sample makes it a bad one
                reason = str(error) if isinstance(error, BadSample) else f"{type(error).__name__}: {error}"
                self._bad[current] = reason
                loc = self.locations[current]
                log.warning("bad sample in shard %s, key %s: %s; reading the next sample instead",
                            loc.shard, loc.key, reason)
                skipped.append({"shard": loc.shard, "key": loc.key, "reason": reason})
                continue
            if skipped:
                if isinstance(item, dict):
                    item = {**item, SKIPPED: item.get(SKIPPED, []) + skipped}
                else:
                    log.warning("%d bad samples skipped but not reportable through a %s item", len(skipped),
                                type(item).__name__)
            return item
        raise RuntimeError(f"{self.folder}: all {len(self)} samples are bad, e.g. {skipped[:3]}")


def _shapes_text(shapes: tuple) -> str:
    return ", ".join(f"{ext} {tuple(shape)}" for ext, shape, _ in shapes)


def split_skipped(items: Sequence) -> tuple[list, list[dict]]:
    """Items without their :data:`SKIPPED` records, and those records concatenated (for collate functions)."""
    skipped = [record for item in items if isinstance(item, Mapping) for record in item.get(SKIPPED, ())]
    return [{k: v for k, v in item.items() if k != SKIPPED} if isinstance(item, Mapping) else item
            for item in items], skipped


def ignore_interrupt(worker_id: int) -> None:
    """A training loader's ``worker_init_fn``: Ctrl-C reaches a terminal's whole process group, and a
    worker it ended would fail the run before the main process saves at the step's end
    (``training.faults.Preemption``); the main process alone answers it. Then what Lightning would have
    set in its place: its per-worker seeding under ``seed_everything(workers=True)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get("PL_SEED_WORKERS") == "1":
        from lightning.fabric.utilities.seed import pl_worker_init_function

        pl_worker_init_function(worker_id)


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
                # The global stream position (round-robin dealing): the same sample gets the same
                # position, hence the same randomness, whatever the number of ranks.
                yield (index, (self.start - 1) * self.world_size + self.rank) if self.with_position else index

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("an endless sampler has no length")
        return max(0, self.total - self.start)
