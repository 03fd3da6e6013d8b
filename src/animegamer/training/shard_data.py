"""The data a phase trains on, as Lightning sees it: train/val loaders over shard datasets, and the clips'
ground truth that the validation videos show beside their samples."""
from __future__ import annotations

import logging
from typing import Callable

import lightning as L

from animegamer.config.schema import RunConfig
from animegamer.data.indexed import IndexedShardDataset
from animegamer.data.storage import data_source

log = logging.getLogger(__name__)


class ShardData(L.LightningDataModule):
    """Train/val loaders of any phase; the train loader starts where the (possibly resumed) run
    stands, so its sample order continues exactly. An empty validation split disables validation."""

    def __init__(self, train_set, val_set, train_loader: Callable, val_loader: Callable) -> None:
        super().__init__()
        self.train_set, self.val_set = train_set, val_set
        self._train_loader, self._val_loader = train_loader, val_loader

    def train_dataloader(self):
        trainer = self.trainer
        return self._train_loader(self.train_set, trainer.global_step, trainer.global_rank, trainer.world_size)

    def val_dataloader(self):
        if not len(self.val_set):
            # Whole shots are held out (data/split.py) and a session only when all its shots are, so a
            # short film can leave a phase nothing to validate on: say so instead of Lightning's
            # "Total length of `list` across ranks is zero".
            log.warning("validation skipped: the held-out split is empty (data.val_fraction holds out whole shots; "
                        "a phase (b) session is held out only when every one of its clips is)")
            return []
        return self._val_loader(self.val_set)


def clip_lookup(cfg: RunConfig, keys: list[str]):
    """key -> ground-truth frames (T, H, W, 3) from the clip shards, for validation videos."""
    wanted = set(keys)
    dataset = IndexedShardDataset(data_source(cfg.data, cfg.data.clips), lambda s: s["mp4"], lambda k: k in wanted)
    positions = {key: i for i, key in enumerate(dataset.keys())}
    return lambda key: dataset[positions[key]]
