"""Shards of seeded random arrays in the pipeline's contracts (features, sessions, adaptation):
what the training tests run on, and what the paper-scale GPU runs train on with random weights."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import webdataset as wds

from animegamer.config.validate import vae_latent_shape
from animegamer.contracts.files import MANIFEST
from animegamer.contracts.shards import IMAGE, LATENTS, PRED_REP, REPS, TEXT
from animegamer.contracts.states import ENTERTAINMENT, ML_RANGE, MOTION_LEVEL, SOCIAL, STAMINA
from animegamer.media.captions import STATUS_OK
from animegamer.utils.io import npy_bytes

ADVERBS, MOTIONS = ("slowly", "quickly", "gently"), ("walk", "run", "talk", "sit")


def _manifest(folder: Path, kind: str, shards: list[dict]) -> None:
    (folder / MANIFEST).write_text(json.dumps({"kind": kind, "shards": shards}))


def feature_shards(root: Path, enc, clips: int, frames: int, height: int, width: int, seed: int = 0,
                   num_shards: int = 2) -> Path:
    """``<root>/features``: latents, T5 and CLIP features of ``clips`` random clips (phase (a) input);
    ``enc`` is ``model.encoders`` (the shapes follow its VAE, T5 and CLIP)."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "features"
    folder.mkdir(parents=True, exist_ok=True)
    latents = vae_latent_shape(enc, frames, height, width)
    patches = (enc.clip.image_size // enc.clip.patch_size) ** 2
    shards = []
    for shard in range(num_shards):
        name = f"shard-{shard:06d}.tar"
        count = 0
        with wds.TarWriter(str(folder / name), encoder=False) as tar:
            for i in range(shard, clips, num_shards):
                meta = {"key": f"syn-{i:06d}", "motion": {"flow": float(rng.uniform(0, 10)), "level": 1 + i % 5},
                        "captioner": {"status": STATUS_OK}, "motion_text": "softly talk", "frames": frames}
                tar.write({"__key__": meta["key"], "json": json.dumps(meta).encode(),
                           LATENTS: npy_bytes(rng.standard_normal(latents).astype(np.float32)),
                           TEXT: npy_bytes(rng.standard_normal((enc.t5.max_tokens, enc.t5.d_model)).astype(np.float32)),
                           IMAGE: npy_bytes(rng.standard_normal((patches, enc.clip.hidden_size)).astype(np.float32))})
                count += 1
        shards.append({"name": name, "count": count})
    _manifest(folder, "features", shards)
    return Path(root)


def session_shards(root: Path, sessions: int, turns: int, tokens: int, width: int, seed: int = 0) -> Path:
    """``<root>/session_shards``: sessions of ``turns`` turns with random states and (turns, N, D) reps."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "session_shards"
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
                    "states": {MOTION_LEVEL: int(rng.integers(ML_RANGE[0], ML_RANGE[1] + 1)), SOCIAL: int(rng.integers(0, 2)),
                               ENTERTAINMENT: int(rng.integers(0, 2)), STAMINA: int(rng.choice([-1, 1]))},
                })
            reps = rng.standard_normal((turns, tokens, width)).astype(np.float16)
            tar.write({"__key__": f"syn-{s:06d}-s{turns}", "json": json.dumps(record).encode(), REPS: npy_bytes(reps)})
    _manifest(folder, "session_shards", [{"name": name, "count": sessions}])
    return Path(root)


def adaptation_shards(root: Path, clips: int, latent_shape: tuple, rep_shape: tuple, seed: int = 0) -> Path:
    """``<root>/adaptation``: true latents beside a predicted representation (phase (c) input)."""
    folder = Path(root) / "adaptation"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with wds.TarWriter(str(folder / "shard-000000.tar"), encoder=False) as tar:
        for i in range(clips):
            tar.write({"__key__": f"syn-{i:06d}", "json": json.dumps({"flow": float(i), "level": 1 + i % 5}).encode(),
                       LATENTS: npy_bytes(rng.standard_normal(latent_shape).astype(np.float32)),
                       PRED_REP: npy_bytes(rng.standard_normal(rep_shape).astype(np.float16))})
    _manifest(folder, "adaptation", [{"name": "shard-000000.tar", "count": clips}])
    return Path(root)
