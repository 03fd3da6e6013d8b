"""Fingerprints: short hashes of exactly what produced a staged or derived artefact.

Every staged plan, clip task and caption result, and every derived folder (features, sessions,
representations, session and adaptation shards) records the fingerprint of its inputs: the config
fields that step reads, the identity of its input files and the caption source's version. A re-run
reuses an artefact only when its recorded fingerprint equals the current one and recomputes it
otherwise, so a changed setting never leaves old results in the shards.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from animegamer.config.schema import PipelineConfig

FINGERPRINT_HEX_CHARS = 16
# Bumped when the staged format or the meaning of a step changes: older staging is then recomputed.
STAGING_FORMAT = 2
# Motion settings that shape a clip's flow value (bins and edges only matter at finalize).
FLOW_FIELDS = ("estimator", "raft_weights", "threshold", "analysis_width")
REUSED, RECOMPUTED = "reused", "recomputed"
FINGERPRINT = "fingerprint"  # the key under which every staged record and manifest keeps its fingerprint


def fingerprint(*parts: object) -> str:
    """Short sha256 of JSON-serialisable parts (dict keys sorted)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_HEX_CHARS]


def file_identity(path: str | Path) -> dict:
    """A file's cheap identity: resolved path, size and modification time (the manifest adds sha256)."""
    path = Path(path).resolve()
    stat = path.stat()
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def plan_fingerprint(path: str | Path, cfg: PipelineConfig) -> str:
    """Probe + shot detection + task split of one film: its file, ingest and shots settings, the clip
    duration (probing rejects films shorter than one clip) and the shots per task."""
    clip_duration = {"frames": cfg.clips.frames, "fps": cfg.clips.fps}
    return fingerprint(STAGING_FORMAT, file_identity(path), asdict(cfg.ingest), asdict(cfg.shots),
                       clip_duration, cfg.shots_per_task)


def task_fingerprint(plan_fp: str, task: int, cfg: PipelineConfig) -> str:
    """Cut, flow and encode of one clip task: its film's plan, the clip settings and the flow settings."""
    flow = {name: getattr(cfg.motion, name) for name in FLOW_FIELDS}
    return fingerprint(plan_fp, task, asdict(cfg.clips), flow)


def caption_fingerprint(task_fp: str, captioner_name: str, captioner_version: str, retries: int) -> str:
    """Captions of one clip task: its clip windows (the task), the backend, its version (for jsonl the
    hash of the caption files, for models the model and prompt) and the retry budget."""
    return fingerprint(task_fp, captioner_name, captioner_version, retries)


def task_fingerprints(plan: dict, task: int, cfg: PipelineConfig, captioner) -> tuple[str, str]:
    """(clips fingerprint, captions fingerprint) of one task of a staged ``plan`` under ``cfg`` and
    the run's ``captioner``."""
    task_fp = task_fingerprint(plan[FINGERPRINT], task, cfg)
    return task_fp, caption_fingerprint(task_fp, captioner.name, captioner.version, cfg.caption.retries)


def shards_digest(manifest: dict) -> str:
    """Identity of a shard set's contents: the names and hashes of its shards."""
    return fingerprint([(s["name"], s["sha256"]) for s in manifest["shards"]])


def reuse_counts(reused: int, recomputed: int) -> dict[str, int]:
    return {REUSED: reused, RECOMPUTED: recomputed}
