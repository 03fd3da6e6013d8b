"""2-process CPU DDP training of every phase through ``train.py`` (a subprocess, never pytest itself):
both ranks see the same number of batches, and loss and trained weights equal the single-process run
with the same global batch (randomness is keyed by each sample's global stream position)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fault_driver import Driver, running
from phase_a_helpers import logged_losses, write_synthetic_features
from phase_b_helpers import write_synthetic_sessions
from phase_c_helpers import write_synthetic_adaptation

from animegamer.errors import INTERRUPTED_EXIT_CODE
from animegamer.training.faults import PREEMPTED_EXIT_CODE

ROOT = Path(__file__).resolve().parents[1]
GLOBAL_BATCH, STEPS = 4, 3
COMMON = ["model=tiny", "trainer=cpu", "logger=csv", f"phase.max_steps={STEPS}", "phase.warmup_steps=1",
          "phase.val_every_n_steps=1000", "checkpoint.every_n_steps=1000", "trainer.log_every_n_steps=1",
          "data.val_fraction=0.2"]


def _features(root: Path) -> Path:
    from animegamer.config.compose import compose_config
    from omegaconf import OmegaConf

    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    # 14 clips, 12 of them training clips: three global batches of 4 in the first epoch.
    return write_synthetic_features(root, enc, clips=14)


PHASES = {
    "a_joint": (["phase=a_joint", "phase.lr=1e-3", "phase.val_clips=0"], _features),
    "b": (["phase=b", "phase.lr=3e-3"], lambda root: write_synthetic_sessions(root, sessions=16)),
    "c": (["phase=c", "phase.lr=1e-3"], lambda root: write_synthetic_adaptation(root, clips=16)),
}


def _command(data_root: Path, output: Path, phase_overrides: list[str], devices: int, global_batch: int) -> list:
    overrides = COMMON + phase_overrides + [f"data.root={data_root}", f"output_dir={output}",
                                            f"phase.batch_size={global_batch // devices}",
                                            f"trainer.devices={devices}", f"trainer.strategy={'ddp' if devices > 1 else 'auto'}"]
    return [sys.executable, str(ROOT / "train.py"), *overrides]


@pytest.fixture(scope="module")
def launcher():
    """Runs ``python train.py ...`` by forking it from tests/fault_driver.py, which imported Lightning and
    the phases once: each run pays no import of its own. What ``train.py`` starts (Lightning's rank 1) is a
    fresh interpreter, as ever."""
    driver = Driver()
    yield driver
    driver.close()


def _start(launcher: Driver, data_root: Path, output: Path, phase_overrides: list[str], devices: int,
           global_batch: int = GLOBAL_BATCH, session: bool = False) -> int:
    """The run started (its pid), its output going to a file beside its folder. ``global_batch``: samples
    per micro-batch over all processes; ``session``: in a session of its own (a process-group kill)."""
    command = _command(data_root, output, phase_overrides, devices, global_batch)
    return launcher.launch(Path(command[1]), command[2:], output.with_name(output.name + ".log"), session=session)


def _finished(launcher: Driver, *pids: int) -> None:
    """Every run waited for (killed past the limit) before any is judged, so none outlives the test."""
    codes = [launcher.wait(pid, timeout=600) for pid in pids]
    for pid, code in zip(pids, codes):
        assert code == 0 and pid not in launcher.timed_out, launcher.logs[pid].read_text()[-4000:]


def _train(launcher: Driver, data_root: Path, output: Path, phase_overrides: list[str], devices: int,
           global_batch: int = GLOBAL_BATCH) -> None:
    _finished(launcher, _start(launcher, data_root, output, phase_overrides, devices, global_batch))


@pytest.mark.parametrize(("phase", "accumulate"), [(p, 1) for p in sorted(PHASES)] + [("a_joint", 2)])
def test_two_process_ddp_matches_single_process(phase, accumulate, launcher, tmp_path):
    overrides, make_data = PHASES[phase]
    overrides = overrides + [f"trainer.accumulate_grad_batches={accumulate}"]
    data_root = make_data(tmp_path / "data")
    # The two runs are independent: side by side, the single process uses what the two ranks leave idle.
    single = _start(launcher, data_root, tmp_path / "single", overrides, devices=1,
                    global_batch=GLOBAL_BATCH // accumulate)
    ddp = _start(launcher, data_root, tmp_path / "ddp", overrides, devices=2, global_batch=GLOBAL_BATCH // accumulate)
    _finished(launcher, single, ddp)

    ranks = [json.loads((tmp_path / "ddp" / name).read_text())
             for name in ("loss_history.json", "loss_history.rank1.json")]
    # both ranks ran every micro-batch of every step, no more
    assert len(ranks[0]) == len(ranks[1]) == STEPS * accumulate

    single, ddp = logged_losses(tmp_path / "single"), logged_losses(tmp_path / "ddp")
    assert sorted(single) == sorted(ddp) == list(range(STEPS))
    for step in single:  # the logged loss is the mean over ranks: the global batch's loss
        assert ddp[step] == pytest.approx(single[step], rel=1e-5, abs=1e-6), step

    trained_single = load_file(tmp_path / "single" / "export" / "trained.safetensors")
    trained_ddp = load_file(tmp_path / "ddp" / "export" / "trained.safetensors")
    assert trained_single.keys() == trained_ddp.keys()
    for name, value in trained_single.items():
        torch.testing.assert_close(trained_ddp[name], value, rtol=1e-4, atol=1e-6, msg=name)


STOPPED_MAX_STEPS = 40  # 12 training clips at a global batch of 2: the resumed run crosses epoch boundaries
STOPPED_STEPS = ["phase=a_joint", "phase.lr=1e-3", "phase.val_clips=0", f"phase.max_steps={STOPPED_MAX_STEPS}",
                 "checkpoint.every_n_steps=10"]


@pytest.fixture(scope="module")
def uninterrupted(launcher, tmp_path_factory):
    """(data root, reference): the uninterrupted 2-process run every stopped run must equal, trained once.
    It runs in the background beside the first stopped run (gloo's waits leave the cores half idle);
    ``reference()`` waits for it and returns its folder."""
    root = tmp_path_factory.mktemp("uninterrupted")
    data_root = _features(root / "data")
    pid = _start(launcher, data_root, root / "reference", STOPPED_STEPS, devices=2, global_batch=2)
    waited = []

    def reference() -> Path:
        if not waited:
            waited.append(pid)
            _finished(launcher, pid)
        return root / "reference"

    yield data_root, reference
    if not waited:  # a test failed before it waited: the run ends with the module
        os.kill(pid, signal.SIGKILL)
        launcher.wait(pid)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_ddp_run_stopped_after_a_checkpoint_resumes_exactly(tmp_path, how, launcher, uninterrupted):
    """Both ranks SIGKILLed (the whole process group), or preempted with SIGTERM, a moment after a
    checkpoint, then restarted: the trained weights and every rank's loss history equal the
    uninterrupted 2-process run's, bitwise."""
    data_root, uninterrupted_run = uninterrupted
    pid = _start(launcher, data_root, tmp_path / "killed", STOPPED_STEPS, devices=2, global_batch=2, session=True)
    checkpoint = tmp_path / "killed" / "checkpoints" / "step-0000020.ckpt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists(), "no step-20 checkpoint before the kill (run ended or 300 s passed)"
    os.killpg(pid, getattr(signal, how))
    code = launcher.wait(pid, timeout=120)
    stderr = launcher.logs[pid].read_text()
    assert pid not in launcher.timed_out, f"still running 120 s after {how}: {stderr[-3000:]}"
    if how == "SIGTERM":  # preempted: a checkpoint at a step boundary past step 20, exit code 143
        assert code == PREEMPTED_EXIT_CODE, stderr[-3000:]
        assert "preempted at step" in stderr
    else:
        assert code == -signal.SIGKILL, stderr[-3000:]
    assert not (tmp_path / "killed" / "export" / "export.json").exists() or \
        json.loads((tmp_path / "killed" / "export" / "export.json").read_text()).get("step", 0) < STOPPED_MAX_STEPS
    _train(launcher, data_root, tmp_path / "killed", STOPPED_STEPS, devices=2, global_batch=2)

    reference = uninterrupted_run()
    for name in ("loss_history.json", "loss_history.rank1.json"):
        assert (tmp_path / "killed" / name).read_text() == (reference / name).read_text(), name
    assert (tmp_path / "killed" / "export" / "trained.safetensors").read_bytes() == \
        (reference / "export" / "trained.safetensors").read_bytes()


# ------------------------------------------------------------------ process group's lifetime (in-process)
def _ddp_trainer(devices: int):
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    strategy = DDPStrategy(start_method="popen") if devices > 1 else "auto"
    return L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False)


def _bindable(port: int) -> bool:
    """Whether a server could listen on ``port`` now (SO_REUSEADDR, as servers set it: closed
    connections' TIME_WAIT does not count, a listening socket does)."""
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_the_launching_rank_holds_the_rendezvous_port_from_the_start(monkeypatch):
    import torch.distributed as dist

    from animegamer.training.process_group import MASTER_PORT, end_process_group, host_rendezvous

    monkeypatch.delenv(MASTER_PORT, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    host_rendezvous(_ddp_trainer(devices=1))  # nothing to launch: nothing bound
    assert MASTER_PORT not in os.environ
    host_rendezvous(_ddp_trainer(devices=2))
    port = int(os.environ[MASTER_PORT])
    assert not _bindable(port)  # bound from the start: no other process can take it before rank 0 joins
    # Rank 0's env:// rendezvous (Lightning's) joins the server already bound instead of binding again.
    dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    end_process_group(synchronize=True)
    # A group of one process is its maker's (a caller may fit again on it); the port is the group's now.
    assert dist.is_initialized() and MASTER_PORT not in os.environ and not _bindable(port)
    dist.destroy_process_group()
    assert _bindable(port)


def test_a_port_chosen_outside_is_left_alone(monkeypatch):
    from animegamer.training.process_group import MASTER_PORT, end_process_group, host_rendezvous

    monkeypatch.setenv(MASTER_PORT, "29517")  # a scheduler's or the user's
    host_rendezvous(_ddp_trainer(devices=2))
    end_process_group(synchronize=True)
    assert os.environ[MASTER_PORT] == "29517"


@pytest.mark.parametrize(("stop", "synchronized"), [(None, [True]), (SystemExit(PREEMPTED_EXIT_CODE), [True]),
                                                    (SystemExit(INTERRUPTED_EXIT_CODE), [True]),  # Ctrl-C, saved
                                                    (SystemExit(1), [False]), (RuntimeError("a step failed"), [False])])
def test_the_group_ends_however_the_run_ends(stop, synchronized, monkeypatch):
    """A finished or preempted run synchronizes before the group goes; a failed one does not wait for
    peers that may never come. (tests/test_fsdp_gather.py ends 2 real ranks this way.)"""
    from animegamer.training import process_group

    ended = []
    monkeypatch.setattr(process_group, "end_process_group", lambda synchronize: ended.append(synchronize))
    with contextlib.suppress(type(stop) if stop else ()), process_group.process_group_lifetime():
        if stop:
            raise stop
    assert ended == synchronized


def test_the_animegamer_command_starts_its_other_ranks_too(tmp_path):
    """``animegamer train`` names its verb in ``sys.argv[0]``, which is no file: Lightning starts rank 1 by
    running the verb's module (``python -m``) instead, and both ranks train."""
    import subprocess

    data = _features(tmp_path / "data")
    overrides = _command(data, tmp_path / "out", PHASES["a_joint"][0], 2, GLOBAL_BATCH)[2:]
    done = subprocess.run([sys.executable, "-m", "animegamer", "train", *overrides], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "export" / "trained.safetensors").exists()
    assert f"done at step {STEPS}" in done.stderr
