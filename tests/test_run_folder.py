"""Run folders (issue 16, point 9): a folder remembers the config that made it; a start into a folder
holding checkpoints compares the new config with it, resumes with changes that cannot alter the
training, refuses the others (every key listed) unless ``resume_with_changes=true``, which applies them
and records them; the jobs of a ``--multirun`` sweep get distinct folders. Also point 11's step
progress bar."""
from __future__ import annotations

import copy
import csv
import functools
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from phase_a_helpers import tiny_train_cfg, write_synthetic_features

from animegamer.config.compose import compose_config
from animegamer.training import run_record
from animegamer.training.run_record import RECORD_FILE, Change, RunFolderChanged, check_run_folder, diff, refused


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]) -> dict:
    return OmegaConf.to_container(compose_config("train", ["experiment=quickstart_a", *overrides]), resolve=True)


def _resolved(*overrides: str) -> dict:
    """The resolved quick-start phase (a) config with ``overrides`` (a fresh copy of a cached composition)."""
    return copy.deepcopy(_composed(overrides))


def _refused_keys(old: dict, new: dict) -> list[str]:
    return [change.key for change, _ in refused(diff(old, new), old, new)]


# ------------------------------------------------------------------------------------------ the diff
def test_diff_lists_every_changed_key_and_refuses_only_what_alters_the_training():
    old, new = _resolved(), _resolved("phase.lr=5e-4", "phase.max_steps=80", "logger=none",
                                      "trainer.log_every_n_steps=1", "checkpoint.every_n_steps=10",
                                      "phase.val_every_n_steps=7")
    changes = {c.key: (c.old, c.new) for c in diff(old, new)}
    assert changes["phase.lr"] == (1e-3, 5e-4) and changes["phase.max_steps"] == (60, 80)
    assert changes["logger.kind"] == ("csv", "none") and changes["checkpoint.every_n_steps"] == (30, 10)
    assert changes["trainer.log_every_n_steps"] == (5, 1) and changes["phase.val_every_n_steps"] == (30, 7)
    assert len(changes) == 6
    assert _refused_keys(old, new) == ["phase.lr"]  # a longer constant-LR run and logging are fine
    assert diff(old, _resolved()) == []


@pytest.mark.parametrize(("old", "new", "refused_keys"), [
    # The cosine schedule decays over phase.max_steps: a new length changes every later LR.
    (["phase.lr_schedule=cosine"], ["phase.lr_schedule=cosine", "phase.max_steps=80"], ["phase.max_steps"]),
    # The global batch (2 x 1 x 1 x 1) re-split as 1 x 1 x 1 x 2, or as 1 per device on 2 devices: the same run.
    ([], ["phase.batch_size=1", "trainer.accumulate_grad_batches=2"], []),
    ([], ["phase.batch_size=1", "trainer.devices=2", "trainer.strategy=ddp"], []),
    ([], ["phase.batch_size=1"], ["phase.batch_size"]),  # half the global batch
    (["trainer.devices=-1"], ["trainer.devices=2"], ["trainer.devices"]),  # -1: unknown before the run
    ([], ["trainer.strategy=fsdp"], ["trainer.strategy"]),
    ([], ["model.decoder.gradient_checkpointing=true", "data.num_workers=2", "pipeline.workers=4"], []),
    ([], ["seed=1", "data.val_fraction=0.3", "phase.init_from=/elsewhere/export"],
     ["data.val_fraction", "phase.init_from", "seed"]),
])
def test_which_changes_a_resume_accepts(old, new, refused_keys):
    assert _refused_keys(_resolved(*old), _resolved(*new)) == refused_keys


def test_refusal_names_every_key_with_both_values_and_the_ways_on(tmp_path):
    old, new = _resolved(), _resolved("phase.lr=5e-4", "seed=3", "phase.max_steps=80")
    check_run_folder(tmp_path, old, None, allow_changes=False, writer=True)
    recorded = (tmp_path / RECORD_FILE).read_bytes()
    with pytest.raises(RunFolderChanged) as error:
        check_run_folder(tmp_path, new, 60, allow_changes=False, writer=True)
    message = str(error.value)
    assert "phase.lr: 0.001 (recorded) -> 0.0005 (now)" in message and "seed: 0 (recorded) -> 3 (now)" in message
    assert "2 setting(s) differ" in message and "phase.max_steps" not in message
    assert "output_dir=" in message and "resume_with_changes=true" in message
    assert (tmp_path / RECORD_FILE).read_bytes() == recorded  # a refusal writes nothing

    assert check_run_folder(tmp_path, new, 60, allow_changes=True, writer=True) == [
        Change("phase.lr", 1e-3, 5e-4), Change("phase.max_steps", 60, 80), Change("seed", 0, 3)]
    record = json.loads((tmp_path / RECORD_FILE).read_text())
    assert record["config"]["phase"]["lr"] == 5e-4
    assert record["changes"][0]["step"] == 60 and record["changes"][0]["forced"] == ["phase.lr", "seed"]
    assert record["changes"][0]["changes"]["phase.max_steps"] == [60, 80]
    assert check_run_folder(tmp_path, new, 80, allow_changes=False, writer=True) == []  # the record moved on


