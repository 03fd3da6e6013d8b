"""The throughput callback: samples/s, tokens/s, data-wait share and MFU in the training log."""
from __future__ import annotations

import pytest
from phase_a_helpers import tiny_train_cfg, write_synthetic_features

from animegamer.phases.run import train
from animegamer.training.throughput import transformer_forward_flops


def test_transformer_flops_by_hand():
    # one layer, 10 tokens, hidden 4, MLP 8: projections 2*(4*4*2 + 4*4*2) = 128 per token, MLP 2*2*4*8 = 128,
    # attention 4 * 10^2 * 4 = 1600
    assert transformer_forward_flops(10, 4, 1, 8) == 10 * 128 + 10 * 128 + 1600
    # grouped-query attention with a gated MLP
    assert transformer_forward_flops(1, 4, 1, 8, kv_hidden=2, gated_mlp=True) == 2 * (2 * 16 + 2 * 8) + 2 * 3 * 32 + 4 * 4


def test_training_log_has_throughput(tmp_path):
    from animegamer.config.compose import compose_config
    from omegaconf import OmegaConf

    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"]).model.encoders)
    root = write_synthetic_features(tmp_path / "data", enc)
    composed, cfg = tiny_train_cfg(root, tmp_path / "run", "phase.max_steps=4", "trainer.throughput_every_n_steps=2",
                                   "trainer.peak_tflops=1.0")
    metrics = train(cfg, composed)["metrics"]
    assert metrics["perf/samples_per_s"] > 0 and metrics["perf/tokens_per_s"] > metrics["perf/samples_per_s"]
    assert 0 <= metrics["perf/data_wait_fraction"] < 1
    assert 0 < metrics["perf/mfu"] < 1  # a CPU core is far below 1 TFLOP/s
    assert metrics["perf/step_s"] == pytest.approx(2 / metrics["perf/samples_per_s"], rel=1e-3)  # batch 2


def two_launches(tmp_path, *overrides: str) -> tuple[list[dict], list[dict]]:
    """A tiny phase (a2) run to step 4, then resumed to step 6: each launch's CSV rows."""
    import csv

    from animegamer.config.compose import compose_config
    from omegaconf import OmegaConf

    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"]).model.encoders)
    root = write_synthetic_features(tmp_path / "data", enc)
    for steps in (4, 6):
        composed, cfg = tiny_train_cfg(root, tmp_path / "run", f"phase.max_steps={steps}", *overrides)
        train(cfg, composed)
    logs = tmp_path / "run" / "logs"
    first, second = ([*csv.DictReader(open(logs / name))] for name in ("metrics.attempt-1.csv", "metrics.csv"))
    return first, second


def test_throughput_rows_reach_the_csv_and_a_resume_keeps_earlier_rows(tmp_path):
    """perf/* rows land at the callback's cadence whatever log_every_n_steps is; the CSV logger
    would empty metrics.csv on resume, so the first attempt's rows are kept beside it."""
    first, second = two_launches(tmp_path, "trainer.throughput_every_n_steps=2", "trainer.log_every_n_steps=5")
    assert [int(r["step"]) for r in first if r.get("perf/step_s")] == [2, 4]
    assert [int(r["step"]) for r in second if r.get("perf/step_s")] == [6]


def test_save_times_and_time_to_first_step_reach_the_log(tmp_path):
    """Every save's wall time and size (``ckpt/save_*``) at its step, and once per launch the time from
    fit's setup to the first batch with whether the launch resumed (``perf/startup_s``, ``perf/resumed``)."""
    from animegamer.training.checkpointing import SAVE_GIB, SAVE_SECONDS
    from animegamer.training.throughput import RESUMED, STARTUP_SECONDS

    attempts = two_launches(tmp_path, "checkpoint.every_n_steps=2", "trainer.log_every_n_steps=5")
    for rows, resumed, saved_at in zip(attempts, (0.0, 1.0), ([2, 4], [6])):
        saves = [r for r in rows if r.get(SAVE_SECONDS)]
        assert sorted({int(r["step"]) for r in saves}) == saved_at
        assert all(0 < float(r[SAVE_SECONDS]) < 60 and 0 < float(r[SAVE_GIB]) < 1 for r in saves)
        starts = [r for r in rows if r.get(STARTUP_SECONDS)]
        assert len(starts) == 1 and float(starts[0][RESUMED]) == resumed and float(starts[0][STARTUP_SECONDS]) > 0


SLOW_SAVE_S = 3.0  # far longer than a tiny step, even on a loaded machine


