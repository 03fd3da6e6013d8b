"""Adaptation shards (phase c input): the frozen phase (b) model's prediction for every clip.

Each clip of the session shards becomes one sample: its VAE ``latents.npy`` (from the feature
shards), ``pred_rep.npy`` (the MLLM's representation given the true history that precedes it in its
session, as much of it as the session holds) and ``json`` (flow, level, source key). The prediction
reads the query positions of the teacher-forced sequence: attention is causal, so the target's own
state tokens, which come after, cannot influence it.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from animegamer.checkpoints.export import TRAINED_FILE, recorded_start
from animegamer.config.neutral_keys import ALLOWED, flatten
from animegamer.config.schema import ModelConfig, PipelineConfig, RunConfig
from animegamer.contracts.files import ADAPTATION_DIR, FEATURES_DIR, MANIFEST, SESSION_SHARDS_DIR
from animegamer.contracts.shards import FLOW, HISTORY_TURNS, JSON, KEY, KEYS, LATENTS, LEVEL, MOTION, PRED_REP
from animegamer.data.indexed import IndexedShardDataset
from animegamer.data.phase_b import session_of
from animegamer.mllm.collate import collate_sequences, make_example
from animegamer.models.game_mllm import TokenizedMLLM, build_game_mllm, run_batch
from animegamer.utils.io import npy_bytes, sha256_file
from data_pipeline.lineage import reused_summary, step_fingerprint
from data_pipeline.writer import write_numbered_shards, write_step_manifest

MODEL_PREFIX = "model."
# Model settings that schedule the same computation differently (compilation, attention kernels,
# gradient checkpointing) or only steer sampling: what a training run may change on resume changes no
# prediction either.
PERFORMANCE_ONLY = frozenset(key for key in ALLOWED if key.startswith(MODEL_PREFIX))


def model_settings(model: ModelConfig) -> dict:
    """The model settings a prediction depends on (flattened), without the performance-only ones."""
    return {key: value for key, value in flatten(asdict(model), MODEL_PREFIX).items() if key not in PERFORMANCE_ONLY}


def load_phase_b(model_cfg: ModelConfig, export: str | Path, device: str) -> TokenizedMLLM:
    """The MLLM of a phase (b) export, frozen, in eval mode, on ``device``, built with the seed the
    export records: an export holds only the trained tensors, and a random-weight build's frozen LLM
    comes from the seed, so another seed would predict with another network."""
    mllm = build_game_mllm(RunConfig(model=model_cfg), [export])
    mllm.model.eval().requires_grad_(False).to(device)
    return mllm


def targets_with_most_history(sessions: IndexedShardDataset) -> dict[str, tuple[int, int]]:
    """clip key -> (session index, turn index) where the clip has the longest true history."""
    best: dict[str, tuple[int, int]] = {}
    for index in range(len(sessions)):
        keys = sessions.raw(index)[JSON][KEYS]
        for turn, key in enumerate(keys):
            if key not in best or turn > best[key][1]:
                best[key] = (index, turn)
    return dict(sorted(best.items()))


@torch.no_grad()
def predict(mllm: TokenizedMLLM, sessions: IndexedShardDataset, jobs: list[tuple[str, tuple[int, int]]]) -> list:
    examples = []
    for _, (index, turn) in jobs:
        session = session_of(sessions.raw(index))
        window = type(session)(session.turns[: turn + 1], session.reps[: turn + 1], key=session.key)
        examples.append(make_example(mllm.ids, mllm.tokenizer, window))
    batch = collate_sequences(examples, pad_id=mllm.ids.pad)
    device = next(mllm.model.parameters()).device
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return list(run_batch(mllm.model, batch)["pred"].float().cpu().numpy())


def build_adaptation_shards(cfg: PipelineConfig, model: ModelConfig, resolved: dict) -> dict:
    settings = cfg.adaptation
    root = Path(cfg.output)
    export_sha = sha256_file(Path(settings.export) / TRAINED_FILE)
    # The export's seed too: shards predicted by a differently seeded frozen LLM are not reusable.
    lineage = step_fingerprint(root, "adaptation", {
        "export_sha256": export_sha, "export_seed": recorded_start(settings.export)[0],
        "model": model_settings(model), "maxcount": cfg.writer.maxcount})
    reused = reused_summary(root, "adaptation", lineage[1])
    if reused is not None:
        return reused
    sessions = IndexedShardDataset(root / SESSION_SHARDS_DIR, lambda s: s, video=False)
    features = IndexedShardDataset(root / FEATURES_DIR, lambda s: s, video=False)
    feature_index = {key: i for i, key in enumerate(features.keys())}
    mllm = load_phase_b(model, settings.export, settings.device)
    jobs = list(targets_with_most_history(sessions).items())

    def adaptation_records(group: list[tuple[str, tuple[int, int]]]):
        for start in range(0, len(group), settings.batch_size):
            chunk = group[start : start + settings.batch_size]
            for (key, (index, turn)), pred in zip(chunk, predict(mllm, sessions, chunk)):
                clip = features.raw(feature_index[key])
                motion = clip[JSON][MOTION]
                meta = {KEY: key, FLOW: motion[FLOW], LEVEL: motion[LEVEL], HISTORY_TURNS: turn}
                yield {"__key__": key, JSON: json.dumps(meta, sort_keys=True).encode(),
                       LATENTS: npy_bytes(clip[LATENTS]), PRED_REP: npy_bytes(pred.astype("float16"))}

    shards = write_numbered_shards(jobs, root / ADAPTATION_DIR, cfg.writer.maxcount, adaptation_records, "adaptation")
    return write_step_manifest(
        root, "adaptation", resolved, lineage, {"clips": len(jobs)}, shards, export=str(settings.export),
        export_sha256=export_sha, session_shards_manifest_sha256=sha256_file(root / SESSION_SHARDS_DIR / MANIFEST),
        features_manifest_sha256=sha256_file(root / FEATURES_DIR / MANIFEST))
