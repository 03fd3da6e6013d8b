"""Pre-flight of a pipeline run.

:func:`early_problems` runs first (the output folder is writable and, with the toy film, holds no clips
of other films), then :func:`check_run`, in the main process before any work: every input exists and
holds videos, the caption source exists and parses (every bad line named; its coverage of the input
films is warned about once, here: records naming no input film, films without a record, overlapping
records), every step asked for can run, and every step that reads an earlier step's output finds it,
current. It raises :class:`ConfigError` listing every problem of both, in seconds, the caption import's
bad lines among them. A run refused for its settings (:func:`data_pipeline.config_checks.validate_pipeline_run`)
names its films' and caption import's problems too (:func:`film_problems`), in the same message.

What a finished output folder holds for training and held-out use is counted by
:func:`animegamer.data.split_counts.split_counts`, which the training recipes' pre-flight reads.
"""
from __future__ import annotations

import glob
import logging
import tempfile
from pathlib import Path

from animegamer.config.schema import PipelineConfig
from animegamer.config.validate import CAPTION_STEPS, ConfigError
from animegamer.contracts.files import CLIPS_DIR, MANIFEST
from animegamer.data.lineage import PRODUCER, SOURCES, stale_reason
from animegamer.media.fingerprint import file_identity
from animegamer.utils.io import read_json
from data_pipeline.captioners.base import BACKEND_JSONL
from data_pipeline.captioners.jsonl import LISTED_BAD_LINES, CaptionFileError, caption_files, listed, read_file_records
from data_pipeline.captioners.registry import build_captioner
from data_pipeline.ingest import find_inputs
from data_pipeline.lineage import shards_problem
from data_pipeline.staging import Staging

log = logging.getLogger(__name__)

# The artefact each step writes (the step reading it may come later in the same run).
STEP_ARTEFACT = {step: name for name, step in PRODUCER.items()}
# Steps that do not run unless switched on, and what switches them on.
_SWITCHED_OFF = {
    "precompute": "pipeline.precompute.enabled is false: set it to true",
    "representations": "pipeline.representations.export is empty: name the export",
    "adaptation": "pipeline.adaptation.export is empty: name the export",
}


def input_problems(cfg: PipelineConfig) -> list[str]:
    """Each entry of ``pipeline.inputs`` must name at least one video file."""
    problems = []
    for pattern in cfg.inputs:
        if find_inputs([pattern], cfg.ingest.extensions):
            continue
        path = Path(pattern)
        if path.is_dir():
            problems.append(f"pipeline.inputs: folder {pattern} holds no video file "
                            f"(searched recursively for {', '.join(cfg.ingest.extensions)})")
        elif not glob.glob(pattern, recursive=True):
            problems.append(f"pipeline.inputs: {pattern} does not exist (no file, folder or glob match)")
        else:
            problems.append(f"pipeline.inputs: {pattern} matches no file")
    return problems


def output_problems(cfg: PipelineConfig) -> list[str]:
    output = Path(cfg.output)
    try:
        output.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output):
            pass
    except OSError as error:
        return [f"pipeline.output={cfg.output}: cannot write there ({error.strerror or error})"]
    return []


def toy_problems(cfg: PipelineConfig, toy_dir: Path) -> list[str]:
    """The toy film is the default input (source=toy): never let it replace the clips of real films.
    Films are told apart by content, so an output folder moved elsewhere still holds the toy film."""
    manifest = Path(cfg.output) / CLIPS_DIR / MANIFEST
    if not manifest.exists():
        return []
    hash_cache = Staging(Path(cfg.output)).hash_cache
    toy = {file_identity(path, hash_cache)["sha256"] for path in toy_dir.glob("*.mp4")}
    others = [s["path"] for s in read_json(manifest)["sources"] if s["sha256"] not in toy]
    if not others:
        return []
    return [f"pipeline.output={cfg.output} holds clips of other films ({', '.join(others[:3])}), but this run "
            "uses the toy film (source=toy, the default): add source=films 'pipeline.inputs=[...]', or choose "
            "another pipeline.output"]


