"""Representations: a trained phase (a) encoder over the feature shards -> ``rep.npy`` shards.

Phase (b) trains on these (inputs of history turns, targets of the query tokens). The manifest
names the export and the hash of its weights, and the feature manifest's hash, so a representation
set made by another checkpoint is never mistaken for this one.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from animegamer.checkpoints.export import TRAINED_FILE
from animegamer.config.schema import ModelConfig, PipelineConfig, RunConfig
from animegamer.contracts.files import FEATURES_DIR, MANIFEST, REPRESENTATIONS_DIR
from animegamer.contracts.shards import IMAGE, JSON, REP, TEXT
from animegamer.data.shards import folder_shards, iter_samples
from animegamer.data.storage import Shard
from animegamer.models.encoder import ActionAwareEncoder
from animegamer.models.reconstruction import build_encoder
from animegamer.utils.io import npy_bytes, sha256_file
from data_pipeline.lineage import reused_summary, step_fingerprint
from data_pipeline.precompute import _batches
from data_pipeline.writer import write_shard, write_step_manifest

log = logging.getLogger(__name__)



def load_encoder(model: ModelConfig, export: str | Path) -> ActionAwareEncoder:
    """The encoder of a phase (a) export (its tensors are named ``encoder.*``), frozen."""
    return build_encoder(RunConfig(model=model), [export]).eval().requires_grad_(False)


@torch.inference_mode()
def encode_representations(encoder: ActionAwareEncoder, batch: list[dict], dtype: np.dtype) -> np.ndarray:
    device = next(encoder.parameters()).device
    text = torch.from_numpy(np.stack([s[TEXT] for s in batch])).to(device)  # (B, Lt, text_dim)
    image = torch.from_numpy(np.stack([s[IMAGE] for s in batch])).to(device)  # (B, P, image_dim)
    return encoder(text, image).float().cpu().numpy().astype(dtype)  # (B, N, D)


def export_representations(cfg: PipelineConfig, model: ModelConfig, resolved: dict) -> dict:
    settings = cfg.representations
    features = Path(cfg.output) / FEATURES_DIR
    out_dir = Path(cfg.output) / REPRESENTATIONS_DIR
    export_sha = sha256_file(Path(settings.export) / TRAINED_FILE)
    lineage = step_fingerprint(cfg.output, "representations", {
        "export_sha256": export_sha, "encoder": asdict(model.encoder), "dtype": settings.dtype})
    reused = reused_summary(cfg.output, "representations", lineage[1])
    if reused is not None:
        return reused
    sources = folder_shards(features)  # names checked before any model is built
    encoder = load_encoder(model, settings.export).to(settings.device)
    dtype = np.dtype(settings.dtype) if settings.dtype != "bfloat16" else np.float32

    def rep_records(shard: Shard):
        for batch in _batches(iter_samples([shard], video=False), settings.batch_size):
            for sample, rep in zip(batch, encode_representations(encoder, batch, dtype)):
                yield {"__key__": sample["__key__"], REP: npy_bytes(rep),
                       JSON: json.dumps(sample[JSON], sort_keys=True).encode()}

    shards = [write_shard(out_dir / shard.name, rep_records(shard))
              for shard in tqdm(sources, desc="representations", unit="shard", disable=None)]
    return write_step_manifest(
        Path(cfg.output), "representations", resolved, lineage, {"clips": sum(s["count"] for s in shards)}, shards,
        export=str(settings.export), export_sha256=export_sha,
        features_manifest_sha256=sha256_file(features / MANIFEST), shape=[encoder.num_tokens, encoder.width],
        dtype=str(dtype))
