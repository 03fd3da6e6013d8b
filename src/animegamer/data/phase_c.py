"""Phase (c) inputs: adaptation shards (true latents, the MLLM's predicted rep, flow)."""
from __future__ import annotations

import torch

from animegamer.config.schema import RunConfig
from animegamer.contracts.shards import FLOW, JSON, LATENTS, PRED_REP
from animegamer.data.indexed import ExpectArrays, IndexedShardDataset
from animegamer.data.split import held_out
from animegamer.data.storage import data_source


ADAPTATION_ARRAYS = ExpectArrays({LATENTS: 4, PRED_REP: 2})


def adaptation_transform(sample: dict) -> dict:
    return {
        "key": sample["__key__"],
        "latents": torch.from_numpy(sample[LATENTS]).float(),  # (T', C, H', W')
        "pred_rep": torch.from_numpy(sample[PRED_REP]).float(),  # (N, D)
        "flow": torch.tensor(float(sample[JSON][FLOW])),
    }


def adaptation_dataset(cfg: RunConfig, split: str) -> IndexedShardDataset:
    keep = held_out(cfg).keep_clip(split)
    return IndexedShardDataset(data_source(cfg.data, cfg.data.adaptation), adaptation_transform, keep, video=False,
                               allow_empty=split == "val", skip_bad=True, check=ADAPTATION_ARRAYS)
