"""The per-film work: probe + shot plan (one job per film), then clip tasks (groups of shots).

Both kinds of job are plain functions of picklable arguments so a process pool can run them, and
both write their results through :class:`Staging` atomically, so a killed run loses at most the
jobs that were in flight. A clip task stages its clips (cut, flow, mp4) and its captions apart, each
with its fingerprint: when only the caption source changed, a task re-captions its clips and keeps
the rest; when only failed captions are asked for again, it captions those clips alone.
"""
from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from animegamer.config.compose import literal
from animegamer.config.schema import PipelineConfig
from animegamer.contracts.shards import (ATTEMPTS, CAPTION, CAPTIONER, CLIP, END, ERROR, FILM, FLOW, FPS, FRAMES, HEIGHT,
                                         INSTRUCTION, KEY, MOTION, MOTION_TEXT, NAME, SHOT, SOURCE, SOURCE_FRAMES,
                                         START, STATES, STATUS, VERSION, WIDTH)
from animegamer.media.fingerprint import FINGERPRINT
from animegamer.media.flow import clip_flow, make_estimator
from animegamer.media.video import encode_mp4
from data_pipeline.captioners.base import ClipContext
from data_pipeline.captioners.fields import build_instruction, build_motion_text
from data_pipeline.captioners.registry import build_captioner
from data_pipeline.clips import ClipWindow, FrameSource, plan_windows
from data_pipeline.errors import BadInput
from data_pipeline.fingerprint import plan_fingerprint, task_fingerprints
from data_pipeline.ingest import FilmInfo, probe, readable_error
from data_pipeline.shots import Shot, detect_cuts, shots_from_cuts
from data_pipeline.staging import Staging, captions_to_retry

log = logging.getLogger(__name__)

DECODE_ERROR = "decode_error"
TASK_TIMINGS = ("decode", "motion", "caption", "encode")


def as_pipeline_config(cfg) -> PipelineConfig:
    """Pool jobs receive plain dicts (cheap to pickle); rebuild the typed config."""
    if isinstance(cfg, PipelineConfig):
        return cfg
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PipelineConfig), _literal(cfg)))


