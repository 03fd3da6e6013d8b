"""The sampler's step cache (diffusion/step_cache.py, diffusers' First Block Cache) on the tiny decoder:
a threshold of 0 skips nothing and samples exactly what the uncached sampler does; a large one skips
every later block after the first step; the hooks live only inside a sample call; the refusals."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.config.schema import DiffusionConfig
from animegamer.config.validate import ConfigError
from animegamer.diffusion.sampler import sample
from animegamer.diffusion.step_cache import CACHE_FIRST_BLOCK, check_sampling_cache
from animegamer.models.encoder import representation_tokens

STEPS = 5
LEVEL_FLOW = {1: 0.25, 2: 1.5, 3: 4.0, 4: 12.0, 5: 30.0}


def tiny_cfg(*overrides: str):
    return OmegaConf.to_object(compose_config("train", ["model=tiny", *overrides]))


@pytest.fixture(scope="module")
def tiny(random_tiny_decoder):
    cfg, decoder = random_tiny_decoder
    n, d = representation_tokens(cfg.model.encoder), cfg.model.encoder.width
    g = torch.Generator().manual_seed(1)
    inputs = dict(shape=(1, 2, cfg.model.decoder.in_channels, 8, 12), cond=torch.randn(1, n, d, generator=g),
                  uncond=torch.randn(1, n, d, generator=g), flow=torch.tensor([4.0]))
    return decoder, inputs


def run(decoder, inputs, diffusion: DiffusionConfig) -> tuple[torch.Tensor, int]:
    """Latents of one sample call and how many times the last block computed (its attention ran: a skipped
    block is still called, and returns its input)."""
    calls = []
    hook = decoder.transformer.transformer_blocks[-1].attn1.register_forward_hook(lambda *_: calls.append(1))
    try:
        latents = sample(decoder, inputs["shape"], inputs["cond"], inputs["uncond"], inputs["flow"], diffusion,
                         torch.Generator().manual_seed(0))
    finally:
        hook.remove()
    return latents, len(calls)


def test_threshold_zero_is_the_uncached_sampler_and_a_large_one_skips(tiny):
    decoder, inputs = tiny
    base = DiffusionConfig(sampling_steps=STEPS)
    plain, plain_calls = run(decoder, inputs, base)
    exact, exact_calls = run(decoder, inputs, replace(base, cache=CACHE_FIRST_BLOCK, cache_threshold=0.0))
    assert plain_calls == exact_calls == STEPS
    assert torch.equal(plain, exact)
    skipped, skipped_calls = run(decoder, inputs, replace(base, cache=CACHE_FIRST_BLOCK, cache_threshold=1e9))
    assert skipped_calls == 1  # the first step runs every block, the rest reuse its residual
    deviation = float((skipped - plain).norm() / plain.norm())
    print(f"every later step cached: relative L2 deviation {deviation:.3g}")
    assert deviation > 1e-3
    # the hooks leave with the call: the decoder is plain again (training between samples needs that)
    assert not decoder.transformer.is_cache_enabled
    again, again_calls = run(decoder, inputs, base)
    assert again_calls == STEPS and torch.equal(again, plain)


def test_each_call_starts_with_a_fresh_cache(tiny):
    """A second call does not reuse the first call's residuals: the same call twice, the same latents."""
    decoder, inputs = tiny
    cached = DiffusionConfig(sampling_steps=STEPS, cache=CACHE_FIRST_BLOCK, cache_threshold=0.2)
    first, first_calls = run(decoder, inputs, cached)
    second, second_calls = run(decoder, inputs, cached)
    assert torch.equal(first, second) and first_calls == second_calls


def test_validation_names_every_problem():
    cfg = tiny_cfg("model.diffusion.cache=fast", "model.diffusion.cache_threshold=-1")
    problems = check_sampling_cache(cfg.model.diffusion, cfg.model.decoder)
    assert any("model.diffusion.cache" in p and "fast" in p for p in problems)
    assert any("cache_threshold=-1" in p for p in problems)
    both = tiny_cfg("model.diffusion.cache=first_block", "model.decoder.cfg_parallel=on")
    assert any("cfg_parallel=on" in p for p in check_sampling_cache(both.model.diffusion, both.model.decoder))
    fine = tiny_cfg("model.diffusion.cache=first_block")
    assert check_sampling_cache(fine.model.diffusion, fine.model.decoder) == []


def test_the_game_refuses_the_two_gpu_pair_before_building():
    from animegamer.game.models import load_game_models

    with pytest.raises(ConfigError, match="decide alone"):
        load_game_models(tiny_cfg("model.diffusion.cache=first_block", "model.decoder.cfg_parallel=on"), None, None,
                         LEVEL_FLOW, device="cpu")


def test_the_gpu_benchmark_rehearsed_on_cpu(tmp_path, monkeypatch):
    """benchmarks/step_cache.py --tiny: the uncached row, a cache that skips nothing and one that skips
    every step after the first, measured against the uncached sample."""
    import json
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import step_cache

    assert step_cache.main(["--tiny", "--steps", str(STEPS), "--thresholds", "0", "1e9", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "step_cache.json").read_text())["rows"]
    assert rows["none"]["steps_computed"] == rows["first_block 0"]["steps_computed"] == STEPS
    assert rows["first_block 0"]["rel_l2_vs_uncached"] == 0
    assert rows["first_block 1e+09"]["steps_computed"] == 1
    assert rows["first_block 1e+09"]["rel_l2_vs_uncached"] > 1e-4
