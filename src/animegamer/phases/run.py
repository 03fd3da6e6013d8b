"""``animegamer train``'s body: typed config in, a fitted phase out (checkpoints, export, logs).

The generic trainer (``animegamer.training``) knows no phase: this module gives it what the configured
phase's spec and builder say (its FSDP wrapping unit, the folder of its samples, its module and data). The
pre-flight that runs first is :mod:`animegamer.phases.preflight`, which loads no Lightning.
"""
from __future__ import annotations

import contextlib
import logging
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Callable

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from animegamer.config.schema import RunConfig
from animegamer.contracts.checkpoint_names import STEP_NAME
from animegamer.contracts.files import EXPORT_DIR
from animegamer.phases.builders import BuiltPhase, builder_for
from animegamer.phases.preflight import prepare_train_run
from animegamer.phases.specs import spec_for
from animegamer.training import strategies
from animegamer.training.bad_data import BadDataBudget
from animegamer.training.callbacks import ExportCallback, RecordOnSave, ResumeSettings, StepProgressBar
from animegamer.training.checkpointing import (CHECKPOINT_DIR, AtomicCheckpointIO, KeepLastCheckpoint,
                                               checkpoint_name, checkpoint_step, clean_partials, resume_checkpoint,
                                               save_checkpoint)
from animegamer.training.faults import LossHistory, Preemption
from animegamer.training.loggers import make_logger
from animegamer.training.process_group import host_rendezvous, process_group_lifetime
from animegamer.training.profiling import make_profiler, summarise_traces
from animegamer.training.run_record import (check_run_folder, finished_run, kept_only_once_trained, record_threads,
                                            recorded_threads)
from animegamer.training.safe_io import ensure_weights_only
from animegamer.training.strategies import checkpoint_safe_globals, is_deepspeed, lightning_precision, module_init
from animegamer.training.sync_sites import SyncSites
from animegamer.training.throughput import Throughput
from animegamer.utils.folder_lock import folder_lock
from animegamer.utils.logging import DropPrefix, is_global_zero
from animegamer.utils.threads import use_threads

log = logging.getLogger(__name__)


def block_types(cfg: RunConfig) -> set[type]:
    """The transformer block classes of the phase's trained network: FSDP's wrapping unit (its builder's)."""
    return builder_for(cfg).wrap_blocks()


def make_strategy(cfg: RunConfig):
    """The Lightning strategy (object or name) of ``cfg.trainer.strategy`` for the configured phase."""
    return strategies.make_strategy(cfg, partial(block_types, cfg))


def build_phase(cfg: RunConfig, init: Callable = contextlib.nullcontext) -> BuiltPhase:
    """(module, datamodule, export function, extra callbacks) of the configured phase (its builder's);
    modules are built inside ``init()`` (the trainer's: random weights of 7B parameters straight on the GPU)."""
    return builder_for(cfg).build(cfg, init)


def plugins(cfg: RunConfig) -> list:
    """Atomic, weights-only checkpoint files (DeepSpeed writes its own folders); on SLURM, requeueing
    is left to :class:`Preemption`, which saves on a step boundary first."""
    found = [] if is_deepspeed(cfg.trainer.strategy) else [AtomicCheckpointIO()]
    if SLURMEnvironment.detect():
        found.append(SLURMEnvironment(auto_requeue=False))
    return found


# Lightning's advertisements for its cloud services, at every start: nothing the user has to act on.
_LIGHTNING_TIPS = "💡 Tip:"
_EXPECTED_WARNINGS = (
    # torch >= 2.10 deprecates the pytree check Lightning 2.6 still uses; harmless, not the user's to fix.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # A resumed run writes into its own folders, which hold the earlier attempt's files by design (the
    # CSV logger's earlier rows are kept as logs/metrics.attempt-N.csv: loggers.keep_earlier_attempt).
    r"Checkpoint directory .* exists and is not empty",
    r"Experiment logs directory .* exists and is not empty",
    # A run folder copied or moved elsewhere: the saves are pruned from the folder's files
    # (checkpointing.prune_checkpoints), never from the top-k Lightning no longer reloads.
    r"The dirpath has changed from .* won't be reloaded",
    # An empty held-out split: training.shard_data.ShardData.val_dataloader has said so in words that name the cause.
    r"Total length of `list` across ranks is zero",
    # PhaseB moves its batches itself (bookkeeping stays on the host); its hook is the one meant.
    r"You have overridden `transfer_batch_to_device` in `LightningModule` but have passed in a `LightningDataModule`",
)


