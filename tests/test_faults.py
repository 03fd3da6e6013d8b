"""Fault injection (issue 7): training runs of every phase killed with SIGKILL at random steps and in
the middle of checkpoint writes, or preempted with SIGTERM, then restarted, end with the same trained
weights (bitwise) and the same loss history as an uninterrupted run; non-finite steps are skipped up to
a limit; an incomplete checkpoint is never resumed from; the data pipeline killed at a random task
resumes to the same shards.

Runs go through ``tests/fault_driver.py`` (a child process per run, forked from a driver that imported
torch and the phases once), so a kill is a real SIGKILL of the training process.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fault_driver import HOOKS as KILL_HOOKS
from fault_driver import Driver, running
from phase_a_helpers import write_synthetic_features
from phase_b_helpers import write_synthetic_sessions
from phase_c_helpers import write_synthetic_adaptation

from animegamer.checkpoints.export import EXPORT_FILE
from animegamer.contracts.files import EXPORT_DIR
from animegamer.errors import INTERRUPTED_EXIT_CODE, INTERRUPTED_MESSAGE
from animegamer.training.callbacks import TRAIN_SECONDS
from animegamer.training.checkpoint_integrity import RECORD_SUFFIX
from animegamer.training.checkpointing import PARTIAL, checkpoint_name, clean_partials, resume_checkpoint
from animegamer.training.faults import LOSS_HISTORY, PREEMPTED_EXIT_CODE

ROOT = Path(__file__).resolve().parents[1]
STEPS, EVERY = 8, 2
COMMON = ["model=tiny", "trainer=cpu", "logger=none", f"phase.max_steps={STEPS}", "phase.warmup_steps=1",
          "phase.batch_size=2", "phase.val_every_n_steps=1000", f"checkpoint.every_n_steps={EVERY}",
          "checkpoint.keep_last=-1", "data.val_fraction=0.2"]
PHASES = {  # overrides, data writer, seed of the random fault schedule
    "a_joint": (["phase=a_joint", "phase.lr=1e-3", "phase.val_clips=0"], "features", 1),
    "b": (["phase=b", "phase.lr=3e-3", "model.mllm.lora_dropout=0.05"], "sessions", 2),
    "c": (["phase=c", "phase.lr=1e-3"], "adaptation", 3),
}


# ------------------------------------------------------------------------------------------ driver
@pytest.fixture(scope="module")
def driver():
    d = Driver()
    yield d
    d.close()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config

    root = tmp_path_factory.mktemp("fault_data")
    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    # 12 training clips / sessions: 6 steps of 2 per epoch, so 8 steps cross an epoch boundary.
    return {"features": write_synthetic_features(root / "features", enc, clips=14),
            "sessions": write_synthetic_sessions(root / "sessions", sessions=16),
            "adaptation": write_synthetic_adaptation(root / "adaptation", clips=16)}


def _overrides(phase: str, data: dict, *extra: str) -> list[str]:
    overrides, kind, _ = PHASES[phase]
    return [*COMMON, *overrides, f"data.root={data[kind]}", *extra]


@pytest.fixture(scope="module")
def references(driver, data, tmp_path_factory):
    """Uninterrupted runs, started together (they overlap the faulty runs); ``get(key)`` waits for one."""
    root = tmp_path_factory.mktemp("references")
    runs = {phase: (root / phase, _overrides(phase, data)) for phase in PHASES}
    runs["a_joint_acc2"] = (root / "a_joint_acc2", _overrides("a_joint", data, "trainer.accumulate_grad_batches=2"))
    pids = {key: driver.start(output, overrides) for key, (output, overrides) in runs.items()}
    done: dict[str, Path] = {}

    def get(key: str) -> Path:
        if key not in done:
            rc = driver.wait(pids[key])
            assert rc == 0, driver.logs[pids[key]].read_text()[-4000:]
            done[key] = runs[key][0]
        return done[key]

    yield get
    for key in runs:
        get(key)  # reap every child


def _assert_same_result(output: Path, reference: Path) -> None:
    trained, expected = (load_file(p / "export" / "trained.safetensors") for p in (output, reference))
    assert trained.keys() == expected.keys()
    for name, value in expected.items():
        assert trained[name].dtype == value.dtype and torch.equal(trained[name].view(torch.uint8),
                                                                  value.view(torch.uint8)), name
    history = json.loads((output / LOSS_HISTORY).read_text())
    assert history == json.loads((reference / LOSS_HISTORY).read_text())  # every micro-batch, exactly
    assert history[-1][0] == STEPS
    assert not list((output / "checkpoints").glob(f"*{PARTIAL}"))


def _step(path: Path | None) -> int:
    return int(path.name[len("step-"):-len(".ckpt")]) if path else 0


# ------------------------------------------------------------------------------------------ SIGKILL
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_sigkill_at_random_steps_and_mid_checkpoint_write_resumes_exactly(phase, driver, data, references,
                                                                          tmp_path):
    rng = random.Random(PHASES[phase][2])
    overrides, output = _overrides(phase, data), tmp_path / "faulty"
    folder = output / "checkpoints"

    # 1. SIGKILL at a random step, at a random point of it (after step-2.ckpt exists, see 2).
    kill = {"step": rng.randint(EVERY + 1, STEPS - 1), "hook": rng.choice(KILL_HOOKS)}
    driver.run(output, overrides, expect=-signal.SIGKILL, kill=kill)
    assert not (output / LOSS_HISTORY).exists()  # written at the end only
    resumed_from = resume_checkpoint(folder)
    assert EVERY <= _step(resumed_from) <= kill["step"]

    # 2. SIGKILL in the middle of writing the n-th checkpoint of the restarted run.
    saves = len(range(_step(resumed_from) + EVERY, STEPS + 1, EVERY))
    n = rng.randint(1, saves)
    torn = folder / (checkpoint_name(_step(resumed_from) + n * EVERY) + PARTIAL)
    log = driver.run(output, overrides, expect=-signal.SIGKILL, kill_in_save=n)
    assert f"resuming from {resumed_from}" in log
    assert torn.is_file() and torn.stat().st_size > 0, sorted(folder.iterdir())
    assert not torn.with_name(torn.name[: -len(PARTIAL)]).exists()
    previous = resume_checkpoint(folder)  # the torn save's predecessor, intact and loadable
    assert _step(previous) == _step(resumed_from) + (n - 1) * EVERY
    assert torch.load(previous, map_location="cpu", weights_only=True)["global_step"] == _step(previous)

    # 3. Restarted: the torn .partial is removed, never loaded; SIGKILLed once more at a random step.
    hook = rng.choice(KILL_HOOKS)
    last = STEPS if hook == "on_train_batch_end" else STEPS - 1  # the other hooks never see global_step 8
    kill = {"step": rng.randint(_step(previous) + 1, last), "hook": hook}
    log = driver.run(output, overrides, expect=-signal.SIGKILL, kill=kill)
    assert f"removing {torn}" in log and f"resuming from {previous}" in log
    assert not torn.exists()

    # 4. Restarted until it completes.
    driver.run(output, overrides)
    _assert_same_result(output, references(phase))


# ------------------------------------------------------------------------------------------ SIGTERM
# (accumulate, where the SIGTERM lands, step of the checkpoint it saves). global_step counts the steps
# done, so "step": 2 is during the 3rd step. Checkpoints every 2 steps: a step-3 one is the preemption's.
PREEMPTIONS = {
    "acc1": (1, {"step": 2, "hook": "on_before_optimizer_step"}, 3),
    # First micro-batch of step 3: held until the step's last micro-batch.
    "acc2": (2, {"step": 2, "hook": "on_before_backward", "micro": 0}, 3),
    # After Preemption's own on_train_batch_end of step 4's first micro-batch (in a later callback): it
    # used to stop there, saving a mid-step step-3 checkpoint with one micro-batch too many.
    "acc2-late": (2, {"step": 3, "hook": "on_train_batch_end", "micro": 0}, 4),
    # Ctrl-C: the same save at the step's end (it used to stop in Lightning's KeyboardInterrupt path, unsaved).
    "acc1-ctrl-c": (1, {"step": 2, "hook": "on_before_optimizer_step", "signal": "SIGINT"}, 3),
}


@pytest.mark.parametrize("case", sorted(PREEMPTIONS))
def test_a_stop_signal_saves_at_a_step_boundary_exits_with_its_code_and_resumes(case, driver, data, references,
                                                                               tmp_path):
    accumulate, pause, step = PREEMPTIONS[case]
    overrides = _overrides("a_joint", data, f"trainer.accumulate_grad_batches={accumulate}")
    output = tmp_path / "preempted"
    pid = driver.start(output, overrides, pause=pause)
    ready = Path(str(driver.logs[pid]) + ".ready")
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline and running(pid):
        time.sleep(0.01)
    assert ready.exists(), driver.logs[pid].read_text()[-4000:]
    os.kill(pid, getattr(signal, pause.get("signal", "SIGTERM")))  # from outside, as a scheduler (or a terminal) does
    rc = driver.wait(pid)
    log = driver.logs[pid].read_text()
    ctrl_c = pause.get("signal") == "SIGINT"  # a user's stop: the shell's code for Ctrl-C, not a scheduler's
    assert rc == (INTERRUPTED_EXIT_CODE if ctrl_c else PREEMPTED_EXIT_CODE), log[-4000:]
    assert f"{'stopped by Ctrl-C' if ctrl_c else 'preempted'} at step {step}" in log
    assert ("Ctrl-C: saving a checkpoint" in log) == ctrl_c

    saved = resume_checkpoint(output / "checkpoints")
    assert saved.name == checkpoint_name(step)
    periodic = {checkpoint_name(s) for s in range(EVERY, step + 1, EVERY)}
    complete = periodic | {saved.name}  # nothing past the boundary, and each with its integrity record
    assert {p.name for p in saved.parent.iterdir()} == complete | {name + RECORD_SUFFIX for name in complete}
    checkpoint = torch.load(saved, map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == step
    history = next(v for k, v in checkpoint["callbacks"].items() if k.startswith("LossHistory"))["ranks"][0]
    assert len(history) == step * accumulate  # whole optimizer steps only
    assert checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"] == step * accumulate
    # How long the first launch trained travels in the checkpoint; the resumed export adds to it.
    trained = next(v for k, v in checkpoint["callbacks"].items() if k.startswith("ExportCallback"))[TRAIN_SECONDS]
    assert trained > 0

    # The export of the stopped run is its last save's, and says so (loading it warns).
    from animegamer.checkpoints.export import warn_if_unfinished

    partial = json.loads((output / EXPORT_DIR / EXPORT_FILE).read_text())
    assert (partial["step"], partial["finished"]) == (step, False) and warn_if_unfinished(output / EXPORT_DIR)

    log = driver.run(output, overrides)
    assert f"resuming from {saved}" in log
    _assert_same_result(output, references("a_joint" if accumulate == 1 else "a_joint_acc2"))
    final = json.loads((output / EXPORT_DIR / EXPORT_FILE).read_text())
    assert final[TRAIN_SECONDS] > trained and final["finished"] and final["step"] == final["max_steps"]
    assert not warn_if_unfinished(output / EXPORT_DIR)


def test_ctrl_c_after_the_last_step_still_stops_the_command_once_the_run_is_saved(driver, data, tmp_path):
    """A Ctrl-C that lands after the last optimizer step (in the final validation, say) finds no step end to
    stop at: the fit runs to its end, the run is saved, and the command stops there with Ctrl-C's code
    instead of going on (a recipe's next stage, its evaluation)."""
    output = tmp_path / "last"
    pid = driver.start(output, _overrides("a_joint", data), pause={"step": STEPS, "hook": "on_train_end",
                                                                    "signal": "SIGINT"})
    ready = Path(str(driver.logs[pid]) + ".ready")
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline and running(pid):
        time.sleep(0.01)
    assert ready.exists(), driver.logs[pid].read_text()[-4000:]
    os.kill(pid, signal.SIGINT)
    rc = driver.wait(pid)
    log = driver.logs[pid].read_text()
    assert rc == INTERRUPTED_EXIT_CODE and "stopped by Ctrl-C after the last step: the run is saved" in log, log[-3000:]
    assert resume_checkpoint(output / "checkpoints").name == checkpoint_name(STEPS)
    assert json.loads((output / EXPORT_DIR / EXPORT_FILE).read_text())["finished"]


def test_ctrl_c_twice_in_training_stops_at_once_with_ctrl_cs_exit_code(driver, data, tmp_path):
    """The second Ctrl-C stops in the middle of the step without the save (Lightning's own interrupt path, which
    exits 1): the command still reports a Ctrl-C, with its message and the shell's code, and the run keeps
    only its periodic checkpoints, the last of which the next run resumes from."""
    output = tmp_path / "twice"
    pid = driver.start(output, _overrides("a_joint", data), pause={"step": STEPS - 1, "hook": "on_before_backward",
                                                                    "signal": "SIGINT", "times": 2})
    ready, log = Path(str(driver.logs[pid]) + ".ready"), driver.logs[pid]
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline and running(pid):
        time.sleep(0.01)
    assert ready.exists(), log.read_text()[-4000:]
    os.kill(pid, signal.SIGINT)
    while "Ctrl-C: saving a checkpoint" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)  # two signals close together would arrive as one
    os.kill(pid, signal.SIGINT)
    rc = driver.wait(pid)
    text = log.read_text()
    assert rc == INTERRUPTED_EXIT_CODE and INTERRUPTED_MESSAGE in text, text[-4000:]
    assert "Traceback" not in text and "stopped by Ctrl-C at step" not in text
    periodic = sorted(p.name for p in (output / "checkpoints").iterdir() if p.name.endswith(".ckpt"))
    assert periodic == [checkpoint_name(s) for s in range(EVERY, STEPS - 1, EVERY)]


