"""The decoder's attention at paper size, kernel by kernel, on one GPU: time, TFLOP/s and deviation.

    python benchmarks/attention_kernels.py            # CUDA; kernels whose package is missing are recorded as such
    python benchmarks/attention_kernels.py --tiny     # CPU smoke test of the code path (math kernel only)

CogVideoX-2B attends jointly over the representation tokens and the video tokens (226 + 6,750 = 6,976
at 17 x 480 x 720) with 30 heads of width 64; attention is 37 % of a sampling step's FLOPs. Shapes are
derived from the composed ``paper_a_joint`` config (``phase_a.shapes_of``), never typed here.

Two workloads: ``sample`` (forward only, batch 2: the CFG batch of a sampling step) and ``train``
(forward and backward, batch 1: phase (a2)'s step). Kernels, each where it runs:

- ``cudnn``, ``flash`` (PyTorch's built-in FlashAttention-2), ``efficient``: SDPA with that one kernel;
- ``fa4_sdpa``: SDPA's flash kernel with FlashAttention-4 activated in PyTorch's dispatcher
  (``torch.nn.attention.activate_flash_attention_impl("FA4")``, package ``flash-attn-4``): what
  ``model.decoder.attention_backends=[fa4]`` does. Activation is process-wide and cannot be undone,
  so it runs after every built-in kernel;
- ``fa4_direct``: ``flash_attn.cute.flash_attn_func`` itself (layout B, L, H, D), to tell the kernel
  from PyTorch's adapter;
- ``sage``: SageAttention 1 (``sageattention``, Triton; INT8 Q K^T, forward only): sampling only.

Time: CUDA events, median of ``--reps`` calls after ``--warmup``. FLOPs: 4 B H L^2 d forward (Q K^T
and P V), backward 2.5x that. Deviation: relative L2 distance of the output (and of dQ, dK, dV for
``train``) from float32 math attention on the same bf16 inputs. ``bf16_peak_tflops``: the matmul
ceiling measured in the same run. Results: ``$OUT/attention_kernels.json`` (or ``--out``), written
after every kernel.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from animegamer.utils.text import doc_summary

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]

import torch  # noqa: E402

from _device import peaks, run_stamp  # noqa: E402
from phase_a import run_config, shapes_of  # noqa: E402

BUILTIN = ("cudnn", "flash", "efficient")
BACKWARD_FLOP_FACTOR = 2.5  # dQ, dK, dV, dP and the recomputed scores: 5 products against the forward's 2
WORKLOADS = {"sample": (2, False), "train": (1, True)}  # name -> (batch, with backward)
SEED = 0


def attention_shapes(tiny: bool) -> dict:
    cfg = run_config(tiny)
    dec, shapes = cfg.model.decoder, shapes_of(cfg)
    return {"heads": dec.num_attention_heads, "head_dim": dec.attention_head_dim, "seq": shapes.seq}


def inputs(batch: int, shape: dict, device: str, grad: bool) -> list[torch.Tensor]:
    """q, k, v and the output's gradient in (B, H, L, d), bf16, unit variance (scores of unit scale
    after 1/sqrt(d)); the same for every kernel."""
    gen = torch.Generator(device).manual_seed(SEED)
    size = (batch, shape["heads"], shape["seq"], shape["head_dim"])
    return [torch.randn(size, generator=gen, device=device, dtype=torch.bfloat16).requires_grad_(grad and n < 3)
            for n in range(4)]


def sdpa_with(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return run


def fa4_direct():
    from flash_attn.cute.interface import flash_attn_func

    def run(q, k, v):  # (B, H, L, d) -> the kernel's (B, L, H, d) and back
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)
    return run


def sage():
    from sageattention import sageattn

    return lambda q, k, v: sageattn(q, k, v, tensor_layout="HND", is_causal=False)


def reference(q, k, v, grad_out=None) -> tuple[torch.Tensor, list]:
    """Float32 math attention on the same inputs: output and, with ``grad_out``, dQ, dK, dV."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q32, k32, v32 = (t.detach().float().requires_grad_(grad_out is not None) for t in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        out = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32)
    grads = list(torch.autograd.grad(out, (q32, k32, v32), grad_out.float())) if grad_out is not None else []
    return out.detach(), grads


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b).norm() / b.norm())


def timed(fn, warmup: int, reps: int, device: str) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def measure(kernel, workload: str, shape: dict, args, device: str, refs: dict) -> dict:
    batch, backward = WORKLOADS[workload]
    q, k, v, grad_out = inputs(batch, shape, device, backward)
    grad_out = grad_out if backward else None
    if workload not in refs:
        refs[workload] = reference(q, k, v, grad_out)
    ref_out, ref_grads = refs[workload]

    def call():
        out = kernel(q, k, v)
        if backward:
            torch.autograd.grad(out, (q, k, v), grad_out)
        return out

    out = kernel(q, k, v)
    row = {"output_rel_l2": rel(out, ref_out)}
    if backward:
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        row.update({f"d{n}_rel_l2": rel(g, r) for n, g, r in zip("qkv", grads, ref_grads)})
    del out
    times = timed(call, args.warmup, args.reps, device)
    flops = 4 * batch * shape["heads"] * shape["seq"] ** 2 * shape["head_dim"] * (1 + (BACKWARD_FLOP_FACTOR
                                                                                      if backward else 0))
    median = statistics.median(times)
    row.update({"median_ms": round(median * 1e3, 3), "min_ms": round(min(times) * 1e3, 3),
                "tflops": round(flops / median / 1e12, 1)})
    if device == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def kernels(device: str):
    """(name, workloads, factory) in the order they must run: FA4's activation last but for sage."""
    from torch.nn.attention import SDPBackend

    builtin = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}
    if device != "cuda":
        return [("math", ("sample", "train"), lambda: sdpa_with(SDPBackend.MATH))]

    def fa4_sdpa():
        from animegamer.models.attention_kernels import activate_fa4

        activate_fa4()
        return sdpa_with(SDPBackend.FLASH_ATTENTION)

    return ([(name, ("sample", "train"), lambda b=b: sdpa_with(b)) for name, b in builtin.items()]
            + [("sage", ("sample",), sage), ("fa4_direct", ("sample", "train"), fa4_direct),
               ("fa4_sdpa", ("sample", "train"), fa4_sdpa)])


def main() -> None:
    ap = argparse.ArgumentParser(description=doc_summary(__doc__))
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "outputs" / "benchmarks")))
    args = ap.parse_args()
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if device == "cpu":
        args.warmup, args.reps = 1, 2
    shape = attention_shapes(args.tiny)
    result = {**run_stamp(), "torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda"
              else "cpu", "shape": shape, "workloads": {k: {"batch": b, "backward": bw} for k, (b, bw) in WORKLOADS.items()},
              "bf16_peak_tflops": round(peaks(device)["measured_tflops"], 1), "kernels": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "attention_kernels.json"
    refs: dict = {}
    for name, workloads, factory in kernels(device):
        entry = result["kernels"].setdefault(name, {})
        try:
            kernel = factory()
        except Exception as error:  # noqa: BLE001 - a missing package or an unsupported GPU is a result
            entry["error"] = f"{type(error).__name__}: {error}"[:600]
            workloads = ()
        for workload in workloads:
            try:
                entry[workload] = measure(kernel, workload, shape, args, device, refs)
            except Exception as error:  # noqa: BLE001
                entry[workload] = {"error": f"{type(error).__name__}: {error}"[:600]}
            if device == "cuda":
                torch.cuda.empty_cache()
            print(name, workload, json.dumps(entry[workload]), flush=True)
        path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
