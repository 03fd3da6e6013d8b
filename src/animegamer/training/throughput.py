"""Throughput in the training log: samples/s, tokens/s, MFU and the share of time spent waiting for data.

Answers "is this step time normal?" from the log itself, and "how long until training starts?":
``perf/startup_s`` is the time from ``fit``'s setup to the first training batch (the engine's setup,
a resumed run's checkpoint load and fast-forward, the loaders), logged once per launch with
``perf/resumed`` (1 when the launch loaded a checkpoint), so a resumed launch's figure minus a fresh
one's is the checkpoint's load time. Model FLOPs per step come from the phase
module's ``flops_per_batch(batch)`` (forward + backward = 3 x forward, the usual convention;
recomputation under gradient checkpointing is not counted), over ``trainer.peak_tflops``.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn

from animegamer.training.host_values import host_scalars

TRAIN_FLOPS_FACTOR = 3  # forward + backward (2 x forward)
STARTUP_SECONDS, RESUMED = "perf/startup_s", "perf/resumed"
PAUSED_SECONDS = "perf/paused_s"
_PAUSED_ATTR = "_animegamer_paused_s"  # on the trainer: every callback and save path can reach it


def add_pause(trainer, seconds: float) -> None:
    """Record time the loop spent between two steps on something other than fetching the next batch (a
    checkpoint save, validation, validation videos), so that the step after it does not count it as
    waiting for data."""
    setattr(trainer, _PAUSED_ATTR, paused_seconds(trainer) + seconds)


@contextmanager
def pausing(trainer) -> Iterator[None]:
    """:func:`add_pause` for the block's wall time (the blocks wrapped here, saves and videos, read their
    results back to the host, so their GPU work is inside it)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        add_pause(trainer, time.perf_counter() - started)


def paused_seconds(trainer) -> float:
    return getattr(trainer, _PAUSED_ATTR, 0.0)


def transformer_forward_flops(tokens: int, hidden: int, layers: int, mlp_hidden: int, kv_hidden: int | None = None,
                              gated_mlp: bool = False) -> float:
    """Matmul FLOPs of one forward of a pre-norm transformer over ``tokens`` tokens of one sequence:
    q/o projections (2 x hidden^2), k/v (2 x hidden x kv_hidden), the MLP (2 or 3 matrices), attention
    scores and values (2 x tokens^2 x hidden); 2 FLOPs per multiply-add."""
    kv_hidden = hidden if kv_hidden is None else kv_hidden
    projections = 2 * hidden * hidden + 2 * hidden * kv_hidden
    mlp = (3 if gated_mlp else 2) * hidden * mlp_hidden
    return layers * (2 * tokens * (projections + mlp) + 4 * tokens * tokens * hidden)


class Throughput(L.Callback):
    """Logs ``perf/*`` every ``every`` optimiser steps, averaged over those steps (rank 0's view).

    The time between one step's end and the next one's start is waiting for data, less the pauses
    recorded by :func:`add_pause` (saves, validation, validation videos): those are logged apart as
    ``perf/paused_s`` and left out of the step time, so a checkpoint step does not read as a data-bound one.
    """

    def __init__(self, peak_tflops: float = 0.0, every: int = 10) -> None:
        self.peak = peak_tflops * 1e12
        self.every = max(1, every)
        self._reset()
        self._last_end: float | None = None
        self._paused_at_end = 0.0
        self._setup_at: float | None = None
        self._validation_start: float | None = None

    def _reset(self) -> None:
        self.steps = self.samples = self.tokens = self.flops = 0
        self.busy = self.wait = self.paused = 0.0

    @staticmethod
    def _now(module) -> float:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)
        return time.perf_counter()

    def setup(self, trainer, module, stage: str) -> None:
        if stage == "fit":
            self._setup_at = time.perf_counter()

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self._start = self._now(module)
        if self._setup_at is not None:  # this launch's first step
            self._emit(trainer, module, {STARTUP_SECONDS: self._start - self._setup_at,
                                         RESUMED: float(trainer.ckpt_path is not None)})
            self._setup_at = None
        if self._last_end is not None:
            paused = paused_seconds(trainer) - self._paused_at_end
            self.paused += paused
            self.wait += max(0.0, self._start - self._last_end - paused)  # fetching and moving the batch

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        end = self._now(module)
        self.busy += end - self._start
        self._last_end, self._paused_at_end = end, paused_seconds(trainer)
        self.samples += int(module.batch_size_of(batch))
        self.tokens += int(module.tokens_of(batch))
        self.flops += TRAIN_FLOPS_FACTOR * float(module.flops_per_batch(batch))
        self.steps += 1
        if self.steps % self.every == 0:
            self._log(trainer, module)

    def on_validation_start(self, trainer, module) -> None:
        if trainer.state.fn == TrainerFn.FITTING:  # within fit; a plain validate() has no steps to measure
            self._validation_start = self._now(module)

    def on_validation_end(self, trainer, module) -> None:
        if self._validation_start is not None:  # synchronised: validation's last kernels are not data wait
            add_pause(trainer, self._now(module) - self._validation_start)
            self._validation_start = None

    def _log(self, trainer, module) -> None:
        seconds = self.busy + self.wait
        metrics = {"perf/samples_per_s": self.samples / seconds, "perf/tokens_per_s": self.tokens / seconds,
                   "perf/data_wait_fraction": self.wait / seconds, "perf/step_s": seconds / self.steps,
                   PAUSED_SECONDS: self.paused}
        if self.peak > 0:
            metrics["perf/mfu"] = self.flops / seconds / self.peak
        if module.device.type == "cuda":  # "why out of memory?": the peak since the run started
            metrics["perf/peak_mem_gib"] = torch.cuda.max_memory_allocated(module.device) / 2**30
            # "why is this step slower?": allocations that found no free cached block, freed the cache and
            # retried (synchronising cudaFree calls; a fragmented allocator), counted since the run started
            metrics["perf/alloc_retries"] = torch.cuda.memory_stats(module.device).get("num_alloc_retries", 0)
        self._emit(trainer, module, metrics)
        self._reset()

    @staticmethod
    def _emit(trainer, module, metrics: dict) -> None:
        # Straight to the loggers at this step (Lightning's own flush runs on its log_every_n_steps
        # cadence, which after a resume need not meet this one); callback_metrics get them too.
        module.log_dict(host_scalars(metrics), rank_zero_only=True, logger=False)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
