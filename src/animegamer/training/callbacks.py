"""Callbacks: portable exports beside checkpoints, validation videos (ground truth | sample), the step
progress bar, the optimizer settings of a run resumed with changes and the run record it then writes."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import TQDMProgressBar

from animegamer.checkpoints.export import FINISHED
from animegamer.contracts.exports import TRAIN_SECONDS
from animegamer.media.video import encode_mp4  # PyAV and OpenCV load only when a video is encoded
from animegamer.models.frozen_encoders import build_frozen_encoders  # diffusers loads only when one is built
from animegamer.training.run_record import write_record
from animegamer.training.strategies import full_weights, is_fsdp_strategy
from animegamer.training.throughput import pausing
from animegamer.utils.randomness import step_generator

log = logging.getLogger(__name__)

TRAIN_BAR = "steps"  # the training bar's description


class StepProgressBar(TQDMProgressBar):
    """Training progress as optimizer steps out of ``phase.max_steps``, across epochs and restarts.

    Training is step-based (``max_epochs=-1``), so Lightning's default bars count batches of an epoch
    and read ``Epoch 0/-2``; this one reads ``steps 30/60`` and starts a resumed run at its step."""

    @property
    def train_description(self) -> str:
        return TRAIN_BAR

    def on_train_start(self, trainer: L.Trainer, *_) -> None:
        super().on_train_start()
        bar = self.train_progress_bar
        bar.total = trainer.max_steps
        bar.initial = bar.n = trainer.global_step  # a resumed run starts at its step; its rate counts its own
        bar.refresh()

    def on_train_epoch_start(self, *_) -> None:
        """Steps count on across epochs: nothing to reset."""

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step, bar = trainer.global_step, self.train_progress_bar
        # Under gradient accumulation several micro-batches end on one step: count the step once.
        if bar.n != step and self._should_update(step, bar.total):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, module))  # and redraws


class ExportCallback(L.Callback):
    """Writes ``export/`` (what the phase trained, loadable alone) whenever a checkpoint is saved.

    Under FSDP the export is written from the state the strategy gathered for the checkpoint (only
    the kept tensors, unit by unit; ``fsdp_gather``), not from the sharded module.

    The export records how long the run has trained (``train_seconds``, from the start of fitting to
    the save): the callback's state travels in the checkpoint, so a resumed run adds to the time its
    earlier launches trained (the time between launches does not count)."""

    def __init__(self, folder: Path, export_fn, meta: dict) -> None:
        self.folder, self.export_fn, self.meta = Path(folder), export_fn, meta
        self.earlier_seconds = 0.0  # trained by the launches before this one (from the checkpoint)
        self.started: float | None = None

    def trained_seconds(self) -> float:
        return self.earlier_seconds + (time.perf_counter() - self.started if self.started is not None else 0.0)

    def state_dict(self) -> dict:
        return {TRAIN_SECONDS: self.trained_seconds()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.earlier_seconds = float(state_dict.get(TRAIN_SECONDS, 0.0))

    def on_train_start(self, trainer, module) -> None:
        self.started = time.perf_counter()

    def _export(self, trainer: L.Trainer, module: L.LightningModule, gathered: dict | None = None) -> None:
        # Rewritten at every checkpoint, so a stopped run leaves the export of its last save: "finished"
        # tells that one from the export of a run that reached phase.max_steps (loading it warns).
        meta = {**self.meta, "step": trainer.global_step, "max_steps": trainer.max_steps,
                FINISHED: trainer.global_step >= trainer.max_steps, TRAIN_SECONDS: round(self.trained_seconds(), 3)}
        if is_fsdp_strategy(trainer.strategy):
            if trainer.strategy._state_dict_type != "full":  # make_strategy asks for full state dicts
                raise ValueError("exports under FSDP need state_dict_type='full' (whole tensors)")
            if gathered is None:
                gathered = trainer.strategy.lightning_module_state_dict()  # a collective: every rank
            if trainer.is_global_zero:
                self.export_fn(module, self.folder, meta, state=model_state(gathered))
            return
        with full_weights(trainer):  # ZeRO-3: every rank gathers, rank 0 writes
            if trainer.is_global_zero:
                self.export_fn(module, self.folder, meta)

    def on_save_checkpoint(self, trainer, module, checkpoint) -> None:
        # Callbacks run before the phase's own hook drops the export-only tensors from the checkpoint.
        self._export(trainer, module, checkpoint.get("state_dict"))

    def on_train_end(self, trainer, module) -> None:
        self._export(trainer, module)


OPTIMIZER_SETTINGS = ("betas", "eps", "weight_decay", "initial_lr")


class ResumeSettings(L.Callback):
    """A run resumed with ``resume_with_changes=true``: the optimizer and LR schedule restored from the
    checkpoint take this config's hyper-parameters (lr, betas, eps, weight decay; the schedule's shape
    is already this config's), so a changed ``phase.lr`` applies from the resumed step on.

    Idempotent (an unchanged config sets what the checkpoint holds), so every rank applies it on the
    override alone, without depending on what the run folder's record said when that rank started."""

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        fresh = module.configure_optimizers()  # this config's optimizer, over the same parameters
        optimizer, scheduler = trainer.optimizers[0], trainer.lr_scheduler_configs[0].scheduler
        for group, new in zip(optimizer.param_groups, fresh["optimizer"].param_groups, strict=True):
            group.update({key: new[key] for key in OPTIMIZER_SETTINGS})
        scheduler.base_lrs = list(fresh["lr_scheduler"]["scheduler"].base_lrs)
        lrs = [base * factor(scheduler.last_epoch) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        scheduler._last_lr = lrs
        log.info("optimizer settings from the config from step %d on: lr %s", trainer.global_step, lrs)


class RecordOnSave(L.Callback):
    """Writes the run folder's updated record (``run_record.Decision.pending``) when the resumed run saves
    its first checkpoint (global rank 0); until then the folder's checkpoints are the recorded run's."""

    def __init__(self, folder: Path, record: dict) -> None:
        self.folder, self.record = Path(folder), record

    def on_save_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict) -> None:
        if self.record is not None and trainer.is_global_zero:
            write_record(self.folder, self.record)
        self.record = None


