"""One run per folder (issue 17, point 1): a second run into a locked folder waits, then refuses naming
the holder, or proceeds once the holder ends; stale locks of dead processes are taken over; the lock
goes on every way out; train() and the pipeline take it before touching their folders."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import run_pipeline
from omegaconf import OmegaConf
from phase_a_helpers import tiny_train_cfg

from animegamer.config.compose import compose_config
from animegamer.errors import UserError
from animegamer.utils import folder_lock as fl
from animegamer.utils.folder_lock import LOCK_FILE, FolderLockedError, Holder, acquire, folder_lock

POLL = 0.02


@pytest.fixture(autouse=True)
def _rank_zero(monkeypatch):
    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK"):
        monkeypatch.delenv(var, raising=False)


def _write_lock(folder: Path, **fields) -> Holder:
    holder = Holder(**{**Holder.me().__dict__, **fields})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILE).write_text(json.dumps(holder.__dict__))
    return holder


def test_a_second_run_waits_then_refuses_naming_the_holder(tmp_path):
    with folder_lock(tmp_path, 0) as first:
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert record["command"] == first.command and record["since"] == first.since
        started = time.monotonic()
        with pytest.raises(FolderLockedError) as refused:
            acquire(tmp_path / LOCK_FILE, 0.3, poll=POLL)
        waited = time.monotonic() - started
    assert 0.3 <= waited < 2.0
    message = str(refused.value)
    assert isinstance(refused.value, UserError)
    for part in (f"pid {os.getpid()}", f"host {socket.gethostname()}", f"since {first.since}",
                 f"command: {first.command}", str(tmp_path / LOCK_FILE)):
        assert part in message
    assert not (tmp_path / LOCK_FILE).exists()  # released by the holder, untouched by the refused one


def test_a_second_run_proceeds_once_the_first_ends_within_the_wait(tmp_path):
    path = tmp_path / LOCK_FILE
    first = acquire(path, 0)
    releaser = threading.Timer(0.3, fl.release, (path, first))
    started = time.monotonic()
    releaser.start()
    second = acquire(path, 10, poll=POLL)
    waited = time.monotonic() - started
    releaser.join()
    assert 0.3 <= waited < 5.0
    assert json.loads(path.read_text())["token"] == second.token != first.token
    fl.release(path, second)
    assert not path.exists()


def test_a_dead_processs_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    pid = int(dead.stdout)
    stale = _write_lock(tmp_path, pid=pid, start=None, command="train.py experiment=old")
    with folder_lock(tmp_path, 0) as mine:
        assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == mine.token != stale.token
    assert f"took over the lock of a run that is no longer running (pid {pid} on host" in caplog.text
    assert "train.py experiment=old" in caplog.text


def test_a_killed_process_not_yet_reaped_holds_no_lock(tmp_path):
    """Killed, its parent not having waited for it yet, a run is a zombie: the same command started again at
    once takes its lock instead of waiting for it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = fl.process_start(child.pid)
        assert fl.pid_alive(child.pid, start)
        child.kill()
        for _ in range(200):  # the kernel marks it a zombie within milliseconds
            if Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.01)
        assert not fl.pid_alive(child.pid, start)
        stale = _write_lock(tmp_path, pid=child.pid, start=start)
        with folder_lock(tmp_path, 0) as mine:
            assert mine.token != stale.token
    finally:
        child.kill()
        child.wait()


def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path):
    """Our own pid, alive, but recorded with another start time: the recorded process is gone."""
    assert fl.pid_alive(os.getpid(), fl.process_start(os.getpid()))
    _write_lock(tmp_path, start="1")
    with folder_lock(tmp_path, 0) as mine:
        assert mine.start == fl.process_start(os.getpid()) != "1"


def test_another_hosts_lock_is_taken_over_only_when_unchanged_for_the_stale_time(tmp_path, caplog):
    path = tmp_path / LOCK_FILE
    _write_lock(tmp_path, host="node-17", pid=1)
    with pytest.raises(FolderLockedError, match="pid 1 on host node-17.*cannot be checked from this host"):
        acquire(path, 0, poll=POLL)  # no wait: the other host's process cannot be checked
    with pytest.raises(FolderLockedError):
        acquire(path, 0.2, poll=POLL, stale_after=0.5)  # a wait shorter than the stale time never takes over
    started = time.monotonic()
    mine = acquire(path, 5, poll=POLL, stale_after=0.3)
    assert 0.3 <= time.monotonic() - started < 3.0
    assert "node-17" in caplog.text and json.loads(path.read_text())["token"] == mine.token


