"""Every command refuses a wrong key, group option or value of its command line the same way: one message that
names it and the closest known one, exit code 2, no traceback, and nothing written (no output folder, no
Hydra run folder). A key added with ``+`` is refused too unless the typed schema has it. The commands run
as subprocesses, all at once: a refusal comes before any model is built, so each takes seconds."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

from animegamer.errors import USER_ERROR_EXIT_CODE, exit_on_user_error

TRAIN, EVALUATE = [sys.executable, str(REPO / "train.py")], [sys.executable, str(REPO / "evaluate.py")]
PIPELINE = [sys.executable, "-m", "data_pipeline"]
QUICKSTART = [sys.executable, "-m", "animegamer.quickstart"]
FINETUNE = [sys.executable, "-m", "animegamer.finetune", "--film", "film.mp4", "--captions", "film.jsonl",
            "--from", "no_run", "--out", "finetuned"]
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}  # torch sees no CUDA device, whatever the machine has

# name -> (command line, extra environment, what stderr says). Each runs in an empty folder of its own, where
# every output folder of the config (relative by default) would land.
REFUSED = {
    "train, a key added with +": (
        [*TRAIN, "experiment=quickstart_a", "+phase.max_step=10"], {},
        ["+phase.max_step=10: phase (PhaseAConfig) has no key 'max_step'; did you mean phase.max_steps?"]),
    "train, an unknown key": (
        [*TRAIN, "experiment=quickstart_a", "phase.max_step=10"], {},
        ["phase.max_step=10: phase (PhaseAConfig) has no key 'max_step'; did you mean phase.max_steps?"]),
    "train, a value of the wrong type": (
        [*TRAIN, "experiment=quickstart_a", "phase.lr=fast"], {},
        ["phase.lr=fast: Value 'fast' of type 'str' could not be converted to Float (phase.lr: float)"]),
    "train, an unknown option of a group": (
        [*TRAIN, "experiment=quickstart_a", "trainer=gpuu"], {},
        ["trainer=gpuu: the group trainer has no option 'gpuu'; did you mean trainer=gpu? options: cpu, ddp, "
         "deepspeed_zero2, deepspeed_zero2_offload, deepspeed_zero3, fsdp, gpu\n"]),
    "train, one job of a sweep": (
        [*TRAIN, "--multirun", "experiment=quickstart_a", "phase.lr=1e-3,fast"], {},
        ["phase.lr=fast: Value 'fast' of type 'str' could not be converted to Float"]),
    "train, a GPU preset without a GPU": (
        [*TRAIN, "experiment=quickstart_a", "trainer=ddp", "trainer.devices=1", "trainer.num_nodes=2"], NO_GPU,
        ["trainer.accelerator='gpu' needs a CUDA GPU, and torch sees none on this machine",
         "in several CPU processes with trainer=cpu trainer.strategy=ddp trainer.devices=1 trainer.num_nodes=2"]),
    "train, a one-GPU preset without a GPU": (
        [*TRAIN, "experiment=quickstart_a", "trainer=gpu", "trainer.devices=1"], NO_GPU,
        ["trainer.accelerator='gpu' needs a CUDA GPU, and torch sees none on this machine: train on the CPU with "
         "trainer=cpu\n"]),
    "pipeline, an unknown key": (
        [*PIPELINE, "pipeline.clips.widht=144"], {},
        ["pipeline.clips.widht=144: pipeline.clips (ClipsConfig) has no key 'widht'; did you mean "
         "pipeline.clips.width?"]),
    "pipeline, a key added with +": (
        [*PIPELINE, "+pipeline.clip.stride_seconds=0.5"], {},
        ["+pipeline.clip.stride_seconds=0.5: pipeline (PipelineConfig) has no key 'clip'; did you mean "
         "pipeline.clips?"]),
    "train, a seed numpy cannot take": (
        [*TRAIN, "experiment=quickstart_a", "seed=-1"], {}, ["seed=-1 must be in [0, 4294967295]"]),
    "pipeline, a CUDA step without a GPU": (
        [*PIPELINE, "pipeline.precompute.device=cuda"], NO_GPU,
        ["pipeline.precompute.device='cuda' needs a CUDA GPU, and torch sees none on this machine: run on the CPU "
         "with pipeline.precompute.device=cpu"]),
    "quickstart, a later CUDA step without a GPU": (
        [*QUICKSTART, "pipeline.adaptation.device=cuda"], NO_GPU,
        ["pipeline.adaptation.device='cuda' needs a CUDA GPU, and torch sees none on this machine"]),
    "evaluate, an unknown key": (
        [*EVALUATE, "experiment=quickstart_eval", "evaluation.gams=3"], {},
        ["evaluation.gams=3: evaluation (EvalConfig) has no key 'gams'; did you mean evaluation.games?"]),
    "finetune, a key added with +": (
        [*FINETUNE, "+pipeline.clip.stride_seconds=0.5"], {},
        ["+pipeline.clip.stride_seconds=0.5: pipeline (PipelineConfig) has no key 'clip'; did you mean "
         "pipeline.clips?"]),
    "finetune, an unknown key": (
        [*FINETUNE, "pipeline.clip.stride_seconds=0.5"], {},
        ["pipeline.clip.stride_seconds=0.5: pipeline (PipelineConfig) has no key 'clip'; did you mean "
         "pipeline.clips?"]),
    "quickstart, a key added with +": (
        [*QUICKSTART, "+phase.max_step=10"], {},
        ["+phase.max_step=10: phase (PhaseAConfig) has no key 'max_step'; did you mean phase.max_steps?"]),
}
# Hydra's own options still work beside the check: the resolved config, with an override applied.
SHOWN = [*TRAIN, "experiment=quickstart_a", "phase.max_steps=7", "--cfg", "job"]
# The commands that name their body (animegamer.config.compose.command_body): importing one loads no torch, so a
# refused override costs the composition alone.
LIGHT_COMMANDS = ("animegamer.cli", "animegamer.cli.train", "animegamer.cli.evaluate", "animegamer.cli.inspect",
                  "animegamer.cli.rank")
HEAVY = ("torch", "lightning")


def _start(argv: list[str], env: dict, folder: Path) -> subprocess.Popen:
    folder.mkdir()
    base = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "LOCAL_RANK")}
    return subprocess.Popen(argv, cwd=folder, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[str, tuple[int, str, str, list[Path]]]:
    """name -> (exit code, stdout, stderr, what is in its folder afterwards) of every command line above, all
    started at once (start-up, the imports, dominates)."""
    root = tmp_path_factory.mktemp("commands")
    cases = {name: (argv, env) for name, (argv, env, _) in REFUSED.items()} | {"shown": (SHOWN, {})}
    folders = {name: root / f"case{i}" for i, name in enumerate(cases)}
    running = {name: _start(argv, env, folders[name]) for name, (argv, env) in cases.items()}
    done = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=600)
        done[name] = (process.returncode, out, err, sorted(folders[name].rglob("*")))
    return done


@pytest.mark.parametrize("name", REFUSED)
def test_a_wrong_key_option_or_value_is_one_message_and_exit_code_2_writing_nothing(finished, name):
    code, out, err, left = finished[name]
    assert code == USER_ERROR_EXIT_CODE, (code, err[-3000:])
    assert "Traceback" not in out + err and "HYDRA_FULL_ERROR" not in err, err[-3000:]
    assert sum(line.startswith("error: ") for line in err.splitlines()) == 1, err[-3000:]  # one message
    for expected in REFUSED[name][2]:
        assert expected in err, (expected, err[-3000:])
    assert left == []  # no output folder, no Hydra run folder


def test_hydras_own_options_still_work_beside_the_check(finished):
    code, out, err, left = finished["shown"]
    assert code == 0, err[-3000:]
    assert "  max_steps: 7\n" in out and left == []


def test_a_commands_module_loads_its_body_only_when_it_runs():
    probe = (f"import sys\nfor name in {LIGHT_COMMANDS!r}:\n    __import__(name)\n"
             f"print(','.join(p for p in {HEAVY!r} if p in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert loaded.stdout.strip() == ""


# Command lines refused by their run's checks (a missing folder, a bad value), past the override check: the
# pre-flight loads torch and the configs but not Lightning, the trainer's import, which only a run that
# trains pays.
PREFLIGHT_REFUSED = {
    "train": ["train", "data.root=no_shards"],
    "eval": ["eval", "data.root=no_shards"],
    "quickstart": ["quickstart", "phase.max_steps=-1"],
    "finetune": ["finetune", "--film", "film.mp4", "--captions", "film.jsonl", "--from", "no_run", "--out", "out"],
}


@pytest.mark.parametrize("name", PREFLIGHT_REFUSED)
def test_a_run_refused_by_its_checks_never_loads_lightning(tmp_path, name):
    probe = ("import sys\nfrom animegamer.cli import main\n"
             f"try:\n    code = main({PREFLIGHT_REFUSED[name]!r})\nexcept SystemExit as stop:\n    code = stop.code\n"
             "print('exit', code, 'lightning' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                          env={**env, **NO_GPU, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])})
    assert done.stdout.strip().splitlines()[-1] == f"exit {USER_ERROR_EXIT_CODE} False", (done.stdout, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("local_rank, says", [(None, True), ("0", True), ("1", False)])
def test_a_user_error_is_said_once_per_node(monkeypatch, capsys, local_rank, says):
    """Under torchrun every process of a node refuses the same config: its first one (LOCAL_RANK 0) says why,
    the others only exit with the code."""
    from animegamer.errors import UserError

    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)

    def refuse() -> None:
        raise UserError("phase.max_step=10: no such key")

    with pytest.raises(SystemExit) as stopped:
        exit_on_user_error(refuse)()
    assert stopped.value.code == USER_ERROR_EXIT_CODE
    assert capsys.readouterr().err == ("error: phase.max_step=10: no such key\n" if says else "")
