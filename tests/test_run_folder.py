"""Run folders (issue 16, point 9): a folder remembers the config and the data that made it; a start
into a folder holding checkpoints compares the new config and data with it, resumes with changes that
cannot alter the training, refuses the others (every key listed) unless ``resume_with_changes=true``,
which applies them and records them, on every rank alike; the jobs of a ``--multirun`` sweep get
distinct folders. Also point 11's step progress bar."""
from __future__ import annotations

import copy
import csv
import functools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf, open_dict

from phase_a_helpers import tiny_train_cfg, write_synthetic_features

from animegamer.config.compose import compose_config
from animegamer.contracts.files import RECORD_FILE
from animegamer.errors import InvalidInputError
from animegamer.training import run_record
from animegamer.training.run_record import Change, RunFolderChanged, check_run_folder, diff, refused, write_record

SAMPLES = "features"  # data.<key> of the quick start's phase (a) samples (its spec's sample_key)


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
    # The global batch (2 x 1) re-split as 1 x 2 accumulated micro-batches on the same process: the same run.
    ([], ["phase.batch_size=1", "trainer.accumulate_grad_batches=2"], []),
    # The same global batch on 2 processes: each rank's share of an epoch (n // 2) and its epoch
    # boundaries differ from one process's, so the sample order does.
    ([], ["phase.batch_size=1", "trainer.devices=2", "trainer.strategy=ddp"], ["phase.batch_size", "trainer.devices"]),
    (["trainer.devices=2", "trainer.strategy=ddp"], ["trainer.num_nodes=2", "trainer.strategy=ddp"], []),  # 2 x 1 = 1 x 2
    ([], ["phase.batch_size=1"], ["phase.batch_size"]),  # half the global batch
    (["trainer.devices=-1"], ["trainer.devices=2"], ["trainer.devices"]),  # -1: unknown before the run
    ([], ["trainer.strategy=fsdp"], ["trainer.strategy"]),
    ([], ["model.decoder.gradient_checkpointing=true", "data.num_workers=2", "pipeline.workers=4"], []),
    # The pipeline's settings: training reads the shards they made (digested), not them.
    ([], ["pipeline.clips.height=96", "pipeline.clips.fps=4", "pipeline.workers=2"], []),
    # Sampling settings: only the game, the evaluation and validation's samples read them.
    ([], ["model.diffusion.sampling_steps=3", "model.diffusion.guidance_scale=1.0",
          "model.diffusion.guidance_exponent=1.0", "model.diffusion.cache=first_block",
          "model.diffusion.cache_threshold=0.1"], []),
    # The noise schedule is what the loss trains against.
    ([], ["model.diffusion.num_train_timesteps=500", "model.diffusion.snr_shift_scale=1.0"],
     ["model.diffusion.num_train_timesteps", "model.diffusion.snr_shift_scale"]),
    ([], ["seed=1", "data.val_fraction=0.3", "phase.init_from=/elsewhere/export"],
     ["data.val_fraction", "phase.init_from", "seed"]),
])
def test_which_changes_a_resume_accepts(old, new, refused_keys):
    assert _refused_keys(_resolved(*old), _resolved(*new)) == refused_keys


def test_a_changed_number_of_processes_is_refused_with_the_reason():
    old, new = _resolved(), _resolved("phase.batch_size=1", "trainer.devices=2", "trainer.strategy=ddp")
    reasons = {change.key: reason for change, reason in refused(diff(old, new), old, new)}
    assert reasons["trainer.devices"].startswith(
        "the number of processes (trainer.devices x trainer.num_nodes) would go from 1 to 2: each rank's sample order")
    assert reasons["phase.batch_size"] == ("the samples per optimizer step and process (phase.batch_size x "
                                           "trainer.accumulate_grad_batches) would go from 2 to 1")