def test_only_global_rank_zero_writes_and_every_rank_decides_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")  # a child Lightning started
    assert not run_record.is_global_zero()
    check_run_folder(tmp_path, _resolved(), None, allow_changes=False)
    assert not (tmp_path / RECORD_FILE).exists()
    monkeypatch.delenv("LOCAL_RANK")
    check_run_folder(tmp_path, _resolved(), None, allow_changes=False)  # rank 0 of a fresh run
    assert (tmp_path / RECORD_FILE).exists()
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(RunFolderChanged):  # rank 1 reads the same record and refuses the same way
        check_run_folder(tmp_path, _resolved("phase.lr=5e-4"), 30, allow_changes=False)


def test_folder_without_record_is_checked_against_its_exports_config(tmp_path):
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "export.json").write_text(json.dumps({"config": _resolved(), "step": 30}))
    with pytest.raises(RunFolderChanged, match="phase.lr"):
        check_run_folder(tmp_path, _resolved("phase.lr=5e-4"), 30, allow_changes=False, writer=True)
    (tmp_path / RECORD_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=f"{RECORD_FILE}: not a run record"):
        check_run_folder(tmp_path, _resolved(), 30, allow_changes=False, writer=True)


# ------------------------------------------------------------------------------------------ train.py's path
@pytest.fixture(scope="module")
def features(tmp_path_factory) -> Path:
    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    return write_synthetic_features(tmp_path_factory.mktemp("run_folder") / "features", enc, clips=14)


def _lrs(output: Path) -> dict[int, float]:
    """step -> logged LR over every attempt's CSV (a resumed run keeps the earlier rows aside)."""
    lrs = {}
    for path in (output / "logs").glob("metrics*.csv"):
        with open(path) as f:
            lrs.update({int(r["step"]): float(r["lr-AdamW/pg1"]) for r in csv.DictReader(f) if r.get("lr-AdamW/pg1")})
    return lrs


def test_changed_lr_is_refused_before_anything_is_built_then_applied_when_allowed(features, tmp_path, monkeypatch,
                                                                                  capfd, recwarn):
    from animegamer.training import runner

    output = tmp_path / "run"
    run = lambda *o: runner.run(tiny_train_cfg(features, output, "phase=a_joint", "phase.max_steps=4", *o)[0])
    assert run()["step"] == 4
    first, printed = capfd.readouterr()
    assert "steps: 100%" in first and "4/4" in first and "Epoch" not in first  # point 11: steps, not epochs
    assert "Tip:" not in first + printed  # Lightning's advertisement, at every start
    assert json.loads((output / RECORD_FILE).read_text())["config"]["phase"]["lr"] == 1e-3

    built = []
    monkeypatch.setattr(runner, "build_phase", lambda *a, **k: built.append(1))
    with pytest.raises(RunFolderChanged, match=r"phase\.lr: 0\.001 \(recorded\) -> 0\.0005 \(now\)"):
        run("phase.lr=5e-4", "phase.max_steps=6")
    assert not built  # refused in the pre-flight, before any model or trainer work
    monkeypatch.undo()

    assert run("phase.lr=5e-4", "phase.max_steps=6", "resume_with_changes=true")["step"] == 6
    resumed, _ = capfd.readouterr()
    assert "4/6" in resumed and "6/6" in resumed  # the bar starts at the resumed step
    # A resume writes into folders that hold the earlier attempt by design: no warnings that it does.
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]
    lrs = _lrs(output)
    assert lrs[3] == pytest.approx(1e-3) and lrs[4] == pytest.approx(5e-4) and lrs[5] == pytest.approx(5e-4)
    change = json.loads((output / RECORD_FILE).read_text())["changes"][-1]
    assert change["step"] == 4 and change["forced"] == ["phase.lr"]
    assert change["changes"] == {"phase.lr": [1e-3, 5e-4], "phase.max_steps": [4, 6]}


# ------------------------------------------------------------------------------------------ sweeps
def _job_output_dir(job_num: int, *overrides: str) -> tuple[Path, Path]:
    """(output_dir of the composed config, that of the --multirun job train.py resolves from it)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from animegamer.config.compose import config_dir
    from animegamer.config.schema import register_configs
    from animegamer.training.sweep import job_output_dir

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("train", list(overrides), return_hydra_config=True)
    with open_dict(cfg.hydra):
        cfg.hydra.mode, cfg.hydra.job.num = RunMode.MULTIRUN, job_num
    HydraConfig.instance().set_config(cfg)
    try:
        return Path(cfg.output_dir), Path(job_output_dir(cfg.output_dir))
    finally:
        HydraConfig.instance().cfg = None


def test_sweep_jobs_train_into_distinct_folders():
    # Experiments fix output_dir, so without a per-job part both jobs would share the experiment's folder.
    base, tiny = _job_output_dir(0, "experiment=ablation_a_addition", "model=tiny")
    same_base, paper = _job_output_dir(1, "experiment=ablation_a_addition", "model=paper")
    assert base == same_base
    assert tiny == base / "experiment=ablation_a_addition,model=tiny"
    assert paper == base / "experiment=ablation_a_addition,model=paper"
    # output_dir itself is not part of the name; a '/' in a value does not make sub-folders
    assert _job_output_dir(0, "output_dir=/tmp/sweep", "data.root=/data/x")[1] == Path("/tmp/sweep/data.root=_data_x")
    base, long = _job_output_dir(3, f"model.mllm.lora_targets=[{'a' * 200}]")
    assert len(long.name.encode()) <= 150 and long.parent == base
    from animegamer.training.sweep import job_output_dir

    assert job_output_dir("outputs/x") == "outputs/x"  # a single run keeps its folder
