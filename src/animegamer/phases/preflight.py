"""A training run's pre-flight: the configured phase's own needs (its spec's checks, weights, frozen
encoders and sample shards), the sizes between the networks, the kernels, the trainer and the export
it starts from, every problem at once, before any model is built.

Each component checks its own settings in its module (the networks', ``training/strategies.py``,
``training/profiling.py``, ``phases/common.py``, each phase's spec); this module composes them for
``train.py``, the recipes and the ablations. It loads no Lightning: a refused run stops in the time of
its imports of torch and the config, before the trainer's.
"""
from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from animegamer.checkpoints.export import export_folder_problems
from animegamer.checkpoints.export_checks import check_export_sizes
from animegamer.config.compose import literal
from animegamer.config.disk_checks import check_weight_folders
from animegamer.config.validate import (ACCELERATORS, ConfigError, check_bad_sample_budget, check_checkpoints,
                                        check_encoders, check_gpu_available, check_seeds, choice, local_folder,
                                        positive)
from animegamer.data.lineage import stale_folder_problems
from animegamer.data.shapes import check_shard_shapes
from animegamer.data.storage import check_remote_settings, data_source, is_url
from animegamer.models.checks import check_kernels, check_model_sizes
from animegamer.models.encoder import check_encoder_config
from animegamer.phases.common import check_schedule, lr_lambda
from animegamer.phases.specs import PHASES
from animegamer.training.loggers import LOGGERS
from animegamer.training.profiling import check_profiler
from animegamer.training.strategies import check_strategy
from animegamer.training.sweep import job_output_dir
from animegamer.utils.io import out_dir_problem
from animegamer.utils.logging import setup_logging

log = logging.getLogger(__name__)


def _schema_of(node) -> type:
    return OmegaConf.get_type(node) if isinstance(node, DictConfig) else type(node)


def check_phase_schema(cfg, spec) -> list[str]:
    """The phase node is the named phase's config (``phase=b phase.name=c`` is not phase c) and holds
    nothing else (``+phase.pack_tokens=...`` on phase (a) would be dropped unread)."""
    schema = _schema_of(cfg.phase)
    if schema is not spec.config:
        return [f"phase.name={spec.name!r} is configured by {spec.config.__name__}, but the phase node is a "
                f"{schema.__name__}: choose the phase with phase={spec.name} instead of overriding phase.name"]
    known = [f.name for f in fields(spec.config)]
    return [f"phase.{key} is not a setting of phase {spec.name} ({spec.config.__name__} has {', '.join(known)})"
            for key in cfg.phase.keys() if key not in known] if isinstance(cfg.phase, DictConfig) else []


def check_trainer(cfg) -> list[str]:
    """The accelerator, devices and accumulation, the profiler, and the strategy against what the phase
    exports (an unknown phase name is the phase checks' to report)."""
    t = cfg.trainer
    problems = choice("trainer.accelerator", t.accelerator, ACCELERATORS)
    if t.devices < 1 and t.devices != -1:
        problems.append(f"trainer.devices={t.devices} must be >= 1 (or -1: every visible device)")
    if t.num_nodes < 1:
        problems.append(f"trainer.num_nodes={t.num_nodes} must be >= 1")
    if t.accumulate_grad_batches < 1:
        problems.append(f"trainer.accumulate_grad_batches={t.accumulate_grad_batches} must be >= 1")
    problems += check_profiler(cfg)
    spec = PHASES.get(cfg.phase.name)
    problems += check_strategy(cfg, spec is not None and spec.exports.lora_adapter)
    return problems


def check_phase(cfg, spec, data: bool = True) -> list[str]:
    """What the configured phase needs: its own checks (its spec's), the weights, frozen encoders and
    shards it reads (``data`` False: not the shards, which a recipe makes after checking its stages)."""
    phase, model = cfg.phase, cfg.model
    problems = check_phase_schema(cfg, spec)
    if _schema_of(phase) is not spec.config:  # the phase's own checks read fields this node does not have
        return problems + (data_root_problems(cfg) if data else [])
    for check in spec.checks:
        problems += check(cfg)
    problems += check_weight_folders(model, spec.weights)
    if data:
        problems += sample_shard_problems(cfg, spec)
    frozen = spec.frozen_encoders(cfg)
    problems += check_encoders(model.encoders, frozen) + check_weight_folders(model, frozen)
    return problems


RUN_PIPELINE_FIRST = "run the pipeline first (animegamer pipeline ...) or set data.root"


