"""FP8 matmuls for the decoder's frozen base weights (``model.decoder.fp8``, models/fp8.py).

On CPU: the refusals and their messages, which linears the conversion picks on the tiny preset, and
torchao's emulation (float8 casts, float32 matmuls) running forward and backward close to float32.
Speed and the deviation of real float8 kernels are measured by benchmarks/fp8_decoder.py on a GPU.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

from animegamer.config.validate import ConfigError
from animegamer.models import fp8
from fake_gpu_helpers import fake_gpu, tiny_cfg

torchao = pytest.importorskip("torchao")
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

LAYERS = 2  # model=tiny's decoder.num_layers
PER_BLOCK = len(fp8.BLOCK_TARGETS)
LORA_TARGETS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0")


# --------------------------------------------------------------------------- refusals
def test_off_needs_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fp8.check_decoder_fp8(tiny_cfg().model.decoder) == []


def test_unknown_recipe_is_named():
    dec = replace(tiny_cfg().model.decoder, fp8="e5m2")
    assert fp8.check_decoder_fp8(dec) == [f"model.decoder.fp8='e5m2' is not one of {fp8.FP8_RECIPES}"]


def test_refused_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    problems = fp8.check_decoder_fp8(replace(tiny_cfg().model.decoder, fp8="tensorwise"))
    assert problems == ["model.decoder.fp8='tensorwise': float8 matmuls need a CUDA GPU (found none); "
                        "set model.decoder.fp8=off"]


def test_refused_below_capability_8_9(monkeypatch):
    dec = replace(tiny_cfg().model.decoder, fp8="rowwise")
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    assert fp8.check_decoder_fp8(dec) == [
        "model.decoder.fp8='rowwise': float8 matmuls need CUDA compute capability >= 8.9 (Ada, Hopper or newer); "
        "NVIDIA A100 has 8.0; set model.decoder.fp8=off"]
    fake_gpu(monkeypatch, (8, 9))
    assert fp8.check_decoder_fp8(dec) == []
    fake_gpu(monkeypatch, (9, 0))
    assert fp8.check_decoder_fp8(dec) == []


def test_refused_without_torchao(monkeypatch):
    fake_gpu(monkeypatch, (9, 0))
    real = fp8.importlib.util.find_spec
    monkeypatch.setattr(fp8.importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    problems = fp8.check_decoder_fp8(replace(tiny_cfg().model.decoder, fp8="tensorwise"))
    assert problems == ["model.decoder.fp8='tensorwise' needs torchao: pip install 'animegamer[fp8]' (or torchao), "
                        "or set model.decoder.fp8=off"]


def test_refused_when_widths_are_not_multiples_of_16(monkeypatch):
    fake_gpu(monkeypatch, (9, 0))
    # hidden 2 x 12 = 24 (not a multiple of 16); feed-forward 4 x 24 = 96 (is)
    dec = replace(tiny_cfg().model.decoder, fp8="tensorwise", attention_head_dim=12)
    assert fp8.check_decoder_fp8(dec) == [
        "model.decoder.fp8='tensorwise': the hidden (num_attention_heads x attention_head_dim) is 24, not a "
        "multiple of 16 (torch._scaled_mm needs both sizes of a float8 weight to be)"]
    dec = replace(dec, attention_head_dim=10)  # 20 and 80: only 20 is refused
    assert len(fp8.check_decoder_fp8(dec)) == 1


def test_validation_pass_composes_the_check(monkeypatch):
    from animegamer.models.checks import check_kernels

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = tiny_cfg("model.decoder.fp8=tensorwise").model
    assert [p for p in check_kernels(model) if "fp8" in p] == [
        "model.decoder.fp8='tensorwise': float8 matmuls need a CUDA GPU (found none); set model.decoder.fp8=off"]


def test_building_refuses_on_cpu(monkeypatch):
    from animegamer.models.reconstruction import build_reconstruction

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="float8 matmuls need a CUDA GPU"):
        build_reconstruction(tiny_cfg("model.decoder.fp8=rowwise"), with_lora=True)


# --------------------------------------------------------------------------- what is converted
def built(with_lora: bool):
    from animegamer.models.reconstruction import build_reconstruction

    return build_reconstruction(tiny_cfg(), with_lora=with_lora)


@pytest.mark.parametrize("with_lora", [False, True])
def test_conversion_picks_exactly_the_frozen_base_linears(with_lora):
    from animegamer.phases.phase_a import stage_trainable

    model = built(with_lora)
    transformer = model.decoder.transformer
    keys_before = list(model.state_dict())
    names = fp8.convert_to_fp8(transformer, "tensorwise", emulate=True)

    suffix = ".base_layer" if with_lora else ""
    expected = [f"transformer_blocks.{i}.{t}{suffix if t in LORA_TARGETS else ''}"
                for i in range(LAYERS) for t in fp8.BLOCK_TARGETS]
    assert sorted(names) == sorted(expected) and len(names) == LAYERS * PER_BLOCK == 12
    swapped = sorted(n for n, m in transformer.named_modules() if isinstance(m, Float8Linear))
    assert swapped == sorted(expected)
    assert list(model.state_dict()) == keys_before  # exports and checkpoints see the same tensors

    # nothing a phase (a2) trains is converted; LoRA matrices stay plain Linears
    trained = set(stage_trainable(model, "a_joint"))
    converted_params = {f"decoder.transformer.{n}.{p}" for n in swapped for p in ("weight", "bias")}
    assert not trained & converted_params
    lora_linears = [m for n, m in transformer.named_modules() if ".lora_" in n and isinstance(m, nn.Linear)]
    assert len(lora_linears) == (2 * LAYERS * len(LORA_TARGETS) if with_lora else 0)
    assert all(type(m) is nn.Linear for m in lora_linears)
    # the other linears (AdaLN, time and motion-scope embedders, final layer, output) stay plain
    plain = [n for n, m in transformer.named_modules() if type(m) is nn.Linear and ".lora_" not in n]
    assert plain and not any(fp8.converts(n) for n in plain)


def test_merging_lora_folds_into_the_converted_weight():
    model = built(with_lora=True)
    fp8.convert_to_fp8(model.decoder.transformer, "rowwise", emulate=True)
    layer = model.decoder.transformer.transformer_blocks[0].attn1.to_q
    torch.nn.init.normal_(layer.lora_B["default"].weight)
    before = layer.base_layer.weight.detach().clone()
    delta = layer.get_delta_weight("default").detach().clone()
    model.decoder.merge_lora()
    assert isinstance(layer.base_layer, Float8Linear)
    torch.testing.assert_close(layer.base_layer.weight.detach(), before + delta)
    assert delta.abs().max() > 0


def test_compiled_backward_drops_the_frozen_weight_gradient():
    """torchao's backward forms grad_weight even for a frozen weight; compiled, that product is dead code.
    Two linears, the input needing a gradient: the second (plain, trained) has two backward products,
    the float8 one before it one when frozen (input gradient only) and two when trained."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    def backward_products(frozen: bool) -> int:
        found = {}

        def count(gm, _inputs):
            found["mm"] = sum(1 for n in gm.graph.nodes if n.op == "call_function" and "mm" in str(n.target))
            return make_boxed_func(gm.forward)

        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
        net[0].requires_grad_(not frozen)
        torchao.float8.convert_to_float8_training(net, module_filter_fn=lambda _m, fqn: fqn == "0",
                                                  config=fp8.float8_config("tensorwise", emulate=True))
        torch._dynamo.reset()
        compiled = torch.compile(net, backend=aot_autograd(fw_compiler=lambda gm, _i: make_boxed_func(gm.forward),
                                                            bw_compiler=count))
        compiled(torch.randn(16, 32, requires_grad=True)).sum().backward()
        return found["mm"]

    assert backward_products(frozen=True) == 3
    assert backward_products(frozen=False) == 4


