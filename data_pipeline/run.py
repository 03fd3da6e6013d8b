"""Orchestration: which films this part owns, the process pool, and the order of the steps."""
from __future__ import annotations

import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from omegaconf import OmegaConf
from tqdm import tqdm

from animegamer.config.schema import PipelineConfig
from animegamer.config.validate import PIPELINE_STEPS
from animegamer.utils.io import clean_stale_temps
from data_pipeline.ingest import film_ids, find_inputs, split_part
from data_pipeline.process import plan_film, run_task
from data_pipeline.staging import Staging

log = logging.getLogger(__name__)

TOY_DIR = "toy_film"


def _map(fn: Callable, jobs: list[tuple], workers: int, desc: str) -> list:
    """Run ``fn(*job)`` for every job, in a spawn pool when workers > 1, with a progress bar."""
    bar = tqdm(total=len(jobs), desc=desc, unit="job", disable=None)
    if workers <= 1 or len(jobs) <= 1:
        results = []
        for job in jobs:
            results.append(fn(*job))
            bar.update(1)
        bar.close()
        return results
    # spawn, not fork: decoders and BLAS thread pools do not survive a fork reliably.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(fn, *job) for job in jobs]
        for future in futures:
            future.result()
            bar.update(1)
    bar.close()
    return [f.result() for f in futures]


def prepare_toy_film(cfg: PipelineConfig) -> None:
    """Generate the toy film (once) into the output folder and point inputs/captions at it."""
    from data_pipeline.toyfilm import make_toy_film

    toy_dir = Path(cfg.output) / TOY_DIR
    toy = make_toy_film(toy_dir) if not any(toy_dir.glob("*.truth.json")) else None
    if toy is not None:
        log.info("toy film written to %s", toy_dir)
    cfg.inputs = [str(p) for p in sorted(toy_dir.glob("*.mp4"))]
    cfg.caption.path = str(toy_dir)


def assigned_films(cfg: PipelineConfig, all_parts: bool) -> dict[str, str]:
    """source path -> film id, for this part (or every part, for finalize)."""
    paths = find_inputs(cfg.inputs, cfg.ingest.extensions)
    ids = film_ids(paths)
    mine = paths if all_parts else split_part(paths, cfg.part, cfg.num_parts)
    return {str(p): ids[p] for p in mine}


def process(cfg: PipelineConfig, films: dict[str, str]) -> None:
    """Plan every film, then run every clip task; both skip what a previous run finished."""
    staging = Staging(Path(cfg.output))
    clean_stale_temps(staging.dir / "rejected")
    cfg_dict = OmegaConf.to_container(OmegaConf.structured(cfg))
    root = str(cfg.output)
    plans = _map(plan_film, [(p, f, cfg_dict, root) for p, f in films.items()], cfg.workers, "shots")
    tasks = []
    for film_id, plan in zip(films.values(), plans):
        if "tasks" in plan:
            clean_stale_temps(staging.film_dir(film_id))
            tasks += [(film_id, t, cfg_dict, root) for t in range(len(plan["tasks"])) if not staging.task_done(film_id, t)]
    _map(run_task, tasks, cfg.workers, "clips")


def run_pipeline(cfg: PipelineConfig, resolved: dict, model_cfg=None) -> dict:
    """Run the configured steps in order; returns the report (finalize) or a summary."""
    steps: Iterable[str] = cfg.steps or PIPELINE_STEPS
    if cfg.toy_film:
        prepare_toy_film(cfg)
        resolved["pipeline"]["inputs"] = list(cfg.inputs)
        resolved["pipeline"]["caption"]["path"] = cfg.caption.path
    report: dict = {"output": str(cfg.output)}
    started = time.perf_counter()
    if "process" in steps:
        process(cfg, assigned_films(cfg, all_parts=False))
    if "finalize" in steps:
        from data_pipeline.writer import finalize

        report = finalize(cfg, resolved, assigned_films(cfg, all_parts=True), {})
    if "precompute" in steps and cfg.precompute.enabled:
        from data_pipeline.precompute import precompute

        report["features"] = precompute(cfg, model_cfg, resolved)
    if "sessions" in steps:
        from data_pipeline.sessions import build_sessions

        report["sessions"] = build_sessions(cfg)
    if "representations" in steps and cfg.representations.export:
        from data_pipeline.representations import export_representations

        report["representations"] = export_representations(cfg, model_cfg, resolved)
    if "session_shards" in steps and (Path(cfg.output) / "representations" / "manifest.json").exists():
        from data_pipeline.session_shards import build_session_shards

        report["session_shards"] = build_session_shards(cfg, resolved)
    if "adaptation" in steps and cfg.adaptation.export:
        from data_pipeline.adaptation import build_adaptation_shards

        report["adaptation"] = build_adaptation_shards(cfg, model_cfg, resolved)
    report["wall_seconds"] = time.perf_counter() - started
    return report
