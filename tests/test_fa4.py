"""FlashAttention-4 in SDPA's flash slot (``model.*.attention_backends=[fa4]``, models/attention_kernels.py).

On CPU: the refusals and their messages, the one process-wide flash kernel shared by both models, and
the registration itself: our shim in front of a stand-in ``flash_attn.cute`` is what PyTorch's FA4
adapter is pointed at and accepts, and what it unpacks. Speed and deviation of the real kernels on a
Hopper GPU: benchmarks/attention_kernels.py (benchmarks/README.md, "Attention kernels").
"""
from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from animegamer.models.checks import check_attention
from animegamer.config.compose import compose_config
from animegamer.models import attention_kernels as kernels
from fake_gpu_helpers import fake_gpu, tiny_cfg

TORCH_HAS_ADAPTER = importlib.util.find_spec(kernels.TORCH_FA4_ADAPTER) is not None


def tiny_model(*overrides: str):
    return tiny_cfg(*overrides).model


@pytest.fixture
def fake_fa4(monkeypatch):
    """A stand-in ``flash_attn.cute.interface`` whose kernels return what flash-attn-4 4.0.0b36's do:
    five results forward (out, lse, and three None), three backward; records the calls."""
    calls = []
    interface = types.ModuleType("flash_attn.cute.interface")

    def fwd(q, k, v, **kwargs):
        calls.append(("fwd", kwargs))
        return q + 1, torch.zeros(q.shape[:-1]), None, None, None

    def bwd(q, k, v, out, dout, lse, **kwargs):
        calls.append(("bwd", kwargs))
        return dout, dout * 2, dout * 3

    interface._flash_attn_fwd, interface._flash_attn_bwd = fwd, bwd
    cute = types.ModuleType("flash_attn.cute")
    cute.interface = interface
    package = types.ModuleType("flash_attn")
    package.cute = cute
    for name, module in (("flash_attn", package), ("flash_attn.cute", cute), ("flash_attn.cute.interface", interface)):
        module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, kernels.FA4_SHIM, raising=False)
    return calls


# --------------------------------------------------------------------------- refusals
def test_fa4_is_a_known_name_and_off_by_default():
    model = tiny_model()
    assert "fa4" in kernels.ATTENTION_BACKENDS
    assert kernels.FA4 not in model.decoder.attention_backends
    assert check_attention(model) == []


def test_refused_without_the_package(monkeypatch):
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    real = kernels.importlib.util.find_spec
    monkeypatch.setattr(kernels.importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("flash_attn") else real(name, *a))
    problems = check_attention(tiny_model("model.decoder.attention_backends=[fa4,cudnn]"))
    if TORCH_HAS_ADAPTER:
        assert problems == ["model.decoder.attention_backends=['fa4', 'cudnn']: fa4 (FlashAttention-4) needs the "
                            "flash-attn-4 package (pip install '.[fa4]'); flash_attn.cute is not importable"]
    else:
        assert len(problems) == 1 and "PyTorch 2.11 or newer" in problems[0]


@pytest.mark.skipif(not TORCH_HAS_ADAPTER, reason="this PyTorch has no FA4 adapter")
def test_refused_without_a_gpu_and_below_hopper(monkeypatch, fake_fa4):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = tiny_model("model.decoder.attention_backends=[fa4]")
    assert check_attention(model) == ["model.decoder.attention_backends=['fa4']: fa4 (FlashAttention-4) needs a "
                                      "CUDA GPU (found none)"]
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    assert check_attention(model) == ["model.decoder.attention_backends=['fa4']: fa4 (FlashAttention-4) has kernels "
                                      "for compute capability 9.x and 10.x (Hopper, Blackwell); NVIDIA A100 has 8.0"]
    for capability in ((9, 0), (10, 0)):
        fake_gpu(monkeypatch, capability)
        assert check_attention(model) == []


@pytest.mark.skipif(not TORCH_HAS_ADAPTER, reason="this PyTorch has no FA4 adapter")
def test_one_flash_kernel_per_process(monkeypatch, fake_fa4):
    fake_gpu(monkeypatch, (9, 0))
    both = check_attention(tiny_model("model.decoder.attention_backends=[fa4,flash]"))
    assert both == ["model.decoder.attention_backends=['fa4', 'flash'] names both flash and fa4: fa4 replaces the "
                    "flash kernel for the whole process, so keep one of them"]
    # the decoder's default order names flash: an MLLM on fa4 would swap it under the decoder
    mixed = check_attention(tiny_model("model.mllm.attention_backends=[fa4]"))
    assert mixed == ["model.mllm.attention_backends names fa4 and model.decoder.attention_backends names flash: fa4 "
                     "replaces the flash kernel for the whole process, so name fa4 in both or flash in neither"]
    assert check_attention(tiny_model("model.mllm.attention_backends=[fa4]",
                                      "model.decoder.attention_backends=[cudnn,fa4]")) == []