def test_a_slow_save_is_a_pause_not_a_data_wait(tmp_path, monkeypatch):
    """The step after a checkpoint save waited on the save, not on the loader: it is logged as
    ``perf/paused_s`` and kept out of the data-wait share and the step time."""
    import csv
    import time

    from lightning.pytorch.callbacks import ModelCheckpoint
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config
    from animegamer.training.throughput import PAUSED_SECONDS

    save = ModelCheckpoint._save_checkpoint  # the write inside the framework's timed save

    def slow_save(self, trainer, filepath):
        time.sleep(SLOW_SAVE_S)
        save(self, trainer, filepath)

    monkeypatch.setattr(ModelCheckpoint, "_save_checkpoint", slow_save)
    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"]).model.encoders)
    root = write_synthetic_features(tmp_path / "data", enc)
    composed, cfg = tiny_train_cfg(root, tmp_path / "run", "phase.max_steps=3", "checkpoint.every_n_steps=2",
                                   "trainer.throughput_every_n_steps=1")
    train(cfg, composed)
    perf = [r for r in csv.DictReader(open(tmp_path / "run" / "logs" / "metrics.csv")) if r.get("perf/step_s")]
    paused = {int(r["step"]): float(r[PAUSED_SECONDS]) for r in perf}
    assert paused[3] >= SLOW_SAVE_S and paused[1] == paused[2] == 0.0  # saved after step 2: step 3's window
    assert max(float(r["perf/data_wait_fraction"]) for r in perf) < 0.5
    assert all(float(r["perf/step_s"]) < SLOW_SAVE_S for r in perf)


class _Clock:
    """Seconds handed out in order in place of ``Throughput._now``: the test decides every interval."""

    def __init__(self, times):
        self.times = iter(times)

    def __call__(self, module) -> float:
        return next(self.times)


def _fake_trainer(fn):
    from types import SimpleNamespace

    return SimpleNamespace(state=SimpleNamespace(fn=fn), ckpt_path=None, is_global_zero=True, global_step=2)


def test_validation_within_fit_is_a_pause(monkeypatch):
    """Validation between two steps counts as ``perf/paused_s``; the same gap without it is data wait."""
    from types import SimpleNamespace

    import torch
    from lightning.pytorch.trainer.states import TrainerFn

    from animegamer.training import throughput

    logged = []
    monkeypatch.setattr(throughput.Throughput, "_emit", staticmethod(lambda trainer, module, m: logged.append(m)))
    module = SimpleNamespace(device=torch.device("cpu"), batch_size_of=lambda b: 1, tokens_of=lambda b: 1,
                             flops_per_batch=lambda b: 1.0)

    def two_steps_around_validation(fn, times):
        monkeypatch.setattr(throughput.Throughput, "_now", staticmethod(_Clock(times)))
        trainer = _fake_trainer(fn)
        callback = throughput.Throughput(every=2)
        callback._setup_at = None
        callback.on_train_batch_start(trainer, module, None, 0)
        callback.on_train_batch_end(trainer, module, None, None, 0)
        callback.on_validation_start(trainer, module)
        callback.on_validation_end(trainer, module)
        callback.on_train_batch_start(trainer, module, None, 1)
        callback.on_train_batch_end(trainer, module, None, None, 1)
        return logged[-1]

    # step 0-1 s, validation 1.5-4.5 s, step 5-6 s: 3 s paused, 1 s of data wait, 2 s of steps
    fit = two_steps_around_validation(TrainerFn.FITTING, [0.0, 1.0, 1.5, 4.5, 5.0, 6.0])
    assert fit[throughput.PAUSED_SECONDS] == 3.0 and fit["perf/data_wait_fraction"] == 1.0 / 3.0
    assert fit["perf/step_s"] == 1.5
    # a plain validate() reads no clock and records no pause: the whole gap is the loader's
    plain = two_steps_around_validation(TrainerFn.VALIDATING, [0.0, 1.0, 5.0, 6.0])
    assert plain[throughput.PAUSED_SECONDS] == 0.0 and plain["perf/data_wait_fraction"] == 4.0 / 6.0


def test_validation_videos_are_a_pause(monkeypatch):
    """Rendering validation videos between two steps is recorded as a pause, as long as it takes."""
    import time

    from lightning.pytorch.trainer.states import TrainerFn

    from animegamer.training.callbacks import ValidationVideos
    from animegamer.training.throughput import paused_seconds

    videos = ValidationVideos.__new__(ValidationVideos)  # only the hook's own attributes
    videos.every, videos.count = 2, 1
    monkeypatch.setattr(ValidationVideos, "log_videos", lambda self, trainer, module, step: time.sleep(0.2))
    trainer = _fake_trainer(TrainerFn.FITTING)
    videos.on_train_batch_end(trainer, None, None, None, 0)
    assert paused_seconds(trainer) >= 0.2


def test_per_step_numbers_are_logged_as_host_tensors():
    """Lightning copies a logged Python number to the module's device, and the host waits for the GPU at
    each copy: the throughput metrics and the skipped-sample count go to ``log`` as CPU tensors."""
    from types import SimpleNamespace

    import torch

    from animegamer.training.bad_data import BadDataBudget
    from animegamer.training.throughput import Throughput

    logged = {}

    def log(name, value, **_kwargs):
        logged[name] = value

    module = SimpleNamespace(log=log, log_dict=lambda metrics, **kw: [log(k, v) for k, v in metrics.items()])
    trainer = SimpleNamespace(is_global_zero=True, loggers=[], global_step=3,
                              strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all: decision))
    Throughput._emit(trainer, module, {"perf/step_s": 0.551, "perf/alloc_retries": 2})
    BadDataBudget(budget=5).on_train_batch_start(trainer, module, {}, 0)
    assert set(logged) == {"perf/step_s", "perf/alloc_retries", "data/skipped"}
    for name, value in logged.items():
        assert isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype == torch.float64, name
    assert (float(logged["perf/step_s"]), float(logged["perf/alloc_retries"]), float(logged["data/skipped"])) == (
        0.551, 2.0, 0.0)
