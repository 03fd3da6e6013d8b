"""DeepSpeed under the framework's rules (issue 17, point 6), with a real engine on CPU.

Tiny phase a_joint runs go through ``runner.train`` under ZeRO-1/2 in bf16 and float32: the engine
clips to ``phase.grad_clip`` (read from the engine; a huge finite gradient reaches AdamW's moments with
exactly that norm, and the weights move by the AdamW step those moments give), a NaN step leaves the
master weights, the module's weights and AdamW's moments as they were, and more than
``trainer.max_nonfinite_in_row`` in a row stop the run. DeepSpeed checkpoint folders (``latest`` plus
shards) get an integrity record; a truncated shard, or a save cut short after ``latest``, is set aside
and the run resumes from the older folder to the uninterrupted run's weights; a disk that fills during
a folder save stops with a message naming the folder.

Lightning runs DeepSpeed on CUDA only; :func:`cpu_deepspeed` lifts exactly that (its CUDA check, and
the device index DeepSpeed's engine needs), while the engine itself runs on DeepSpeed's CPU accelerator
over gloo, in this process.
"""
from __future__ import annotations

import configparser
import errno
import importlib
import json
import logging
import os
import re
import socket
import warnings
from pathlib import Path

import pytest

# DeepSpeed picks its accelerator once, at first use: CPU here, whatever else the machine has.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
deepspeed = pytest.importorskip("deepspeed")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from phase_a_helpers import tiny_train_cfg, write_synthetic_features  # noqa: E402

from animegamer.phases import run as runner  # noqa: E402
from animegamer.training import checkpointing, strategies  # noqa: E402
from animegamer.training.checkpoint_integrity import record_path, write_pending_record  # noqa: E402
from animegamer.training.checkpointing import DiskFullError, checkpoint_name, resume_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLIP = 0.5  # phase.grad_clip in these runs: not the default, so the engine's value is ours
HUGE = 1e6  # loss factor of the "huge gradient" step: its norm is far above CLIP
STEPS = 4
DS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")  # Lightning sets them for DeepSpeed


@pytest.fixture(scope="module")
def cpu_deepspeed():
    """The DeepSpeed strategy that ``make_strategy`` builds, runnable on CPU in this process."""
    from deepspeed.accelerator import get_accelerator
    from lightning.pytorch.strategies import DDPStrategy

    if get_accelerator().device_name() != "cpu":
        pytest.skip(f"DeepSpeed chose the {get_accelerator().device_name()} accelerator before this module set "
                    "DS_ACCELERATOR=cpu")
    # importlib: ``deepspeed.comm.torch`` as an attribute is the torch module that package imports
    ds_comm = importlib.import_module("deepspeed.comm.torch")

    base = strategies.rule_keeping_deepspeed()

    class OnCpu(base):
        # Lightning refuses every accelerator but CUDA here; the DDP parent sets up the process group.
        setup_environment = DDPStrategy.setup_environment

        def __init__(self, *args, **kwargs) -> None:
            # DeepSpeed's engine takes its device index from the rank's device; Lightning's CPU has none.
            super().__init__(*args, parallel_devices=[torch.device("cpu", 0)], **kwargs)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(strategies, "rule_keeping_deepspeed", lambda: OnCpu)
        # The shared-memory all-reduce speeds up several CPU processes; one has nothing to share, and
        # building the op (a C++ compile at first use) took 136 s on a 2-core machine.
        patch.setattr(ds_comm, "build_shm_op", lambda: None)
        for name, value in zip(DS_ENV, ("127.0.0.1", str(port), "0", "1", "0")):
            patch.setenv(name, value)  # restored afterwards: Lightning writes them for the process group
        yield
        # One process group serves every run of this module (DeepSpeed keeps handles to it); later
        # modules start their own.
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> Path:
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config

    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    return write_synthetic_features(tmp_path_factory.mktemp("ds_features") / "features", enc, clips=14)


