"""Phase (a) inputs: feature shards (fast path) or clip shards (frozen encoders in the step)."""
from __future__ import annotations

import hashlib
from functools import partial

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

from animegamer.config.schema import RunConfig
from animegamer.contracts.shards import CAPTIONER, FLOW, IMAGE, JSON, LATENTS, MOTION, MOTION_TEXT, MP4, STATUS, TEXT
from animegamer.data.indexed import (SKIPPED, ExpectArrays, IndexedShardDataset, StepSampler, ignore_interrupt,
                                     split_skipped)
from animegamer.data.split import held_out
from animegamer.data.storage import data_source
from animegamer.media.captions import STATUS_OK

FEATURES, CLIPS = "features", "clips"
INPUTS = (FEATURES, CLIPS)  # phase.input: precomputed features or raw clips
# What a good sample holds (ranks; shapes must also match the first good samples').
FEATURE_ARRAYS = ExpectArrays({LATENTS: 4, TEXT: 2, IMAGE: 2})
CLIP_ARRAYS = ExpectArrays({MP4: (None, None, None, 3)})  # (T, H, W, RGB)


def _captioned(sample: dict) -> None:
    if sample[JSON][CAPTIONER][STATUS] != STATUS_OK:
        raise ValueError(f"{sample['__url__']}: {sample['__key__']} has no caption; phase (a) needs motion_text")


def feature_transform(sample: dict) -> dict:
    return {
        "key": sample["__key__"],
        "latents": torch.from_numpy(sample[LATENTS]).float(),  # (T', C, H', W')
        "text": torch.from_numpy(sample[TEXT]).float(),  # (Lt, text_dim)
        "image": torch.from_numpy(sample[IMAGE]).float(),  # (P, image_dim)
        "flow": torch.tensor(float(sample[JSON][MOTION][FLOW])),
    }


def _frame_index(key: str, frames: int, random_frame: bool, seed: int) -> int:
    """First frame (paper), or a per-clip fixed "random" frame for the Table 3 ablation."""
    if not random_frame:
        return 0
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % frames


def clip_transform(sample: dict, random_frame: bool, seed: int) -> dict:
    _captioned(sample)
    video = sample[MP4]  # (T, H, W, 3) uint8
    frame = _frame_index(sample["__key__"], video.shape[0], random_frame, seed)
    return {
        "key": sample["__key__"],
        "video": torch.from_numpy(np.ascontiguousarray(video)),
        "frame": torch.from_numpy(np.ascontiguousarray(video[frame])),
        "motion_text": sample[JSON][MOTION_TEXT],
        "flow": torch.tensor(float(sample[JSON][MOTION][FLOW])),
    }


def phase_a_dataset(cfg: RunConfig, split: str) -> IndexedShardDataset:
    """Train or validation clips; validation = the held-out shots (``animegamer.data.split``)."""
    keep = held_out(cfg).keep_clip(split)

    if cfg.phase.input == FEATURES:
        return IndexedShardDataset(data_source(cfg.data, cfg.data.features), feature_transform, keep, video=False,
                                   allow_empty=split == "val", skip_bad=True, check=FEATURE_ARRAYS)
    transform = partial(clip_transform, random_frame=cfg.phase.random_frame, seed=cfg.seed)
    return IndexedShardDataset(data_source(cfg.data, cfg.data.clips), transform, keep, video=True,
                               allow_empty=split == "val", skip_bad=True, check=CLIP_ARRAYS)


def collate_samples(items: list[dict]) -> dict:
    """``default_collate``, with the items' bad-sample records (:data:`SKIPPED`) concatenated."""
    items, skipped = split_skipped(items)
    batch = default_collate(items)
    if skipped:
        batch[SKIPPED] = skipped
    return batch


def train_loader(cfg: RunConfig, dataset, start_step: int, rank: int, world_size: int) -> DataLoader:
    """Loader whose sample order depends on (seed, step) only: resuming at ``start_step`` is exact."""
    per_step = cfg.phase.batch_size * cfg.trainer.accumulate_grad_batches
    # Endless: one never-ending epoch, stopped by max_steps, so no epoch boundary can restart it.
    sampler = StepSampler(len(dataset), cfg.seed, rank, world_size, start=start_step * per_step)
    return DataLoader(dataset, batch_size=cfg.phase.batch_size, sampler=sampler, num_workers=cfg.data.num_workers,
                      drop_last=True, persistent_workers=cfg.data.num_workers > 0, collate_fn=collate_samples,
                      worker_init_fn=ignore_interrupt)


def val_loader(cfg: RunConfig, dataset) -> DataLoader:
    return DataLoader(dataset, batch_size=cfg.phase.batch_size, shuffle=False, num_workers=0,
                      collate_fn=collate_samples)
