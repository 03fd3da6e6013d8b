"""A pipeline run config's settings and the exports its steps read, checked before any step runs; a
refused run names its films' and caption import's problems in the same message.
"""
from __future__ import annotations

from typing import Sequence

from animegamer.checkpoints.export import export_folder_problems
from animegamer.checkpoints.export_checks import check_export_role, check_export_sizes
from animegamer.config.disk_checks import check_weight_folders
from animegamer.config.validate import (PIPELINE_STEPS, ConfigError, check_encoders, check_pipeline,
                                       check_pipeline_devices, check_seeds)
from animegamer.models.checks import check_tokenizer
from animegamer.models.mllm import check_mllm
from data_pipeline.preflight import film_problems


def validate_pipeline_run(cfg, refused: Sequence[str] = ()) -> None:
    """Raise :class:`ConfigError` listing every problem of a pipeline run config. A run refused (for its
    settings, or for ``refused``: the problems a recipe found in its other stages) names its films' and
    caption import's problems in the same message: the pipeline's pre-flight would otherwise tell of them
    only in the run after these are fixed."""
    problems = pipeline_problems(cfg)
    if problems or refused:
        problems += film_problems(cfg.pipeline, cfg.pipeline.steps or PIPELINE_STEPS)
        raise ConfigError(list(dict.fromkeys([*problems, *refused])))


def pipeline_problems(cfg) -> list[str]:
    """Every problem of a pipeline run config's settings and the exports it reads."""
    p = cfg.pipeline
    problems = check_pipeline(p, cfg.model.encoders) + check_seeds(cfg)
    steps = p.steps or PIPELINE_STEPS
    reps, adaptation = p.representations.export, p.adaptation.export
    if reps:
        problems += export_folder_problems(f"pipeline.representations.export={reps!r}", reps,
                                           "not a phase (a) export folder")
    if adaptation:
        problems += export_folder_problems(f"pipeline.adaptation.export={adaptation!r}", adaptation,
                                           "not a phase (b) export folder")
    with_model = {"precompute": p.precompute.enabled, "representations": bool(reps), "adaptation": bool(adaptation)}
    problems += check_pipeline_devices(p, [step for step in steps if with_model.get(step)])
    if "precompute" in steps and p.precompute.enabled:
        problems += check_encoders(cfg.model.encoders)
        problems += check_weight_folders(cfg.model, ("t5", "clip", "vae"))
    if reps and "representations" in steps:
        problems += (check_export_role("pipeline.representations.export", reps, "renderer")
                     or check_export_sizes("pipeline.representations.export", reps, cfg.model, ("encoder",)))
    if adaptation and "adaptation" in steps:
        problems += check_export_role("pipeline.adaptation.export", adaptation, "mllm")
        problems += check_mllm(cfg.model)
        problems += check_tokenizer(cfg.model, [("pipeline.adaptation.export", adaptation)], words_from_data=False)
        problems += check_export_sizes("pipeline.adaptation.export", adaptation, cfg.model)
    return problems
