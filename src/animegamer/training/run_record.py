"""A run folder remembers the config and the data that made it, and a resume checks the new ones against it.

``<output_dir>/run_config.json`` holds the resolved config of the run, the digests of the shard
folders it reads (:func:`data_digests`) and the history of the changes it was resumed with. It is
written (atomically, by global rank 0 only) when a run starts with no checkpoint in the folder. A
later start into a folder holding checkpoints compares the new resolved config with the record, key
by key (:func:`diff`); every differing key is then:

* allowed, when it cannot change what the run computes: logging, validation, checkpoint cadence,
  performance switches that keep the same computation, ``phase.max_steps`` under a constant LR
  schedule (an extension or an earlier stop), and the global batch split differently between
  ``phase.batch_size`` and ``trainer.accumulate_grad_batches`` on the same number of processes
  (:func:`reason_refused`);
* refused otherwise (the LR, the model, the data, the seed, the number of processes, ...): the start
  fails before anything is built with every such key, its recorded and its new value, and the two
  ways on: a new ``output_dir``, or ``resume_with_changes=true``, which resumes with the change.

The data is compared too: a shard folder whose manifest now describes other shards (the pipeline ran
again into ``data.root``) is refused the same way, naming the manifest.

An input named by a path is compared by what it holds, not by how the path is spelled: a new
``data.root`` (or shard folder name) whose manifests hold the recorded shards and a new ``phase.init_from``
whose export file is the recorded one's are allowed, so a run folder copied or moved with its inputs (a
recipe's ``--out``) resumes there. The ``pipeline.*`` settings are the pipeline's: a training run reads
the shards they made (digested above), never the settings themselves, so they may differ too.

A fresh start that fails before it trains a step (:func:`kept_only_once_trained`: the data cannot be
read, the model cannot be built) puts back what the folder held before it: no record, or the earlier
one; once a step is trained or a checkpoint is in the folder, the record stays.

Resumed changes (allowed or forced) are appended to the record's ``changes``, with the step they
start at. Every rank reads the record that describes the folder's checkpoints and decides the same,
whenever it starts: the updated record is only written (by rank 0) once the resumed run has saved a
checkpoint (:class:`Decision`), so a rank started later (Lightning starts ranks 1..N-1 inside
``fit``) never reads a record that rank 0 has already moved on.
"""
from __future__ import annotations

import json
import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from animegamer.checkpoints.export import EXPORT_FILE
from animegamer.config.neutral_keys import ALLOWED, flatten
from animegamer.config.schema import CONSTANT_SCHEDULE, DATA_ROOT_KEY, INIT_FROM_KEY, MAX_STEPS_KEY
from animegamer.config.validate import ConfigError
from animegamer.contracts.files import CPU_THREADS_FILE, EXPORT_DIR, MANIFEST, RECORD_FILE
from animegamer.data.storage import ShardSource, data_source, join
from animegamer.errors import InvalidInputError
from animegamer.media.fingerprint import shards_digest
from animegamer.utils.io import read_json, sha256_bytes, write_bytes_atomic, write_json_atomic
from animegamer.utils.logging import is_global_zero

log = logging.getLogger(__name__)

EXPORT_META = Path(EXPORT_DIR) / EXPORT_FILE  # runs made before run records: the export's config
OVERRIDE = "resume_with_changes"
ABSENT = "<absent>"
# How a refusal says to train into another folder: train.py's setting; a recipe names its own option.
NEW_FOLDER = "output_dir=..."

# Samples per optimizer step and process: may be re-split as long as their product stays. The number of
# processes (WORLD_SIZE) may not change: StepSampler deals each rank n // world_size samples an epoch (the
# dropped tail and the epoch boundaries follow it) and phase (b)'s LoRA dropout masks follow the rank.
PER_RANK_BATCH = ("phase.batch_size", "trainer.accumulate_grad_batches")
WORLD_SIZE = ("trainer.devices", "trainer.num_nodes")
# Strategies that keep full replicas and write the same checkpoint file (one process or DDP).
REPLICATED_STRATEGIES = ("auto", "ddp")
HELD_OUT_SOURCE = "clips"  # every phase's held-out split reads the clips' shots.json
# The pipeline's settings: a training run reads the shards they made (their digests are compared), not them.
PIPELINE_PREFIX = "pipeline."


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    def describe(self) -> str:
        return f"{self.key}: {self.old!r} (recorded) -> {self.new!r} (now)"


