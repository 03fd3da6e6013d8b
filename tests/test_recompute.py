"""Selective activation checkpointing: every k-th block recomputes in backward, gradients unchanged."""
from __future__ import annotations

import threading

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from animegamer.config.compose import compose_config
from animegamer.models.recompute import checkpoint_every


def test_every_kth_block_runs_twice_and_gradients_are_unchanged():
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(6)])
    x = torch.randn(4, 8)
    blocks(x).square().sum().backward()
    reference = [p.grad.clone() for p in blocks.parameters()]
    blocks.zero_grad()

    assert checkpoint_every(blocks, 2) == 3
    calls = [0] * 6
    for i, block in enumerate(blocks):  # count the inner Linear: the block's own hooks wrap the wrapper
        block[0].register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    blocks(x).square().sum().backward()
    assert calls == [2, 1, 2, 1, 2, 1]  # blocks 0, 2, 4 recomputed in backward
    for got, want in zip((p.grad for p in blocks.parameters()), reference):
        torch.testing.assert_close(got, want)
    names = [n for n, _ in blocks.named_parameters()]
    assert names == [f"{i}.{j}.{w}" for i in range(6) for j in (0,) for w in ("weight", "bias")]

    with torch.no_grad():  # inference: no recomputation, no checkpoint machinery
        calls[:] = [0] * 6
        blocks(x)
        assert calls == [1] * 6
    assert checkpoint_every(blocks, 0) == 0 and not any(hasattr(b, "_animegamer_forward") for b in blocks)


def test_decoder_switch_selects_blocks_and_keeps_the_loss():
    from animegamer.models.decoder import MotionScopeDecoder

    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny"]))
    torch.manual_seed(0)
    decoder = MotionScopeDecoder(cfg.model.decoder, cfg.model.encoder.width, 46)
    blocks = decoder.transformer.transformer_blocks
    latents = torch.randn(1, 5, cfg.model.decoder.in_channels, 8, 12)
    rep, t, flow = torch.randn(1, 46, cfg.model.encoder.width), torch.tensor([500]), torch.tensor([3.0])

    def grads():
        decoder.zero_grad()
        decoder(latents, t, rep, flow).square().mean().backward()
        return {n: p.grad.clone() for n, p in decoder.named_parameters() if p.grad is not None}

    reference = grads()
    decoder.set_gradient_checkpointing(True, every=2)
    assert sum(hasattr(b, "_animegamer_forward") for b in blocks) == -(-len(blocks) // 2)
    got = grads()
    assert got.keys() == reference.keys()
    for name, want in reference.items():
        torch.testing.assert_close(got[name], want, msg=name)
    decoder.set_gradient_checkpointing(False)
    assert not any(hasattr(b, "_animegamer_forward") for b in blocks)


def test_mllm_switch_wraps_every_kth_layer_instead_of_all():
    from animegamer.models.game_mllm import build_mllm

    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny", "phase=b", "model.mllm.gradient_checkpointing=true",
                                                       "model.mllm.gradient_checkpointing_every=2"]))
    model = build_mllm(cfg, 300)
    layers = model.causal_lm.model.layers
    assert [hasattr(layer, "_animegamer_forward") for layer in layers] == [i % 2 == 0 for i in range(len(layers))]
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.causal_lm.modules())


def test_recomputed_decoder_blocks_keep_the_configured_attention_kernels(monkeypatch):
    from attention_helpers import recording_kernel_contexts

    from animegamer.models.decoder import MotionScopeDecoder

    entered = recording_kernel_contexts(monkeypatch)
    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny", "model.decoder.attention_backends=[efficient]"]))
    decoder = MotionScopeDecoder(cfg.model.decoder, cfg.model.encoder.width, 46)
    latents = torch.randn(1, 5, cfg.model.decoder.in_channels, 8, 12)
    rep, t, flow = torch.randn(1, 46, cfg.model.encoder.width), torch.tensor([500]), torch.tensor([3.0])
    blocks = len(decoder.transformer.transformer_blocks)
    for every, recomputed in ((1, blocks), (2, -(-blocks // 2))):
        entered.clear()
        decoder.set_gradient_checkpointing(True, every=every)
        loss = decoder(latents, t, rep, flow).square().mean()
        assert entered == [], every  # nothing entered before the backward recomputes
        loss.backward()
        assert entered == [["efficient"]] * recomputed, every


def _backward_on_another_thread(loss: torch.Tensor, threads: int) -> None:
    """``loss.backward()`` on a thread of its own whose CPU thread count is ``threads``, as the autograd
    engine's CUDA device thread."""
    def run():
        torch.set_num_threads(threads)
        loss.backward()

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()


@pytest.mark.parametrize("pinned", [True, False])
def test_compiled_layers_recompute_with_the_thread_count_of_their_forward(pinned):
    """On CUDA, backward runs on the autograd engine's own thread, whose CPU thread count need not be the
    main thread's (Lightning lowers the main thread's); Dynamo guards on that count. Unpinned, each
    recomputation compiled a second graph, which once a batch shape changed saved its tensors in another
    order than the forward's (``CheckpointError``, phase (b) on an H200). Here backward runs on a thread
    of its own, as on CUDA."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from animegamer.models.game_mllm import build_mllm
    from animegamer.models.recompute import checkpoint_every

    previous = torch.get_num_threads()
    try:
        cfg = OmegaConf.to_object(compose_config("train", [
            "model=tiny", "phase=b", "model.mllm.gradient_checkpointing=true", "model.mllm.compile=true",
            "model.mllm.lora_dropout=0.05"]))
        model = build_mllm(cfg, 300).train()
        if not pinned:  # the wrappers without the recomputation's context: what ran before
            checkpoint_every(model.causal_lm.model.layers, 1, None)
        torch._dynamo.reset()
        counters.clear()
        for length in (40, 56):  # two shapes: one dynamic graph
            ids = torch.randint(0, 300, (2, length), generator=torch.Generator().manual_seed(length))
            torch.set_num_threads(1)  # the main thread's count, as Lightning sets it for multi-process runs
            loss = model(ids, labels=ids)["loss"]
            _backward_on_another_thread(loss, 2)
            assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)
        assert counters["stats"]["unique_graphs"] == (1 if pinned else 2)
    finally:
        torch.set_num_threads(previous)
