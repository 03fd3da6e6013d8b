"""A pipeline run killed mid-way and started again writes byte-identical shards, nothing lost or doubled."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import REPO, pipeline_overrides, run_pipeline

from data_pipeline.staging import Staging

KILL_AFTER_TASKS = 3
TIMEOUT_S = 120


def _shard_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.glob("shard-*.tar"))}


def test_killed_run_resumes_to_identical_shards(toy_film, toy_run, tmp_path):
    output = tmp_path / "run"
    # One shot per task and one worker: many small atomic steps, killed after a few of them.
    overrides = pipeline_overrides(output, [toy_film.video_path], toy_film.captions_path,
                                   "pipeline.shots_per_task=1", "pipeline.workers=1")
    proc = subprocess.Popen([sys.executable, "-m", "data_pipeline", *overrides], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    staging = Staging(output)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(staging.task_done(toy_film.film_id, t) for t in range(20)) >= KILL_AFTER_TASKS:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (output / "clips" / "manifest.json").exists()
    done_before = [t for t in range(20) if staging.task_done(toy_film.film_id, t)]
    assert len(done_before) >= KILL_AFTER_TASKS

    report = run_pipeline(overrides)

    reference = toy_run[0]
    assert report["counts"] == toy_run[1]["counts"]
    # Same bytes as the uninterrupted run, which used two workers and 8 shots per task.
    assert _shard_bytes(output / "clips") == _shard_bytes(reference / "clips")
    assert _shard_bytes(output / "features") == _shard_bytes(reference / "features")
    assert not list(output.rglob(".tmp-*"))