def test_the_evaluation_pass_checks_attention_too(tmp_path):
    from animegamer.evaluation.preflight import validate_eval_run
    from animegamer.config.validate import ConfigError

    cfg = compose_config("evaluate", ["model=tiny", f"data.root={tmp_path}", "model.decoder.attention_backends=[fa4,flash]"])
    with pytest.raises(ConfigError) as caught:
        validate_eval_run(cfg)
    assert "model.decoder.attention_backends=['fa4', 'flash'] names both flash and fa4: fa4 replaces the flash kernel " \
           "for the whole process, so keep one of them" in caught.value.problems


def test_activation_refuses_where_fa4_cannot_run(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(kernels, "fa4_problem", lambda device=None: "needs a CUDA GPU (found none)")
    with pytest.raises(RuntimeError, match="attention backend fa4: FlashAttention-4 needs a CUDA GPU"):
        kernels.activate_fa4()
    # on CPU the kernel preference is not entered at all, so a CPU run of an fa4 config never activates it
    with kernels.attention_kernels(["fa4"], on_cuda=False):
        pass


# --------------------------------------------------------------------------- the registration
@pytest.mark.skipif(not TORCH_HAS_ADAPTER, reason="this PyTorch has no FA4 adapter")
def test_shim_gives_the_adapter_what_it_unpacks(fake_fa4):
    shim = importlib.import_module(kernels.FA4_SHIM)
    q = torch.randn(1, 8, 2, 4)
    out, lse = shim._flash_attn_fwd(q, q, q, softmax_scale=0.5, return_lse=True)  # the adapter's unpacking
    assert torch.equal(out, q + 1) and lse.shape == (1, 8, 2)
    dq, dk, dv = shim._flash_attn_bwd(q, q, q, out, q, lse, softmax_scale=0.5)
    assert torch.equal(dk, q * 2) and torch.equal(dv, q * 3)
    assert [name for name, _ in fake_fa4] == ["fwd", "bwd"] and fake_fa4[0][1]["softmax_scale"] == 0.5
    adapter = importlib.import_module(kernels.TORCH_FA4_ADAPTER)
    assert adapter._fa4_import_module.__wrapped__(kernels.FA4_SHIM) is shim  # the adapter's own check passes


@pytest.mark.skipif(not TORCH_HAS_ADAPTER, reason="this PyTorch has no FA4 adapter")
def test_activation_registers_our_shim_once(monkeypatch, fake_fa4):
    from torch.nn import attention

    monkeypatch.setattr(kernels, "fa4_problem", lambda device=None: None)
    registered = []
    monkeypatch.setattr(attention, "register_flash_attention_impl",
                        lambda impl, register_fn: registered.append((impl, register_fn)))
    active = []
    monkeypatch.setattr(attention, "activate_flash_attention_impl", active.append)
    monkeypatch.setattr(attention, "current_flash_attention_impl",
                        lambda: active[-1] if active else None)
    kernels.activate_fa4()
    kernels.activate_fa4()  # already active: nothing more
    assert active == [kernels.FA4_IMPL] and len(registered) == 1
    impl, register_fn = registered[0]
    assert impl == kernels.FA4_IMPL and register_fn.keywords == {"module_path": kernels.FA4_SHIM}


def test_fa4_takes_sdpa_flash_slot(monkeypatch):
    """``attention_kernels`` on CUDA inputs: fa4 activates and orders SDPA's flash kernel where it stands."""
    from torch.nn.attention import SDPBackend

    activated, orders = [], []
    monkeypatch.setattr(kernels, "activate_fa4", lambda: activated.append(True))
    import torch.nn.attention as attention

    monkeypatch.setattr(attention, "sdpa_kernel", lambda backends, set_priority: orders.append(backends))
    kernels.attention_kernels(["cudnn", "fa4"], on_cuda=True)
    assert activated == [True] and orders == [[SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]]
    kernels.attention_kernels(["cudnn", "efficient"], on_cuda=True)
    assert activated == [True]  # no fa4 named: nothing swapped

