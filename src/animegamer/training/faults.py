"""Preemption (save, then exit) and the loss history that survives restarts."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from animegamer.contracts.files import LOSS_HISTORY
from animegamer.errors import INTERRUPTED_EXIT_CODE
from animegamer.training.checkpointing import checkpoint_name, save_checkpoint

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: what schedulers expect of a job stopped by a signal
# The exit codes of a run that every rank stopped at the same step, saved: a scheduler's signal, or Ctrl-C.
SAVED_STOP_CODES = (PREEMPTED_EXIT_CODE, INTERRUPTED_EXIT_CODE)
INTERRUPT_NOTE = (b"\nCtrl-C: saving a checkpoint at the end of this optimizer step, then exiting "
                  b"(press Ctrl-C again to stop at once without it)\n")


class Preemption(L.Callback):
    """On any of ``signals``: finish the current optimizer step, save a checkpoint, exit.

    Ctrl-C (SIGINT, in the default signals) does the same, so an interactive stop loses no steps; a
    second Ctrl-C stops at once, as Python's own handler would, and the run resumes from its last save.

    The signal handlers only note the request. At the end of each optimizer step (the last micro-batch
    under gradient accumulation) the ranks agree on it with one all-reduce, so every rank stops after
    the same step, where the step-indexed data stream resumes exactly; Lightning then raises its
    ``SIGTERMException`` and :meth:`on_exception` saves. (Lightning's own SIGTERM handler broadcasts
    from inside the handler; deferred to a step boundary, ranks could enter it at different steps and
    hang, which a 2-process CPU test showed.) On SLURM a SIGUSR1 also requeues the job.
    """

    def __init__(self, signals: list[str], folder: str | Path, keep_last: int) -> None:
        self.signals = [getattr(signal, name) for name in signals]
        self.folder, self.keep_last = Path(folder), keep_last  # checkpoint.keep_last holds for its save too
        self.received: int | None = None
        self._requested = False
        self.stopped_at_once = False  # a second Ctrl-C: no save, Lightning's KeyboardInterrupt path
        self._before: dict[int, object] = {}  # the handlers to put back when the fit ends

    @property
    def interactive(self) -> bool:
        """The stop was a user's Ctrl-C, not a scheduler's signal."""
        return self.received == signal.SIGINT

    @property
    def pending(self) -> bool:
        """A stop was asked for after the last step had ended (in the final validation, say): the fit ran
        to its end, and the command stops once the run is saved."""
        return self._requested

    @property
    def exit_code(self) -> int:
        """What the process exits with once saved: a scheduler's code for its signals, the shell's for Ctrl-C."""
        return INTERRUPTED_EXIT_CODE if self.interactive else PREEMPTED_EXIT_CODE

    def _note(self, signum: int, _frame) -> None:
        if signum == signal.SIGINT:
            if self._requested:  # Ctrl-C again: stop at once, as Python does, without the save
                self.stopped_at_once = True
                raise KeyboardInterrupt
            os.write(2, INTERRUPT_NOTE)  # a handler may interrupt logging itself: no logging here
        self.received, self._requested = signum, True

    def _install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                # a signal the process was started to ignore (SIGINT in a script's background job) stays ignored
                current = signal.getsignal(signum)
                if current is signal.SIG_IGN or current == self._note:
                    continue
                self._before.setdefault(signum, current)
                signal.signal(signum, self._note)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the process's own handlers back: what runs after the fit in this process (the recipe's
        evaluation, the next stage) must not have Ctrl-C or SIGTERM only noted for a fit that is over.
        (After an exception Lightning restores the handlers it saved, ours, after the teardown hooks:
        the runner calls this again once ``fit`` has returned or raised.)"""
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._before.items():
                if signal.getsignal(signum) == self._note:
                    signal.signal(signum, handler)
        self._before.clear()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._install()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install()  # over the SIGTERM handler Lightning registers for this fit

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        connector = trainer._signal_connector
        # A SIGTERM that Lightning caught before on_train_start: take it over, so that Lightning
        # does not stop in the middle of a step (it checks its flag after every micro-batch).
        self._requested |= connector.received_sigterm
        connector.received_sigterm = False
        if trainer.fit_loop.epoch_loop._should_accumulate():
            return
        requested = self._requested
        if trainer.world_size > 1:
            flag = torch.tensor([float(requested)], device=trainer.strategy.root_device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            requested = bool(flag.item())
        if requested:
            connector.received_sigterm = True  # Lightning raises SIGTERMException after this batch

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        path = self.folder / checkpoint_name(trainer.global_step)
        if not path.exists():
            save_checkpoint(trainer, path, self.keep_last)
        log.warning("%s at step %d: checkpoint %s saved; the next run resumes from it",
                    "stopped by Ctrl-C" if self.interactive else "preempted", trainer.global_step, path)
        if self.received == signal.SIGUSR1 and os.environ.get("SLURM_JOB_ID") and trainer.is_global_zero:
            job = os.environ["SLURM_JOB_ID"]
            if os.environ.get("SLURM_ARRAY_JOB_ID"):
                job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
            try:
                result: int | str = subprocess.call(["scontrol", "requeue", job])
            except OSError as error:  # no scontrol in the job's environment (a container): the checkpoint stands
                result = f"{error.strerror}: {error.filename}"
            log.warning("requeue of SLURM job %s: %s", job, "done" if result == 0 else f"failed ({result}); the "
                        f"checkpoint is saved: submit the job again to resume")


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