def data_root_problems(cfg) -> list[str]:
    """A local ``data.root`` that does not exist, where the phase's own shards cannot be named (an unknown
    phase, or the node of another phase): whichever phase is meant, its shards are not there."""
    root = str(cfg.data.root)
    if is_url(root) or Path(root).is_dir():
        return []
    return [f"data.root={root!r}: no such folder; {RUN_PIPELINE_FIRST}"]


def sample_shard_problems(cfg, spec) -> list[str]:
    """The phase's sample shards: there, and of the shapes this config makes."""
    source = data_source(cfg.data, getattr(cfg.data, spec.sample_key(cfg.phase)))  # a folder or a URL
    if not source.remote and not Path(str(cfg.data.root)).is_dir():
        return data_root_problems(cfg)
    missing = source.manifest_problem()
    if missing is None:
        stale = [] if source.remote else stale_folder_problems(cfg.data.root, source.folder)
        return check_shard_shapes(source, spec.sample_shapes(cfg)) + stale
    if source.remote:
        return [f"data.root={cfg.data.root!r}: {missing}"]
    return [f"{missing}; {RUN_PIPELINE_FIRST}"]


def check_training(cfg, data: bool = True) -> list[str]:
    """Phase, model and data agreement: the phase's own needs, sizes between encoders, encoder and
    decoder, the trainer, the exports it starts from (``data`` False: not the shards, for a recipe
    checking a stage before they are made)."""
    phase, model = cfg.phase, cfg.model
    problems = check_schedule(phase)
    problems += choice("logger.kind", cfg.logger.kind, LOGGERS)
    problems += check_encoder_config(model.encoder)
    problems += positive("phase", phase, ("max_steps", "lr", "batch_size"))
    spec = PHASES.get(phase.name)
    if spec is None:
        problems += choice("phase.name", phase.name, PHASES) + (data_root_problems(cfg) if data else [])
    else:
        problems += check_phase(cfg, spec, data)
    problems += check_model_sizes(model)
    problems += check_kernels(model)
    problems += check_trainer(cfg)
    if phase.init_from:
        problems += check_export_sizes("phase.init_from", phase.init_from, model)
    dec = model.decoder
    problems += local_folder("model.decoder.path", dec.path)
    if dec.official_checkpoint and not Path(dec.official_checkpoint).exists():
        problems.append(f"model.decoder.official_checkpoint={dec.official_checkpoint!r}: no such file or folder")
    if phase.init_from:
        problems += export_folder_problems(f"phase.init_from={phase.init_from!r}", phase.init_from,
                                           "no such export folder", "train the earlier stage first")
    if not 0 < cfg.data.val_fraction < 1:
        problems.append(f"data.val_fraction={cfg.data.val_fraction} must be in (0, 1)")
    if not is_url(str(cfg.output_dir)) and (out_problem := out_dir_problem(cfg.output_dir)):
        problems.append(f"output_dir={cfg.output_dir!r}: {out_problem}; choose another output folder")
    problems += check_bad_sample_budget(cfg.data.bad_sample_budget) + check_remote_settings(cfg.data)
    problems += check_checkpoints(cfg.checkpoint) + check_seeds(cfg)
    return problems


def validate_train_run(cfg, machine: bool = False) -> None:
    """Raise :class:`ConfigError` listing every problem of a training run config (``machine``: and what this
    machine lacks for it, a GPU; ``train.py`` asks, a config checked elsewhere is not refused for it)."""
    problems = check_training(cfg) + (check_gpu_available(cfg.trainer) if machine else [])
    if problems:
        raise ConfigError(problems)


def prepare_train_run(cfg: DictConfig) -> DictConfig:
    """What ``train.py`` does before Lightning or any network loads: logging, a ``--multirun`` job's own
    sub-folder, then every problem of the run at once (:class:`ConfigError`). Returns ``cfg``."""
    setup_logging(cfg.log_level)
    cfg.output_dir = literal(job_output_dir(cfg.output_dir))  # resolved: a folder named like ${x} stays as it is
    validate_train_run(cfg, machine=True)
    for warning in schedule_warnings(cfg.phase):
        log.warning("phase %s: %s", cfg.phase.name, warning)
    return cfg


def schedule_warnings(phase) -> list[str]:
    """Settings a run trains with but likely did not mean: a warm-up that does not end before the last step
    keeps the learning rate below ``phase.lr`` for the whole run (a short test run of a long preset)."""
    if phase.warmup_steps < phase.max_steps:
        return []
    reached = lr_lambda(phase)(phase.max_steps - 1)  # the factor of the last step
    return [f"phase.warmup_steps={phase.warmup_steps} is not below phase.max_steps={phase.max_steps}: the learning "
            f"rate only rises, to {reached:.0%} of phase.lr at the last step; lower phase.warmup_steps for a short run"]