def _literal(value: Any) -> Any:
    """``value`` with every ``${`` escaped: the dict holds resolved values (a folder may be named
    ``run ${x}``), which OmegaConf would otherwise read as interpolations."""
    if isinstance(value, dict):
        return {key: _literal(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_literal(item) for item in value]
    return literal(value) if isinstance(value, str) else value


def _with_clip_count(record: dict, cfg: PipelineConfig) -> dict:
    """A plan as returned to callers: with the number of clips under the current clip settings."""
    if "tasks" not in record:
        return record
    film, shots = film_from_plan(record)
    return {**record, "num_clips": len(plan_windows(film, shots, cfg.clips))}


def plan_film(path: str, film_id: str, cfg_dict: dict, root: str) -> dict:
    """Probe and detect shots of one film; returns its plan (or rejection) record, also staged.

    A staged record made with the same file and settings (its fingerprint) is returned as it is."""
    cfg = as_pipeline_config(cfg_dict)
    staging = Staging(Path(root))
    plan_fp = plan_fingerprint(path, cfg, staging.hash_cache)
    existing = staging.plan(film_id, plan_fp) or staging.rejection(path, plan_fp)
    if existing is not None:
        return _with_clip_count(existing, cfg)
    started = time.perf_counter()
    try:
        film = probe(Path(path), film_id, cfg.ingest, cfg.clips)
        probed = time.perf_counter()
        cuts = detect_cuts(film, cfg.shots)
    except BadInput as bad:
        record = {**bad.to_json(), "film_id": film_id, FINGERPRINT: plan_fp}
        staging.write_rejection(record)
        log.warning("skipping %s", bad)
        return record
    except Exception as exc:  # a decoder crash on a file that probed fine is still the file's fault
        record = {"path": path, "film_id": film_id, "reason": DECODE_ERROR, "detail": readable_error(exc, typed=True),
                  FINGERPRINT: plan_fp}
        staging.write_rejection(record)
        log.warning("skipping %s: %s", path, record["detail"])
        return record
    shots = shots_from_cuts(cuts, film.num_frames)
    plan = {
        "film": film.to_json(),
        "shots": [s.to_json() for s in shots],
        "tasks": _task_shot_ranges(shots, cfg.shots_per_task),
        "timings": {"ingest": probed - started, "shots": time.perf_counter() - probed},
        FINGERPRINT: plan_fp,
    }
    staging.write_plan(film_id, plan)
    return _with_clip_count(plan, cfg)


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


def clip_meta(film: FilmInfo, window: ClipWindow, cfg: PipelineConfig, flow: float) -> dict:
    """The clip's json record minus its caption fields and its motion level (the fields: see
    docs/architecture.md, 'Clip shards')."""
    return {
        KEY: window.key,
        FILM: film.film_id,
        SHOT: window.shot_index,
        CLIP: window.clip_index,
        SOURCE: Path(film.path).name,
        SOURCE_FRAMES: list(window.frame_indices),
        START: window.start_s(film.fps),
        END: window.end_s(film.fps),
        FPS: cfg.clips.fps,
        FRAMES: cfg.clips.frames,
        HEIGHT: cfg.clips.height,
        WIDTH: cfg.clips.width,
        MOTION: {FLOW: flow},
    }


def caption_fields(result) -> dict:
    """The caption part of a clip's json record; finalize merges it into the clip meta."""
    caption = result.to_json()
    return {
        CAPTION: caption["caption"],
        STATES: caption["states"],
        INSTRUCTION: build_instruction(result.caption) if result.ok else None,
        MOTION_TEXT: build_motion_text(result.caption) if result.ok else None,
        CAPTIONER: {
            NAME: caption["captioner"],
            VERSION: caption["captioner_version"],
            STATUS: caption["status"],
            ERROR: caption["error"],
            ATTEMPTS: caption["attempts"],
        },
    }


_CAPTIONERS: dict[str, object] = {}
# Every film this worker process has handled (film id -> path), shared by its captioners: a captioner
# built for one film resolves the path/name/stem aliases of the films that come after it.
_FILM_PATHS: dict[str, str] = {}


def captioner_for(caption_cfg, film_paths: dict[str, str], version: str | None = None):
    """One captioner per worker process and config: a VLM is loaded once, not once per task.

    ``version``: the caption source's version the run's main process read; a cached captioner of
    another version (the caption file was edited since it was built) is built again. The run's
    pre-flight warns (once, in the main process) about caption records naming no input film; workers
    see only the films they handle, so they do not warn."""
    _FILM_PATHS.update(film_paths)
    key = repr(caption_cfg)
    cached = _CAPTIONERS.get(key)
    if cached is None or (version is not None and cached.version != version):
        cached = _CAPTIONERS[key] = build_captioner(caption_cfg, _FILM_PATHS, warn_unknown_films=False)
    if version is not None and cached.version != version:
        raise RuntimeError(f"the caption source ({caption_cfg.path}) changed while the run was going "
                           f"(version {version} at the start, {cached.version} now): run again")
    return cached


def _cut_and_caption(film: FilmInfo, windows: list[ClipWindow], cfg: PipelineConfig, captioner,
                     with_clips: bool, kept: dict[str, dict]
                     ) -> tuple[list[tuple[str, bytes, dict]], dict[str, dict], dict]:
    """Caption every window but those in ``kept`` (key -> staged caption fields, kept as they are), and
    (``with_clips``) measure and encode it; frames are decoded only when clips are made or the
    captioner looks at them."""
    timings = dict.fromkeys(TASK_TIMINGS, 0.0)
    source = FrameSource(film, cfg.clips) if with_clips or captioner.needs_frames else None
    estimator = make_estimator(cfg.motion) if with_clips else None
    no_frames = np.zeros((0, cfg.clips.height, cfg.clips.width, 3), np.uint8)
    staged, captions = [], {}
    for window in windows:
        if window.key in kept:
            captions[window.key] = kept[window.key]
            continue
        t0 = time.perf_counter()
        frames = source.clip_frames(window) if source is not None else no_frames
        t1 = time.perf_counter()
        flow = clip_flow(frames, cfg.motion, estimator) if with_clips else None
        t2 = time.perf_counter()
        context = ClipContext(film.film_id, window.key, window.start_s(film.fps), window.end_s(film.fps), frames)
        captions[window.key] = caption_fields(captioner.caption(context))
        t3 = time.perf_counter()
        if with_clips:
            mp4 = encode_mp4(frames, cfg.clips.fps, cfg.clips)
            staged.append((window.key, mp4, clip_meta(film, window, cfg, flow)))
        t4 = time.perf_counter()
        for name, dt in zip(TASK_TIMINGS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            timings[name] += dt
    return staged, captions, timings


def run_task(film_id: str, task: int, cfg_dict: dict, root: str, captioner_version: str | None = None) -> dict:
    """Cut, measure, caption and encode the clips of one task; staged atomically as a folder, then
    its captions. Whatever is current (same fingerprint) is kept: clips made with the same settings
    are only re-captioned when the caption source changed. ``captioner_version``: the caption
    source's version as the run's main process read it (see :func:`captioner_for`)."""
    cfg = as_pipeline_config(cfg_dict)
    staging = Staging(Path(root))
    plan = staging.plan(film_id)
    film, _ = film_from_plan(plan)
    captioner = captioner_for(cfg.caption, {film.film_id: film.path}, captioner_version)
    task_fp, caption_fp = task_fingerprints(plan, task, cfg, captioner)
    clips_current = staging.task_done(film_id, task, task_fp)
    previous = staging.captions(film_id, task, caption_fp) if clips_current else None
    retry = captions_to_retry(previous, cfg.caption.retry_failed, captioner.name)
    if previous is not None and not retry:
        return staging.task_info(film_id, task)
    kept = {key: fields for key, fields in previous["captions"].items() if key not in retry} if previous else {}
    if retry:
        log.info("task %d of %s: asking again for %d failed caption(s)", task, film_id, len(retry))
    try:
        windows = task_windows(plan, task, cfg)
        staged, captions, timings = _cut_and_caption(film, windows, cfg, captioner, not clips_current, kept)
    except Exception as exc:
        record = {"film_id": film_id, "task": task, "reason": DECODE_ERROR, "detail": readable_error(exc, typed=True),
                  "traceback": traceback.format_exc(limit=5), FINGERPRINT: caption_fp}
        staging.write_task_error(film_id, task, record)
        log.warning("task %d of %s failed: %s", task, film_id, record["detail"])
        return record
    if not clips_current:
        info = {"film_id": film_id, "task": task, "clips": len(staged), FINGERPRINT: task_fp,
                "timings": {k: v for k, v in timings.items() if k != "caption"}}
        staging.write_task(film_id, task, staged, info)
    caption_seconds = timings["caption"] + (previous["timings"]["caption"] if previous else 0.0)
    staging.write_captions(film_id, task, {FINGERPRINT: caption_fp, "captions": captions,
                                           "timings": {"caption": caption_seconds}})
    return staging.task_info(film_id, task)
