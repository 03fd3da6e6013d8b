"""Precompute: frozen-encoder features of every captioned clip, as feature shards with the same keys.

Phase (a)'s fast path reads these instead of running T5, CLIP and the VAE in the training step.
Feature shards mirror the clip shards one to one (same names, same keys minus uncaptioned clips) and
carry the clip json, so a training reader needs only this folder. Each feature shard records the
fingerprint of what its features are computed from (per clip: whether it is captioned, its mp4 bytes
and its motion text) and of the encoders; a re-run recomputes exactly the shards where one of these
changed. A shard whose clips changed only in other json fields (another caption's instruction, a
caption file's version, the motion level) keeps its features and has its json rewritten.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from animegamer.checkpoints.trained_data import manifest_content_sha256
from animegamer.config.schema import ModelConfig, PipelineConfig
from animegamer.contracts.files import CLIPS_DIR, FEATURES_DIR, MANIFEST
from animegamer.contracts.shards import IMAGE, LATENTS, TEXT
from animegamer.data.lineage import MADE_FROM, made_from
from animegamer.data.shards import folder_shards, iter_samples
from animegamer.data.storage import Shard
from animegamer.media.captions import STATUS_OK
from animegamer.media.fingerprint import FINGERPRINT, fingerprint
from animegamer.models.frozen_encoders import build_frozen_encoders
from animegamer.utils.command import recorded_command
from animegamer.utils.io import npy_bytes, read_json, write_json_atomic
from data_pipeline.fingerprint import RECOMPUTED, REUSED, reuse_counts
from data_pipeline.writer import write_shard

log = logging.getLogger(__name__)

# Member names of a feature sample (see docs/architecture.md, 'Feature shards').
FEATURE_MEMBERS = (LATENTS, TEXT, IMAGE)
INPUTS = "inputs"  # per-shard record key: the fingerprint of its feature inputs (:func:`feature_inputs`)
SOURCE_SHA256 = "source_sha256"  # per-shard record key: the hash of the clip shard it was written from


def folder_fingerprint(path: str) -> list:
    """Cheap identity of a weights folder: relative names and sizes (hashing 10 GB would take minutes)."""
    root = Path(path)
    return sorted([str(p.relative_to(root)), p.stat().st_size] for p in root.rglob("*") if p.is_file())


def encoders_fingerprint(model: ModelConfig) -> str:
    """Hash of the encoder config and of each local weight folder's listing."""
    enc = model.encoders
    ident = {"config": asdict(enc), "folders": {k: folder_fingerprint(getattr(enc, k).path)
                                                for k in ("t5", "clip", "vae") if getattr(enc, k).path}}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _batches(samples, size: int):
    batch = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def encode_batch(encoders, batch: list[dict]) -> dict[str, np.ndarray]:
    """Features of a batch of decoded clip samples: (B, ...) arrays per member name."""
    video = np.stack([s["mp4"] for s in batch])  # (B, T, H, W, 3) uint8
    first_frames = video[:, 0]  # (B, H, W, 3): the image branch sees the clip's first frame
    texts = [s["json"]["motion_text"] for s in batch]
    with torch.inference_mode():
        latents = encoders.vae.encode(torch.from_numpy(video))
        text = encoders.t5.encode(texts)
        image = encoders.clip.encode(torch.from_numpy(first_frames))
    return {LATENTS: latents.float().cpu().numpy(), TEXT: text.float().cpu().numpy(), IMAGE: image.float().cpu().numpy()}


def _captioned(samples, skipped: list[str]):
    """Clips whose caption failed have no motion_text to encode: listed, not encoded."""
    for sample in samples:
        if sample["json"]["captioner"]["status"] == STATUS_OK:
            yield sample
        else:
            skipped.append(sample["__key__"])


def feature_inputs(clip_shard: Shard) -> str:
    """Fingerprint of everything the features of a clip shard are computed from: each clip's key,
    whether it is encoded (captioned), its mp4 bytes and its motion text."""
    return fingerprint([(s["__key__"], s["json"]["captioner"]["status"] == STATUS_OK,
                         hashlib.sha256(s["mp4"]).hexdigest(), s["json"]["motion_text"])
                        for s in iter_samples([clip_shard], video=False)])


def _feature_record(sample: dict, features: dict[str, np.ndarray]) -> dict:
    record = {"__key__": sample["__key__"], "json": json.dumps(sample["json"], sort_keys=True).encode()}
    record.update({name: npy_bytes(features[name]) for name in FEATURE_MEMBERS})
    return record


def write_feature_shard(encoders, clip_shard: Shard, out_path: Path, batch_size: int) -> dict:
    """One feature shard from one clip shard, renamed into place when complete."""
    skipped: list[str] = []

    def records():
        for batch in _batches(_captioned(iter_samples([clip_shard]), skipped), batch_size):
            features = encode_batch(encoders, batch)
            for i, sample in enumerate(batch):
                yield _feature_record(sample, {name: array[i] for name, array in features.items()})

    return {**write_shard(out_path, records()), "skipped": skipped}


