"""Phase (a) training on tiny models: golden curve, exact resume, trainable sets, export, sampling."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from golden_helpers import check_golden_losses
from phase_a_helpers import logged_losses, tiny_train_cfg, write_synthetic_features

from animegamer.phases.preflight import validate_train_run
from animegamer.phases.phase_a import PhaseA
from animegamer.phases.run import train


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    from animegamer.config.compose import compose_config
    from omegaconf import OmegaConf

    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"]).model.encoders)
    return write_synthetic_features(tmp_path_factory.mktemp("synthetic"), enc)


def _run(data_root, output, *overrides):
    composed, cfg = tiny_train_cfg(data_root, output, *overrides)
    validate_train_run(composed)
    return train(cfg, composed)


def test_golden_loss_curve(data_root, tmp_path):
    _run(data_root, tmp_path / "run", "phase=a_joint")
    losses = logged_losses(tmp_path / "run")
    assert sorted(losses) == list(range(6))
    check_golden_losses("phase_a_tiny", losses, "pytest tests/test_phase_a.py -k golden")


def test_resume_mid_run_continues_the_curve_exactly(data_root, tmp_path):
    _run(data_root, tmp_path / "full", "phase=a_joint")
    full = logged_losses(tmp_path / "full")
    _run(data_root, tmp_path / "split", "phase=a_joint", "phase.max_steps=3")
    (tmp_path / "split" / "logs" / "metrics.csv").rename(tmp_path / "first.csv")
    _run(data_root, tmp_path / "split", "phase=a_joint")  # resumes from checkpoints/step-0000003.ckpt
    resumed = logged_losses(tmp_path / "split")
    assert sorted(resumed) == [3, 4, 5]
    for step in resumed:
        assert resumed[step] == full[step], step  # bitwise on CPU


def _expected_trainable(model, stage):
    """Written from the spec, independently of stage_trainable."""
    names = [n for n, _ in model.named_parameters()]
    patterns = [r"^encoder\.", r"\.ofs_embedding\.linear_[12]\.(weight|bias)$"]
    if stage == "a_joint":
        patterns += [r"transformer_blocks\.\d+\.norm[12]\.linear\.(weight|bias)$",
                     r"attn1\.(to_q|to_k|to_v|to_out\.0)\.lora_[AB]\.default\.weight$"]
    return sorted(n for n in names if any(re.search(p, n) for p in patterns))


@pytest.mark.parametrize("stage", ["a_warmup", "a_joint"])
def test_trainable_set_of_each_stage(data_root, tmp_path, stage):
    _, cfg = tiny_train_cfg(data_root, tmp_path, f"phase={stage}")
    module = PhaseA(cfg)
    trainable = module.trainable_parameter_names()
    assert trainable == _expected_trainable(module.model, stage)
    layers = cfg.model.decoder.num_layers
    decoder = [n for n in trainable if n.startswith("decoder.")]
    assert len(decoder) == 4 + (0 if stage == "a_warmup" else layers * (4 + 8))


def test_motion_scope_starts_at_zero(data_root, tmp_path):
    _, cfg = tiny_train_cfg(data_root, tmp_path)
    transformer = PhaseA(cfg).model.decoder.transformer
    emb = transformer.ofs_embedding(transformer.ofs_proj(torch.tensor([0.5, 7.0, 40.0])))
    assert torch.count_nonzero(emb) == 0


def test_export_then_load_is_exact(data_root, tmp_path):
    result = _run(data_root, tmp_path / "run", "phase=a_joint", "phase.max_steps=2")
    trained = result["module"].model
    _, cfg = tiny_train_cfg(data_root, tmp_path / "other", "phase=a_joint", f"phase.init_from={result['export']}")
    loaded = PhaseA(cfg).model
    for (name, a), (_, b) in zip(trained.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert (Path(result["export"]) / "lora" / "adapter_config.json").exists()


def _one_clip_fit(data_root, tmp_path, lr: str, steps: int, train_everything: bool) -> tuple[float, float]:
    """Loss on one clip at fixed t and noise, before and after ``steps`` AdamW steps on it."""
    from animegamer.data.phase_a import phase_a_dataset
    from animegamer.models.reconstruction import ClipBatch
    from animegamer.phases.common import make_optimizer
    from animegamer.utils.randomness import SampleRandom

    _, cfg = tiny_train_cfg(data_root, tmp_path, "phase=a_joint", f"phase.lr={lr}", "phase.warmup_steps=1",
                            "phase.text_dropout=0", "phase.image_dropout=0", "phase.weight_decay=0")
    module = PhaseA(cfg)
    if train_everything:
        module.model.requires_grad_(True)
    item = phase_a_dataset(cfg, "train")[0]
    clips = ClipBatch(item["latents"][None], item["text"][None], item["image"][None], item["flow"][None])
    t = torch.tensor([500])
    loss_at = lambda: module.diffusion_loss(clips, SampleRandom(0, range(len(t))), t=t, dropout=False)
    optimizer = make_optimizer(module.model, cfg.phase)["optimizer"]
    first = float(loss_at())
    for _ in range(steps):
        optimizer.zero_grad()
        loss_at().backward()
        optimizer.step()
    return first, float(loss_at())


def test_tiny_model_overfits_one_clip(data_root, tmp_path):
    """The whole tiny network drives one clip's reconstruction loss down by more than 10x."""
    first, last = _one_clip_fit(data_root, tmp_path, "3e-3", 150, train_everything=True)
    assert last < first / 10, (first, last)


