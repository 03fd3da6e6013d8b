"""Phase (c) on tiny models: exactly its trainable set, and its loss falls on adaptation data."""
from __future__ import annotations

import re

import pytest
import torch
from omegaconf import OmegaConf

from animegamer.checks import validate_train_run
from animegamer.config.compose import compose_config
from animegamer.data.phase_c import adaptation_dataset
from animegamer.phases.common import make_optimizer
from animegamer.phases.phase_c import PhaseC
from animegamer.training.runner import train
from animegamer.utils.randomness import SampleRandom
from phase_c_helpers import write_synthetic_adaptation


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return write_synthetic_adaptation(tmp_path_factory.mktemp("adaptation"))


def _cfg(data_root, output, *overrides):
    composed = compose_config("train", ["model=tiny", "phase=c", "trainer=cpu", "logger=none", f"data.root={data_root}",
                                        f"output_dir={output}", "phase.max_steps=3", "phase.batch_size=2",
                                        "phase.val_every_n_steps=1000", "data.val_fraction=0.2", *overrides])
    return composed, OmegaConf.to_object(composed)


def test_trains_exactly_motion_scope_adaln_and_lora(data_root, tmp_path):
    _, cfg = _cfg(data_root, tmp_path)
    module = PhaseC(cfg)
    names = module.trainable_parameter_names()
    expected = sorted(n for n, _ in module.model.named_parameters() if any(re.search(p, n) for p in (
        r"\.ofs_embedding\.linear_[12]\.(weight|bias)$", r"transformer_blocks\.\d+\.norm[12]\.linear\.(weight|bias)$",
        r"attn1\.(to_q|to_k|to_v|to_out\.0)\.lora_[AB]\.default\.weight$")))
    assert names == expected and not any(n.startswith("encoder.") for n in names)


def test_loss_falls_on_adaptation_data(data_root, tmp_path):
    _, cfg = _cfg(data_root, tmp_path, "phase.lr=1e-2", "phase.warmup_steps=1", "phase.unconditional_rep_prob=0")
    module = PhaseC(cfg)
    items = [adaptation_dataset(cfg, "train")[i] for i in range(2)]
    batch = {k: torch.stack([it[k] for it in items]) for k in ("latents", "pred_rep", "flow")}
    t = torch.tensor([300, 700])
    loss_at = lambda: float(module.loss(batch, SampleRandom(0, range(2)), t=t, dropout=False))
    optimizer = make_optimizer(module.model, cfg.phase)["optimizer"]
    first = loss_at()
    for step in range(60):
        optimizer.zero_grad()
        module.loss(batch, SampleRandom(0, range(2 * step, 2 * step + 2)), dropout=False).backward()
        optimizer.step()
    assert loss_at() < 0.8 * first, (first, loss_at())


def test_export_carries_the_encoder_for_the_renderer(data_root, tmp_path):
    composed, cfg = _cfg(data_root, tmp_path)
    validate_train_run(composed)
    result = train(cfg, composed)
    from safetensors.torch import load_file

    tensors = load_file(f"{result['export']}/trained.safetensors")
    assert any(k.startswith("encoder.") for k in tensors) and any("lora_A" in k for k in tensors)