def rewrite_json(clip_shard: Shard, out_path: Path) -> dict:
    """The feature shard at ``out_path`` with the clip shard's json and its own features: for a clip
    shard whose feature inputs are unchanged (same clips, mp4 bytes and motion texts, in order)."""
    skipped: list[str] = []
    old = iter_samples([out_path], video=False)

    def records():
        for sample, features in zip(_captioned(iter_samples([clip_shard], video=False), skipped), old, strict=True):
            if sample["__key__"] != features["__key__"]:
                raise RuntimeError(f"{out_path}: holds {features['__key__']} where {clip_shard} has {sample['__key__']}")
            yield _feature_record(sample, features)

    # written beside the old shard (still read while writing), renamed over it when complete
    return {**write_shard(out_path, records()), "skipped": skipped}


def _settings(model: ModelConfig, cfg: PipelineConfig) -> dict:
    return {"encoders": encoders_fingerprint(model), "dtype": cfg.precompute.dtype}


def _matching_record(done_path: Path, out_path: Path, **expected: str) -> dict | None:
    """The per-shard record of an existing feature shard whose fields equal ``expected``, else None."""
    if not (out_path.exists() and done_path.exists()):
        return None
    record = read_json(done_path)
    return record if all(record.get(key) == value for key, value in expected.items()) else None


def precompute(cfg: PipelineConfig, model: ModelConfig, resolved: dict) -> dict:
    """Feature shards for every clip shard. A feature shard is reused when its feature inputs
    (:func:`feature_inputs`), the encoders and the dtype are unchanged (its json rewritten when the
    clip shard changed otherwise), recomputed otherwise; shards of clip shards that no longer exist
    are deleted."""
    clip_dir, out_dir = Path(cfg.output) / CLIPS_DIR, Path(cfg.output) / FEATURES_DIR
    settings = _settings(model, cfg)
    settings_fp = fingerprint(settings)
    clip_shards = folder_shards(clip_dir)  # names checked: a feature shard is written under each one
    names = {shard.name for shard in clip_shards}
    for stale in out_dir.glob("shard-*.tar"):
        if stale.name not in names:
            stale.unlink()
            (out_dir / f".{stale.name}.json").unlink(missing_ok=True)
    encoders = None
    shards, reused = [], 0
    for source in tqdm(clip_shards, desc="precompute", unit="shard", disable=None):
        out_path, clip_sha256 = out_dir / source.name, source.entry["sha256"]
        done_path = out_dir / f".{out_path.name}.json"  # per-shard record, written after the shard
        record = _matching_record(done_path, out_path, **{SOURCE_SHA256: clip_sha256, FINGERPRINT: settings_fp})
        if record is not None:  # the very clip shard, the same settings: nothing to read again
            reused += 1
            shards.append(record)
            continue
        inputs_fp = feature_inputs(source)
        record = _matching_record(done_path, out_path, **{INPUTS: inputs_fp, FINGERPRINT: settings_fp})
        if record is None:
            if encoders is None:
                encoders = build_frozen_encoders(model.encoders, device=cfg.precompute.device,
                                                 dtype=getattr(torch, cfg.precompute.dtype))
            record = write_feature_shard(encoders, source, out_path, cfg.precompute.batch_size)
        else:
            reused += 1
            if record[SOURCE_SHA256] == clip_sha256:
                shards.append(record)
                continue
            record = rewrite_json(source, out_path)
        record.update({SOURCE_SHA256: clip_sha256, INPUTS: inputs_fp, FINGERPRINT: settings_fp})
        write_json_atomic(done_path, record)
        shards.append(record)
    sources = made_from(cfg.output, "features")
    manifest = {
        "kind": "features",
        "command": recorded_command(),
        "config": resolved,
        "clip_manifest_sha256": manifest_content_sha256(clip_dir / MANIFEST),
        **settings,
        MADE_FROM: sources,
        FINGERPRINT: fingerprint(sources, settings),
        "members": list(FEATURE_MEMBERS),
        "counts": {"clips": sum(s["count"] for s in shards), "skipped_uncaptioned": sum(len(s["skipped"]) for s in shards)},
        "shards": [{k: s[k] for k in ("name", "count", "sha256")} for s in shards],
    }
    write_json_atomic(out_dir / MANIFEST, manifest)
    counts = reuse_counts(reused, len(shards) - reused)
    log.info("features: %d shards reused, %d recomputed", counts[REUSED], counts[RECOMPUTED])
    return {"output": str(out_dir), **manifest["counts"], "reuse": counts}
