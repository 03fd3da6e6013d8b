"""Orchestration: which films this part owns, the process pool, and the order of the steps."""
from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from omegaconf import OmegaConf
from tqdm import tqdm

from animegamer.config.schema import PipelineConfig
from animegamer.config.validate import PIPELINE_STEPS, ConfigError
from animegamer.data.lineage import INDEX_FILES, SOURCES, stale_reason
from animegamer.errors import INTERRUPTED_EXIT_CODE, stop_if_interrupted
from animegamer.utils.folder_lock import folder_lock, part_lock_name
from animegamer.utils.io import clean_stale_temps, read_json, write_json_atomic
from animegamer.utils.logging import setup_logging
from animegamer.utils.threads import use_threads
from data_pipeline.adaptation import build_adaptation_shards
from data_pipeline.captioners.base import BACKEND_JSONL, BACKEND_NONE
from data_pipeline.captioners.failures import CaptionsFailedError, caption_secrets, stop_reason, summary, tally_captions
from data_pipeline.captioners.jsonl import FILM_NAMING
from data_pipeline.captioners.probe import probe_problems, probed
from data_pipeline.clips import short_shots_warning
from data_pipeline.fingerprint import RECOMPUTED, REUSED, plan_fingerprint, reuse_counts, task_fingerprints
from data_pipeline.ingest import film_ids, find_inputs, split_part
from data_pipeline.precompute import precompute
from data_pipeline.preflight import check_run, early_problems
from data_pipeline.process import film_from_plan, plan_film, run_task
from data_pipeline.representations import export_representations
from data_pipeline.session_shards import build_session_shards
from data_pipeline.sessions import build_sessions
from data_pipeline.staging import Staging, captions_to_retry
from data_pipeline.toyfilm import make_toy_film
from data_pipeline.writer import REPORT, finalize

log = logging.getLogger(__name__)

TOY_DIR = "toy_film"
# Report keys of the steps after finalize (each reports its output, counts and reuse).
DERIVED_KEYS = tuple(SOURCES)  # the derived artefacts, each reported under its own key
STEP_SECONDS = "step_seconds"  # report key: wall seconds of each step's latest run
CAPTIONS_RETRIED = "captions_retried"  # reuse key: failed captions asked for again in the latest process step
CAPTIONS = "captions"  # report key: per backend, the clips captioned and failed, with the first reasons
# Report keys kept per step across runs: a run of some steps updates only their entries.
MERGED_KEYS = ("reuse", STEP_SECONDS)


def _map(fn: Callable, jobs: list[tuple], workers: int, desc: str) -> list:
    """Run ``fn(*job)`` for every job, in a spawn pool when workers > 1, with a progress bar."""
    bar = tqdm(total=len(jobs), desc=desc, unit="job", disable=None)
    use_threads(workers if len(jobs) > 1 else 1)  # spawned workers start with the count it sets
    if workers <= 1 or len(jobs) <= 1:
        results = []
        for job in jobs:
            results.append(fn(*job))
            bar.update(1)
        bar.close()
        return results
    # spawn, not fork: decoders and BLAS thread pools do not survive a fork reliably.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=start_worker,
                             initargs=(logging.getLogger().getEffectiveLevel(),)) as pool:
        try:
            with _ctrl_c_ignored_by_new_workers():  # the pool starts its workers as jobs are submitted
                futures = [pool.submit(fn, *job) for job in jobs]
            for future in futures:
                future.result()
                bar.update(1)
        except KeyboardInterrupt:  # the workers still starting ignore it: end them, the parent says what is kept
            for worker in multiprocessing.active_children():
                worker.terminate()
            raise
    bar.close()
    return [f.result() for f in futures]