def early_problems(cfg: PipelineConfig, toy_dir: Path | None) -> list[str]:
    """What must hold before the toy film (in ``toy_dir``, None when not used) is written: a writable
    output folder that holds no clips of other films."""
    problems = output_problems(cfg)
    if toy_dir is not None and not problems:
        problems += toy_problems(cfg, toy_dir)
    return problems


def build_run_captioner(cfg: PipelineConfig, films: dict[str, str]):
    """The run's caption backend, knowing every film of the run (id -> path); warns once about the
    caption import's coverage of the films. Raises ConfigError when the caption source is unusable."""
    try:
        return build_captioner(cfg.caption, {film_id: path for path, film_id in films.items()})
    except CaptionFileError as error:  # every bad line, one problem each
        raise ConfigError(bad_line_problems(cfg, error.problems)) from None
    except (OSError, ValueError) as error:
        raise ConfigError([f"pipeline.caption ({cfg.caption.backend}): {error}"]) from None


def bad_line_problems(cfg: PipelineConfig, bad_lines: list[str]) -> list[str]:
    """One problem per bad line of the caption import (``file:line: reason``), the rest counted."""
    return [f"pipeline.caption ({cfg.caption.backend}): {problem}"
            for problem in listed(bad_lines, LISTED_BAD_LINES, "bad lines")]


def caption_import_problems(cfg: PipelineConfig) -> list[str]:
    """Every bad line of the user's caption import, read without building the captioner (nothing is
    warned about the import's coverage): what a run refused for other problems names beside them. Empty
    for the other backends (no model is loaded, no endpoint asked, for a run already refused), for the
    toy film's captions (the pipeline writes them) and for a path that does not exist (the settings'
    check, :func:`animegamer.config.validate.check_pipeline`, names it)."""
    c = cfg.caption
    if c.backend != BACKEND_JSONL or cfg.toy_film or not c.path or not Path(c.path).exists():
        return []
    try:
        bad_lines = [problem for file in caption_files(c.path) for problem in read_file_records(file)[1]]
    except OSError as error:
        return [f"pipeline.caption ({c.backend}): {error}"]
    return bad_line_problems(cfg, bad_lines)


def film_problems(cfg: PipelineConfig, steps) -> list[str]:
    """The user's films (:func:`input_problems`) and caption import (:func:`caption_import_problems`) when
    ``steps`` read them; read-only, so a run refused for its settings names these in the same message."""
    if not set(CAPTION_STEPS) & set(steps):
        return []
    return input_problems(cfg) + caption_import_problems(cfg)


def step_problems(cfg: PipelineConfig, running: list[str], requested: list[str]) -> list[str]:
    """Steps asked for that cannot run, and steps whose input (made by a step not in this run) is
    missing, made from inputs that changed since, or names a shard by other than a plain file name."""
    problems = [f"pipeline.steps names {step} but {why}" for step, why in _SWITCHED_OFF.items()
                if step in requested and step not in running]
    for step in running:
        for source in SOURCES.get(STEP_ARTEFACT.get(step, ""), ()):
            if PRODUCER[source] in running:
                continue
            if reason := stale_reason(cfg.output, source) or shards_problem(cfg.output, source):
                problems.append(f"step {step}: {reason}")
    return problems


def check_run(cfg: PipelineConfig, running: list[str], requested: list[str], films: dict[str, str],
              early: list[str]):
    """Everything that can be known before work; returns the run's captioner (None when no step
    captions). ``running``: the steps that will run; ``requested``: pipeline.steps as given;
    ``early``: the problems :func:`early_problems` found."""
    needs_films = set(CAPTION_STEPS) & set(running)
    problems = list(early)
    if needs_films:
        problems += input_problems(cfg)
    problems += step_problems(cfg, running, requested)
    if problems:  # the caption import's bad lines too: one refusal names every problem
        raise ConfigError(problems + (caption_import_problems(cfg) if needs_films else []))
    return build_run_captioner(cfg, films) if needs_films else None