# --------------------------------------------------------------------------- emulated numerics
def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_emulated_forward_backward_stays_close(recipe):
    """Forward and the LoRA gradients of the tiny decoder: float8 (emulated) against float32, beside the
    whole decoder in bfloat16 against float32 as the yardstick. Measured (both recipes): output 0.0026
    (bfloat16: 0.0059; the residual stream, embeddings and output layer stay exact under float8),
    LoRA gradients 0.027 (bfloat16: 0.0054)."""
    torch.manual_seed(0)
    model = built(with_lora=True)
    for name, param in model.decoder.named_parameters():
        if ".lora_B." in name:  # non-zero adapters, so LoRA changes the output and gets gradients through A too
            nn.init.normal_(param, std=0.02)
    reference = model.decoder
    converted = copy.deepcopy(reference)
    fp8.convert_to_fp8(converted.transformer, recipe, emulate=True)
    dec = model.decoder.cfg
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(2, 5, dec.in_channels, dec.sample_height, dec.sample_width, generator=g)
    rep = torch.randn(2, reference.rep_tokens, reference.hidden, generator=g)
    timestep, flow = torch.tensor([100, 700]), torch.tensor([1.0, 3.0])

    def run(decoder, dtype):
        decoder = decoder.to(dtype)
        decoder.zero_grad(set_to_none=True)
        out = decoder(latents.to(dtype), timestep, rep.to(dtype), flow)
        out.float().square().mean().backward()
        grads = torch.cat([p.grad.float().flatten() for n, p in decoder.named_parameters() if ".lora_" in n])
        return out.detach().float(), grads

    out32, grad32 = run(reference, torch.float32)
    out8, grad8 = run(converted, torch.float32)
    out16, grad16 = run(copy.deepcopy(reference), torch.bfloat16)
    forward, backward = relative(out8, out32), relative(grad8, grad32)
    assert torch.isfinite(out8).all() and torch.isfinite(grad8).all()
    # the conversion took effect: float8 (3 mantissa bits) rounds the gradients more than bfloat16 (8) ...
    assert forward > 1e-3 and backward > 2 * relative(grad16, grad32), (forward, backward)
    # ... and stays close: well under a per cent on the output, a few per cent on the gradients
    assert forward < 0.01 and backward < 0.06, (forward, backward)
    assert relative(out16, out32) < 0.02