@contextmanager
def _ctrl_c_ignored_by_new_workers() -> Iterator[None]:
    """Ctrl-C ignored while workers are started: a spawned process inherits the ignoring, so a Ctrl-C while it
    is still importing (before :func:`start_worker` gives it its own handler) prints no traceback of its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _stop_quietly(signum, frame) -> None:
    os._exit(INTERRUPTED_EXIT_CODE)


def start_worker(level: str | int) -> None:
    """A spawned worker's start: the parent's logging format and level (a spawned process has none), and
    Ctrl-C, which a terminal sends to every process of the run, ends the worker without a traceback of its
    own; the parent says what is kept. A task cut short leaves only temporary files, which the next run
    removes, as after a kill."""
    setup_logging(level)
    signal.signal(signal.SIGINT, _stop_quietly)


def use_toy_film(cfg: PipelineConfig, toy_dir: Path, generate: bool) -> None:
    """Point inputs/captions at the toy film in ``toy_dir``, generating it first (once) when
    ``generate``. The pre-flight (:func:`early_problems`) has checked the output folder before."""
    if generate and not any(toy_dir.glob("*.truth.json")):
        make_toy_film(toy_dir)
        log.info("toy film written to %s", toy_dir)
    cfg.inputs = [str(p) for p in sorted(toy_dir.glob("*.mp4"))]
    cfg.caption.path = str(toy_dir)


def assigned_films(cfg: PipelineConfig, all_parts: bool) -> dict[str, str]:
    """source path -> film id, for this part (or every part, for finalize)."""
    paths = find_inputs(cfg.inputs, cfg.ingest.extensions)
    ids = film_ids(paths)
    mine = paths if all_parts else split_part(paths, cfg.part, cfg.num_parts)
    return {str(p): ids[p] for p in mine}


def _plan_jobs(staging: Staging, cfg: PipelineConfig, films: dict[str, str]) -> list[tuple[str, str]]:
    """(path, film id) of the films whose staged plan is missing or was made by other files or settings."""
    jobs = []
    for path, film_id in films.items():
        plan_fp = plan_fingerprint(path, cfg, staging.hash_cache)
        if staging.plan(film_id, plan_fp) is None and staging.rejection(path, plan_fp) is None:
            jobs.append((path, film_id))
    return jobs


def _task_jobs(staging: Staging, cfg: PipelineConfig, film_id: str, plan: dict,
               captioner) -> tuple[list[int], int, int]:
    """(tasks to run, how many of them only re-caption, how many failed captions they ask for again)
    of one planned film."""
    todo, captions_only, retried = [], 0, 0
    for task in range(len(plan["tasks"])):
        task_fp, caption_fp = task_fingerprints(plan, task, cfg, captioner)
        clips_current = staging.task_done(film_id, task, task_fp)
        captions = staging.captions(film_id, task, caption_fp) if clips_current else None
        retry = captions_to_retry(captions, cfg.caption.retry_failed, captioner.name)
        if captions is not None and not retry:
            continue
        todo.append(task)
        captions_only += clips_current
        retried += len(retry)
    return todo, captions_only, retried


def captions_to_make(cfg: PipelineConfig, films: dict[str, str], captioner) -> bool:
    """Whether the process step would caption any clip of ``films``: one of them has no current plan
    (nor a current rejection), or a task's captions are not current or hold failures asked for again.
    Reads staged records only; a film is hashed only where it has been planned before."""
    staging = Staging(Path(cfg.output))
    for path, film_id in films.items():
        if staging.plan(film_id) is None and staging.rejection(path) is None:
            return True
        plan_fp = plan_fingerprint(path, cfg, staging.hash_cache)
        plan = staging.plan(film_id, plan_fp)
        if plan is None and staging.rejection(path, plan_fp) is None:
            return True
        if plan is not None and _task_jobs(staging, cfg, film_id, plan, captioner)[0]:
            return True
    return False


def probe_caption_endpoint(cfg: PipelineConfig, films: dict[str, str], captioner) -> None:
    """Before any work: the http caption endpoint answers, takes the key and serves the path
    (captioners/probe.py), when the process step has clips of ``films`` to caption. Raises ConfigError."""
    if probed(cfg.caption) and captions_to_make(cfg, films, captioner):
        if problems := probe_problems(cfg.caption):
            raise ConfigError(problems)


def staged_captions(cfg: PipelineConfig, films: dict[str, str], captioner) -> Iterator[tuple[str, dict]]:
    """(clip key, caption fields) of every clip of ``films`` whose clips and captions are staged and
    current, in film and key order."""
    staging = Staging(Path(cfg.output))
    for path, film_id in sorted(films.items(), key=lambda item: item[1]):
        plan = staging.plan(film_id, plan_fingerprint(path, cfg, staging.hash_cache))
        for task in range(len(plan["tasks"]) if plan is not None else 0):
            task_fp, caption_fp = task_fingerprints(plan, task, cfg, captioner)
            record = staging.captions(film_id, task, caption_fp)
            if record is not None and staging.task_done(film_id, task, task_fp):
                yield from sorted(record["captions"].items())


def caption_outcome(cfg: PipelineConfig, films: dict[str, str], captioner) -> tuple[dict, Optional[str]]:
    """The caption tally of ``films``' staged clips per backend (report.json's ``captions``) and why the
    run stops (None: it goes on); every backend with failures but ``none`` is summarised at WARNING."""
    tallies = tally_captions(staged_captions(cfg, films, captioner), caption_secrets(cfg.caption))
    for tally in tallies.values():
        if tally.failed and tally.backend != BACKEND_NONE:
            log.warning(summary(tally))
    return ({name: tally.to_json() for name, tally in tallies.items()},
            stop_reason(tallies, cfg.caption.min_captioned_share))


def refuse_uncaptionable(cfg: PipelineConfig, planned: list[str], captioner) -> None:
    """Stop before any clip is cut when the caption import names none of the films that can be cut (the
    ``planned`` ones): every clip would fail to caption, and the run would stop only after cutting them all.
    Films the ingest rejected are left to the report, which names each with its reason."""
    if cfg.caption.backend != BACKEND_JSONL or not planned or cfg.caption.min_captioned_share <= 0:
        return
    if set(planned) <= set(captioner.films_without_records()):
        raise ConfigError([f"pipeline.caption.path={cfg.caption.path}: no caption record names any of the films "
                           f"({', '.join(sorted(planned))}; {FILM_NAMING}), so no clip could be captioned: give the "
                           f"films' own caption file"])


def process(cfg: PipelineConfig, films: dict[str, str], captioner) -> dict:
    """Plan every film, then run every clip task; both reuse what is current (same fingerprint) and
    redo the rest. Returns reused/recomputed counts per stage (plans, clip tasks, caption tasks)."""
    staging = Staging(Path(cfg.output))
    clean_stale_temps(staging.dir / "rejected")
    cfg_dict = OmegaConf.to_container(OmegaConf.structured(cfg))
    root = str(cfg.output)
    plan_jobs = _plan_jobs(staging, cfg, films)
    _map(plan_film, [(path, film_id, cfg_dict, root) for path, film_id in plan_jobs], cfg.workers, "shots")
    jobs, total_tasks, captions_only, retried, planned = [], 0, 0, 0, []
    for path, film_id in films.items():
        plan = staging.plan(film_id, plan_fingerprint(path, cfg, staging.hash_cache))
        if plan is None:  # rejected
            continue
        planned.append(film_id)
        plan = staging.relocate(film_id, plan, path)  # its tasks decode the film where it is now
        warning = short_shots_warning(*film_from_plan(plan), cfg.clips)
        if warning:
            log.warning(warning)
        clean_stale_temps(staging.film_dir(film_id))
        staging.remove_tasks_from(film_id, len(plan["tasks"]))
        todo, only_captions, failed_captions = _task_jobs(staging, cfg, film_id, plan, captioner)
        jobs += [(film_id, t, cfg_dict, root, captioner.version) for t in todo]
        total_tasks += len(plan["tasks"])
        captions_only += only_captions
        retried += failed_captions
    refuse_uncaptionable(cfg, planned, captioner)
    _map(run_task, jobs, cfg.workers, "clips")
    reuse = {"plans": reuse_counts(len(films) - len(plan_jobs), len(plan_jobs)),
             "clip_tasks": reuse_counts(total_tasks - len(jobs) + captions_only, len(jobs) - captions_only),
             "caption_tasks": reuse_counts(total_tasks - len(jobs), len(jobs))}
    for stage, counts in reuse.items():
        log.info("%s: %d reused, %d recomputed", stage, counts[REUSED], counts[RECOMPUTED])
    if retried:
        log.info("failed captions asked for again: %d (pipeline.caption.retry_failed)", retried)
    return {**reuse, CAPTIONS_RETRIED: retried}


def running_steps(cfg: PipelineConfig) -> list[str]:
    """The steps this run performs, in order: those asked for (all when none) that have what they need."""
    steps = list(cfg.steps or PIPELINE_STEPS)
    optional = {
        "precompute": cfg.precompute.enabled,
        "representations": bool(cfg.representations.export),
        # Without a representation step in this run, session shards need an earlier one's output.
        "session_shards": _session_shards_asked(cfg)
        or (Path(cfg.output) / INDEX_FILES["representations"]).exists(),
        "adaptation": bool(cfg.adaptation.export),
    }
    return [s for s in steps if optional.get(s, True)]


def _session_shards_asked(cfg: PipelineConfig) -> bool:
    """Named in pipeline.steps, or following a representation step of this run."""
    return "session_shards" in cfg.steps or bool(cfg.representations.export)


def _session_shards_wanted(cfg: PipelineConfig) -> bool:
    """Session shards run by default only over current representations; asked for, they must be."""
    if _session_shards_asked(cfg):
        return True
    reason = stale_reason(cfg.output, "representations")
    if reason is not None:
        log.warning("session shards not rebuilt: %s", reason)
    return reason is None


@contextmanager
def _timed(seconds: dict[str, float], step: str) -> Iterator[None]:
    stop_if_interrupted()  # a Ctrl-C swallowed during the last step stops the run before this one
    started = time.perf_counter()
    yield
    seconds[step] = time.perf_counter() - started


def update_report(root: Path, report: dict) -> None:
    """report.json always describes the latest run of every step (finalize writes it first)."""
    path = root / REPORT
    if path.exists():
        previous = read_json(path)
        merged = {key: {**previous.get(key, {}), **report[key]} for key in MERGED_KEYS}
        write_json_atomic(path, {**previous, **report, **merged})


def run_pipeline(cfg: PipelineConfig, resolved: dict, model_cfg=None) -> dict:
    """Run the configured steps in order; returns the report (finalize) or a summary.

    Fails in seconds (ConfigError) when something the steps need is missing, before any work; the
    output folder is locked for the run (one lock per part when ``num_parts`` machines share it); a run
    refused before any work leaves no folder it created behind."""
    created = first_missing(Path(cfg.output))
    try:
        with folder_lock(cfg.output, cfg.lock_wait_seconds, name=part_lock_name(cfg.part, cfg.num_parts)):
            return _run_pipeline(cfg, resolved, model_cfg)
    except ConfigError:
        if created is not None and not any(p.is_file() for p in created.rglob("*")):
            shutil.rmtree(created, ignore_errors=True)
        raise


def first_missing(path: Path) -> Path | None:
    """The outermost of ``path`` and its parents that does not exist yet (None: ``path`` exists)."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def _run_pipeline(cfg: PipelineConfig, resolved: dict, model_cfg=None) -> dict:
    steps = running_steps(cfg)
    needs_films = {"process", "finalize"} & set(steps)
    toy_dir = Path(cfg.output) / TOY_DIR if cfg.toy_film and needs_films else None
    problems = early_problems(cfg, toy_dir)
    # The checks after it need the films, so the toy film is drawn first; a run refused by them leaves
    # no toy film it drew behind (a folder that was there before is kept).
    drawn = toy_dir if toy_dir is not None and not problems and "process" in steps and not toy_dir.exists() else None
    try:
        all_films, my_films, captioner = _checked_films(cfg, resolved, steps, toy_dir, problems)
    except ConfigError:
        if drawn is not None:
            shutil.rmtree(drawn, ignore_errors=True)
        raise
    report: dict = {"output": str(cfg.output)}
    reuse: dict = {}
    seconds: dict[str, float] = {}
    if "process" in steps:
        with _timed(seconds, "process"):
            reuse.update(process(cfg, my_films, captioner))
    if "finalize" in steps:
        with _timed(seconds, "finalize"):
            report = finalize(cfg, resolved, all_films, {}, captioner)
    if needs_films:  # this run captioned (or gathered) these films' clips: enough of them captioned?
        captions, stop = caption_outcome(cfg, all_films if "finalize" in steps else my_films, captioner)
        if "finalize" in steps:  # report.json describes the shards: all films
            report[CAPTIONS] = captions
        if stop is not None:
            _record(Path(cfg.output), report, reuse, seconds)
            raise CaptionsFailedError(stop)
    if "precompute" in steps:
        with _timed(seconds, "precompute"):
            report["features"] = precompute(cfg, model_cfg, resolved)
    if "sessions" in steps:
        with _timed(seconds, "sessions"):
            report["sessions"] = build_sessions(cfg)
    if "representations" in steps:
        with _timed(seconds, "representations"):
            report["representations"] = export_representations(cfg, model_cfg, resolved)
    if "session_shards" in steps and _session_shards_wanted(cfg):
        with _timed(seconds, "session_shards"):
            report["session_shards"] = build_session_shards(cfg, resolved)
    if "adaptation" in steps:
        with _timed(seconds, "adaptation"):
            report["adaptation"] = build_adaptation_shards(cfg, model_cfg, resolved)
    reuse.update({key: report[key]["reuse"] for key in DERIVED_KEYS if key in report})
    _record(Path(cfg.output), report, reuse, seconds)
    return report


