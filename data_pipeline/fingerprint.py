"""The pipeline's fingerprints: what each staged or derived artefact was made from.

Every staged plan, clip task and caption result, and every derived folder (features, sessions,
representations, session and adaptation shards) records the fingerprint of its inputs: the config
fields that step reads, the identity of its input files and the caption source's version. A re-run
reuses an artefact only when its recorded fingerprint equals the current one and recomputes it
otherwise, so a changed setting never leaves old results in the shards.

An input film's identity is its content (:func:`animegamer.media.fingerprint.file_identity`): a film
copied, moved or mounted elsewhere (another machine of ``num_parts``) keeps its staged work; its hash is
cached under the staging folder.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from animegamer.config.schema import PipelineConfig
from animegamer.media.fingerprint import FINGERPRINT, file_identity, fingerprint

# Bumped when the staged format or the meaning of a step changes: older staging is then recomputed.
STAGING_FORMAT = 3
# Motion settings that shape a clip's flow value (bins and edges only matter at finalize).
FLOW_FIELDS = ("estimator", "raft_weights", "threshold", "analysis_width")
# Ingest settings that probing reads (extensions only decide which files are found).
PROBE_FIELDS = ("min_side", "max_aspect", "vfr_tolerance")
# Shot settings that each detector reads (besides the decode width and the minimum shot length).
DETECTOR_FIELDS = {"content": ("threshold",), "adaptive": ("adaptive_threshold", "min_content_val")}
SHOT_FIELDS = ("detector", "min_scene_frames", "analysis_width")
REUSED, RECOMPUTED = "reused", "recomputed"


def plan_fingerprint(path: str | Path, cfg: PipelineConfig, cache_dir: Path) -> str:
    """Probe + shot detection + task split of one film: its content, the ingest and shot settings that
    probing and its detector read, the clip duration (probing rejects films shorter than one clip) and
    the shots per task. ``cache_dir``: where file hashes are cached (:meth:`Staging.hash_cache`)."""
    probing = {name: getattr(cfg.ingest, name) for name in PROBE_FIELDS}
    shots = {name: getattr(cfg.shots, name) for name in SHOT_FIELDS + DETECTOR_FIELDS.get(cfg.shots.detector, ())}
    clip_duration = {"frames": cfg.clips.frames, "fps": cfg.clips.fps}
    return fingerprint(STAGING_FORMAT, file_identity(path, cache_dir), probing, shots, clip_duration,
                       cfg.shots_per_task)


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


def reuse_counts(reused: int, recomputed: int) -> dict[str, int]:
    return {REUSED: reused, RECOMPUTED: recomputed}