def test_refusal_names_every_key_with_both_values_and_the_ways_on(tmp_path):
    old, new = _resolved(), _resolved("phase.lr=5e-4", "seed=3", "phase.max_steps=80")
    check_run_folder(tmp_path, old, None, allow_changes=False, samples=SAMPLES, writer=True)
    recorded = (tmp_path / RECORD_FILE).read_bytes()
    with pytest.raises(RunFolderChanged) as error:
        check_run_folder(tmp_path, new, 60, allow_changes=False, samples=SAMPLES, writer=True)
    message = str(error.value)
    assert "phase.lr: 0.001 (recorded) -> 0.0005 (now)" in message and "seed: 0 (recorded) -> 3 (now)" in message
    assert "2 setting(s) differ" in message and "phase.max_steps" not in message
    assert "output_dir=" in message and "resume_with_changes=true" in message
    assert (tmp_path / RECORD_FILE).read_bytes() == recorded  # a refusal writes nothing

    decision = check_run_folder(tmp_path, new, 60, allow_changes=True, samples=SAMPLES, writer=True)
    assert decision.changes == [Change("phase.lr", 1e-3, 5e-4), Change("phase.max_steps", 60, 80), Change("seed", 0, 3)]
    assert (tmp_path / RECORD_FILE).read_bytes() == recorded  # written once the resumed run saves a checkpoint
    record = decision.pending
    assert record["config"]["phase"]["lr"] == 5e-4
    assert record["changes"][0]["step"] == 60 and record["changes"][0]["forced"] == ["phase.lr", "seed"]
    assert record["changes"][0]["changes"]["phase.max_steps"] == [60, 80]
    write_record(tmp_path, record)
    moved_on = check_run_folder(tmp_path, new, 80, allow_changes=False, samples=SAMPLES, writer=True)
    assert moved_on.changes == []  # the record moved on


def test_a_change_to_a_finished_run_says_it_would_train_nothing(tmp_path, caplog):
    old = _resolved("phase.max_steps=60")
    new = _resolved("phase.max_steps=60", "phase.lr=5e-4")
    check_run_folder(tmp_path, old, None, allow_changes=False, samples=SAMPLES, writer=True)
    with pytest.raises(RunFolderChanged) as error:
        check_run_folder(tmp_path, new, 60, allow_changes=False, samples=SAMPLES, writer=True)
    assert str(error.value).endswith(
        "\nThe run finished at step 60 (phase.max_steps=60): resuming it trains nothing, so the change takes effect "
        "only in a new folder (output_dir=...), or with phase.max_steps above its last step (resume_with_changes=true).")
    with caplog.at_level("WARNING"):
        check_run_folder(tmp_path, new, 60, allow_changes=True, samples=SAMPLES, writer=True)
    assert "the run finished at step 60 (phase.max_steps=60), so nothing is trained" in caplog.text
    # with steps left to train, the change is taken on
    longer = _resolved("phase.max_steps=80", "phase.lr=5e-4")
    with pytest.raises(RunFolderChanged) as error:
        check_run_folder(tmp_path, longer, 60, allow_changes=False, samples=SAMPLES, writer=True)
    assert "The run finished" not in str(error.value) and "Either train into a new folder" in str(error.value)


def test_only_global_rank_zero_writes_and_every_rank_decides_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")  # a child Lightning started
    assert not run_record.is_global_zero()
    check_run_folder(tmp_path, _resolved(), None, allow_changes=False, samples=SAMPLES)
    assert not (tmp_path / RECORD_FILE).exists()
    monkeypatch.delenv("LOCAL_RANK")
    check_run_folder(tmp_path, _resolved(), None, allow_changes=False, samples=SAMPLES)  # rank 0 of a fresh run
    assert (tmp_path / RECORD_FILE).exists()
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(RunFolderChanged):  # rank 1 reads the same record and refuses the same way
        check_run_folder(tmp_path, _resolved("phase.lr=5e-4"), 30, allow_changes=False, samples=SAMPLES)


def test_folder_without_record_is_checked_against_its_exports_config(tmp_path):
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "export.json").write_text(json.dumps({"config": _resolved(), "step": 30}))
    with pytest.raises(RunFolderChanged, match="phase.lr"):
        check_run_folder(tmp_path, _resolved("phase.lr=5e-4"), 30, allow_changes=False, samples=SAMPLES, writer=True)
    (tmp_path / RECORD_FILE).write_text("{not json")
    with pytest.raises(InvalidInputError, match=f"{RECORD_FILE}: not a run record"):
        check_run_folder(tmp_path, _resolved(), 30, allow_changes=False, samples=SAMPLES, writer=True)