def test_ctrl_c_twice_stops_at_once_and_an_ignored_signal_stays_ignored(tmp_path):
    """The first Ctrl-C asks for the save at the step's end; the second raises KeyboardInterrupt as
    Python's own handler would (the run resumes from its last save). A process started with SIGINT
    ignored (a script's background job) keeps ignoring it."""
    from animegamer.training.faults import Preemption

    preemption = Preemption(["SIGINT", "SIGTERM"], tmp_path, keep_last=1)
    preemption._note(signal.SIGINT, None)
    assert preemption._requested and preemption.received == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        preemption._note(signal.SIGINT, None)

    # after the fit the process's own handlers are back (the recipe evaluates in the same process); as
    # launched from a terminal, whatever the test runner's disposition (a background job ignores SIGINT)
    runner_own = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        fitting = Preemption(["SIGINT"], tmp_path, keep_last=1)
        fitting._install()
        assert signal.getsignal(signal.SIGINT) == fitting._note
        fitting.restore()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, runner_own)

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    term = signal.getsignal(signal.SIGTERM)
    try:
        Preemption(["SIGINT", "SIGTERM"], tmp_path, keep_last=1)._install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is not term  # the others are taken over
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, term)


# ------------------------------------------------------------------------------------------ checkpoints
def test_incomplete_checkpoints_are_never_resumed_from(tmp_path):
    assert resume_checkpoint(tmp_path / "missing") is None
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    assert resume_checkpoint(folder) is None
    (folder / checkpoint_name(2)).write_bytes(b"file checkpoint")
    deepspeed = folder / checkpoint_name(4)  # a DeepSpeed folder: complete once its `latest` tag exists
    (deepspeed / "checkpoint").mkdir(parents=True)
    (deepspeed / "latest").write_text("checkpoint")
    torn_folder = folder / checkpoint_name(6)  # killed before DeepSpeed wrote `latest`
    (torn_folder / "checkpoint").mkdir(parents=True)
    (torn_folder / "checkpoint" / "mp_rank_00_model_states.pt").write_bytes(b"half")
    torn_file = folder / (checkpoint_name(8) + PARTIAL)
    torn_file.write_bytes(b"half")
    (folder / "notes.txt").write_text("not a checkpoint")
    assert resume_checkpoint(folder) == deepspeed
    clean_partials(folder)
    assert not torn_file.exists() and (folder / checkpoint_name(2)).exists() and torn_folder.exists()
    assert resume_checkpoint(folder) == deepspeed


