"""Phase (c) on tiny models: exactly its trainable set, its loss falls on adaptation data, the
representation dropout's rate, and a golden loss curve with the dropout on."""
from __future__ import annotations

import math
import re

import pytest
import torch
from omegaconf import OmegaConf

from animegamer.phases.preflight import validate_train_run
from animegamer.config.compose import compose_config
from animegamer.data.phase_c import adaptation_dataset
from animegamer.phases.common import make_optimizer
from animegamer.phases.phase_c import PhaseC, rep_dropout
from animegamer.phases.run import train
from animegamer.utils.randomness import SampleRandom
from golden_helpers import check_golden_losses
from phase_a_helpers import logged_losses
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
    loss_at = lambda: float(module.diffusion_loss(batch, SampleRandom(0, range(2)), t=t, dropout=False))
    optimizer = make_optimizer(module.model, cfg.phase)["optimizer"]
    first = loss_at()
    for step in range(60):
        optimizer.zero_grad()
        module.diffusion_loss(batch, SampleRandom(0, range(2 * step, 2 * step + 2)), dropout=False).backward()
        optimizer.step()
    assert loss_at() < 0.8 * first, (first, loss_at())


def test_export_carries_the_encoder_for_the_renderer(data_root, tmp_path):
    composed, cfg = _cfg(data_root, tmp_path)
    validate_train_run(composed)
    result = train(cfg, composed)
    from safetensors.torch import load_file

    tensors = load_file(f"{result['export']}/trained.safetensors")
    assert any(k.startswith("encoder.") for k in tensors) and any("lora_A" in k for k in tensors)


# --------------------------------------------------------------------------- representation dropout (CFG)
DRAWS = 4000
# A deterministic draw (keyed generators), so no flakiness: the bound is four binomial standard
# deviations, which a correct rate misses with probability below 1e-4 for any seed.
SIGMAS = 4.0


def _phase_c_dropout_prob(data_root, tmp_path) -> float:
    _, cfg = _cfg(data_root, tmp_path)
    return cfg.phase.unconditional_rep_prob


@pytest.mark.parametrize("which", ["phase c config", "a quarter"])
def test_dropout_replaces_a_share_p_of_the_representations(data_root, tmp_path, which):
    p = _phase_c_dropout_prob(data_root, tmp_path) if which == "phase c config" else 0.25
    assert 0 < p < 1
    rep = torch.randn(DRAWS, 3, 4, generator=torch.Generator().manual_seed(1))
    uncond = torch.full((3, 4), 7.0)
    out = rep_dropout(rep, uncond, p, SampleRandom(0, range(DRAWS)))
    dropped = (out == uncond).all(dim=(1, 2))
    assert torch.equal(out[~dropped], rep[~dropped])  # the others pass unchanged
    tolerance = SIGMAS * math.sqrt(p * (1 - p) / DRAWS)
    assert abs(float(dropped.float().mean()) - p) < tolerance, (float(dropped.float().mean()), p, tolerance)


def test_dropout_never_and_always_at_the_ends():
    rep, uncond = torch.randn(64, 2, 4), torch.zeros(2, 4)
    assert torch.equal(rep_dropout(rep, uncond, 0.0, SampleRandom(0, range(64))), rep)
    assert torch.equal(rep_dropout(rep, uncond, 1.0, SampleRandom(0, range(64))), uncond.expand_as(rep))


GOLDEN_STEPS = 6


def test_golden_loss_curve_with_dropout_on(data_root, tmp_path):
    """Six steps at the phase's own dropout rate; the draws of those steps drop some samples and keep
    others, so the curve pins both branches (and which samples take which)."""
    composed, cfg = _cfg(data_root, tmp_path / "run", "logger=csv", "trainer.log_every_n_steps=1",
                         f"phase.max_steps={GOLDEN_STEPS}", "phase.warmup_steps=2", "phase.lr=1e-3",
                         "checkpoint.every_n_steps=1000")
    p = cfg.phase.unconditional_rep_prob
    samples = GOLDEN_STEPS * cfg.phase.batch_size
    dropped = int((SampleRandom(cfg.seed, range(samples)).rand() < p).sum())  # train_draw's positions, one process
    assert 0 < dropped < samples, (dropped, p)
    validate_train_run(composed)
    train(cfg, composed)
    losses = logged_losses(tmp_path / "run")
    assert sorted(losses) == list(range(GOLDEN_STEPS))
    check_golden_losses("phase_c_tiny_dropout", losses, "pytest tests/test_phase_c.py -k golden")