def test_data_changed_under_the_run_folder_is_refused_naming_its_manifest(tmp_path, caplog):
    data, out = tmp_path / "data", tmp_path / "run"
    out.mkdir()
    config = _resolved(f"data.root={data}", "data.features=feats")  # folder names come from the config
    manifest = data / "feats" / "manifest.json"
    shards = [{"name": "shard-000000.tar", "count": 3, "sha256": "a" * 64}]
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"kind": "features", "shards": shards, "command": "first"}))
    check_run_folder(out, config, None, allow_changes=False, samples=SAMPLES, writer=True)
    # Re-run with the same shards (another command line): the same data.
    manifest.write_text(json.dumps({"kind": "features", "shards": shards, "command": "again"}))
    assert check_run_folder(out, config, 30, allow_changes=False, samples=SAMPLES, writer=True).changes == []

    manifest.write_text(json.dumps({"kind": "features", "shards": [{**shards[0], "sha256": "b" * 64}]}))
    with pytest.raises(RunFolderChanged) as error:
        check_run_folder(out, config, 30, allow_changes=False, samples=SAMPLES, writer=True)
    assert f"{manifest}: " in str(error.value) and "its shards changed since the checkpoints" in str(error.value)
    assert "1 setting(s) differ" in str(error.value)
    decision = check_run_folder(out, config, 30, allow_changes=True, samples=SAMPLES, writer=True)
    assert [c.key for c in decision.changes] == [str(manifest)]
    assert decision.pending["changes"][-1]["forced"] == [str(manifest)]
    write_record(out, decision.pending)
    assert check_run_folder(out, config, 40, allow_changes=False, samples=SAMPLES, writer=True).changes == []

    # A record made before data digests: the current data is recorded, with a warning.
    record = json.loads((out / RECORD_FILE).read_text())
    del record["data"]
    write_record(out, record)
    with caplog.at_level("WARNING"):
        decision = check_run_folder(out, config, 40, allow_changes=False, samples=SAMPLES, writer=True)
    assert decision.changes == [] and "records no digest of the data" in caplog.text
    assert decision.pending["data"] == run_record.data_digests(config, SAMPLES)
    assert decision.pending["data"]["data.features"]


def test_inputs_moved_with_what_they_hold_are_accepted_and_changed_contents_refused(tmp_path, caplog):
    """A run folder copied with its data and its start (a recipe's --out): every path differs, what the
    paths hold does not, so the resume goes on; a start of other content, or other shards, is refused."""
    def inputs(where: Path, export_text: str, sha: str) -> list[str]:
        (where / "export").mkdir(parents=True)
        (where / "export" / "export.json").write_text(export_text)
        for folder in ("feats", "clips"):
            (where / "data" / folder).mkdir(parents=True)
            (where / "data" / folder / "manifest.json").write_text(json.dumps(
                {"kind": folder, "shards": [{"name": "shard-000000.tar", "count": 3, "sha256": sha}]}))
        return [f"data.root={where / 'data'}", "data.features=feats", f"phase.init_from={where / 'export'}",
                f"pipeline.output={where / 'data'}"]

    out = tmp_path / "run"
    out.mkdir()
    check_run_folder(out, _resolved(*inputs(tmp_path / "first", '{"step": 20}', "a" * 64)), None,
                     allow_changes=False, samples=SAMPLES, writer=True)
    moved = _resolved(*inputs(tmp_path / "copy", '{"step": 20}', "a" * 64))
    with caplog.at_level("INFO"):
        decision = check_run_folder(out, moved, 30, allow_changes=False, samples=SAMPLES, writer=True)
    assert sorted(c.key for c in decision.changes) == ["data.root", "phase.init_from", "pipeline.output"]
    assert decision.pending["changes"][-1]["forced"] == [] and "resuming with phase.init_from" in caplog.text

    other_start = _resolved(*inputs(tmp_path / "other", '{"step": 40}', "a" * 64))
    with pytest.raises(RunFolderChanged) as error:
        check_run_folder(out, other_start, 30, allow_changes=False, samples=SAMPLES, writer=True)
    assert [c.key for c, _ in error.value.refusals] == ["phase.init_from"]
    other_data = _resolved(*inputs(tmp_path / "shards", '{"step": 20}', "b" * 64))
    with pytest.raises(RunFolderChanged) as error:
        check_run_folder(out, other_data, 30, allow_changes=False, samples=SAMPLES, writer=True)
    refused_keys = [c.key for c, _ in error.value.refusals]
    assert refused_keys[0] == "data.root" and len(refused_keys) == 3  # and both manifests, named by path

    # A record made before input digests: the recorded start's export, where it still is, is compared.
    record = json.loads((out / RECORD_FILE).read_text())
    del record["inputs"]
    write_record(out, record)
    assert check_run_folder(out, moved, 30, allow_changes=False, samples=SAMPLES, writer=True).pending
    (tmp_path / "first" / "export" / "export.json").unlink()
    with pytest.raises(RunFolderChanged, match="phase.init_from"):
        check_run_folder(out, moved, 30, allow_changes=False, samples=SAMPLES, writer=True)


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