# ------------------------------------------------------------------------------------------ non-finite
def _nan_run(data, tmp_path, monkeypatch, nan_steps: set[int], *overrides: str):
    """In-process tiny phase (a) run whose loss is NaN in the steps that start at ``nan_steps``;
    records weights and AdamW state before and after every step."""
    import lightning as L

    from animegamer.phases.phase_a import PhaseA
    from animegamer.phases import run as runner
    from phase_a_helpers import tiny_train_cfg

    original = PhaseA.training_step

    def training_step(self, batch, batch_idx):
        loss = original(self, batch, batch_idx)
        return loss * float("nan") if self.global_step in nan_steps else loss

    monkeypatch.setattr(PhaseA, "training_step", training_step)

    class Record(L.Callback):
        def __init__(self):
            self.steps = []

        @staticmethod
        def state(trainer, module):
            weights = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
            adam = [{k: v.clone() for k, v in s.items()} for s in trainer.optimizers[0].state.values()]
            return weights, adam

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.before = (trainer.global_step, self.state(trainer, module))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            step, before = self.before
            self.steps.append((step, before, self.state(trainer, module), getattr(module, "skipped_steps", 0),
                               getattr(module, "nonfinite_in_row", 0)))

    record = Record()
    make_trainer = runner.make_trainer
    monkeypatch.setattr(runner, "make_trainer",
                        lambda cfg, callbacks, **kw: make_trainer(cfg, [*callbacks, record], **kw))
    composed, cfg = tiny_train_cfg(data["features"], tmp_path / "run", "phase=a_joint", "phase.max_steps=4",
                                   "logger=none", *overrides)
    return record, lambda: runner.train(cfg, composed)


