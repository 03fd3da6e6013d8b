"""A run folder remembers the config that made it, and a resume checks the new config against it.

``<output_dir>/run_config.json`` holds the resolved config of the run and the history of the changes
it was resumed with. It is written (atomically, by global rank 0 only) when a run starts with no
checkpoint in the folder. A later start into a folder holding checkpoints compares the new resolved
config with the record, key by key (:func:`diff`); every differing key is then:

* allowed, when it cannot change what the run computes: logging, validation, checkpoint cadence,
  performance switches that keep the same computation, ``phase.max_steps`` under a constant LR
  schedule (an extension or an earlier stop), and the split of the global batch over devices,
  nodes and accumulation when the global batch stays the same (:func:`reason_refused`);
* refused otherwise (the LR, the model, the data, the seed, ...): the start fails before anything
  is built with every such key, its recorded and its new value, and the two ways on: a new
  ``output_dir``, or ``resume_with_changes=true``, which resumes with the change.

Resumed changes (allowed or forced) are appended to the record's ``changes``, with the step they
start at. Every rank reads the same record and decides the same; only rank 0 writes, and it never
writes a record that a refused rank would read differently (it writes nothing when it refuses).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from animegamer.config.validate import ConfigError
from animegamer.utils.io import read_json, write_json_atomic

log = logging.getLogger(__name__)

RECORD_FILE = "run_config.json"
EXPORT_META = Path("export") / "export.json"  # runs made before run records: the export's config
OVERRIDE = "resume_with_changes"
ABSENT = "<absent>"

# Keys (or key prefixes, ending in '.') whose value never changes what a run computes.
ALLOWED = (
    "logger.", "log_level", "evaluation.", "output_dir", "checkpoint.",
    "phase.val_every_n_steps", "phase.val_clips", "phase.val_sampling_steps",
    "trainer.log_every_n_steps", "trainer.throughput_every_n_steps", "trainer.peak_tflops", "trainer.profiler",
    "trainer.profile_skip_steps", "trainer.profile_active_steps", "trainer.preemption_signals",
    "trainer.max_nonfinite_in_row", "data.num_workers", "data.bad_sample_budget",
    # The same computation, scheduled differently (memory, kernels, compilation, packing: tested equal).
    "trainer.benchmark", "trainer.deterministic", "trainer.fsdp_init_device",
    "phase.pack_tokens", "phase.pad_to_multiple",
    "model.decoder.gradient_checkpointing", "model.decoder.gradient_checkpointing_every",
    "model.decoder.attention_backends", "model.decoder.compile", "model.decoder.compile_mode",
    "model.mllm.gradient_checkpointing", "model.mllm.gradient_checkpointing_every",
    "model.mllm.attention_backends", "model.mllm.attention", "model.mllm.compile", "model.mllm.constrained_states",
    "model.encoders.vae.tiling", "model.encoders.vae.cudnn_benchmark",
    # The pipeline's execution (the shards it writes do not depend on these).
    "pipeline.workers", "pipeline.part", "pipeline.num_parts", "pipeline.steps", "pipeline.precompute.device",
    "pipeline.precompute.batch_size", "pipeline.representations.device", "pipeline.representations.batch_size",
    "pipeline.adaptation.device", "pipeline.adaptation.batch_size",
)
# The global batch: these may be re-split as long as their product (samples per optimizer step) stays.
GLOBAL_BATCH = ("phase.batch_size", "trainer.devices", "trainer.num_nodes", "trainer.accumulate_grad_batches")
# Strategies that keep full replicas and write the same checkpoint file (one process or DDP).
REPLICATED_STRATEGIES = ("auto", "ddp")
MAX_STEPS = "phase.max_steps"


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    def describe(self) -> str:
        return f"{self.key}: {self.old!r} (recorded) -> {self.new!r} (now)"


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are values, compared whole."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def diff(old: dict, new: dict) -> list[Change]:
    """Every key whose value differs between two resolved configs (nested dicts), sorted by key."""
    a, b = flatten(old), flatten(new)
    return [Change(k, a.get(k, ABSENT), b.get(k, ABSENT)) for k in sorted(a.keys() | b.keys())
            if a.get(k, ABSENT) != b.get(k, ABSENT)]


def _allowed(key: str) -> bool:
    return any(key == rule or (rule.endswith(".") and key.startswith(rule)) for rule in ALLOWED)


def _global_batch(config: dict) -> int | None:
    """Samples per optimizer step, or None when it is not known before the run (devices=-1)."""
    flat = flatten(config)
    values = [flat.get(key) for key in GLOBAL_BATCH]
    if any(not isinstance(v, int) or v < 1 for v in values):
        return None
    product = 1
    for value in values:
        product *= value
    return product


def reason_refused(change: Change, old: dict, new: dict) -> str | None:
    """Why resuming with ``change`` would alter the run (None: allowed). ``old``/``new``: whole configs."""
    key = change.key
    if _allowed(key):
        return None
    if ABSENT in (change.old, change.new):
        return None  # a key added or removed by a newer version of the code: its default keeps the old behaviour
    if key == MAX_STEPS:
        schedules = {flatten(c).get("phase.lr_schedule") for c in (old, new)}
        return None if schedules == {"constant"} else "the cosine LR schedule spans phase.max_steps"
    if key in GLOBAL_BATCH:
        before, after = _global_batch(old), _global_batch(new)
        if before is not None and before == after:
            return None
        return (f"the global batch (phase.batch_size x trainer.devices x trainer.num_nodes x "
                f"trainer.accumulate_grad_batches) would go from {before or 'unknown'} to {after or 'unknown'}")
    if key == "trainer.strategy" and {change.old, change.new} <= set(REPLICATED_STRATEGIES):
        return None
    return "changes what the run computes"


def refused(changes: list[Change], old: dict, new: dict) -> list[tuple[Change, str]]:
    """The changes a resume does not accept without ``resume_with_changes=true``, with the reason."""
    return [(c, reason) for c in changes if (reason := reason_refused(c, old, new)) is not None]


class RunFolderChanged(ConfigError):
    """A start into a run folder whose checkpoints were made with a config that differs in keys that
    change the training."""

    def __init__(self, folder: Path, source: Path, refusals: list[tuple[Change, str]]) -> None:
        super().__init__([f"{c.describe()} ({reason})" for c, reason in refusals])
        self.args = (f"{folder} holds checkpoints of a run with another config (recorded in {source}); "
                     f"{len(refusals)} setting(s) differ:\n" + "\n".join(f"  - {p}" for p in self.problems) +
                     f"\nEither train into a new folder (output_dir=...), or resume this run with the change "
                     f"({OVERRIDE}=true; the change is recorded in {RECORD_FILE}).",)


def read_record(folder: Path) -> tuple[dict, Path] | None:
    """(record, the file it came from): the folder's record, or one made from its export's config (runs
    made before records), or None."""
    for path, from_export in ((folder / RECORD_FILE, False), (folder / EXPORT_META, True)):
        if not path.is_file():
            continue
        try:
            data = read_json(path)
            config = data["config"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}: not a run record ({error!r}); move it away to start the folder afresh") \
                from error
        return ({"config": config, "changes": []} if from_export else data), path
    return None


def write_record(folder: Path, config: dict, changes: list[dict]) -> None:
    write_json_atomic(folder / RECORD_FILE, {"config": config, "changes": changes})


def is_global_zero() -> bool:
    """Global rank 0 from the launcher's environment (before the trainer exists): Lightning's own
    children, torchrun and SLURM set these variables; a plain start is rank 0."""
    from animegamer.utils.logging import global_rank

    return global_rank() == 0 and os.environ.get("NODE_RANK", "0") in ("", "0")


def check_run_folder(folder: str | Path, config: dict, resume_step: int | None, allow_changes: bool,
                     writer: bool | None = None) -> list[Change]:
    """Compare ``config`` (resolved, plain containers) with the folder's record and record it.

    ``resume_step``: the step of the checkpoint the run resumes from (None: a fresh run, which
    (re)writes the record). Raises :class:`RunFolderChanged` when a change that alters the training is
    not allowed by ``allow_changes``. Returns the changes the run resumes with."""
    folder = Path(folder)
    writer = is_global_zero() if writer is None else writer
    config = {k: v for k, v in config.items() if k != OVERRIDE}  # how to resume, not what the run is
    if resume_step is None:
        if writer:
            write_record(folder, config, [])
            log.info("new run in %s (its config: %s)", folder, folder / RECORD_FILE)
        return []
    found = read_record(folder)
    if found is None:
        log.warning("%s holds checkpoints but no %s (made before run records): recording the current config "
                    "without checking it against the checkpoints'", folder, RECORD_FILE)
        if writer:
            write_record(folder, config, [])
        return []
    record, source = found
    changes = diff(record["config"], config)
    refusals = refused(changes, record["config"], config)
    if refusals and not allow_changes:
        raise RunFolderChanged(folder, source, refusals)
    if not changes:
        return []
    forced = {c.key for c, _ in refusals}
    for change in changes:
        if change.key in forced:
            log.warning("resuming with a change that alters the training (%s=true): %s", OVERRIDE, change.describe())
        else:
            log.info("resuming with %s", change.describe())
    if writer:
        entry = {"step": resume_step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "forced": sorted(forced),
                 "changes": {c.key: [c.old, c.new] for c in changes}}
        write_record(folder, config, [*record.get("changes", []), entry])
    return changes