# --------------------------------------------------------------------------- the GPU benchmark, rehearsed
def test_fp8_benchmark_runs_both_variants_on_cpu(tmp_path):
    """benchmarks/fp8_decoder.py --tiny (eager, float8 emulated): both variants sample and train from
    the same weights, and the comparison is written."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": f"{root / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "benchmarks/fp8_decoder.py", "--tiny", "--compile", "none", "--steps", "2",
                           "--sample-steps", "2", "--out", str(tmp_path)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "fp8_decoder.json").read_text())
    assert report["variants"]["bf16"]["float8_linears"] == 0
    assert report["variants"]["fp8"]["float8_linears"] == LAYERS * PER_BLOCK
    compare = report["compare"]
    assert 0 < compare["latents_rel_l2_fp8_vs_bf16"] < 0.05
    assert compare["latents_rel_l2_bf16_vs_bf16_other_order"] == 0  # the CPU has one attention kernel
    assert compare["loss_curve_rel_fp8_vs_bf16"]["steps"] == 2
    assert 0 < compare["loss_curve_rel_fp8_vs_bf16"]["max"] < 0.01


def test_fp8_benchmark_yardstick_runs_another_kernel_than_training():
    """With FA4 (or flash) first, a flash-first yardstick would rerun the same kernel: it goes cuDNN first."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import fp8_decoder

    assert fp8_decoder.yardstick_order(fp8_decoder.CUDNN_FIRST)[0] == "flash"
    for first in ("fa4", "flash"):
        assert fp8_decoder.yardstick_order([first, "cudnn", "efficient", "math"])[0] == "cudnn"
