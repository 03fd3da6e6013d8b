"""Classifier-free guidance on two devices (diffusion/cfg_parallel.py), checked on the CPU: the two-device
predictor (the same CPU device twice) against the batched one, the device choice and its refusals."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.config.schema import DiffusionConfig
from animegamer.config.validate import ConfigError
from animegamer.diffusion.cfg_parallel import (TwoDeviceCFG, cfg_devices, check_cfg_parallel, replicate,
                                               two_device_predictor)
from animegamer.diffusion.sampler import BatchedCFG, sample
from animegamer.models.encoder import representation_tokens

CPU = torch.device("cpu")
STEPS = 4
LEVEL_FLOW = {1: 0.25, 2: 1.5, 3: 4.0, 4: 12.0, 5: 30.0}


def tiny_cfg(*overrides: str):
    return OmegaConf.to_object(compose_config("train", ["model=tiny", *overrides]))


def toy_denoiser(calls: list):
    """A nonlinear function of every input that records what each call got."""
    def denoise(x, t, rep, flow):
        calls.append({"batch": x.shape[0], "rep": rep.clone(), "t": t.clone(), "flow": flow.clone()})
        context = rep.mean(dim=(1, 2)).reshape(-1, 1, 1, 1, 1) + 0.01 * flow.reshape(-1, 1, 1, 1, 1)
        return torch.tanh(x) * (t.float() / 1000).reshape(-1, 1, 1, 1, 1) + context
    return denoise


def reps(batch: int, tokens: int = 5, width: int = 7):
    g = torch.Generator().manual_seed(3)
    return torch.randn(batch, tokens, width, generator=g), torch.randn(1, tokens, width, generator=g), \
        torch.rand(batch, generator=g) * 10


def test_two_devices_equal_one_batch_with_a_toy_denoiser():
    """Elementwise denoiser: the split computes bit for bit what the batch of 2 computes; each branch
    gets its own representation, the same timestep and flow, and the batch of one."""
    shape, cfg = (2, 3, 4, 6, 8), DiffusionConfig(sampling_steps=STEPS)
    cond, uncond, flow = reps(shape[0])
    batched_calls, first_calls, second_calls = [], [], []
    one = sample(BatchedCFG(toy_denoiser(batched_calls)), shape, cond, uncond, flow, cfg,
                 torch.Generator().manual_seed(0))
    two = sample(TwoDeviceCFG(toy_denoiser(first_calls), toy_denoiser(second_calls), (CPU, CPU)), shape, cond,
                 uncond, flow, cfg, torch.Generator().manual_seed(0))
    assert torch.equal(one, two)
    assert [c["batch"] for c in batched_calls] == [4] * STEPS
    assert [c["batch"] for c in first_calls] == [c["batch"] for c in second_calls] == [2] * STEPS
    for batched, first, second in zip(batched_calls, first_calls, second_calls):
        assert torch.equal(first["rep"], uncond.expand(2, -1, -1))
        assert torch.equal(second["rep"], cond)
        assert torch.equal(batched["t"], torch.cat([first["t"], second["t"]]))
        assert torch.equal(first["flow"], flow) and torch.equal(second["flow"], flow)


def test_without_guidance_only_the_first_device_runs():
    shape = (1, 3, 4, 6, 8)
    cond, _, flow = reps(1)
    first_calls, second_calls = [], []
    sample(TwoDeviceCFG(toy_denoiser(first_calls), toy_denoiser(second_calls), (CPU, CPU)), shape, cond, None,
           flow, DiffusionConfig(sampling_steps=STEPS, guidance_scale=1.0), torch.Generator().manual_seed(0))
    assert len(first_calls) == STEPS and not second_calls


@pytest.fixture(scope="module")
def tiny_decoder(random_tiny_decoder):
    return random_tiny_decoder


def test_two_devices_equal_one_batch_with_the_tiny_decoder(tiny_decoder):
    """The real decoder: a batch of one per branch against the batch of two, same noise. The CPU's
    kernels may sum in another order for another batch size; measured: max |diff| 5.7e-6 over 4 steps
    in float32 with latents up to 11.4 (5e-7 relative), against 1.2e-2 for another conditional rep."""
    cfg, decoder = tiny_decoder
    replica = replicate(decoder, CPU)
    assert replica is not decoder
    for (name, a), (_, b) in zip(decoder.named_parameters(), replica.named_parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), name
    n, d = representation_tokens(cfg.model.encoder), cfg.model.encoder.width
    g = torch.Generator().manual_seed(1)
    cond, uncond = torch.randn(1, n, d, generator=g), torch.randn(1, n, d, generator=g)
    flow = torch.tensor([4.0])
    shape = (1, 2, cfg.model.decoder.in_channels, 8, 12)
    diffusion = DiffusionConfig(sampling_steps=STEPS)
    one = sample(decoder, shape, cond, uncond, flow, diffusion, torch.Generator().manual_seed(0))
    two = sample(TwoDeviceCFG(decoder, replica, (CPU, CPU)), shape, cond, uncond, flow, diffusion,
                 torch.Generator().manual_seed(0))
    diff = float((one - two).abs().max())
    print(f"max |two devices - one batch| = {diff:.3g} (latents max {float(one.abs().max()):.3g})")
    assert diff <= 1e-5 * float(one.abs().max()), diff
    # not trivially equal: the conditional branch matters
    other_cond = torch.randn(1, n, d, generator=g)
    other = sample(TwoDeviceCFG(decoder, replica, (CPU, CPU)), shape, other_cond, uncond, flow, diffusion,
                   torch.Generator().manual_seed(0))
    print(f"another cond: max |diff| = {float((other - two).abs().max()):.3g}")
    assert float((other - two).abs().max()) > 100 * max(diff, 1e-7)


def test_two_device_predictor_and_replica_of_a_compiled_decoder(tiny_decoder):
    cfg, decoder = tiny_decoder
    assert two_device_predictor(decoder, None) is decoder
    predictor = two_device_predictor(decoder, replicate(decoder, CPU))
    assert isinstance(predictor, TwoDeviceCFG) and predictor.devices == (CPU, CPU)
    assert not predictor.uses_cuda_graphs
    # a compiled decoder's copy is compiled again (deepcopy drops nn.Module.compile's wrapper), not run eager
    decoder.cfg.compile = True
    try:
        decoder.transformer.compile(dynamic=False)
        copied = replicate(decoder, CPU)
        assert copied.transformer._compiled_call_impl is not None
        assert copied.transformer._compiled_call_impl is not decoder.transformer._compiled_call_impl
    finally:
        decoder.cfg.compile = False
        decoder.transformer._compiled_call_impl = None


def test_device_choice(monkeypatch):
    assert cfg_devices("off", "cpu") is None
    assert cfg_devices("auto", "cpu") is None
    with pytest.raises(ConfigError, match="two CUDA devices.*auto or off"):
        cfg_devices("on", "cpu")
    with pytest.raises(ConfigError, match="not one of"):
        cfg_devices("two", "cpu")
    assert check_cfg_parallel(tiny_cfg().model.decoder) == []
    assert check_cfg_parallel(tiny_cfg("model.decoder.cfg_parallel=yes").model.decoder)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cfg_devices("auto", "cuda:0") is None
    with pytest.raises(ConfigError, match="1 CUDA device"):
        cfg_devices("on", "cuda:0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cfg_devices("auto", "cuda:0") == (torch.device("cuda", 0), torch.device("cuda", 1))
    assert cfg_devices("on", "cuda:1") == (torch.device("cuda", 1), torch.device("cuda", 0))
    assert cfg_devices("off", "cuda:0") is None


def test_load_game_models_refuses_on_without_two_gpus():
    from animegamer.game.models import load_game_models

    with pytest.raises(ConfigError, match="cfg_parallel=on"):
        load_game_models(tiny_cfg("model.decoder.cfg_parallel=on"), None, None, LEVEL_FLOW, device="cpu")