class Record(L.Callback):
    """Before and after every optimizer step: the module's trained weights, DeepSpeed's float32 master
    partitions and AdamW state, the learning rate, and the engine's norm and skip count."""

    def __init__(self) -> None:
        self.steps: dict[int, dict] = {}

    @staticmethod
    def state(trainer, module) -> dict:
        engine = trainer.strategy.deepspeed_engine
        zero = engine.optimizer
        adam = zero.optimizer
        return {
            "weights": {n: p.detach().float().clone() for n, p in module.named_parameters() if p.requires_grad},
            "master": [p.detach().clone() for p in zero.single_partition_of_fp32_groups],
            "adam": [{k: v.detach().clone() for k, v in adam.state[p].items()} if p in adam.state else {}
                     for group in adam.param_groups for p in group["params"]],
            "groups": [(group["lr"], group["weight_decay"], group["betas"], group["eps"])
                       for group in adam.param_groups],
        }

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.before = (trainer.global_step, self.state(trainer, module))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step, before = self.before
        engine = trainer.strategy.deepspeed_engine
        self.steps[step] = {"before": before, "after": self.state(trainer, module),
                            "norm": float(engine.get_global_grad_norm()), "engine_skipped": engine.skipped_steps,
                            "skipped": getattr(module, "skipped_steps", 0),
                            "in_row": getattr(module, "nonfinite_in_row", 0),
                            "clip": engine.gradient_clipping(), "zero_clip": engine.optimizer.clip_grad,
                            "stage": engine.zero_optimization_stage(), "bf16": engine.bfloat16_enabled(),
                            "bf16_config": trainer.strategy.config.get("bf16")}


def deepspeed_run(features, output, monkeypatch, *overrides, nan_steps=(), huge_steps=()):
    """A tiny phase a_joint run under DeepSpeed whose loss is NaN / multiplied by :data:`HUGE` in the
    steps that start at ``nan_steps`` / ``huge_steps``; returns (recorder, run)."""
    from animegamer.phases.phase_a import PhaseA

    original = PhaseA.training_step

    def training_step(self, batch, batch_idx):
        loss = original(self, batch, batch_idx)
        if self.global_step in nan_steps:
            return loss * float("nan")
        return loss * HUGE if self.global_step in huge_steps else loss

    monkeypatch.setattr(PhaseA, "training_step", training_step)
    record = Record()
    make_trainer = runner.make_trainer
    monkeypatch.setattr(runner, "make_trainer",
                        lambda cfg, callbacks, **kw: make_trainer(cfg, [*callbacks, record], **kw))
    composed, cfg = tiny_train_cfg(features, output, "phase=a_joint", f"phase.max_steps={STEPS}", "logger=none",
                                   "trainer.strategy=deepspeed_stage_2", "trainer.precision=bf16-mixed",
                                   f"phase.grad_clip={CLIP}", *overrides)
    return record, lambda: runner.train(cfg, composed)


def _equal(a: dict, b: dict) -> bool:
    return (all(torch.equal(a["weights"][n], b["weights"][n]) for n in a["weights"])
            and all(torch.equal(x, y) for x, y in zip(a["master"], b["master"]))
            and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                    for x, y in zip(a["adam"], b["adam"])))


@pytest.mark.parametrize("strategy, precision", [("deepspeed_stage_2", "bf16-mixed"), ("deepspeed_stage_2", "32-true"),
                                                 ("deepspeed_stage_1", "bf16-mixed")])