def test_stage_trainables_fit_one_clip(data_root, tmp_path):
    """With only the a_joint set (tiny LoRA r=4, so little capacity) the loss still halves."""
    first, last = _one_clip_fit(data_root, tmp_path, "1e-2", 200, train_everything=False)
    assert last < first / 2, (first, last)


def test_sampler_returns_a_clip_of_the_configured_size(data_root, tmp_path):
    from animegamer.data.phase_a import phase_a_dataset
    from animegamer.models.frozen_encoders import build_frozen_encoders
    from animegamer.models.reconstruction import ClipBatch
    from animegamer.utils.randomness import step_generator

    _, cfg = tiny_train_cfg(data_root, tmp_path)
    module = PhaseA(cfg)
    item = phase_a_dataset(cfg, "val")[0]
    clips = ClipBatch(item["latents"][None], item["text"][None], item["image"][None], item["flow"][None])
    latents = module.reconstruct(clips, step_generator(0, 0, 0), steps=2)
    assert latents.shape == clips.latents.shape
    video = build_frozen_encoders(cfg.model.encoders, which=("vae",)).vae.decode(latents)
    assert video.shape == (1, 17, 32, 48, 3)


def test_bf16_mixed_with_fused_adamw_and_clipping_trains(data_root, tmp_path, monkeypatch):
    """Lightning's own clipping refuses fused AdamW under bf16-mixed (the GPU preset): phases clip
    themselves. Fused AdamW exists on CPU too, so the GPU crash is reproduced here."""
    import animegamer.phases.common as common

    original = torch.optim.AdamW
    monkeypatch.setattr(common.torch.optim, "AdamW", lambda *a, **k: original(*a, **{**k, "fused": True}))
    result = _run(data_root, tmp_path / "run", "phase=a_joint", "phase.max_steps=2", "trainer.precision=bf16-mixed")
    assert result["step"] == 2


def test_inputs_follow_weights_an_engine_converted(data_root, tmp_path):
    """DeepSpeed's bf16 mode converts the module's weights itself (LightningModule.dtype stays float32)
    and hands bf16 inputs: the first H200 run then failed with 'mat1 and mat2 must have the same dtype'.
    The phase casts to the weights' compute dtype, so the step runs."""
    from animegamer.data.phase_a import phase_a_dataset
    from animegamer.models.reconstruction import ClipBatch
    from animegamer.utils.randomness import SampleRandom

    _, cfg = tiny_train_cfg(data_root, tmp_path, "phase=a_joint")
    module = PhaseA(cfg)
    module.model.to(torch.bfloat16)  # what DeepSpeed's engine does: not through LightningModule.to
    assert module.dtype == torch.float32 and module.compute_dtype == torch.bfloat16
    item = phase_a_dataset(cfg, "train")[0]
    clips = ClipBatch(*(item[k][None].to(torch.bfloat16) for k in ("latents", "text", "image")), item["flow"][None])
    loss = module.diffusion_loss(clips, SampleRandom(0, range(1)))
    assert torch.isfinite(loss) and loss.dtype == torch.float32


def test_a_cpu_resume_takes_the_thread_count_the_run_started_with(data_root, tmp_path, monkeypatch):
    """A CPU run's float sums depend on its thread count, which a start picks from the machine's load: the
    resume takes the recorded count again, where a fresh start under the same load takes another."""
    import json
    import os

    from animegamer.contracts.files import CPU_THREADS_FILE
    from animegamer.utils import threads

    before = torch.get_num_threads()
    for name in threads.THREAD_ENV:
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    monkeypatch.setattr(threads, "_ASKED", "")  # no OMP_NUM_THREADS of the user's
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    try:
        _run(data_root, tmp_path / "run", "phase=a_joint", "phase.max_steps=2")
        assert json.loads((tmp_path / "run" / CPU_THREADS_FILE).read_text()) == {"cpu_threads": 2}
        monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.2, 0.0, 0.0))  # one of the two cores busy now
        _run(data_root, tmp_path / "other", "phase=a_joint", "phase.max_steps=1")
        assert torch.get_num_threads() == 1
        _run(data_root, tmp_path / "run", "phase=a_joint", "phase.max_steps=3")  # resumes from step 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