def diff(old: dict, new: dict) -> list[Change]:
    """Every key whose value differs between two resolved configs (nested dicts), sorted by key."""
    a, b = flatten(old), flatten(new)
    return [Change(k, a.get(k, ABSENT), b.get(k, ABSENT)) for k in sorted(a.keys() | b.keys())
            if a.get(k, ABSENT) != b.get(k, ABSENT)]


def _allowed(key: str) -> bool:
    return any(key == rule or (rule.endswith(".") and key.startswith(rule)) for rule in ALLOWED)


def _product(config: dict, keys: tuple[str, ...]) -> int | None:
    """The product of ``keys``' values, or None when one is not known before the run (devices=-1)."""
    flat = flatten(config)
    values = [flat.get(key) for key in keys]
    if any(not isinstance(v, int) or v < 1 for v in values):
        return None
    return math.prod(values)


def _product_changed(keys: tuple[str, ...], what: str, old: dict, new: dict) -> str | None:
    before, after = _product(old, keys), _product(new, keys)
    if before is not None and before == after:
        return None
    return f"{what} ({' x '.join(keys)}) would go from {before or 'unknown'} to {after or 'unknown'}"


def reason_refused(change: Change, old: dict, new: dict) -> str | None:
    """Why resuming with ``change`` would alter the run (None: allowed). ``old``/``new``: whole configs."""
    key = change.key
    if _allowed(key) or key.startswith(PIPELINE_PREFIX):
        return None
    if ABSENT in (change.old, change.new):
        return None  # a key added or removed by a newer version of the code: its default keeps the old behaviour
    if key == MAX_STEPS_KEY:
        schedules = {flatten(c).get("phase.lr_schedule") for c in (old, new)}
        return None if schedules == {CONSTANT_SCHEDULE} else "the cosine LR schedule spans phase.max_steps"
    if key in PER_RANK_BATCH:
        return _product_changed(PER_RANK_BATCH, "the samples per optimizer step and process", old, new)
    if key in WORLD_SIZE:
        reason = _product_changed(WORLD_SIZE, "the number of processes", old, new)
        return reason and (f"{reason}: each rank's sample order (n // processes samples an epoch) and phase (b)'s "
                           f"LoRA dropout masks depend on it")
    if key == "trainer.strategy" and {change.old, change.new} <= set(REPLICATED_STRATEGIES):
        return None
    return "changes what the run computes"


def refused(changes: list[Change], old: dict, new: dict) -> list[tuple[Change, str]]:
    """The changes a resume does not accept without ``resume_with_changes=true``, with the reason."""
    return [(c, reason) for c in changes if (reason := reason_refused(c, old, new)) is not None]



class RunFolderChanged(ConfigError):
    """A start into a run folder whose checkpoints were made with a config that differs in keys that
    change the training."""

    def __init__(self, folder: Path, source: Path, refusals: list[tuple[Change, str]],
                 new_folder: str = NEW_FOLDER, finished: str = "") -> None:
        super().__init__([f"{c.describe()} ({reason})" for c, reason in refusals])
        self.refusals, self.folder, self.source, self.finished = refusals, folder, source, finished
        way = (f"\n{finished[:1].upper()}{finished[1:]}: resuming it trains nothing, so the change takes effect "
               f"only in a new folder ({new_folder}), or with {MAX_STEPS_KEY} above its last step ({OVERRIDE}=true)."
               if finished else
               f"\nEither train into a new folder ({new_folder}), or resume this run with the change "
               f"({OVERRIDE}=true; the change is recorded in {RECORD_FILE}).")
        self.args = (f"{folder} holds checkpoints of a run with another config (recorded in {source}); "
                     f"{len(refusals)} setting(s) differ:\n" + "\n".join(f"  - {p}" for p in self.problems) + way,)

    def advising(self, new_folder: str) -> "RunFolderChanged":
        """The same refusal, naming ``new_folder`` (the command's own option) as the way to a new folder."""
        return RunFolderChanged(self.folder, self.source, self.refusals, new_folder, self.finished)


def finished_run(config: dict, resume_step: int) -> str:
    """How a run resumed at its last step is named ("" while steps are left to train)."""
    last = config.get("phase", {}).get("max_steps")
    if not isinstance(last, int) or resume_step < last:
        return ""
    return f"the run finished at step {resume_step} ({MAX_STEPS_KEY}={last})"


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
            raise InvalidInputError(f"{path}: not a run record ({error!r}); move it away to start the folder "
                                    "afresh") from error
        return ({"config": config, "changes": []} if from_export else data), path
    return None