def test_the_engine_clips_to_phase_grad_clip_and_skips_a_nan_step(cpu_deepspeed, features, tmp_path, monkeypatch,
                                                                   caplog, strategy, precision):
    caplog.set_level(logging.WARNING, logger="animegamer.training.nonfinite")
    record, run = deepspeed_run(features, tmp_path / "run", monkeypatch, f"trainer.strategy={strategy}",
                                f"trainer.precision={precision}", "trainer.max_nonfinite_in_row=1",
                                huge_steps={1}, nan_steps={2})
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        assert run()["step"] == STEPS
    assert not [w for w in warned if strategies.LIGHTNING_CLIP_WARNING in str(w.message)]  # it said "will not clip"
    steps = record.steps
    assert sorted(steps) == list(range(STEPS))
    first = steps[0]
    assert (first["clip"], first["zero_clip"]) == (CLIP, CLIP)  # phase.grad_clip, as the engine applies it
    assert first["stage"] == int(strategy[-1]) and first["bf16"] == (precision == "bf16-mixed")
    # Asked for, not left to DeepSpeed's default (False in 0.19.0): without it a bf16 ZeRO-1/2 step
    # applies NaN gradients (measured with 0.19.8: weights and moments become NaN).
    assert first["bf16_config"] == ({"enabled": True, "check_grad_overflow": True} if first["bf16"] else None)

    # The huge step: its norm was far above CLIP, and AdamW received the gradient clipped to CLIP.
    huge = steps[1]
    assert huge["norm"] > 1000 * CLIP
    beta1 = huge["before"]["groups"][0][2][0]
    grads = [(after["exp_avg"] - before.get("exp_avg", torch.zeros_like(after["exp_avg"])) * beta1) / (1 - beta1)
             for before, after in zip(huge["before"]["adam"], huge["after"]["adam"])]
    assert float(torch.linalg.vector_norm(torch.cat(grads))) == pytest.approx(CLIP, rel=1e-3)
    # ... and the master weights moved by exactly the AdamW step of those moments.
    for i, (lr, decay, (b1, b2), eps) in enumerate(huge["before"]["groups"]):
        state, step = huge["after"]["adam"][i], float(huge["after"]["adam"][i]["step"])
        denom = (state["exp_avg_sq"].sqrt() / (1 - b2 ** step) ** 0.5) + eps
        expected = huge["before"]["master"][i] * (1 - lr * decay) - lr / (1 - b1 ** step) * state["exp_avg"] / denom
        torch.testing.assert_close(huge["after"]["master"][i], expected, rtol=1e-5, atol=1e-7)

    # The NaN step: nothing changed, and it was counted; the next step trains and resets the row.
    nan = steps[2]
    assert nan["norm"] == float("inf") and nan["engine_skipped"] == 1
    assert _equal(nan["before"], nan["after"]) and (nan["skipped"], nan["in_row"]) == (1, 1)
    assert not _equal(steps[3]["before"], steps[3]["after"]) and (steps[3]["skipped"], steps[3]["in_row"]) == (1, 0)
    assert all(torch.isfinite(w).all() for w in steps[3]["after"]["weights"].values())
    assert "step 2: gradient norm is inf; step skipped (1 in a row, limit 1)" in caplog.text


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_too_many_nan_steps_in_a_row_stop_a_deepspeed_run(cpu_deepspeed, features, tmp_path, monkeypatch,
                                                          precision):
    record, run = deepspeed_run(features, tmp_path / "run", monkeypatch, f"trainer.precision={precision}",
                                "trainer.max_nonfinite_in_row=1", nan_steps={1, 2})
    with pytest.raises(FloatingPointError) as error:
        run()
    assert "non-finite gradients in 2 steps in a row at step 2" in str(error.value)
    assert "trainer.max_nonfinite_in_row=1" in str(error.value)
    assert _equal(record.steps[1]["before"], record.steps[1]["after"])  # step 1, skipped, changed nothing


def test_phase_grad_clip_reaches_the_deepspeed_config(tmp_path):
    """Without an engine: the config the strategy hands DeepSpeed (what a GPU run gets)."""
    from animegamer.config.compose import compose_config
    from omegaconf import OmegaConf

    for clip in (0.25, 0.0):
        cfg = OmegaConf.to_object(compose_config("train", ["model=tiny", "phase=a_joint", "trainer=deepspeed_zero2",
                                                           f"phase.grad_clip={clip}", f"output_dir={tmp_path}"]))
        strategy = runner.make_strategy(cfg)
        assert strategy.config["gradient_clipping"] == clip
        assert strategy.config["zero_optimization"]["stage"] == 2 and strategy.exclude_frozen_parameters


