"""``trainer.fsdp_compute=bf16``: FSDP's MixedPrecision instead of Lightning's autocast.

Lightning refuses FSDP on CPU, so the networks are wrapped with torch's FSDP directly (one gloo rank,
the preset's wrapping and mixed precision): they must compute what the same network converted to
bf16 computes (DeepSpeed's bf16 mode) while the optimizer keeps float32 weights and gradients.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from phase_b_helpers import tiny_b_cfg, write_synthetic_sessions
from test_config_faults import problems_of
from test_encoder_decoder import _decoder, _decoder_inputs, randomize_lora_b
from test_mllm_model import _batch, _model, _randomize

from animegamer.config.compose import compose_config
from animegamer.phases.run import block_types, make_strategy
from animegamer.training.strategies import fsdp_mixed_precision, lightning_precision


@pytest.fixture
def one_rank():
    # An in-memory store: one rank needs no rendezvous, so no port to pick and release
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _cfg(tmp_path, *overrides):
    root = write_synthetic_sessions(tmp_path / "data", sessions=4)
    return tiny_b_cfg(root, tmp_path / "run", "trainer=fsdp", *overrides)[1]


def test_bf16_compute_is_checked(tmp_path):
    from animegamer.phases.preflight import validate_train_run

    for overrides, expected in {("trainer=ddp", "trainer.fsdp_compute=bf16"): "applies to trainer.strategy=fsdp only",
                                ("trainer.fsdp_compute=bf16", "trainer.precision=bf16-true"): "set trainer.precision=bf16-mixed",
                                ("trainer.fsdp_compute=fp8",): "trainer.fsdp_compute='fp8' is not one of"}.items():
        problems = problems_of(validate_train_run, _cfg(tmp_path, *overrides))
        assert any(expected in problem for problem in problems), problems


def test_bf16_compute_reaches_the_strategy_and_the_trainer(tmp_path):
    cfg = _cfg(tmp_path, "trainer.fsdp_compute=bf16")
    mp = make_strategy(cfg).mixed_precision
    assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)
    assert lightning_precision(cfg) == "32-true"  # no autocast on top
    default = _cfg(tmp_path, "trainer.fsdp_sharding=FULL_SHARD")
    assert make_strategy(default).mixed_precision is None and lightning_precision(default) == "bf16-mixed"


def _fsdp(module, cfg):
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FullyShardedDataParallel(module, device_id=torch.device("cpu"), use_orig_params=True,
                                    auto_wrap_policy=ModuleWrapPolicy(block_types(cfg)),
                                    mixed_precision=fsdp_mixed_precision(cfg))


def _grads(module) -> dict:
    return {n.replace("_fsdp_wrapped_module.", ""): p.grad for n, p in module.named_parameters()
            if p.grad is not None}


def test_decoder_under_bf16_compute_matches_the_bf16_network(tmp_path, one_rank):
    """Phases (a) and (c): float32 inputs, bf16 compute, float32 weights and gradients."""
    model_cfg = OmegaConf.to_object(compose_config("pipeline", ["model=tiny"]).model)
    decoder = _decoder(model_cfg)
    decoder.add_lora()
    randomize_lora_b(decoder)
    reference = copy.deepcopy(decoder).to(torch.bfloat16)
    cfg = _cfg(tmp_path, "trainer.fsdp_compute=bf16")
    cfg = dataclasses.replace(cfg, phase=dataclasses.replace(cfg.phase, name="a_joint"))  # decoder blocks
    wrapped = _fsdp(decoder, cfg)
    inputs = _decoder_inputs(model_cfg.decoder, decoder.rep_tokens, decoder.hidden)

    out = wrapped(**inputs)
    out.float().square().mean().backward()
    expected = reference(**{k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()})
    expected.float().square().mean().backward()

    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    grads, reference_grads = _grads(wrapped), _grads(reference)
    assert grads.keys() == reference_grads.keys() and any("lora_B" in n for n in grads)
    for name, grad in grads.items():
        assert grad.dtype == torch.float32, name  # the optimizer's side stays float32
        torch.testing.assert_close(grad, reference_grads[name].float(), rtol=0, atol=0, msg=name)
    assert all(p.dtype == torch.float32 for p in wrapped.parameters())


def test_mllm_under_bf16_compute_matches_the_bf16_network(tmp_path, one_rank):
    """Phase (b): integer token inputs pass through, float inputs are cast, the losses agree."""
    model_cfg = OmegaConf.to_object(compose_config("pipeline", ["model=tiny"]).model)
    from animegamer.mllm.tokens import TokenIds, add_animegamer_tokens, byte_tokenizer

    tokenizer = byte_tokenizer()
    add_animegamer_tokens(tokenizer)
    vocab = (tokenizer, TokenIds.from_tokenizer(tokenizer))
    model = _model(model_cfg, vocab, lora_dropout=0.0).train()
    _randomize(model)
    reference = copy.deepcopy(model).to(torch.bfloat16)
    wrapped = _fsdp(model, _cfg(tmp_path, "trainer.fsdp_compute=bf16"))
    batch = _batch(model_cfg, vocab)

    out = wrapped(**batch)
    out["loss"].backward()
    expected = reference(**{k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in batch.items()})
    expected["loss"].backward()

    assert out["pred"].dtype == torch.bfloat16
    assert out["loss"].item() == pytest.approx(expected["loss"].item(), rel=1e-6)
    grads, reference_grads = _grads(wrapped), _grads(reference)
    assert grads.keys() == reference_grads.keys() and grads
    for name, grad in grads.items():
        assert grad.dtype == torch.float32, name
        torch.testing.assert_close(grad, reference_grads[name].float(), rtol=0, atol=0, msg=name)
