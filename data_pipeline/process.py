"""The per-film work: probe + shot plan (one job per film), then clip tasks (groups of shots).

Both kinds of job are plain functions of picklable arguments so a process pool can run them, and
both write their results through :class:`Staging` atomically, so a killed run loses at most the
jobs that were in flight.
"""
from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from animegamer.config.schema import PipelineConfig
from data_pipeline.clips import ClipWindow, FrameSource, encode_mp4, plan_windows
from data_pipeline.errors import BadInput
from data_pipeline.ingest import FilmInfo, probe
from data_pipeline.motion import clip_flow, make_estimator
from data_pipeline.shots import Shot, detect_cuts, shots_from_cuts
from data_pipeline.staging import Staging

log = logging.getLogger(__name__)

DECODE_ERROR = "decode_error"


def as_pipeline_config(cfg) -> PipelineConfig:
    """Pool jobs receive plain dicts (cheap to pickle); rebuild the typed config."""
    if isinstance(cfg, PipelineConfig):
        return cfg
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PipelineConfig), cfg))


def plan_film(path: str, film_id: str, cfg_dict: dict, root: str) -> dict:
    """Probe and detect shots of one film; returns its plan (or rejection) record, also staged."""
    cfg = as_pipeline_config(cfg_dict)
    staging = Staging(Path(root))
    existing = staging.plan(film_id) or staging.rejection(path)
    if existing is not None:
        return existing
    started = time.perf_counter()
    try:
        film = probe(Path(path), film_id, cfg.ingest, cfg.clips)
        probed = time.perf_counter()
        cuts = detect_cuts(film, cfg.shots)
    except BadInput as bad:
        record = {**bad.to_json(), "film_id": film_id}
        staging.write_rejection(record)
        log.warning("skipping %s", bad)
        return record
    except Exception as exc:  # a decoder crash on a file that probed fine is still the file's fault
        record = {"path": path, "film_id": film_id, "reason": DECODE_ERROR, "detail": repr(exc)[:300]}
        staging.write_rejection(record)
        log.warning("skipping %s: %s", path, record["detail"])
        return record
    shots = shots_from_cuts(cuts, film.num_frames)
    windows = plan_windows(film, shots, cfg.clips)
    plan = {
        "film": film.to_json(),
        "shots": [s.to_json() for s in shots],
        "num_clips": len(windows),
        "tasks": _task_shot_ranges(shots, cfg.shots_per_task),
        "timings": {"ingest": probed - started, "shots": time.perf_counter() - probed},
    }
    staging.write_plan(film_id, plan)
    return plan


def _task_shot_ranges(shots: list[Shot], shots_per_task: int) -> list[list[int]]:
    """[first_shot, end_shot) per task: long films become several independent tasks."""
    return [[i, min(i + shots_per_task, len(shots))] for i in range(0, len(shots), shots_per_task)]


def film_from_plan(plan: dict) -> tuple[FilmInfo, list[Shot]]:
    film = FilmInfo(**plan["film"])
    shots = [Shot(i, s, e) for i, (s, e) in enumerate(plan["shots"])]
    return film, shots


def task_windows(plan: dict, task: int, cfg: PipelineConfig) -> list[ClipWindow]:
    film, shots = film_from_plan(plan)
    first, end = plan["tasks"][task]
    return [w for w in plan_windows(film, shots, cfg.clips) if first <= w.shot_index < end]


def clip_meta(film: FilmInfo, window: ClipWindow, cfg: PipelineConfig, flow: float, result) -> dict:
    """The clip's json record (DESIGN section 3) minus the motion level, set once bins are known."""
    from data_pipeline.captioners.fields import build_instruction, build_motion_text

    caption = result.to_json()
    return {
        "key": window.key,
        "film": film.film_id,
        "shot": window.shot_index,
        "clip": window.clip_index,
        "source": film.path,
        "source_frames": list(window.frame_indices),
        "start": window.start_s(film.fps),
        "end": window.end_s(film.fps),
        "fps": cfg.clips.fps,
        "frames": cfg.clips.frames,
        "height": cfg.clips.height,
        "width": cfg.clips.width,
        "caption": caption["caption"],
        "states": caption["states"],
        "instruction": build_instruction(result.caption) if result.ok else None,
        "motion_text": build_motion_text(result.caption) if result.ok else None,
        "motion": {"flow": flow},
        "captioner": {
            "name": caption["captioner"],
            "version": caption["captioner_version"],
            "status": caption["status"],
            "error": caption["error"],
            "attempts": caption["attempts"],
        },
    }


_CAPTIONERS: dict[str, object] = {}


def captioner_for(caption_cfg, film_paths: dict[str, str]):
    """One captioner per worker process and config: a VLM is loaded once, not once per task."""
    from data_pipeline.captioners.base import build_captioner

    key = repr(caption_cfg)
    if key not in _CAPTIONERS:
        _CAPTIONERS[key] = build_captioner(caption_cfg, film_paths)
    return _CAPTIONERS[key]


def run_task(film_id: str, task: int, cfg_dict: dict, root: str) -> dict:
    """Cut, measure, caption and encode the clips of one task; staged atomically as a folder."""
    from data_pipeline.captioners.base import ClipContext

    cfg = as_pipeline_config(cfg_dict)
    staging = Staging(Path(root))
    if staging.task_done(film_id, task):
        return staging.task_info(film_id, task)
    plan = staging.plan(film_id)
    film, _ = film_from_plan(plan)
    timings = {"decode": 0.0, "motion": 0.0, "caption": 0.0, "encode": 0.0}
    try:
        source = FrameSource(film, cfg.clips)
        estimator = make_estimator(cfg.motion)
        captioner = captioner_for(cfg.caption, {film.film_id: film.path})
        staged = []
        for window in task_windows(plan, task, cfg):
            t0 = time.perf_counter()
            frames = source.clip_frames(window)
            t1 = time.perf_counter()
            flow = clip_flow(frames, cfg.motion, estimator)
            t2 = time.perf_counter()
            context = ClipContext(film.film_id, window.key, window.start_s(film.fps), window.end_s(film.fps), frames)
            caption = captioner.caption(context)
            t3 = time.perf_counter()
            mp4 = encode_mp4(frames, cfg.clips.fps, cfg.clips)
            t4 = time.perf_counter()
            for name, dt in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                timings[name] += dt
            staged.append((window.key, mp4, clip_meta(film, window, cfg, flow, caption)))
    except Exception as exc:
        record = {"film_id": film_id, "task": task, "reason": DECODE_ERROR, "detail": repr(exc)[:300],
                  "traceback": traceback.format_exc(limit=5)}
        staging.write_task_error(film_id, task, record)
        log.warning("task %d of %s failed: %s", task, film_id, record["detail"])
        return record
    info = {"film_id": film_id, "task": task, "clips": len(staged), "timings": timings}
    staging.write_task(film_id, task, staged, info)
    return info