def make_record(config: dict, changes: list[dict], data: dict[str, str | None]) -> dict:
    """``data``: the digests of :func:`data_digests`; the record's ``inputs``: :func:`input_digests`."""
    return {"config": config, "data": data, "inputs": input_digests(config), "changes": changes}



def export_digest(folder: str | None) -> str | None:
    """What an export folder holds, from its export file (which names the run, its step and its training
    time): None for no folder or no export file."""
    path = Path(folder) / EXPORT_FILE if folder else None
    return sha256_bytes(path.read_bytes()) if path is not None and path.is_file() else None


def input_digests(config: dict) -> dict[str, str | None]:
    """The digest of each input named by a path whose content is not in the data digests."""
    return {INIT_FROM_KEY: export_digest(flatten(config).get(INIT_FROM_KEY))}


def moved_inputs(record: dict, config: dict, samples: str, data_now: dict[str, str | None]) -> set[str]:
    """The changed path keys whose new path holds what the recorded one did (see the module's notes)."""
    moved: set[str] = set()
    recorded_data = record.get("data")
    if recorded_data and None not in data_now.values() and recorded_data == data_now:
        moved |= {DATA_ROOT_KEY, *(f"data.{key}" for key in data_folders(samples))}
    recorded_config = flatten(record["config"])
    for key, digest in input_digests(config).items():
        # a record made before input digests: the recorded path's content, where it is still there
        recorded = record["inputs"].get(key) if "inputs" in record else export_digest(recorded_config.get(key))
        if digest is not None and recorded == digest:
            moved.add(key)
    return moved


def write_record(folder: Path, record: dict) -> None:
    write_json_atomic(Path(folder) / RECORD_FILE, record)


def data_folders(samples: str) -> list[str]:
    """The ``data.*`` keys of the shard folders a phase reads: its samples' (``samples``, the phase spec's
    ``sample_key``) and the clips' (the held-out split reads their shots.json)."""
    return list(dict.fromkeys((samples, HELD_OUT_SOURCE)))


def manifest_path(config: dict, key: str) -> str:
    """The manifest of folder ``data.<key>``: a path, or a URL where data.root (or the folder) is one."""
    return join(config["data"]["root"], config["data"][key], MANIFEST)


def manifest_digest(source: ShardSource) -> str | None:
    """A shard folder's contents from its manifest: its shards' names and sha256 (as the pipeline's
    lineage compares them), or the manifest's own hash when its shards carry none; None when missing."""
    try:
        raw = source.read_bytes(MANIFEST)
    except (FileNotFoundError, IsADirectoryError):
        return None
    manifest = json.loads(raw)
    shards = manifest.get("shards", [])
    return shards_digest(manifest) if shards and all("sha256" in s for s in shards) else sha256_bytes(raw)


def data_digests(config: dict, samples: str) -> dict[str, str | None]:
    """``data.<key>`` -> digest of that folder's manifest, for every folder the phase reads (its samples in
    ``data.<samples>``)."""
    return {f"data.{key}": manifest_digest(data_source(config["data"], config["data"][key]))
            for key in data_folders(samples)}


DATA_REASON = "its shards changed since the checkpoints were made (the pipeline ran again into data.root?)"


def only_data_changed(error: RunFolderChanged) -> bool:
    """Whether every refused change is of the shards the run reads (no setting changed)."""
    return all(reason == DATA_REASON for _, reason in error.refusals)


def data_changes(recorded: dict[str, str | None], config: dict, now: dict[str, str | None]) -> list[Change]:
    """The folders whose manifest (digests ``now``) describes other shards than the record's, named by
    manifest path."""
    return [Change(str(manifest_path(config, key.removeprefix("data."))), recorded.get(key, ABSENT), digest)
            for key, digest in now.items() if recorded.get(key, ABSENT) != digest]


@dataclass(frozen=True)
class Decision:
    """What a start into a run folder decided: the changes it resumes with, and the record that describes
    the folder once the resumed run has saved a checkpoint (None: the record stays as it is). Until
    then the checkpoints are the recorded run's, so the record must stay, for every rank that reads it."""

    changes: list[Change]
    pending: dict | None = None


