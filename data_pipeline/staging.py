"""The pipeline's restart state: per-film plans, per-task clip folders and rejection records.

Everything is written atomically (temp name + rename), so a folder or file that exists is complete.
A restarted run skips what exists and redoes the rest; because every task is a pure function of
(film, plan, config), the final shards come out byte-identical.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from animegamer.utils.io import atomic_dir, read_json, write_json_atomic

STAGING_DIR = ".staging"
PLAN_FILE = "plan.json"
TASK_FILE = "task.json"


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
        return self.film_dir(film_id) / f"task-{task:05d}"

    def task_error_path(self, film_id: str, task: int) -> Path:
        return self.film_dir(film_id) / f"task-{task:05d}.error.json"

    def rejection_path(self, source: str) -> Path:
        return self.dir / "rejected" / (hashlib.sha1(source.encode()).hexdigest()[:16] + ".json")

    # ------------------------------------------------------------------ writing
    def write_plan(self, film_id: str, plan: dict) -> None:
        write_json_atomic(self.plan_path(film_id), plan)

    def write_rejection(self, record: dict) -> None:
        write_json_atomic(self.rejection_path(record["path"]), record)

    def write_task(self, film_id: str, task: int, clips: list[tuple[str, bytes, dict]], info: dict) -> None:
        """Write a task's clips (key, mp4 bytes, meta) and info as one atomic folder."""
        with atomic_dir(self.task_dir(film_id, task)) as tmp:
            for key, mp4, meta in clips:
                (tmp / f"{key}.mp4").write_bytes(mp4)
                (tmp / f"{key}.json").write_text(json.dumps(meta, sort_keys=True))
            (tmp / TASK_FILE).write_text(json.dumps(info, sort_keys=True))
        self.task_error_path(film_id, task).unlink(missing_ok=True)

    def write_task_error(self, film_id: str, task: int, record: dict) -> None:
        write_json_atomic(self.task_error_path(film_id, task), record)

    # ------------------------------------------------------------------ reading
    def plan(self, film_id: str) -> dict | None:
        path = self.plan_path(film_id)
        return read_json(path) if path.exists() else None

    def rejection(self, source: str) -> dict | None:
        path = self.rejection_path(source)
        return read_json(path) if path.exists() else None

    def task_done(self, film_id: str, task: int) -> bool:
        return (self.task_dir(film_id, task) / TASK_FILE).exists()

    def task_info(self, film_id: str, task: int) -> dict:
        return read_json(self.task_dir(film_id, task) / TASK_FILE)

    def task_error(self, film_id: str, task: int) -> dict | None:
        path = self.task_error_path(film_id, task)
        return read_json(path) if path.exists() else None

    def task_clips(self, film_id: str, task: int) -> list[tuple[str, Path, dict]]:
        """(key, mp4 path, meta) of a finished task, in key order."""
        folder = self.task_dir(film_id, task)
        metas = sorted(p for p in folder.glob("*.json") if p.name != TASK_FILE)
        return [(p.stem, p.with_suffix(".mp4"), read_json(p)) for p in metas]
