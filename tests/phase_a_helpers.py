"""Synthetic feature shards and a tiny phase (a) config, so training tests need no pipeline run."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import webdataset as wds
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.utils.io import npy_bytes

NUM_CLIPS = 12


def write_synthetic_features(root: Path, enc, clips: int = NUM_CLIPS, frames: int = 17, height: int = 32,
                             width: int = 48, seed: int = 0) -> Path:
    """Feature shards with the contract's members and seeded random arrays, plus the manifest."""
    rng = np.random.default_rng(seed)
    folder = root / "features"
    folder.mkdir(parents=True, exist_ok=True)
    spatial = 2 ** (len(enc.vae.block_out_channels) - 1)
    latent_shape = ((frames - 1) // enc.vae.temporal_compression_ratio + 1, enc.vae.latent_channels,
                    height // spatial, width // spatial)
    patches = (enc.clip.image_size // enc.clip.patch_size) ** 2
    shards = []
    for shard in range(2):
        name = f"shard-{shard:06d}.tar"
        count = 0
        with wds.TarWriter(str(folder / name), encoder=False) as tar:
            for i in range(shard, clips, 2):
                meta = {"key": f"syn-{i:06d}", "motion": {"flow": float(rng.uniform(0, 10)), "level": 1 + i % 5},
                        "captioner": {"status": "ok"}, "motion_text": "softly talk", "frames": frames}
                tar.write({"__key__": meta["key"], "json": json.dumps(meta).encode(),
                           "latents.npy": npy_bytes(rng.standard_normal(latent_shape).astype(np.float32)),
                           "text.npy": npy_bytes(rng.standard_normal((enc.t5.max_tokens, enc.t5.d_model)).astype(np.float32)),
                           "image.npy": npy_bytes(rng.standard_normal((patches, enc.clip.hidden_size)).astype(np.float32))})
                count += 1
        shards.append({"name": name, "count": count})
    (folder / "manifest.json").write_text(json.dumps({"kind": "features", "shards": shards}))
    return root


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