def test_every_rank_applies_the_new_optimizer_settings_whatever_order_they_start_in(features, tmp_path, monkeypatch):
    """Lightning starts ranks 1..N-1 inside ``fit``, after rank 0 has passed the run-folder check: rank 1
    must still find the change and take the resumed config's LR (before: rank 0 had rewritten the
    record, rank 1 found no change and kept the checkpoint's LR)."""
    import torch

    from animegamer.phases import run as runner
    from animegamer.training.callbacks import RecordOnSave, ResumeSettings

    output = tmp_path / "run"
    cfg = lambda *o: tiny_train_cfg(features, output, "phase=a_joint", "phase.max_steps=4", *o)
    assert runner.run(cfg()[0])["step"] == 4
    recorded = (output / RECORD_FILE).read_bytes()
    resume = runner.resume_checkpoint(output / "checkpoints")
    composed, typed = cfg("phase.lr=5e-4", "phase.max_steps=6", "resume_with_changes=true")
    resolved = OmegaConf.to_container(composed, resolve=True)

    def lrs_on_rank(rank: str) -> list[float]:
        """The LR a rank's optimizer has after its resume callbacks ran on the checkpoint's state."""
        monkeypatch.setenv("RANK", rank)
        callbacks = runner.run_folder_callbacks(typed, resolved, resume)
        module, *_ = runner.build_phase(typed)
        optimizers = module.configure_optimizers()
        optimizer, scheduler = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
        state = torch.load(resume, weights_only=True)
        optimizer.load_state_dict(state["optimizer_states"][0])
        scheduler.load_state_dict(state["lr_schedulers"][0])
        trainer = SimpleNamespace(optimizers=[optimizer], lr_scheduler_configs=[SimpleNamespace(scheduler=scheduler)],
                                  global_step=4, is_global_zero=rank == "0")
        for callback in callbacks:
            if isinstance(callback, ResumeSettings):
                callback.on_train_start(trainer, module)
            if isinstance(callback, RecordOnSave):  # rank 0 moves the record on before rank 1 starts
                callback.on_save_checkpoint(trainer, module, {})
        return [group["lr"] for group in optimizer.param_groups]

    rank0 = lrs_on_rank("0")
    assert json.loads((output / RECORD_FILE).read_bytes())["config"]["phase"]["lr"] == 5e-4 != \
        json.loads(recorded)["config"]["phase"]["lr"]
    assert lrs_on_rank("1") == rank0 == [pytest.approx(5e-4)] * len(rank0)


def test_changed_lr_is_refused_before_anything_is_built_then_applied_when_allowed(features, tmp_path, monkeypatch,
                                                                                  capfd, recwarn):
    from animegamer.phases import run as runner

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

    from animegamer.config.compose import config_dir, search_path_override
    from animegamer.config.schema import register_configs
    from animegamer.training.sweep import job_output_dir

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("train", [*overrides, search_path_override("train")], return_hydra_config=True)
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


def test_a_max_steps_below_the_checkpoints_step_says_nothing_is_trained(tmp_path, caplog):
    """A resume goes on from its checkpoint: a shorter phase.max_steps cannot take the run back, and says so."""
    check_run_folder(tmp_path, _resolved("phase.max_steps=60"), None, allow_changes=False, samples=SAMPLES,
                     writer=True)
    with caplog.at_level("WARNING"):
        decision = check_run_folder(tmp_path, _resolved("phase.max_steps=30"), 60, allow_changes=False,
                                    samples=SAMPLES, writer=True)
    assert decision.changes == [Change("phase.max_steps", 60, 30)]
    assert "phase.max_steps=30 is below the step its checkpoint reached (60): nothing is trained and its export " \
           "stays at step 60; a shorter run needs a new folder" in caplog.text
