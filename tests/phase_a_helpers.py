"""Synthetic feature shards and a tiny phase (a) config, so training tests need no pipeline run."""
from __future__ import annotations

import csv
from pathlib import Path

from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from synthetic import feature_shards

NUM_CLIPS = 12


def write_synthetic_features(root: Path, enc, clips: int = NUM_CLIPS, frames: int = 17, height: int = 32,
                             width: int = 48, seed: int = 0) -> Path:
    """Feature shards with the contract's members and seeded random arrays, plus the manifest."""
    return feature_shards(root, enc, clips, frames, height, width, seed)


def tiny_train_cfg(data_root: Path, output: Path, *overrides: str):
    """Typed tiny phase (a) config over ``data_root``: CSV logs every step, no validation videos."""
    composed = compose_config("train", [
        "model=tiny", "trainer=cpu", "logger=csv", f"data.root={data_root}", f"output_dir={output}",
        "phase.max_steps=6", "phase.warmup_steps=2", "phase.lr=1e-3", "phase.batch_size=2", "phase.val_clips=0",
        "phase.val_every_n_steps=1000", "checkpoint.every_n_steps=2", "trainer.log_every_n_steps=1",
        "data.val_fraction=0.2", *overrides,
    ])
    return composed, OmegaConf.to_object(composed)


def logged_losses(output: Path) -> dict[int, float]:
    """step -> train/loss from the CSV logger (Lightning logs the step index after the update)."""
    losses = {}
    with open(output / "logs" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("train/loss"):
                losses[int(row["step"])] = float(row["train/loss"])
    return losses