def _same(a, b) -> bool:
    weights_a, adam_a = a
    weights_b, adam_b = b
    return (all(torch.equal(weights_a[n], weights_b[n]) for n in weights_a) and len(adam_a) == len(adam_b)
            and all(sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
                    for sa, sb in zip(adam_a, adam_b)))


def test_non_finite_step_is_skipped_weights_and_adamw_state_unchanged(data, tmp_path, monkeypatch):
    record, run = _nan_run(data, tmp_path, monkeypatch, {2}, "trainer.max_nonfinite_in_row=1")
    assert run()["step"] == 4
    by_step = {step: (before, after, skipped, in_row) for step, before, after, skipped, in_row in record.steps}
    assert sorted(by_step) == [0, 1, 2, 3]
    before, after, skipped, in_row = by_step[2]
    assert _same(before, after) and skipped == 1 and in_row == 1  # the NaN step changed nothing
    for step in (1, 3):  # the steps around it did train
        assert not _same(by_step[step][0], by_step[step][1])
    assert by_step[3][2:] == (1, 0)  # a finite step resets the in-a-row count, not the total


def test_too_many_non_finite_steps_in_a_row_stop_the_run(data, tmp_path, monkeypatch):
    _, run = _nan_run(data, tmp_path, monkeypatch, {1, 2, 3}, "trainer.max_nonfinite_in_row=2")
    with pytest.raises(FloatingPointError) as error:
        run()
    message = str(error.value)
    assert "non-finite gradients in 3 steps in a row at step 3" in message
    assert "trainer.max_nonfinite_in_row=2" in message