_NOT_A_TIP = DropPrefix(_LIGHTNING_TIPS)


def quiet_lightning() -> None:
    """Drop what Lightning prints at every start that is expected and needs nothing from the user."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        tips = logging.getLogger(name)  # rank_zero_info logs through whichever was imported last
        tips.addFilter(_NOT_A_TIP)  # once: the same filter object is not added twice
    for message in _EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def make_trainer(cfg: RunConfig, callbacks: list, finished: bool = False) -> L.Trainer:
    """``finished``: the run resumes at its last step, so it trains nothing and its model summary says nothing
    new."""
    t = cfg.trainer
    quiet_lightning()
    return L.Trainer(
        accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=make_strategy(cfg),
        plugins=plugins(cfg), precision=lightning_precision(cfg),
        # The phases' StepSampler already deals each rank its share; Lightning's wrapper would re-split it.
        use_distributed_sampler=False, accumulate_grad_batches=t.accumulate_grad_batches,
        gradient_clip_val=cfg.phase.grad_clip or None, max_steps=cfg.phase.max_steps,
        val_check_interval=cfg.phase.val_every_n_steps, check_val_every_n_epoch=None,
        log_every_n_steps=t.log_every_n_steps, deterministic=t.deterministic, benchmark=t.benchmark,
        logger=make_logger(cfg), callbacks=[*callbacks, StepProgressBar()], default_root_dir=cfg.output_dir,
        enable_progress_bar=True, num_sanity_val_steps=0, profiler=make_profiler(cfg),
        enable_model_summary=not finished,
    )


def run_folder_callbacks(cfg: RunConfig, resolved: dict, resume: Path | None) -> list[L.Callback]:
    """The run folder's pre-flight (its record against this config and data; raises when refused) and
    what resuming needs. Every rank gets the same callbacks whenever it starts: the record is only
    rewritten once the resumed run saves a checkpoint, and the optimizer settings follow the override."""
    out = Path(cfg.output_dir)
    samples = spec_for(cfg).sample_key(cfg.phase)
    decision = check_run_folder(out, resolved, checkpoint_step(resume) if resume else None, cfg.resume_with_changes,
                                samples)
    callbacks: list[L.Callback] = [] if decision.pending is None else [RecordOnSave(out, decision.pending)]
    if resume is not None and cfg.resume_with_changes:
        callbacks.append(ResumeSettings())
    return callbacks


def train(cfg: RunConfig, resolved: dict | DictConfig) -> dict:
    """Fit the configured phase; resumes from the newest complete checkpoint in ``<output>/checkpoints``.
    The run folder is locked first (global rank 0), so no other run's partial files are cleaned."""
    with folder_lock(cfg.output_dir, cfg.lock_wait_seconds, enabled=is_global_zero()), process_group_lifetime():
        return _train(cfg, resolved)


