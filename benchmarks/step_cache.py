"""The sampler's step cache (``model.diffusion.cache=first_block``) against uncached sampling, on one GPU.

    python benchmarks/step_cache.py                          # paper sizes, CUDA (~3 min on an H200)
    python benchmarks/step_cache.py --thresholds 0.05 0.1    # other thresholds
    python benchmarks/step_cache.py --tiny                   # tiny config on CPU: a smoke test

The decoder is benchmarks/phase_a.py's framework build (``experiment=paper_a_joint``, random weights,
bf16, latents (1, 5, 16, 60, 90) = 17 frames at 480x720), sampled as ``ReconstructionModel.reconstruct``
does (CFG as one batch of 2, ``--steps`` DPM++ steps, the same noise every time), eager, with its
blocks compiled (``--compile blocks``) or its whole transformer compiled as ``model.decoder.compile=true``
does, what the game runs (``--compile whole``). Per row: seconds per sample (median of ``--repeats`` after one
warm-up), the share of steps whose later blocks ran (counted on the last block's attention), and the
latents' relative L2 against the uncached sample. The yardstick beside it: the uncached sample with
flash attention tried before cuDNN (same maths, other kernels): bf16's own run-to-run deviation.

Random weights decide differently from trained ones which steps change little, so the skipped share
here is not a trained decoder's; the known-answer benchmark measures the cache on a trained one
(``--stage eval:model.diffusion.cache=first_block``, docs/known-answer.md). Output:
``$OUT/step_cache.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from animegamer.utils.text import doc_summary

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a bare checkout (the GPU machine) has no installed package
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import fp8_decoder as fp8  # noqa: E402  (benchmarks/ on sys.path)
import phase_a as bench_a  # noqa: E402
from _device import run_stamp  # noqa: E402

UNCACHED = "none"


@torch.no_grad()
def timed_sample(built, clips, diffusion, device, repeats: int, count_steps: bool = True) -> dict:
    """Latents of the last of ``repeats`` + 1 samples (all from the same noise), the median seconds after
    the first, and how many steps ran the later blocks (last block's attention calls per sample; None
    without ``count_steps``: inside a compiled block the hook is traced, not called, and counts nothing)."""
    decoder = built.module.model.decoder
    calls: list[int] = []
    hook = decoder.transformer.transformer_blocks[-1].attn1.register_forward_hook(lambda *_: calls.append(1))
    seconds, computed = [], []
    try:
        for _ in range(repeats + 1):
            calls.clear()
            generator = torch.Generator(device="cpu").manual_seed(fp8.SAMPLE_SEED)
            start = time.perf_counter()
            latents = built.module.model.reconstruct(clips, diffusion, generator, torch.bfloat16)
            fp8.sync(device)
            seconds.append(time.perf_counter() - start)
            computed.append(len(calls))
    finally:
        hook.remove()
    return {"latents": latents.float().cpu(), "seconds": statistics.median(seconds[1:] or seconds), "first_s": seconds[0],
            "steps_computed": computed[-1] if count_steps else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=doc_summary(__doc__))
    ap.add_argument("--tiny", action="store_true", help="tiny config on CPU (smoke test)")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    ap.add_argument("--steps", type=int, default=None, help="DPM++ steps (default 50; tiny 5)")
    ap.add_argument("--repeats", type=int, default=None, help="timed samples per row (default 3; tiny 1)")
    ap.add_argument("--compile", default="none", choices=("none", "blocks", "whole"),
                    help="whole: the transformer compiled as model.decoder.compile=true does (what the game runs)")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "outputs" / "benchmarks")))
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.tiny else "cuda")
    steps = args.steps or (5 if args.tiny else 50)
    repeats = args.repeats or (1 if args.tiny else 3)
    cfg = bench_a.run_config(args.tiny)
    cfg = replace(cfg, model=replace(cfg.model, decoder=replace(cfg.model.decoder, attention_backends=fp8.CUDNN_FIRST)))
    shapes = bench_a.shapes_of(cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"env": {**run_stamp(), "torch": torch.__version__, "device": str(device), "steps": steps,
                      "repeats": repeats, "compile": args.compile, "shapes": shapes.__dict__ | {"seq": shapes.seq}},
              "rows": {}}
    print(json.dumps(report["env"]), flush=True)
    built = fp8.build(cfg, shapes, device, fp8.BF16, args.tiny)
    if args.compile != "none":
        fp8.compile_in_place(built, args.compile)
    built.module.eval()
    clips = built.module.to_clip_batch(bench_a.synthetic_batch(shapes, device, torch.bfloat16))
    base = replace(cfg.model.diffusion, sampling_steps=steps)
    eager = args.compile == "none"
    plain = timed_sample(built, clips, base, device, repeats, eager)
    # Compiled blocks keep the kernels they were traced with (the attention preference is not guarded):
    # there the yardstick would compare a sample with itself, so it comes from the eager run only.
    yardstick = None
    if eager:
        fp8.with_attention(built.module.model.decoder, fp8.FLASH_FIRST)
        other_kernels = timed_sample(built, clips, base, device, 0)
        fp8.with_attention(built.module.model.decoder, fp8.CUDNN_FIRST)
        yardstick = fp8.relative(other_kernels["latents"], plain["latents"])
    report["yardstick_rel_l2_flash_first_vs_cudnn_first"] = yardstick
    variants = [(UNCACHED, base)] + [(f"first_block {t:g}", replace(base, cache="first_block", cache_threshold=t))
                                     for t in args.thresholds]
    for name, diffusion in variants:
        found = plain if name == UNCACHED else timed_sample(built, clips, diffusion, device, repeats, eager)
        row = {"seconds": found["seconds"], "first_s": found["first_s"], "steps_computed": found["steps_computed"],
               "speedup": plain["seconds"] / found["seconds"],
               "rel_l2_vs_uncached": fp8.relative(found["latents"], plain["latents"])}
        report["rows"][name] = row
        counted = "?" if row["steps_computed"] is None else row["steps_computed"]
        print(f"{name:>18}: {row['seconds']:.3f} s per sample ({row['speedup']:.2f}x), "
              f"{counted}/{steps} steps computed, rel L2 {row['rel_l2_vs_uncached']:.4f}", flush=True)
        (out / "step_cache.json").write_text(json.dumps(report, indent=1))
    print("yardstick (flash vs cuDNN first, uncached): " + ("eager runs only" if yardstick is None
                                                            else f"rel L2 {yardstick:.4f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