# ------------------------------------------------------------------------------------------ pipeline
def test_pipeline_killed_at_random_tasks_resumes_to_identical_shards(toy_film, toy_run, tmp_path):
    """tests/test_pipeline_restart.py kills after a fixed 3 tasks; here after a seeded random number."""
    from conftest import REPO, pipeline_overrides, run_pipeline

    from data_pipeline.staging import Staging

    rng = random.Random(7)  # the toy film has 10 tasks: killed after 6
    output = tmp_path / "run"
    overrides = pipeline_overrides(output, [toy_film.video_path], toy_film.captions_path,
                                   "pipeline.shots_per_task=1", "pipeline.workers=1")
    staging = Staging(output)
    done = lambda tasks: sum(staging.task_done(toy_film.film_id, t) for t in range(tasks))
    proc = subprocess.Popen([sys.executable, "-m", "data_pipeline", *overrides], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, target, tasks = time.monotonic() + 120, None, 0
    while time.monotonic() < deadline and proc.poll() is None:
        plan = staging.plan(toy_film.film_id)
        if plan and target is None:
            tasks = len(plan["tasks"])
            target = rng.randint(1, tasks - 1)
        if target is not None and done(tasks) >= target:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert target <= done(tasks) < tasks
    assert not (output / "clips" / "manifest.json").exists()

    report = run_pipeline(overrides)
    reference = toy_run[0]
    assert report["counts"] == toy_run[1]["counts"]
    for step in ("clips", "features"):
        produced = {p.name: p.read_bytes() for p in sorted((output / step).glob("shard-*.tar"))}
        assert produced and produced == {p.name: p.read_bytes() for p in sorted((reference / step).glob("shard-*.tar"))}
    assert not list(output.rglob(".tmp-*"))


def test_a_slurm_requeue_without_scontrol_keeps_the_preemption_exit(tmp_path, monkeypatch, caplog):
    """SIGUSR1 under SLURM asks ``scontrol requeue``; a job's container without scontrol still ends as a
    preempted run (the checkpoint saved, the exit code the scheduler expects), the failed requeue logged."""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from animegamer.training.checkpointing import checkpoint_name
    from animegamer.training.faults import Preemption

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no_bin"))  # no scontrol anywhere
    preemption = Preemption(["SIGUSR1"], tmp_path, keep_last=1)
    preemption.received = signal.SIGUSR1
    (tmp_path / checkpoint_name(7)).write_bytes(b"saved")  # the step's checkpoint is there: nothing to save
    preemption.on_exception(SimpleNamespace(global_step=7, is_global_zero=True), None, SIGTERMException())
    assert "requeue of SLURM job 4242: failed (No such file or directory: scontrol)" in caplog.text
    assert "submit the job again to resume" in caplog.text