def model_state(state: dict) -> dict:
    """A LightningModule's state dict -> its ``model``'s (the ``model.`` prefix removed, others dropped)."""
    return {name.removeprefix("model."): t for name, t in state.items() if name.startswith("model.")}


def side_by_side(truth: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """(T, H, W, 3) twice -> (T, H, 2W, 3): ground truth left, reconstruction right."""
    frames = min(len(truth), len(sample))
    return np.concatenate([truth[:frames], sample[:frames]], axis=2)


class ValidationVideos(L.Callback):
    """Every ``every`` steps: sample a few validation clips from their representation and log them.

    Videos are always written as mp4 under ``<output>/validation/step-N/``; a wandb logger also gets
    them as videos, TensorBoard as a frame strip.
    """

    def __init__(self, cfg, val_dataset, clip_lookup, every: int, count: int, steps: int) -> None:
        self.cfg, self.dataset, self.clip_lookup = cfg, val_dataset, clip_lookup
        self.every, self.count, self.steps = every, count, steps
        self._vae = None

    def _vae_model(self, module):
        if self._vae is None:
            self._vae = build_frozen_encoders(self.cfg.model.encoders, device=module.device, which=("vae",)).vae
        return self._vae

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or self.every <= 0 or step % self.every or step == 0:
            return
        if getattr(self, "_last", None) == step:  # gradient accumulation: one call per optimiser step
            return
        self._last = step
        with pausing(trainer):  # seconds of sampling and encoding: not the next step's data wait
            self.log_videos(trainer, module, step)

    @torch.no_grad()
    def log_videos(self, trainer, module, step: int) -> list[Path]:
        out_dir = Path(self.cfg.output_dir) / "validation" / f"step-{step:07d}"
        written = []
        for index in range(min(self.count, len(self.dataset))):
            item = self.dataset[index]
            batch = {k: (v.unsqueeze(0).to(module.device) if torch.is_tensor(v) else [v]) for k, v in item.items()}
            clips = module.to_clip_batch(batch)
            latents = module.reconstruct(clips, step_generator(self.cfg.seed, step, index), self.steps)
            video = self._vae_model(module).decode(latents.float())[0].clamp(0, 1)  # (T, H, W, 3)
            sample = (video.cpu().numpy() * 255).round().astype(np.uint8)
            truth = self.clip_lookup(item["key"])
            frames = side_by_side(truth, sample)
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / f"{item['key']}.mp4"
            path.write_bytes(encode_mp4(frames, self.cfg.pipeline.clips.fps, self.cfg.pipeline.clips))
            written.append(path)
            pixel_mse = float(np.mean((truth[: len(sample)].astype(np.float32) - sample[: len(truth)]) ** 2) / 255**2)
            module.log("val/pixel_mse", pixel_mse, batch_size=1)
            self._to_logger(trainer, path, frames, step)
        log.info("validation videos: %s", out_dir)
        return written

    @staticmethod
    def _to_logger(trainer, path: Path, frames: np.ndarray, step: int) -> None:
        for logger in trainer.loggers:
            name = type(logger).__name__
            if name == "WandbLogger":
                import wandb  # an optional dependency, present when this logger is

                logger.experiment.log({"val/video": wandb.Video(str(path), format="mp4")}, step=step)
            elif name == "TensorBoardLogger":
                strip = np.concatenate(list(frames[:: max(1, len(frames) // 4)]), axis=0)  # frames stacked
                logger.experiment.add_image(f"val/{path.stem}", strip, step, dataformats="HWC")
