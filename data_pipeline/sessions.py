"""Sessions: the index of multi-turn sessions (K consecutive captioned clips of one film) for phase (b).

A session never spans a gap: an uncaptioned clip (or a missing clip index) ends the run of
consecutive clips, because the game's history must be what really happened before the target turn.
"""
from __future__ import annotations

import sys
from itertools import groupby
from pathlib import Path

from animegamer.config.schema import PipelineConfig
from animegamer.data.shards import iter_samples, read_manifest, shard_urls
from animegamer.data.split import SESSIONS_FILE
from animegamer.utils.io import sha256_file, write_json_atomic
from data_pipeline.writer import CLIPS_DIR, MANIFEST


def consecutive_runs(clips: list[dict]) -> list[list[dict]]:
    """Split one film's clips (sorted by index) into runs of consecutive, captioned clips."""
    runs, current = [], []
    for clip in clips:
        ok = clip["captioner"]["status"] == "ok"
        if current and (not ok or clip["clip"] != current[-1]["clip"] + 1):
            runs.append(current)
            current = []
        if ok:
            current.append(clip)
    if current:
        runs.append(current)
    return runs


def sessions_of_run(run: list[dict], turns: int, stride: int) -> list[dict]:
    """Windows of ``turns`` clips every ``stride`` clips; a run shorter than ``turns`` gives none."""
    return [
        {
            "film": run[0]["film"],
            "keys": [c["key"] for c in run[start : start + turns]],
            "levels": [c["motion"]["level"] for c in run[start : start + turns]],
        }
        for start in range(0, len(run) - turns + 1, stride)
    ]


def build_sessions(cfg: PipelineConfig) -> dict:
    clip_dir = Path(cfg.output) / CLIPS_DIR
    metas = [s["json"] for s in iter_samples(shard_urls(clip_dir), video=False)]
    metas.sort(key=lambda m: (m["film"], m["clip"]))
    sessions = []
    for _, film_clips in groupby(metas, key=lambda m: m["film"]):
        for run in consecutive_runs(list(film_clips)):
            sessions += sessions_of_run(run, cfg.sessions.turns, cfg.sessions.stride)
    index = {
        "kind": "sessions",
        "command": " ".join(sys.argv),
        "turns": cfg.sessions.turns,
        "stride": cfg.sessions.stride,
        "clip_manifest_sha256": sha256_file(clip_dir / MANIFEST),
        "motion_bins": read_manifest(clip_dir)["motion_bins"],
        "sessions": sessions,
    }
    out = Path(cfg.output) / SESSIONS_FILE
    write_json_atomic(out, index)
    return {"output": str(out), "sessions": len(sessions)}