def _train(cfg: RunConfig, resolved: dict | DictConfig) -> dict:
    out = Path(cfg.output_dir)
    folder = out / CHECKPOINT_DIR
    resolved = OmegaConf.to_container(resolved, resolve=True) if isinstance(resolved, DictConfig) else resolved
    # Pre-flight, before anything is built: the run folder's record against this config.
    clean_partials(folder)
    resume = resume_checkpoint(folder)
    # Each of this node's ranks takes its share of the cores the load leaves; a CPU run's resume takes the
    # count it started with, on which its float sums depend.
    cpu = str(cfg.trainer.accelerator).lower() == "cpu"
    threads = use_threads(cfg.trainer.devices, recorded_threads(out) if cpu and resume is not None else None)
    L.seed_everything(cfg.seed, workers=True)
    if resume is not None:
        # Refused here, before anything is built: FSDP and DeepSpeed read checkpoints past the
        # weights-only CheckpointIO, so every pickle file of the checkpoint is checked first.
        ensure_weights_only(resume, checkpoint_safe_globals(cfg.trainer.strategy))
    trainer: L.Trainer | None = None

    def trained() -> bool:  # any checkpoint file, even an incomplete one, keeps the record that describes it
        stepped = trainer is not None and trainer.global_step > 0
        return stepped or (folder.is_dir() and any(STEP_NAME.match(p.name) for p in folder.iterdir()))

    # The record is written before the data is first read (the phase is built, then fitted): a fresh start
    # refused there (say, a data.root server without byte ranges) leaves no record of a run never trained.
    with kept_only_once_trained(out, resume is None and is_global_zero(), trained):
        if cpu and resume is None and is_global_zero():
            record_threads(out, threads)
        resuming = run_folder_callbacks(cfg, resolved, resume)
        keep_last = cfg.checkpoint.keep_last  # for every save: periodic, preemption and final
        checkpoints = KeepLastCheckpoint(folder, cfg.checkpoint.every_n_steps, keep_last)
        preemption = Preemption(cfg.trainer.preemption_signals, folder, keep_last)
        callbacks = [checkpoints, preemption, LossHistory(out)]
        if cfg.logger.kind != "none":
            callbacks.append(LearningRateMonitor(logging_interval="step"))
        callbacks.append(BadDataBudget(cfg.data.bad_sample_budget))
        callbacks.append(Throughput(cfg.trainer.peak_tflops, cfg.trainer.throughput_every_n_steps))
        if cfg.trainer.sync_debug:
            callbacks.append(SyncSites(out))
        callbacks.extend(resuming)
        finished = resume is not None and bool(finished_run(resolved, checkpoint_step(resume)))
        trainer = make_trainer(cfg, callbacks, finished=finished)
        host_rendezvous(trainer)  # before fit launches the other ranks
        module, data, export_fn, phase_callbacks = build_phase(cfg, module_init(cfg, trainer))
        # Lightning re-orders callbacks when fitting starts (checkpointing last), so adding them now is fine.
        trainer.callbacks.extend([ExportCallback(out / EXPORT_DIR, export_fn, {"config": resolved}), *phase_callbacks])
        if resume is not None:
            log.info("resuming from %s", resume)
        started = time.time()
        try:
            trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume else None)
        except SIGTERMException as stop:
            raise SystemExit(preemption.exit_code) from stop
        except SystemExit:
            # Lightning ends its KeyboardInterrupt path with exit code 1; a second Ctrl-C is still a Ctrl-C,
            # which the command reports with the shell's code like any other
            if preemption.stopped_at_once:
                raise KeyboardInterrupt from None
            raise
        finally:
            preemption.restore()
    # The periodic saves may miss the final step: save it so a longer run continues from here.
    final = folder / checkpoint_name(trainer.global_step)
    if not final.exists():
        save_checkpoint(trainer, final, keep_last)  # the full state: a longer run resumes from it
    summarise_traces(cfg, trainer, since=started)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # a run resumed at its last step trains no step in this launch, so it has no metrics to show
    said = metrics or "finished in an earlier launch, nothing to train"
    log.info("phase %s done at step %d: %s; export: %s", cfg.phase.name, trainer.global_step, said, out / EXPORT_DIR)
    if preemption.pending:  # asked for after the last step: the run is whole, what follows it must not start
        log.warning("%s after the last step: the run is saved", "stopped by Ctrl-C" if preemption.interactive else
                    "preempted")
        raise SystemExit(preemption.exit_code)
    return {"step": trainer.global_step, "metrics": metrics, "export": str(out / EXPORT_DIR), "module": module}


def run(cfg: DictConfig) -> dict:
    """Validate a composed config (every problem at once) and train; what ``train.py`` does."""
    return train_checked(prepare_train_run(cfg))


def train_checked(cfg: DictConfig) -> dict:
    """Train a composed config that :func:`animegamer.phases.preflight.prepare_train_run` passed."""
    return train(OmegaConf.to_object(cfg), cfg)