def check_run_folder(folder: str | Path, config: dict, resume_step: int | None, allow_changes: bool, samples: str,
                     writer: bool | None = None) -> Decision:
    """Compare ``config`` (resolved, plain containers) and the data it reads with the folder's record.

    ``samples``: the ``data.*`` key of the folder of the phase's samples (its spec's ``sample_key``).
    ``resume_step``: the step of the checkpoint the run resumes from (None: a fresh run, whose record
    ``writer`` (default: global rank 0) writes now). Raises :class:`RunFolderChanged` when a change that
    alters the training is not allowed by ``allow_changes``. A resume returns the changes and the
    record to write once it has saved a checkpoint; it writes nothing, so every rank decides alike."""
    folder = Path(folder)
    writer = is_global_zero() if writer is None else writer
    config = {k: v for k, v in config.items() if k != OVERRIDE}  # how to resume, not what the run is
    if resume_step is None:
        if writer:
            write_record(folder, make_record(config, [], data_digests(config, samples)))
            log.info("new run in %s (its config: %s)", folder, folder / RECORD_FILE)
        return Decision([])
    found = read_record(folder)
    if found is None:
        log.warning("%s holds checkpoints but no %s (made before run records): recording the current config "
                    "without checking it against the checkpoints'", folder, RECORD_FILE)
        return Decision([], make_record(config, [], data_digests(config, samples)))
    record, source = found
    now = data_digests(config, samples)
    changes = diff(record["config"], config)
    moved = moved_inputs(record, config, samples, now)
    refusals = [(c, reason) for c, reason in refused(changes, record["config"], config) if c.key not in moved]
    if "data" in record:
        moved = data_changes(record["data"], config, now)
        changes, refusals = changes + moved, refusals + [(c, DATA_REASON) for c in moved]
    else:
        log.warning("%s records no digest of the data its checkpoints were trained on (made before data digests): "
                    "recording the current data's without checking it", source)
    finished = finished_run(config, resume_step)
    if refusals and not allow_changes:
        raise RunFolderChanged(folder, source, refusals, finished=finished)
    if not changes:
        return Decision([], None if "data" in record else make_record(config, record.get("changes", []), now))
    shorter = [c for c in changes if c.key == MAX_STEPS_KEY and isinstance(c.new, int) and c.new < resume_step]
    if shorter and writer:  # a resume goes on from its checkpoint: it cannot train fewer steps than it has
        log.warning("%s: %s=%d is below the step its checkpoint reached (%d): nothing is trained and its export "
                    "stays at step %d; a shorter run needs a new folder", folder, MAX_STEPS_KEY, shorter[0].new,
                    resume_step, resume_step)
    if finished and refusals:  # forced with resume_with_changes=true
        log.warning("%s: %s, so nothing is trained and the changed settings have no effect on its export; train "
                    "into a new folder, or raise %s", folder, finished, MAX_STEPS_KEY)
    forced = {c.key for c, _ in refusals}
    for change in changes:
        if change.key in forced:
            log.warning("resuming with a change that alters the training (%s=true): %s", OVERRIDE, change.describe())
        else:
            log.info("resuming with %s", change.describe())
    entry = {"step": resume_step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "forced": sorted(forced),
             "changes": {c.key: [c.old, c.new] for c in changes}}
    return Decision(changes, make_record(config, [*record.get("changes", []), entry], now))


def recorded_threads(folder: str | Path) -> int | None:
    """The CPU thread count the run in ``folder`` started with (None: not recorded, or not a count)."""
    path = Path(folder) / CPU_THREADS_FILE
    try:
        count = read_json(path)["cpu_threads"] if path.is_file() else None
    except (ValueError, KeyError, TypeError):
        log.warning("%s: not a thread record; the resume picks its own count", path)
        return None
    return count if isinstance(count, int) and count > 0 else None


def record_threads(folder: str | Path, count: int) -> None:
    """Record the CPU thread count a fresh run starts with, for its resumes."""
    write_json_atomic(Path(folder) / CPU_THREADS_FILE, {"cpu_threads": count})


@contextmanager
def kept_only_once_trained(folder: str | Path, fresh: bool, trained: Callable[[], bool]) -> Iterator[None]:
    """Around a start that writes the records of a fresh run (``fresh``: no checkpoint, global rank 0): when
    the start fails before ``trained()`` (a step trained, or a checkpoint in the folder), the record and
    thread-count files are put back as they were before (removed, or the earlier bytes written again), so a
    start refused at run time leaves no record of a run that never trained. A resume writes no record
    here: untouched."""
    paths = [Path(folder) / name for name in (RECORD_FILE, CPU_THREADS_FILE)]
    before = {path: path.read_bytes() if fresh and path.is_file() else None for path in paths}
    try:
        yield
    except BaseException:
        if fresh and not trained():
            for path, earlier in before.items():
                if earlier is None:
                    path.unlink(missing_ok=True)
                elif not path.is_file() or path.read_bytes() != earlier:
                    write_bytes_atomic(path, earlier)
        raise
