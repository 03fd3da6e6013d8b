"""Helpers the GPU benchmarks share: building on the device, the two MFU denominators, the plain
side's attention preference, the best-plain comparison and the run's stamp (date, commit)."""
from __future__ import annotations

import contextlib
import datetime
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Iterable, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]

# Dense bf16 tensor-core rate of the vendor's datasheet, TFLOP/s, by the name torch reports. The H100
# SXM and the H200 share it: the datasheet's 1,979 TFLOP/s is "with sparsity", half of it dense.
DATASHEET_DENSE_BF16_TFLOPS = {"NVIDIA H200": 989.0, "NVIDIA H100 80GB HBM3": 989.0}
PEAK_MATMUL_SIZE = 8192  # n of the n x n x n bf16 products that measure the matmul ceiling
PEAK_MATMUL_SIZE_CPU = 256  # a CPU smoke test only checks the code path
PEAK_WARMUP, PEAK_REPS = 3, 20
# The environment variables that name the code measured where the GPU host has no .git to read the commit from.
COMMIT_ENV, TREE_ENV = "BENCH_COMMIT", "BENCH_TREE"
# The official tokenizer (vocabulary 32,284) gives paper-size MLLM runs their token counts and LM head:
# looked for where scripts/device_wheels.sh puts it (copied to the GPU host with the wheels), then in ../shared.
TOKENIZER_PLACES = (ROOT / ".device_wheels" / "animegamer_tokenizer",
                    ROOT.parent / "shared" / "reference" / "animegamer_tokenizer")
BYTE_TOKENIZER = "byte"  # --tokenizer byte: the byte tokenizer of random builds, asked for by name


def default_tokenizer() -> str:
    """The first of :data:`TOKENIZER_PLACES` that exists (else the first: the error then names it)."""
    return str(next((p for p in TOKENIZER_PLACES if p.is_dir()), TOKENIZER_PLACES[0]))


def add_tokenizer_argument(parser) -> None:
    """``--tokenizer``, the same in every paper-size MLLM benchmark; :func:`official_tokenizer` checks it."""
    parser.add_argument("--tokenizer", default=default_tokenizer(),
                        help=f"official tokenizer folder (vocabulary 32,284), or '{BYTE_TOKENIZER}'")


def official_tokenizer(given, tiny: bool, needed: bool = True) -> str:
    """The tokenizer folder of a paper-size run, or '' (the byte tokenizer) for tiny runs, ``--tokenizer
    byte`` and runs that build no MLLM (``needed`` false). A missing folder stops the benchmark: falling
    back silently gave figures of another vocabulary and other token counts, beside runs with the official
    one (2026-12-01)."""
    if tiny or not needed or str(given) == BYTE_TOKENIZER:
        return ""
    if not given or not Path(given).is_dir():
        raise SystemExit(f"--tokenizer {given}: no such folder. Paper-size MLLM figures need the official tokenizer "
                         f"(vocabulary 32,284; scripts/device_wheels.sh copies it into .device_wheels); "
                         f"--tokenizer {BYTE_TOKENIZER} runs the byte tokenizer of random builds instead")
    return str(Path(given).resolve())


@contextlib.contextmanager
def building(device: str, dtype: torch.dtype):
    """Build weights directly on the device in the target dtype (a 7B model in float32 on CPU is slow),
    the framework's seeded random weights included (nothing rebuilds a benchmark's weights elsewhere)."""
    from animegamer.utils.randomness import draw_on_caller_device

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), draw_on_caller_device():
            yield
    finally:
        torch.set_default_dtype(previous)


def measure_bf16_peak(device) -> dict:
    """The bf16 matmul ceiling measured here: median of ``PEAK_REPS`` n^3 products on random data
    (never zeros: they run faster) after ``PEAK_WARMUP``, timed with CUDA events."""
    device = torch.device(device)
    n = PEAK_MATMUL_SIZE if device.type == "cuda" else PEAK_MATMUL_SIZE_CPU
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(PEAK_WARMUP):
        torch.matmul(a, b, out=out)
    times = []
    for _ in range(PEAK_REPS):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b, out=out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            torch.matmul(a, b, out=out)
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"n": n, "median_s": med, "tflops": 2 * n ** 3 / med / 1e12, "max_tflops": 2 * n ** 3 / min(times) / 1e12}


def datasheet_tflops(device) -> Optional[float]:
    """The datasheet's dense bf16 TFLOP/s for this GPU, or None (CPU, or a GPU not in the table)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return DATASHEET_DENSE_BF16_TFLOPS.get(torch.cuda.get_device_name(device))


def peaks(device) -> dict:
    """Both MFU denominators: ``measured`` (this run's matmul ceiling, TFLOP/s) and ``datasheet``."""
    matmul = measure_bf16_peak(device)
    return {"measured_tflops": matmul["tflops"], "datasheet_tflops": datasheet_tflops(device), "matmul": matmul}


def mfu(flops: float, seconds: float, peak: dict) -> dict:
    """Model FLOPs per second over each denominator: ``mfu`` against the measured matmul peak,
    ``mfu_datasheet`` against the datasheet's dense bf16 figure (None where there is none)."""
    rate = flops / seconds
    sheet = peak.get("datasheet_tflops")
    return {"mfu": rate / (peak["measured_tflops"] * 1e12),
            "mfu_datasheet": rate / (sheet * 1e12) if sheet else None}


def prefer_cudnn_attention(device="cuda"):
    """What a plain user writes to prefer cuDNN's fused attention (PyTorch's own order tries flash
    first): every SDPA kernel stays allowed, cuDNN is tried first. A no-op off CUDA."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH], set_priority=True)


def compare(framework: dict, plain: Iterable[dict], seconds_key: str, name_key: str = "name") -> dict:
    """The framework's row against the fastest plain row (the best plain configuration) and every
    other plain row: ``speedup_vs_best_plain`` > 1 means the framework is faster."""
    rows = sorted((r for r in plain if r.get(seconds_key)), key=lambda r: r[seconds_key])
    if not rows or not framework.get(seconds_key):
        return {}
    f = framework[seconds_key]
    return {"framework": framework[name_key], "framework_s": f, "best_plain": rows[0][name_key],
            "best_plain_s": rows[0][seconds_key], "speedup_vs_best_plain": rows[0][seconds_key] / f,
            "speedup_vs": {r[name_key]: r[seconds_key] / f for r in rows}}


def run_stamp() -> dict:
    """Date and commit of this run. On a GPU host without .git the caller passes the commit and
    the state of the working tree in ``BENCH_COMMIT`` / ``BENCH_TREE``."""
    commit, tree = os.environ.get(COMMIT_ENV), os.environ.get(TREE_ENV)
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True, check=True).stdout.strip()
            changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                     capture_output=True, text=True, check=True).stdout.splitlines()
            tree = f"{len(changed)} tracked files changed" if changed else "clean"
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    return {"date": datetime.date.today().isoformat(), "commit": commit, "tree": tree or "unknown"}
