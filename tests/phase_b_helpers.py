"""Synthetic session shards and a tiny phase (b) config for training tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import webdataset as wds
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.utils.io import npy_bytes

ADVERBS, MOTIONS = ("slowly", "quickly", "gently"), ("walk", "run", "talk", "sit")


def write_synthetic_sessions(root: Path, sessions: int = 10, turns: int = 5, tokens: int = 46, width: int = 32,
                             seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    folder = root / "session_shards"
    folder.mkdir(parents=True, exist_ok=True)
    name = "shard-000000.tar"
    with wds.TarWriter(str(folder / name), encoder=False) as tar:
        for s in range(sessions):
            record = {"film": "syn", "keys": [], "turns": []}
            for t in range(turns):
                key = f"syn-{s * turns + t:06d}"
                record["keys"].append(key)
                record["turns"].append({
                    "key": key, "flow": float(rng.uniform(0, 10)),
                    "instruction": f"Character: Qiqi; Motion: {ADVERBS[t % 3]} {MOTIONS[(s + t) % 4]}; Background: day town.",
                    "states": {"ML": int(rng.integers(1, 6)), "SC": int(rng.integers(0, 2)),
                               "ET": int(rng.integers(0, 2)), "ST": int(rng.choice([-1, 1]))},
                })
            reps = rng.standard_normal((turns, tokens, width)).astype(np.float16)
            tar.write({"__key__": f"syn-{s:06d}-s{turns}", "json": json.dumps(record).encode(), "reps.npy": npy_bytes(reps)})
    (folder / "manifest.json").write_text(json.dumps({"kind": "session_shards", "shards": [{"name": name, "count": sessions}]}))
    return root


def tiny_b_cfg(data_root: Path, output: Path, *overrides: str):
    composed = compose_config("train", [
        "model=tiny", "phase=b", "trainer=cpu", "logger=csv", f"data.root={data_root}", f"output_dir={output}",
        "phase.max_steps=6", "phase.warmup_steps=2", "phase.lr=3e-3", "phase.batch_size=2",
        "phase.val_every_n_steps=1000", "checkpoint.every_n_steps=2", "trainer.log_every_n_steps=1",
        "data.val_fraction=0.2", "model.mllm.lora_dropout=0.05", *overrides,
    ])
    return composed, OmegaConf.to_object(composed)
