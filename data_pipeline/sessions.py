"""Sessions: the index of multi-turn sessions (K consecutive captioned clips of one film) for phase (b).

A session never spans a gap: an uncaptioned clip (or a missing clip index) ends the run of
consecutive clips, because the game's history must be what really happened before the target turn.
The index also records why there are as many sessions as there are (clips, captioned clips, shots,
the longest run of consecutive captioned clips), and the step warns with what to change when there
are none.
"""
from __future__ import annotations

import logging
from pathlib import Path

from animegamer.checkpoints.trained_data import manifest_content_sha256
from animegamer.config.schema import PipelineConfig
from animegamer.contracts.files import CLIPS_DIR, MANIFEST, SESSIONS_FILE
from animegamer.contracts.shards import CAPTIONER, FILM, JSON, KEY, LEVEL, MOTION, NAME, SHOT, STATUS
from animegamer.data.lineage import MADE_FROM, index
from animegamer.data.shards import folder_shards, iter_samples, read_manifest
from animegamer.data.split import consecutive_runs, shot_id
from animegamer.media.captions import STATUS_OK
from animegamer.media.fingerprint import FINGERPRINT
from animegamer.utils.command import recorded_command
from animegamer.utils.io import write_json_atomic
from data_pipeline.captioners.failures import ADVICE
from data_pipeline.lineage import built_summary, reused_summary, step_fingerprint

log = logging.getLogger(__name__)


def sessions_of_run(run: list[dict], turns: int, stride: int) -> list[dict]:
    """Windows of ``turns`` clips every ``stride`` clips; a run shorter than ``turns`` gives none."""
    return [
        {
            "film": run[0][FILM],
            "keys": [c[KEY] for c in run[start : start + turns]],
            "levels": [c[MOTION][LEVEL] for c in run[start : start + turns]],
        }
        for start in range(0, len(run) - turns + 1, stride)
    ]


def is_captioned(meta: dict) -> bool:
    return meta[CAPTIONER][STATUS] == STATUS_OK


def clip_stats(metas: list[dict], runs: list[list[dict]], sessions: list[dict], turns: int) -> dict:
    """What decides the number of sessions."""
    captioned = [m for m in metas if is_captioned(m)]
    return {
        "clips": len(metas),
        "captioned_clips": len(captioned),
        "captioners": sorted({m[CAPTIONER][NAME] for m in metas}),
        "films": len({m[FILM] for m in metas}),
        "shots": len({shot_id(m[FILM], m[SHOT]) for m in metas}),
        "longest_run": max((len(r) for r in runs), default=0),
        "sessions": len(sessions),
        "turns": turns,
    }


def why_no_sessions(stats: dict) -> str | None:
    """What to change when the clips give no session (None when there are sessions)."""
    if stats["sessions"]:
        return None
    turns = stats["turns"]
    if not stats["clips"]:
        return "there are no clips (see report.json: skipped_inputs, failed_tasks)"
    if not stats["captioned_clips"]:
        advice = "; ".join(ADVICE.get(name, "check pipeline.caption") for name in stats["captioners"])
        return (f"none of the {stats['clips']} clips is captioned (report.json: caption_failed names them, "
                f"captions gives the first reasons): {advice}")
    return (f"the longest run of consecutive captioned clips is {stats['longest_run']} "
            f"({stats['captioned_clips']} of {stats['clips']} clips captioned, {stats['shots']} shots), "
            f"but pipeline.sessions.turns={turns} needs {turns}: lower pipeline.sessions.turns to at most "
            f"{stats['longest_run']}, lower pipeline.clips.stride_seconds for more clips per shot, or caption "
            "the clips that break the runs")


def _tell(stats: dict, reason: str | None) -> None:
    if reason is not None:
        log.warning("no session for phase (b): %s", reason)
    else:
        log.info("%d sessions of %d turns from %d captioned of %d clips (%d shots)", stats["sessions"],
                 stats["turns"], stats["captioned_clips"], stats["clips"], stats["shots"])


def build_sessions(cfg: PipelineConfig) -> dict:
    clip_dir = Path(cfg.output) / CLIPS_DIR
    settings = {"turns": cfg.sessions.turns, "stride": cfg.sessions.stride}
    sources, step_fp = step_fingerprint(cfg.output, "sessions", settings)
    reused = reused_summary(cfg.output, "sessions", step_fp)
    if reused is not None:
        previous = index(cfg.output, "sessions")
        _tell(previous["stats"], previous["why_no_sessions"])
        return {**reused, "why_no_sessions": previous["why_no_sessions"]}
    metas = [s[JSON] for s in iter_samples(folder_shards(clip_dir), video=False)]
    runs = consecutive_runs(metas, is_captioned)  # of one film each, in (film, clip) order
    sessions = [session for run in runs for session in sessions_of_run(run, cfg.sessions.turns, cfg.sessions.stride)]
    stats = clip_stats(metas, runs, sessions, cfg.sessions.turns)
    reason = why_no_sessions(stats)
    _tell(stats, reason)
    record = {
        "kind": "sessions",
        "command": recorded_command(),
        **settings,
        "clip_manifest_sha256": manifest_content_sha256(clip_dir / MANIFEST),
        MADE_FROM: sources,
        FINGERPRINT: step_fp,
        "motion_bins": read_manifest(clip_dir)["motion_bins"],
        "counts": {"sessions": len(sessions)},
        "stats": stats,
        "why_no_sessions": reason,
        "sessions": sessions,
    }
    write_json_atomic(Path(cfg.output) / SESSIONS_FILE, record)
    return {**built_summary(cfg.output, "sessions", record["counts"]), "why_no_sessions": reason}
