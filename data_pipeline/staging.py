"""The pipeline's restart state: per-film plans, per-task clip folders, caption results and rejections.

Everything is written atomically (temp name + rename), so a folder or file that exists is complete.
Each record carries the fingerprint of what produced it (:mod:`data_pipeline.fingerprint`); a reader
that passes the current fingerprint sees only records made by the current inputs and config. A
restarted run skips what is current and redoes the rest; because every task is a pure function of
(film, plan, config), the final shards come out byte-identical.

Captions are staged apart from the clips (``task-NNNNN.captions.json`` beside ``task-NNNNN/``), so a
changed caption source re-captions clips without cutting and encoding them again, and a backend whose
failures can pass (:data:`~data_pipeline.captioners.base.RETRIED_BACKENDS`) is asked again for the
failed clips of a current record only (:func:`captions_to_retry`).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from animegamer.media.captions import STATUS_OK
from animegamer.media.fingerprint import FINGERPRINT, path_key
from animegamer.utils.io import atomic_dir, read_json, read_json_if_exists, write_json_atomic
from data_pipeline.captioners.base import RETRIED_BACKENDS

STAGING_DIR = ".staging"
PLAN_FILE = "plan.json"
TASK_FILE = "task.json"
TASK_PREFIX = "task-"
HASH_CACHE_DIR = "hashes"


def captions_to_retry(record: dict | None, retry_failed: bool, backend: str) -> list[str]:
    """Keys of the clips of a staged captions ``record`` (None: none staged) whose caption failed and is
    asked for again: with ``retry_failed`` (``caption.retry_failed``), for a backend whose failures can
    pass."""
    if record is None or not retry_failed or backend not in RETRIED_BACKENDS:
        return []
    return sorted(key for key, fields in record["captions"].items() if fields["captioner"]["status"] != STATUS_OK)


def _current(record: dict | None, fingerprint: str | None) -> dict | None:
    """``record`` when it was made by ``fingerprint`` (or no fingerprint is asked for), else None."""
    if record is None or (fingerprint is not None and record.get(FINGERPRINT) != fingerprint):
        return None
    return record


@dataclass(frozen=True)
class Staging:
    root: Path  # the pipeline output folder

    @property
    def dir(self) -> Path:
        return self.root / STAGING_DIR

    def film_dir(self, film_id: str) -> Path:
        return self.dir / "films" / film_id

    def plan_path(self, film_id: str) -> Path:
        return self.film_dir(film_id) / PLAN_FILE

    def task_dir(self, film_id: str, task: int) -> Path:
        return self.film_dir(film_id) / f"{TASK_PREFIX}{task:05d}"

    def task_error_path(self, film_id: str, task: int) -> Path:
        return self.film_dir(film_id) / f"{TASK_PREFIX}{task:05d}.error.json"

    def captions_path(self, film_id: str, task: int) -> Path:
        return self.film_dir(film_id) / f"{TASK_PREFIX}{task:05d}.captions.json"

    def rejection_path(self, source: str) -> Path:
        return self.dir / "rejected" / f"{path_key(source)}.json"

    @property
    def hash_cache(self) -> Path:
        """Where input files' content hashes are cached (:func:`animegamer.media.fingerprint.file_identity`)."""
        return self.dir / HASH_CACHE_DIR

    # ------------------------------------------------------------------ writing
    def write_plan(self, film_id: str, plan: dict) -> None:
        write_json_atomic(self.plan_path(film_id), plan)
        self.rejection_path(plan["film"]["path"]).unlink(missing_ok=True)  # the file was fixed

    def relocate(self, film_id: str, plan: dict, path: str) -> dict:
        """``plan`` with its film at ``path`` (the same content, copied, moved or mounted elsewhere)."""
        if plan["film"]["path"] == path:
            return plan
        plan = {**plan, "film": {**plan["film"], "path": path}}
        self.write_plan(film_id, plan)
        return plan

    def write_rejection(self, record: dict) -> None:
        write_json_atomic(self.rejection_path(record["path"]), record)
        self.plan_path(record["film_id"]).unlink(missing_ok=True)  # the file (or the settings) changed

    def write_task(self, film_id: str, task: int, clips: list[tuple[str, bytes, dict]], info: dict) -> None:
        """Write a task's clips (key, mp4 bytes, meta) and info as one atomic folder (replacing an old one)."""
        with atomic_dir(self.task_dir(film_id, task)) as tmp:
            for key, mp4, meta in clips:
                (tmp / f"{key}.mp4").write_bytes(mp4)
                (tmp / f"{key}.json").write_text(json.dumps(meta, sort_keys=True))
            (tmp / TASK_FILE).write_text(json.dumps(info, sort_keys=True))
        # An error of an earlier attempt no longer applies: until its captions are staged the task is pending.
        self.task_error_path(film_id, task).unlink(missing_ok=True)

    def write_captions(self, film_id: str, task: int, record: dict) -> None:
        """A task's caption results (``captions``: clip key -> caption fields), after its clips."""
        write_json_atomic(self.captions_path(film_id, task), record)
        self.task_error_path(film_id, task).unlink(missing_ok=True)

    def write_task_error(self, film_id: str, task: int, record: dict) -> None:
        write_json_atomic(self.task_error_path(film_id, task), record)

    def remove_tasks_from(self, film_id: str, first: int) -> int:
        """Delete staged tasks numbered ``first`` and above (a re-plan made fewer); returns how many."""
        removed = set()
        for path in self.film_dir(film_id).glob(f"{TASK_PREFIX}*"):
            number = path.name[len(TASK_PREFIX):].split(".")[0]
            if number.isdigit() and int(number) >= first:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed.add(int(number))
        return len(removed)

    # ------------------------------------------------------------------ reading
    def plan(self, film_id: str, fingerprint: str | None = None) -> dict | None:
        return _current(read_json_if_exists(self.plan_path(film_id)), fingerprint)

    def rejection(self, source: str, fingerprint: str | None = None) -> dict | None:
        return _current(read_json_if_exists(self.rejection_path(source)), fingerprint)

    def task_done(self, film_id: str, task: int, fingerprint: str | None = None) -> bool:
        path = self.task_dir(film_id, task) / TASK_FILE
        return path.exists() and (fingerprint is None or _current(read_json(path), fingerprint) is not None)

    def task_info(self, film_id: str, task: int) -> dict:
        return read_json(self.task_dir(film_id, task) / TASK_FILE)

    def captions(self, film_id: str, task: int, fingerprint: str | None = None) -> dict | None:
        return _current(read_json_if_exists(self.captions_path(film_id, task)), fingerprint)

    def task_error(self, film_id: str, task: int, fingerprint: str | None = None) -> dict | None:
        return _current(read_json_if_exists(self.task_error_path(film_id, task)), fingerprint)

    def task_clips(self, film_id: str, task: int) -> list[tuple[str, Path, dict]]:
        """(key, mp4 path, meta) of a finished task, in key order."""
        folder = self.task_dir(film_id, task)
        metas = sorted(p for p in folder.glob("*.json") if p.name != TASK_FILE)
        return [(p.stem, p.with_suffix(".mp4"), read_json(p)) for p in metas]