def test_a_live_holders_heartbeat_keeps_another_host_from_taking_over(tmp_path):
    path = tmp_path / LOCK_FILE
    with folder_lock(tmp_path, 0, heartbeat=0.02) as holder:
        # Seen from another host: its pid cannot be checked, only the heartbeat.
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "host": "node-17"}))
        with pytest.raises(FolderLockedError, match="node-17"):
            acquire(path, 0.8, poll=POLL, stale_after=0.4)
        assert json.loads(path.read_text())["token"] == holder.token


@pytest.mark.parametrize("error", [RuntimeError("boom"), SystemExit(143), KeyboardInterrupt()])
def test_the_lock_is_released_on_every_way_out(tmp_path, error):
    with pytest.raises(type(error)):
        with folder_lock(tmp_path, 0):
            assert (tmp_path / LOCK_FILE).exists()
            raise error
    assert not (tmp_path / LOCK_FILE).exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temp or set-aside file left either


def test_a_lock_taken_over_meanwhile_is_left_to_its_new_holder(tmp_path, caplog):
    with folder_lock(tmp_path, 0):
        newcomer = _write_lock(tmp_path, command="the new holder")
    assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == newcomer.token
    assert "no longer this run's" in caplog.text


def test_only_global_rank_zero_locks(tmp_path, monkeypatch):
    from animegamer.utils.logging import is_global_zero

    monkeypatch.setenv("LOCAL_RANK", "1")
    with folder_lock(tmp_path, 0, enabled=is_global_zero()) as holder:
        assert holder is None and not (tmp_path / LOCK_FILE).exists()


def test_part_locks_of_a_split_pipeline_run_are_distinct():
    assert fl.part_lock_name(0, 1) == LOCK_FILE
    assert len({fl.part_lock_name(i, 3) for i in range(3)} | {LOCK_FILE}) == 4


# ------------------------------------------------------------------------------------------ entry points
def test_train_into_a_locked_folder_refuses_before_anything_is_built(tmp_path, monkeypatch):
    from animegamer.phases import run as runner
    from animegamer.training.checkpointing import CHECKPOINT_DIR, PARTIAL

    output = tmp_path / "run"
    partial = output / CHECKPOINT_DIR / f"step-0000004.ckpt{PARTIAL}"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"the live run is writing this")
    built = []
    monkeypatch.setattr(runner, "build_phase", lambda *a, **k: built.append(1))
    composed, typed = tiny_train_cfg(tmp_path / "features", output, "lock_wait_seconds=0.2")
    with folder_lock(output, 0) as holder:
        with pytest.raises(FolderLockedError, match=f"pid {holder.pid} on host"):
            runner.train(typed, composed)
    assert not built and partial.exists()  # refused before cleaning or building anything
    assert not (output / "run_config.json").exists()


def test_the_pipeline_into_a_locked_output_folder_refuses(tmp_path):
    output = tmp_path / "pipeline"
    with folder_lock(output, 0) as holder:
        with pytest.raises(FolderLockedError, match=f"pid {holder.pid} on host") as refused:
            run_pipeline([f"pipeline.output='{output}'", "pipeline.steps=[session_shards]"])
    assert str(output) in str(refused.value)


def test_the_wait_is_a_typed_setting_and_changing_it_is_no_config_change():
    from animegamer.training.run_record import refused, reason_refused, Change

    typed = OmegaConf.to_object(compose_config("train", ["lock_wait_seconds=120", "pipeline.lock_wait_seconds=30"]))
    assert typed.lock_wait_seconds == 120.0 and typed.pipeline.lock_wait_seconds == 30.0
    for key in ("lock_wait_seconds", "pipeline.lock_wait_seconds"):
        assert reason_refused(Change(key, 0.0, 120.0), {}, {}) is None
    assert refused([Change("seed", 0, 1)], {}, {})  # the rule still refuses what changes the run
