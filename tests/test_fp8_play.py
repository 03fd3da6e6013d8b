"""Play's FP8 (``model.decoder.fp8`` in the game and evaluation, models/fp8.py ``apply_play_fp8``): the
frozen decoder's base weights stored in float8 once, after the LoRA merge.

torchao's float8 inference refuses CPUs in its hardware check, while ``torch._scaled_mm`` itself runs
on them; the tests lift that one check (``cpu_float8``) to see which weights are stored and what the
decoder then computes. The framework's own refusal on a CPU is tested as a user meets it.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from animegamer.config.validate import ConfigError
from animegamer.models import fp8
from fake_gpu_helpers import tiny_cfg

torchao = pytest.importorskip("torchao")
from torchao.quantization import Float8Tensor  # noqa: E402

LAYERS = 2  # model=tiny's decoder.num_layers
LORA_TARGETS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0")
LEVEL_FLOW = {str(level): float(level) for level in range(1, 6)}


@pytest.fixture
def cpu_float8(monkeypatch):
    """torchao's hardware check and the framework's device check lifted: float8 weights on the CPU."""
    import torchao.quantization.quant_api as quant_api

    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)
    monkeypatch.setattr(fp8, "fp8_device_problem", lambda device=None: None)


def merged_renderer(recipe: str, lora_scale: float = 0.5):
    """The tiny renderer with a non-zero LoRA adapter, merged, frozen in bfloat16 (what play holds before FP8)."""
    from animegamer.game.models import renderer_for_play
    from animegamer.models.reconstruction import build_reconstruction

    torch.manual_seed(0)
    model = build_reconstruction(tiny_cfg(f"model.decoder.fp8={recipe}"), with_lora=True, play=True)
    for name, param in model.decoder.named_parameters():
        if ".lora_B." in name:
            nn.init.normal_(param, std=lora_scale)
    off = copy.deepcopy(model)
    off.decoder.cfg = tiny_cfg().model.decoder  # the same weights, fp8 off
    return model, off, renderer_for_play


def decoder_output(decoder) -> torch.Tensor:
    dec = decoder.cfg
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(2, 5, dec.in_channels, dec.sample_height, dec.sample_width, generator=g)
    rep = torch.randn(2, decoder.rep_tokens, decoder.hidden, generator=g)
    with torch.no_grad():
        return decoder(latents.bfloat16(), torch.tensor([100, 700]), rep.bfloat16(), torch.tensor([1.0, 3.0])).float()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_play_stores_exactly_the_frozen_base_weights_in_float8(recipe, cpu_float8):
    model, off, renderer_for_play = merged_renderer(recipe)
    renderer, replica = renderer_for_play(model, "cpu", torch.bfloat16)
    reference, _ = renderer_for_play(off, "cpu", torch.bfloat16)
    assert replica is None
    transformer = renderer.decoder.transformer
    stored = sorted(n.removesuffix(".weight") for n, p in transformer.named_parameters() if isinstance(p, Float8Tensor))
    expected = sorted(f"transformer_blocks.{i}.{t}{'.base_layer' if t in LORA_TARGETS else ''}"
                      for i in range(LAYERS) for t in fp8.BLOCK_TARGETS)
    assert stored == expected and len(stored) == 12
    for name in stored:  # float8 values with their scales (one per tensor, or one per output row)
        weight = transformer.get_submodule(name).weight
        assert weight.qdata.dtype == torch.float8_e4m3fn
        assert weight.scale.numel() == (1 if recipe == "tensorwise" else weight.shape[0])
    # everything else, the merged LoRA matrices included, stays in bfloat16
    others = [p for n, p in renderer.named_parameters() if not isinstance(p, Float8Tensor)]
    assert others and all(p.dtype == torch.bfloat16 for p in others)

    # the merged adapter is inside the float8 weights: each holds base + adapter to within float8's rounding
    base_only, _ = renderer_for_play(merged_renderer(recipe, lora_scale=0.0)[1], "cpu", torch.bfloat16)
    for name in stored:
        merged = reference.decoder.transformer.get_submodule(name).weight.float()
        base = base_only.decoder.transformer.get_submodule(name).weight.float()
        rounded = transformer.get_submodule(name).weight.dequantize().float()
        assert relative(rounded, merged) < 0.05, name
        if name.endswith(".base_layer"):  # an adapted projection: the adapter moved the weight far more
            assert relative(base, merged) > 0.2, name
    # and the decoder's output follows the bf16 decoder's, a float8 step away
    out, ref = decoder_output(renderer.decoder), decoder_output(reference.decoder)
    assert torch.isfinite(out).all()
    assert 1e-3 < relative(out, ref) < 0.05


def test_the_guidance_replica_is_quantized_on_its_own(cpu_float8, monkeypatch):
    """The replica is copied from the bf16 decoder and quantized where it lives (not a deep copy of float8
    weights), and holds the same float8 values and scales: both branches compute what one device would."""
    from animegamer.diffusion import cfg_parallel

    copied = []
    real_replicate = cfg_parallel.replicate

    def spy(decoder, device):
        copied.append(sum(isinstance(p, Float8Tensor) for p in decoder.parameters()))
        return real_replicate(decoder, device)

    monkeypatch.setattr("animegamer.game.models.replicate", spy)  # the name the loader calls
    model, _, renderer_for_play = merged_renderer("tensorwise")
    renderer, replica = renderer_for_play(model, "cpu", torch.bfloat16, replica_device="cpu")
    assert copied == [0]  # copied before any weight was float8
    assert replica is not None and replica is not renderer.decoder
    ours = dict(renderer.decoder.named_parameters())
    theirs = dict(replica.named_parameters())
    assert ours.keys() == theirs.keys()
    quantized = [n for n, p in theirs.items() if isinstance(p, Float8Tensor)]
    assert len(quantized) == 12 and all(isinstance(ours[n], Float8Tensor) for n in quantized)
    for name in quantized:
        assert ours[name].qdata is not theirs[name].qdata
        assert torch.equal(ours[name].qdata.view(torch.uint8), theirs[name].qdata.view(torch.uint8))
        assert torch.equal(ours[name].scale, theirs[name].scale)


def test_quantize_for_play_names_only_the_weights_it_stored(cpu_float8):
    """torchao leaves a weight ``torch._scaled_mm`` cannot take (a size not a multiple of 16) in its dtype:
    such a linear is not reported as float8."""
    block = nn.ModuleDict({"transformer_blocks": nn.ModuleList([nn.ModuleDict({
        "ff": nn.ModuleDict({"net": nn.ModuleList([nn.ModuleDict({"proj": nn.Linear(32, 48)}), nn.Identity(),
                                                   nn.Linear(48, 40)])})})])}).bfloat16()
    assert fp8.quantize_for_play(block, "tensorwise") == ["transformer_blocks.0.ff.net.0.proj"]
    assert not isinstance(block.transformer_blocks[0].ff.net[2].weight, Float8Tensor)  # 40 rows: left as it was


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rowwise_play_refuses_other_dtypes_than_bfloat16(dtype, cpu_float8):
    dec = tiny_cfg("model.decoder.fp8=rowwise").model.decoder
    assert fp8.check_play_fp8(dec, [torch.device("cuda")], dtype) == [
        f"model.decoder.fp8='rowwise' plays with bfloat16 weights (torchao's per-row float8), not "
        f"{str(dtype).removeprefix('torch.')}; play in bfloat16 or use tensorwise"]
    assert fp8.check_play_fp8(dec, [torch.device("cuda")], torch.bfloat16) == []
    assert fp8.check_play_fp8(replace_fp8(dec, "tensorwise"), [torch.device("cuda")], dtype) == []
    model, _, renderer_for_play = merged_renderer("rowwise")
    with pytest.raises(ConfigError, match="plays with bfloat16 weights"):
        renderer_for_play(model, "cpu", dtype)


def replace_fp8(dec, recipe: str):
    from dataclasses import replace

    return replace(dec, fp8=recipe)


def test_play_without_fp8_keeps_bf16_weights():
    model, off, renderer_for_play = merged_renderer("off")
    renderer, _ = renderer_for_play(model, "cpu", torch.bfloat16)
    assert not any(isinstance(p, Float8Tensor) for p in renderer.parameters())


def test_building_for_play_leaves_the_training_conversion_out(cpu_float8):
    from torchao.float8.float8_linear import Float8Linear

    from animegamer.models.reconstruction import build_reconstruction

    model = build_reconstruction(tiny_cfg("model.decoder.fp8=tensorwise"), with_lora=True, play=True)
    assert not any(isinstance(m, Float8Linear) for m in model.modules())


def test_game_loader_refuses_fp8_on_cpu_before_building(monkeypatch):
    from animegamer.game.models import load_game_models

    monkeypatch.setattr("animegamer.game.models.build_reconstruction",
                        lambda *a, **k: pytest.fail("built before refusing"))
    with pytest.raises(ConfigError) as refused:
        load_game_models(tiny_cfg("model.decoder.fp8=rowwise"), None, None, LEVEL_FLOW, device="cpu")
    assert "model.decoder.fp8='rowwise': float8 matmuls need a CUDA GPU (this run plays on cpu); set " \
        "model.decoder.fp8=off" in str(refused.value)


def test_game_turn_benchmark_plays_with_the_loaders_fp8(monkeypatch, cpu_float8):
    """benchmarks/game_turn.py builds its renderer through ``renderer_for_play``: ``--fp8`` takes effect."""
    from argparse import Namespace
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import game_turn

    args = Namespace(tokenizer=None, attention=None, tiny=True, compile=False, mllm_compile=False,
                     vae_cudnn_benchmark=False, vae_compile=False, compile_mode="default", cache=None, fp8="tensorwise",
                     device="cpu", dtype=torch.bfloat16)
    models = game_turn.build_framework(args, game_turn.compose(args))
    assert sum(isinstance(p, Float8Tensor) for p in models.renderer.parameters()) == 12
