"""``trainer.sync_debug``: which lines of code make the host wait for the GPU, and how often per step.

Every read of a device value on the host (``.item()``, ``bool(tensor)``, a boolean-mask index, a copy to
the CPU) waits until the GPU has run everything queued before it, and the GPU then idles while the host
queues the next kernels. A profile's ``aten::item`` count does not tell them apart from reads of CPU
scalars, which do not wait (2026-12-01, phase (b): 988 a step in the profile, 28 waits here), nor where
they come from. PyTorch names them itself with ``torch.cuda.set_sync_debug_mode("warn")``: each
synchronising operation raises a warning located at the Python line that called it. This callback turns
that on for the training steps, counts the warnings by line (on every thread: backward runs on the
autograd engine's device thread), lets every other warning through, and writes
``<output>/sync_sites.json`` with the counts per step, largest first; the log gets the top lines.
CUDA only: on the CPU nothing synchronises, and the callback says so once.
"""
from __future__ import annotations

import json
import logging
import warnings
from collections import Counter
from pathlib import Path

import lightning as L
import torch

SYNC_MESSAGE = "called a synchronizing CUDA operation"  # PyTorch's warning in sync debug mode
SITES_FILE = "sync_sites.json"
LOGGED_SITES = 10

log = logging.getLogger(__name__)


def count_sync_warnings(records: list, counts: Counter) -> list:
    """Add the sync warnings of ``records`` (``warnings.WarningMessage``) to ``counts`` by ``file:line``;
    returns the other records, to be shown as usual."""
    others = []
    for record in records:
        if SYNC_MESSAGE in str(record.message):
            counts[f"{record.filename}:{record.lineno}"] += 1
        else:
            others.append(record)
    return others


class SyncSites(L.Callback):
    """Count the host's waits for the GPU by line of code over the training steps (module docstring)."""

    def __init__(self, output_dir: str | Path) -> None:
        self.path = Path(output_dir) / SITES_FILE
        self.counts: Counter = Counter()
        self.steps = 0
        self.active = False
        self._catcher = None
        self._records: list | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.active = trainer.strategy.root_device.type == "cuda"
        if not self.active:
            log.info("trainer.sync_debug: a %s run has no GPU to wait for; nothing is counted",
                     trainer.strategy.root_device.type)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.active:
            return
        self._catcher = warnings.catch_warnings(record=True)
        self._records = self._catcher.__enter__()
        warnings.simplefilter("always")  # every occurrence, not the first per line
        torch.cuda.set_sync_debug_mode("warn")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._catcher is None:
            return
        records = self._stop()
        self.steps += 1
        for record in count_sync_warnings(records, self.counts):
            warnings.warn_explicit(record.message, record.category, record.filename, record.lineno)

    def on_train_end(self, trainer, pl_module) -> None:
        self._stop()
        if self.active and trainer.is_global_zero:
            self.write()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._stop()

    def _stop(self) -> list:
        if self._catcher is None:
            return []
        torch.cuda.set_sync_debug_mode(0)
        records = list(self._records or [])
        self._catcher.__exit__(None, None, None)
        self._catcher, self._records = None, None
        return records

    def per_step(self) -> dict[str, float]:
        """Waits per step by ``file:line``, largest first."""
        steps = max(self.steps, 1)
        return {site: round(count / steps, 2) for site, count in self.counts.most_common()}

    def write(self) -> None:
        sites = self.per_step()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps({"steps": self.steps, "waits_per_step": round(sum(sites.values()), 2),
                                       "per_step_by_site": sites}, indent=1))
        partial.replace(self.path)
        top = "\n".join(f"  {count:8.2f}  {site}" for site, count in list(sites.items())[:LOGGED_SITES])
        log.info("host waits for the GPU per step over %d steps: %.1f; top lines (%s):\n%s", self.steps,
                 sum(sites.values()), self.path, top or "  none")
