"""Preemption (save, then exit) and the loss history that survives restarts."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from animegamer.training.checkpointing import checkpoint_name

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: what schedulers expect of a job stopped by a signal
LOSS_HISTORY = "loss_history.json"


class Preemption(L.Callback):
    """On any of ``signals``: finish the current optimizer step, save a checkpoint, exit.

    Lightning turns SIGTERM into ``trainer.received_sigterm`` (and forwards it to every rank); the
    other signals (SLURM's ``--signal=USR1@90``) are forwarded to it. A signal that lands in the middle
    of gradient accumulation is held until the step's last micro-batch, so the checkpoint is always on
    a step boundary, where the step-indexed data stream resumes exactly. On SLURM a SIGUSR1 also
    requeues the job.
    """

    def __init__(self, signals: list[str], folder: str | Path) -> None:
        self.signals = [getattr(signal, name) for name in signals]
        self.folder = Path(folder)
        self.received: int | None = None
        self._held = False
        self._deferred: list = []  # Lightning's SIGTERM handler calls, run at the next step boundary

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum in self.signals:
            if signum != signal.SIGTERM:
                signal.signal(signum, self._forward)

    def _forward(self, signum: int, _frame) -> None:
        self.received = signum
        os.kill(os.getpid(), signal.SIGTERM)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning's SIGTERM handler (registered for this fit) sets the flag checked after every batch;
        # a signal landing after on_train_batch_end of a mid-step micro-batch (in a later callback, the
        # logger) would stop the run mid-step. So the handler itself runs only at a step boundary.
        handler = signal.getsignal(signal.SIGTERM)
        if callable(handler) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: self._deferred.append(partial(handler, signum, frame)))

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        connector = trainer._signal_connector
        mid_step = trainer.fit_loop.epoch_loop._should_accumulate()
        if connector.received_sigterm and mid_step:  # landed before on_train_start
            connector.received_sigterm, self._held = False, True
        elif not mid_step:
            while self._deferred:
                self._deferred.pop(0)()
            if self._held:
                connector.received_sigterm, self._held = True, False

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        path = self.folder / checkpoint_name(trainer.global_step)
        if not path.exists():
            trainer.save_checkpoint(str(path))
        log.warning("preempted at step %d: checkpoint %s saved; the next run resumes from it",
                    trainer.global_step, path)
        if self.received == signal.SIGUSR1 and os.environ.get("SLURM_JOB_ID") and trainer.is_global_zero:
            job = os.environ["SLURM_JOB_ID"]
            if os.environ.get("SLURM_ARRAY_JOB_ID"):
                job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
            result = subprocess.call(["scontrol", "requeue", job])
            log.warning("requeue of SLURM job %s: %s", job, "done" if result == 0 else f"failed ({result})")


class LossHistory(L.Callback):
    """Every micro-batch's training loss, kept in the checkpoints and written to ``loss_history.json``
    at the end: a resumed run's history is the uninterrupted run's, which the fault tests compare."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / LOSS_HISTORY
        self.entries: list[list] = []  # [global step, batch index, loss]
        self._pending: list[tuple[int, int, torch.Tensor]] = []  # converted lazily: no sync per step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._pending.append((trainer.global_step, batch_idx, loss.detach()))

    def _flush(self) -> None:
        self.entries += [[step, index, float(loss)] for step, index, loss in self._pending]
        self._pending = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.rank = trainer.global_rank

    def state_dict(self) -> dict:
        """Every rank's history: the checkpoint is written by rank 0 but restored on every rank. Every
        rank saves a checkpoint together (Lightning), so gathering here is safe."""
        self._flush()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            ranks = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(ranks, self.entries)
            return {"ranks": ranks}
        return {"ranks": [list(self.entries)]}

    def load_state_dict(self, state: dict) -> None:
        ranks = state["ranks"]
        rank = getattr(self, "rank", 0)
        if rank >= len(ranks):  # resumed on more processes: this rank's history starts here
            log.warning("the checkpoint holds the loss history of %d rank(s); rank %d starts an empty one",
                        len(ranks), rank)
        self.entries = [list(e) for e in ranks[rank]] if rank < len(ranks) else []
        self._pending = []

    def on_train_end(self, trainer, pl_module) -> None:
        self._flush()
        # Rank r > 0 writes its own file: what each rank saw is checkable (equal batch counts).
        path = self.path if trainer.is_global_zero else self.path.with_suffix(f".rank{trainer.global_rank}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.entries))
