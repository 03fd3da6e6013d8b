"""Bad-data budget: count the corrupt samples and shards the datasets skipped, stop past a budget.

The datasets (``animegamer.data.indexed.IndexedShardDataset`` with ``skip_bad``) replace a bad
sample by the next good one and list it in the batch under ``"__skipped__"``; shards that could not
be indexed are in the dataset's ``bad_items``. This callback counts them once each (by shard and
key), logs each with its shard and key, logs the running count as ``data/skipped``, and raises once
the count exceeds the budget. The count is saved in checkpoints, so a resumed run keeps it.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

from lightning.pytorch.callbacks import Callback

from animegamer.config.validate import check_bad_sample_budget
from animegamer.contracts.shards import SKIPPED
from animegamer.training.host_values import host_scalar

log = logging.getLogger(__name__)

SHOWN = 5  # bad items named in the error


class BadDataBudget(Callback):
    def __init__(self, budget: int) -> None:
        problems = check_bad_sample_budget(budget)
        if problems:
            raise ValueError(problems[0])
        self.budget = budget
        self.seen: dict[tuple[str, str], str] = {}  # (shard, key) -> reason, in the order met

    @property
    def count(self) -> int:
        return len(self.seen)

    def record(self, items: Iterable[Mapping]) -> int:
        """Count the new bad items (by shard and key); returns how many were new."""
        new = 0
        for item in items:
            where = (str(item["shard"]), str(item["key"]))
            if where in self.seen:
                continue
            self.seen[where] = str(item.get("reason", ""))
            new += 1
            log.warning("bad data %d (budget %d): shard %s, key %s skipped: %s", self.count, self.budget,
                        where[0], where[1], self.seen[where])
        return new

    def exceeded(self) -> bool:
        return self.count > self.budget

    def error(self) -> RuntimeError:
        last = "; ".join(f"shard {shard} key {key}: {reason}" for (shard, key), reason in list(self.seen.items())[-SHOWN:])
        return RuntimeError(
            f"bad data budget exceeded: {self.count} corrupt samples/shards skipped, more than "
            f"data.bad_sample_budget={self.budget}. Last bad items: {last or '(on another rank)'}. "
            "Repair or re-create those shards, or raise data.bad_sample_budget.")

    # ------------------------------------------------------------------ Lightning hooks
    def on_train_start(self, trainer, pl_module) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        for name in ("train_set", "val_set"):
            self.record(getattr(getattr(datamodule, name, None), "bad_items", None) or ())
        if self.exceeded():  # the same shards on every rank: every rank stops here
            raise self.error()

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        skipped = batch.get(SKIPPED) if isinstance(batch, Mapping) else None
        if skipped:
            self.record(skipped)
        # Any rank over budget stops all of them together (a lone rank raising would hang the rest).
        if trainer.strategy.reduce_boolean_decision(self.exceeded(), all=False):
            raise self.error()
        pl_module.log("data/skipped", host_scalar(self.count), on_step=True, on_epoch=False, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"budget": self.budget,
                "seen": [{"shard": shard, "key": key, "reason": reason} for (shard, key), reason in self.seen.items()]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seen = {(item["shard"], item["key"]): item["reason"] for item in state_dict.get("seen", [])}
