"""SDPA kernel preference, shared by the decoder and the MLLM (``model.*.attention_backends``).

``fa4`` names SDPA's flash slot filled by FlashAttention-4 (package ``flash-attn-4``, CuTe DSL kernels
for Hopper and Blackwell) instead of PyTorch's built-in FlashAttention-2: PyTorch's flash-attention
registry (``torch.nn.attention.activate_flash_attention_impl``) swaps the implementation behind
``scaled_dot_product_attention``'s flash kernel, so every caller of SDPA, compiled graphs included,
runs the same code path as today with another kernel. The swap is process-wide, which is why ``fa4``
and ``flash`` cannot both be named (``check_attention_backends``). PyTorch's own adapter for FA4 is
registered under our name :data:`FA4_IMPL`, pointed at ``models/fa4_shim.py`` (why: its docstring).
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import warnings
from typing import Callable, ContextManager, Optional, Sequence

import torch
from torch import nn

FA4 = "fa4"
ATTENTION_BACKENDS = ("cudnn", "flash", "efficient", "math", FA4)  # the names configs use
ON_CUDA = "_attention_inputs_on_cuda"  # module attribute: did the last forward run on CUDA inputs
FA4_IMPL = "animegamer-fa4"  # our entry in PyTorch's flash-attention registry
FA4_MODULE = "flash_attn.cute"  # what the flash-attn-4 package installs
FA4_SHIM = "animegamer.models.fa4_shim"
TORCH_FA4_ADAPTER = "torch.nn.attention._fa4"
FA4_EXTRA = "fa4"  # setup.cfg's optional extra that installs it
FA4_CAPABILITY_MAJORS = (9, 10)  # Hopper, Blackwell: the architectures FA4 has kernels for
FA4_NOISE = r"Argument aux_data .* cannot be converted to a JitArgument"

logger = logging.getLogger(__name__)


def fa4_problem(device: Optional[torch.device] = None) -> Optional[str]:
    """Why FlashAttention-4 cannot run here (PyTorch, package, GPU), or None."""
    from torch.nn import attention

    if not hasattr(attention, "activate_flash_attention_impl") or importlib.util.find_spec(TORCH_FA4_ADAPTER) is None:
        return (f"needs PyTorch's flash-attention registry and its FA4 adapter ({TORCH_FA4_ADAPTER}, PyTorch 2.11 "
                f"or newer); PyTorch {torch.__version__} has none")
    try:
        found = importlib.util.find_spec(FA4_MODULE) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return f"needs the flash-attn-4 package (pip install '.[{FA4_EXTRA}]'); {FA4_MODULE} is not importable"
    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return "needs a CUDA GPU (found none)"
    index = torch.device(device).index if device is not None else None
    major, minor = torch.cuda.get_device_capability(index)
    if major not in FA4_CAPABILITY_MAJORS:
        return (f"has kernels for compute capability {' and '.join(f'{m}.x' for m in FA4_CAPABILITY_MAJORS)} "
                f"(Hopper, Blackwell); {torch.cuda.get_device_name(index)} has {major}.{minor}")
    return None


def check_attention_backends(key: str, names: Sequence[str]) -> list[str]:
    """``key`` (e.g. ``model.decoder.attention_backends``): ``fa4`` runnable here and not beside ``flash``."""
    if FA4 not in names:
        return []
    if "flash" in names:
        return [f"{key}={list(names)} names both flash and fa4: fa4 replaces the flash kernel for the whole "
                f"process, so keep one of them"]
    problem = fa4_problem()
    return [f"{key}={list(names)}: fa4 (FlashAttention-4) {problem}"] if problem else []


def activate_fa4() -> None:
    """Swap FlashAttention-4 into SDPA's flash kernel (once per process; a no-op once active)."""
    import functools

    from torch.nn import attention

    if attention.current_flash_attention_impl() == FA4_IMPL:
        return
    problem = fa4_problem()
    if problem:
        raise RuntimeError(f"attention backend {FA4}: FlashAttention-4 {problem}")
    # the CuTe DSL warns once per compiled kernel that an argument it is not meant to convert is not
    # convertible (flash-attn-4 4.0.0b36, seen on an H200): noise, not a problem of the run
    warnings.filterwarnings("ignore", message=FA4_NOISE)
    adapter = importlib.import_module(TORCH_FA4_ADAPTER)
    attention.register_flash_attention_impl(
        FA4_IMPL, register_fn=functools.partial(adapter.register_flash_attention_fa4, module_path=FA4_SHIM))
    attention.activate_flash_attention_impl(FA4_IMPL)
    logger.info("SDPA's flash kernel is FlashAttention-4 for the rest of this process")


def attention_kernels(names: Sequence[str], on_cuda: bool, module: Optional[nn.Module] = None):
    """SDPA's kernels in the configured order of preference (CUDA only; CPU, or no names, keeps
    PyTorch's own choice). ``module``: remember ``on_cuda`` there for :func:`recompute_context`."""
    if module is not None:
        setattr(module, ON_CUDA, on_cuda)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not on_cuda or not names:
        return contextlib.nullcontext()
    if FA4 in names:
        activate_fa4()
    kernels = dict(zip(ATTENTION_BACKENDS, (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                                            SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
                                            SDPBackend.FLASH_ATTENTION)))
    return sdpa_kernel([kernels[n] for n in names], set_priority=True)


def recompute_context(names: Sequence[str], module: nn.Module) -> Optional[Callable[[], ContextManager]]:
    """The attention kernels a checkpointed block's recomputation runs under (``None`` when ``names`` is
    empty), for :func:`animegamer.models.recompute.forward_state`.

    A checkpointed block recomputes its forward during backward, outside the ``attention_kernels``
    block its first forward ran in; without this the recomputation would pick PyTorch's own kernel,
    and a kernel that saves other tensors than the first one fails the checkpoint's check.
    """
    if not names:
        return None
    # where the forward's inputs were (set by the module as it enters attention_kernels)
    return lambda: attention_kernels(names, getattr(module, ON_CUDA, False))