def test_an_older_deepspeed_is_refused_with_what_to_install(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.17.6")
    with pytest.raises(strategies.UserError, match=re.escape(
            f"trainer.strategy='deepspeed_stage_2' needs deepspeed>={strategies.DEEPSPEED_MIN_VERSION} and "
            "deepspeed 0.17.6 is installed: pip install -e '.[distributed]'")):
        strategies.require_deepspeed("deepspeed_stage_2")


def test_the_distributed_extra_requires_the_verified_deepspeed():
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    requirement = parser["options.extras_require"]["distributed"].strip()
    assert requirement.startswith(f"deepspeed>={strategies.DEEPSPEED_MIN_VERSION},")
    from packaging.version import Version

    assert Version(deepspeed.__version__) >= Version(strategies.DEEPSPEED_MIN_VERSION)


# ------------------------------------------------------------------------------------------ folders
def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def test_deepspeed_folders_are_recorded_and_a_damaged_one_is_set_aside(cpu_deepspeed, features, tmp_path,
                                                                      monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="animegamer.training")
    _, reference = deepspeed_run(features, tmp_path / "reference", monkeypatch)
    reference()
    _, run = deepspeed_run(features, tmp_path / "run", monkeypatch)
    run()
    folder = tmp_path / "run" / "checkpoints"
    saved = [folder / checkpoint_name(step) for step in (2, 4)]
    for checkpoint in saved:  # DeepSpeed's layout: the `latest` tag and the shards under it
        files = _files(checkpoint)
        assert (checkpoint / "latest").read_text() == "checkpoint"
        assert {"latest", "checkpoint/mp_rank_00_model_states.pt",
                "checkpoint/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"} <= files.keys()
        assert json.loads(record_path(checkpoint).read_text()) == {"files": {n: {"size": s} for n, s in files.items()}}

    shard = saved[1] / "checkpoint" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # cut short after the save
    _, again = deepspeed_run(features, tmp_path / "run", monkeypatch)
    assert again()["step"] == STEPS
    assert f"checkpoint {saved[1]} is damaged: {shard.name} has" in caplog.text
    assert f"resuming from {saved[0]}" in caplog.text
    assert (folder / (checkpoint_name(4) + ".damaged") / "checkpoint" / shard.name).is_file()
    ours, theirs = (load_file(tmp_path / name / "export" / "trained.safetensors") for name in ("run", "reference"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    # A save cut short between DeepSpeed's `latest` and the record leaves the pending record: damaged.
    write_pending_record(saved[1])
    assert resume_checkpoint(folder) == saved[0]
    assert "its save did not finish" in caplog.text
    assert (folder / (checkpoint_name(4) + ".damaged-2") / "latest").is_file()


def test_a_disk_that_fills_during_a_deepspeed_save_names_the_folder(cpu_deepspeed, features, tmp_path,
                                                                     monkeypatch):
    save, full = torch.save, []
    usage = checkpointing.shutil.disk_usage

    def filling_save(obj, f, *args, **kwargs):
        if checkpoint_name(4) in str(f):  # DeepSpeed's shard writes: half, then the disk is full
            full.append(f)
            Path(f).write_bytes(b"x" * 1000)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing "
                               f"file data/0: file write failed ({os.strerror(errno.ENOSPC)})")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", filling_save)
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda p: usage(p)._replace(free=0) if full else usage(p))
    _, run = deepspeed_run(features, tmp_path / "run", monkeypatch)
    with pytest.raises(DiskFullError) as error:
        run()
    folder = tmp_path / "run" / "checkpoints"
    assert str(error.value).startswith(f"checkpoint {folder / checkpoint_name(4)} does not fit: the disk filled "
                                       "up during the write, 0 bytes are free on its disk.")
    assert sorted(p.name for p in folder.iterdir()) == [checkpoint_name(2), checkpoint_name(2) + ".integrity.json"]
    assert resume_checkpoint(folder) == folder / checkpoint_name(2)


def test_fsdp_saves_one_gathered_file_through_the_atomic_writer(tmp_path):
    """FSDP checkpoints are files, never folders: the file rules (sha256 record, full-disk checks) apply."""
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config
    from animegamer.training.checkpointing import AtomicCheckpointIO

    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny", "phase=a_joint", "trainer=fsdp",
                                                       f"output_dir={tmp_path}"]))
    assert runner.make_strategy(cfg)._state_dict_type == "full"
    assert any(isinstance(plugin, AtomicCheckpointIO) for plugin in runner.plugins(cfg))