def _checked_films(cfg: PipelineConfig, resolved: dict, steps: list[str], toy_dir: Path | None,
                   problems: list[str]) -> tuple[dict[str, str], dict[str, str], object]:
    """(every film, this part's films, the captioner) once every pre-flight check passed, the toy film
    (in ``toy_dir``, None when not used) drawn when the early ``problems`` allow. Raises ConfigError."""
    if toy_dir is not None and not problems:
        use_toy_film(cfg, toy_dir, generate="process" in steps)
        resolved["pipeline"]["inputs"] = list(cfg.inputs)
        resolved["pipeline"]["caption"]["path"] = cfg.caption.path
    all_films = assigned_films(cfg, all_parts=True) if {"process", "finalize"} & set(steps) else {}
    # A session-shard step that is only on by default checks its input when its turn comes.
    checked = [s for s in steps if s != "session_shards" or _session_shards_asked(cfg)]
    captioner = check_run(cfg, checked, list(cfg.steps), all_films, problems)
    my_films = assigned_films(cfg, all_parts=False) if "process" in steps else {}
    if "process" in steps:
        probe_caption_endpoint(cfg, my_films, captioner)
    return all_films, my_films, captioner


def _record(root: Path, report: dict, reuse: dict, seconds: dict[str, float]) -> None:
    """The run's reuse counts and step times into ``report`` and ``root``'s report.json."""
    report["reuse"] = reuse
    report[STEP_SECONDS] = seconds
    update_report(root, {k: v for k, v in report.items() if k != "output"})
