"""FP8 matmuls for the decoder's frozen base weights (``model.decoder.fp8``) against bf16, on one GPU.

    python benchmarks/fp8_decoder.py                    # paper sizes, CUDA, tensorwise (~3.5 min on an H200, pip install included)
    python benchmarks/fp8_decoder.py --recipe rowwise   # torchao's rowwise scaling instead
    python benchmarks/fp8_decoder.py --compile whole --budget-s 480   # the decoder's own compile (longer)
    python benchmarks/fp8_decoder.py --attention fa4 cudnn efficient math   # FP8 with FlashAttention-4
    python benchmarks/fp8_decoder.py --tiny             # tiny config on CPU, float8 emulated: a smoke test

Needs torchao (``pip install 'animegamer[fp8]'``) besides what benchmarks/phase_a.py needs. Random
weights, no downloads; the phase (a2) step and its paper-size shapes are benchmarks/phase_a.py's
(``build_framework``: ``PhaseA`` from ``experiment=paper_a_joint``, bf16-true, no gradient
checkpointing, latents (1, 5, 16, 60, 90) = 17 frames at 480x720, batch 1). Per variant (bf16, then
fp8 built through ``model.decoder.fp8`` so the conversion is the framework's own):

1. **Sampling** (before any training, so both start from the same seeded weights; eager): latents
   from the same noise with ``--sample-steps`` DPM++ steps, CFG as one batch of 2 (what
   ``ReconstructionModel.reconstruct`` does). bf16 samples twice, the second time through another
   attention kernel (flash before cuDNN; cuDNN first when ``--attention`` puts the flash slot first,
   ``flash`` or ``fa4``): that pair is the run-to-run yardstick (same maths, other kernels). Also the
   loss of one forward at a few fixed timesteps, under both attention orders (the loss yardstick).
2. **Training**: the transformer blocks compiled in place (``--compile blocks``, the default:
   ``block.compile(dynamic=False)``, regional compilation; the 30 identical blocks share one compiled
   graph, so it compiles far faster than the whole transformer, ~100 s per variant in
   benchmarks/phase_a.py; ``dynamo_stats`` in the JSON shows whether they did), then ``--steps`` phase (a2) steps on one fixed random batch, the
   same noise and timesteps per step in both variants (``SampleRandom(seed, step)``). Step time is the
   median of the steps after ``--warmup`` (CUDA events between consecutive steps); MFU = model FLOPs
   of the step (phase_a.model_flops: 3 x forward) / time / the bf16 matmul peak measured in the same
   run (``mfu_datasheet``: over the datasheet's dense bf16 figure): FP8 rows use the same bf16
   denominator, so they can pass what bf16 can reach. Peak memory is ``max_memory_allocated`` since
   the build.

Also, after bf16's samples: the same sample through play's FP8 (the game's and evaluation's path: a copy
with the LoRA merged and the base weights stored in float8 once; GPU only), ``play_fp8`` in the JSON.

Reported: the fp8 step-time speed-up over bf16, the losses' relative deviation per step (max and mean
over the common steps), and the sampled latents' relative L2 (fp8 vs bf16, and bf16 vs bf16 with
the other attention order). ``--budget-s`` bounds the whole run: training of each variant stops early
when its share is spent (both then compare over the steps both ran). Output:
``$OUT/fp8_decoder.json``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from animegamer.utils.text import doc_summary

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a bare checkout (the GPU machine) has no installed package
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import phase_a as bench_a  # noqa: E402  (benchmarks/ on sys.path)
from _device import mfu, peaks, run_stamp  # noqa: E402
from animegamer.models.attention_kernels import FA4  # noqa: E402

BF16, FP8, PLAY = "bf16", "fp8", "play_fp8"
CUDNN_FIRST = ["cudnn", "flash", "efficient", "math"]  # the config's default order
FLASH_FIRST = ["flash", "cudnn", "efficient", "math"]  # the yardstick: same maths, other kernels
FLASH_SLOT = ("flash", FA4)  # fa4 takes SDPA's flash slot: a flash-first yardstick would rerun its kernel
LOSS_TIMESTEPS = (50, 250, 500, 750, 950)  # fixed timesteps of the one-forward loss check
SAMPLE_SEED = 7
COMPILE_CHOICES = ("blocks", "whole", "none")
NO_COMPILE = COMPILE_CHOICES[-1]
DEFAULT_BUDGET_S = 190.0  # the lead's limit is 4 minutes; pip, imports and the config come before the clock
TRAIN_SHARE = 0.45  # of what is left of the budget when a variant's training starts (bf16 first)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def sync(device: torch.device) -> None:
    bench_a.sync(device)


def build(cfg, shapes, device: torch.device, recipe: str, tiny: bool):
    """The phase (a2) module through benchmarks/phase_a.py's framework build, bf16-true, no GC. fp8 on
    CUDA goes through ``model.decoder.fp8`` (the framework's conversion); on CPU (``--tiny``) it is
    converted after the build with torchao's emulation, since the config path refuses CPUs."""
    from animegamer.models.fp8 import convert_to_fp8

    variant = bench_a.Variant(recipe, "framework", mixed=False, gc=False)
    if recipe != BF16 and not tiny:
        cfg = replace(cfg, model=replace(cfg.model, decoder=replace(cfg.model.decoder, fp8=recipe)))
    built = bench_a.build_framework(variant, cfg, shapes, device)
    if recipe != BF16 and tiny:
        convert_to_fp8(built.module.model.decoder.transformer, recipe, emulate=True)
    return built


def yardstick_order(order: list[str]) -> list[str]:
    """The attention order of the yardstick sample: the same maths through another kernel than ``order``'s."""
    return CUDNN_FIRST if order[0] in FLASH_SLOT else FLASH_FIRST


def with_attention(decoder, order: list[str]):
    """The decoder reads ``cfg.attention_backends`` at each forward: swap the order in its config."""
    decoder.cfg = replace(decoder.cfg, attention_backends=list(order))


@torch.no_grad()
def sample_and_loss(built, cfg, shapes, device: torch.device, steps: int, order: list[str]) -> dict:
    """Latents from fixed noise (eager) and the loss of one forward at fixed timesteps."""
    from animegamer.phases.denoising import validation_draw

    module = built.module
    with_attention(module.model.decoder, order)
    module.eval()
    clips = clip_batch(built, shapes, device)
    latents, seconds = timed_sample(module.model, clips, cfg, device, steps)
    losses = []
    for t in LOSS_TIMESTEPS:  # the validation loss: fixed noise per timestep, no CFG dropout
        draw = validation_draw(cfg.seed, t, 0, shapes.batch, device)
        timesteps = torch.full((shapes.batch,), t, dtype=torch.long, device=device)
        losses.append(float(module.diffusion_loss(clips, draw, timesteps, dropout=False)))
    module.train()
    with_attention(module.model.decoder, cfg.model.decoder.attention_backends)  # training's order
    return {"latents": latents, "seconds": seconds, "losses": losses}


def compile_in_place(built, how: str) -> None:
    """``blocks``: regional compilation, every transformer block in place (identical blocks share the
    graph). ``whole``: the transformer, as ``model.decoder.compile=true`` does (~100 s per variant)."""
    torch._dynamo.reset()  # the other variant's graphs out of the cache (and out of its recompile limit)
    transformer = built.module.model.decoder.transformer
    if how == "whole":
        transformer.compile(dynamic=False)
    else:
        for block in transformer.transformer_blocks:
            block.compile(dynamic=False)


def train(built, device: torch.device, steps: int, warmup: int, budget_s: float) -> dict:
    """``steps`` steps (fewer when ``budget_s`` runs out); per-step times from CUDA events."""
    losses, times, first = [], [], None
    events = []
    start = time.perf_counter()
    done = 0
    for i in range(steps):
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            events.append(event)
        t0 = time.perf_counter()
        losses.append(built.step(i).detach())
        done += 1
        if i == 0:
            sync(device)
            first = time.perf_counter() - t0  # compiles here
        if device.type != "cuda":
            times.append(time.perf_counter() - t0)
        if i % 10 == 9:
            sync(device)
            if time.perf_counter() - start > budget_s:
                break
    if device.type == "cuda":
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        events.append(end)
        torch.cuda.synchronize(device)
        times = [events[k].elapsed_time(events[k + 1]) / 1e3 for k in range(done)]
    timed = times[warmup:] or times[-1:]
    return {"steps": done, "first_step_s": first, "median_s": statistics.median(timed), "min_s": min(timed),
            "max_s": max(timed), "wall_s": time.perf_counter() - start, "losses": [float(x) for x in losses]}


def deviation(a: list[float], b: list[float]) -> dict:
    """Per-step |a - b| / |b| over the common steps."""
    n = min(len(a), len(b))
    rel = [abs(x - y) / abs(y) for x, y in zip(a[:n], b[:n]) if y]
    return {"steps": n, "max": max(rel), "mean": statistics.fmean(rel), "last10_mean": statistics.fmean(rel[-10:])}


def clip_batch(built, shapes, device: torch.device):
    return built.module.to_clip_batch(bench_a.synthetic_batch(shapes, device, torch.bfloat16))


def timed_sample(model, clips, cfg, device: torch.device, steps: int) -> tuple[torch.Tensor, float]:
    """``model`` (a ReconstructionModel) sampling ``clips`` from the fixed noise: latents (on the host), seconds."""
    generator = torch.Generator(device="cpu").manual_seed(SAMPLE_SEED)
    t0 = time.perf_counter()
    latents = model.reconstruct(clips, cfg.model.diffusion, generator, torch.bfloat16, steps=steps)
    sync(device)
    seconds = time.perf_counter() - t0
    return latents.float().cpu(), seconds


@torch.no_grad()
def play_sample(built, cfg, shapes, device: torch.device, steps: int, recipe: str) -> dict:
    """The same sample through play's FP8: a copy of the model held as the game holds its renderer
    (``renderer_for_play``: LoRA merged, then ``apply_play_fp8`` stores the base weights in float8 once)."""
    from torchao.quantization import Float8Tensor

    from animegamer.game.models import renderer_for_play

    model = copy.deepcopy(built.module.model)  # a fresh adapter (B = 0): merging it adds nothing
    model.decoder.cfg = replace(model.decoder.cfg, fp8=recipe)
    model, _ = renderer_for_play(model, device, torch.bfloat16)
    stored = sum(isinstance(p, Float8Tensor) for p in model.decoder.transformer.parameters())
    latents, seconds = timed_sample(model, clip_batch(built, shapes, device), cfg, device, steps)
    del model
    return {"latents": latents, "seconds": seconds, "float8_weights": stored}


def play_row(report: dict, built, cfg, shapes, device: torch.device, args) -> dict:
    """``report["variants"][PLAY]`` from :func:`play_sample`; its latents by name, none if it failed (the
    bf16 variant's training goes on either way)."""
    row = report["variants"][PLAY] = {"recipe": args.recipe}
    try:
        play = play_sample(built, cfg, shapes, device, args.sample_steps, args.recipe)
    except Exception as error:  # noqa: BLE001 - keep the other variants' numbers
        traceback.print_exc()
        row["error"] = repr(error)
        return {}
    row.update(sample_s=play["seconds"], float8_weights=play["float8_weights"])
    return {PLAY: play["latents"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=doc_summary(__doc__))
    ap.add_argument("--tiny", action="store_true", help="tiny config on CPU, float8 emulated (smoke test)")
    ap.add_argument("--recipe", default="tensorwise", choices=("tensorwise", "rowwise"))
    ap.add_argument("--steps", type=int, default=None, help="training steps per variant (default 200; tiny 4)")
    ap.add_argument("--warmup", type=int, default=None, help="steps left out of the median (default 5; tiny 1)")
    ap.add_argument("--sample-steps", type=int, default=4, help="DPM++ sampling steps")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall-clock bound of the run")
    ap.add_argument("--attention", nargs="+", default=CUDNN_FIRST, choices=bench_a.ATTENTION_BACKENDS,
                    help="the decoder's attention order for both variants (e.g. fa4 cudnn efficient math: FP8 "
                         "and FlashAttention-4 together)")
    ap.add_argument("--compile", default="blocks", choices=COMPILE_CHOICES,
                    help="blocks (regional, default) | whole (the transformer, as model.decoder.compile) | none")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "outputs" / "benchmarks")))
    args = ap.parse_args(argv)
    clock = time.perf_counter()

    device = torch.device("cpu" if args.tiny else "cuda")
    steps = args.steps if args.steps is not None else (4 if args.tiny else 200)
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 5)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = bench_a.run_config(args.tiny)
    cfg = replace(cfg, model=replace(cfg.model, decoder=replace(cfg.model.decoder, attention_backends=args.attention)))
    shapes = bench_a.shapes_of(cfg)
    import torchao

    env = {**run_stamp(), "torch": torch.__version__, "torchao": torchao.__version__,
           "python": platform.python_version(), "device": str(device),
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
           "recipe": args.recipe, "attention": args.attention,
           "yardstick_attention": yardstick_order(args.attention), "steps": steps, "warmup": warmup,
           "sample_steps": args.sample_steps,
           "compile": args.compile, "shapes": shapes.__dict__ | {"seq": shapes.seq}}
    print(json.dumps(env), flush=True)
    peak = peaks(device)
    flops = bench_a.model_flops(cfg, shapes)
    report = {"env": env, "peak": peak, "flops": flops, "variants": {}, "compare": {}}
    json_path = out / "fp8_decoder.json"

    def save():
        json_path.write_text(json.dumps(report, indent=1))

    samples, curves = {}, {}
    status = 0
    for name, recipe in ((BF16, BF16), (FP8, args.recipe)):
        row: dict = {"recipe": recipe}
        report["variants"][name] = row
        built = None
        try:
            bench_a.cleanup(device)
            t0 = time.perf_counter()
            built = build(cfg, shapes, device, recipe, args.tiny)
            sync(device)
            row["build_s"] = time.perf_counter() - t0
            float8 = [n for n, m in built.module.named_modules() if type(m).__name__ == "Float8Linear"]
            row["float8_linears"] = len(float8)
            print(f"-- {name}: built in {row['build_s']:.1f} s, {len(float8)} Float8Linear", flush=True)
            first = sample_and_loss(built, cfg, shapes, device, args.sample_steps, args.attention)
            samples[name] = first["latents"]
            row.update(sample_s=first["seconds"], fixed_t_losses=first["losses"])
            if name == BF16:
                other = yardstick_order(args.attention)
                second = sample_and_loss(built, cfg, shapes, device, args.sample_steps, other)
                samples["bf16-other"] = second["latents"]
                row["fixed_t_losses_other_order"] = second["losses"]
                if not args.tiny:  # torchao's float8 inference refuses CPUs
                    samples.update(play_row(report, built, cfg, shapes, device, args))
            print(f"   sampled {args.sample_steps} steps in {first['seconds']:.1f} s; fixed-t losses "
                  f"{[round(x, 5) for x in first['losses']]}", flush=True)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            if args.compile != NO_COMPILE:
                compile_in_place(built, args.compile)
            left = args.budget_s - (time.perf_counter() - clock)
            res = train(built, device, steps if name == BF16 else curves.get(BF16, {"steps": steps})["steps"],
                        warmup, left * (TRAIN_SHARE if name == BF16 else 0.9))
            curves[name] = res
            if args.compile != NO_COMPILE:  # one graph per direction when the blocks share it (else: recompiles)
                from torch._dynamo.utils import counters

                row["dynamo_stats"] = dict(counters["stats"])
            med = res["median_s"]
            row.update(res)
            row.update(peak_mem_gib=(torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda"
                                     else None),
                       model_tflops_per_s=flops["step"] / med / 1e12, **mfu(flops["step"], med, peak))
            print(f"   {res['steps']} steps: first {res['first_step_s']:.1f} s, median {med * 1e3:.1f} ms, "
                  f"MFU {row['mfu']:.3f}, peak {row['peak_mem_gib']} GiB; loss[0] {res['losses'][0]:.5f} "
                  f"loss[-1] {res['losses'][-1]:.5f}", flush=True)
        except Exception as error:  # noqa: BLE001 - keep the other variant's numbers
            traceback.print_exc()
            row["error"] = repr(error)
            status = 1
        finally:
            del built
            bench_a.cleanup(device)
        save()

    compare = report["compare"]
    if BF16 in samples and "bf16-other" in samples:
        compare["latents_rel_l2_bf16_vs_bf16_other_order"] = relative(samples["bf16-other"], samples[BF16])
    if FP8 in samples and BF16 in samples:
        compare["latents_rel_l2_fp8_vs_bf16"] = relative(samples[FP8], samples[BF16])
    if PLAY in samples and BF16 in samples:
        compare["latents_rel_l2_play_fp8_vs_bf16"] = relative(samples[PLAY], samples[BF16])
    rows = report["variants"]
    if "fixed_t_losses" in rows.get(FP8, {}) and "fixed_t_losses" in rows[BF16]:
        compare["fixed_t_loss_rel_fp8_vs_bf16"] = deviation(rows[FP8]["fixed_t_losses"], rows[BF16]["fixed_t_losses"])
        compare["fixed_t_loss_rel_bf16_other_order"] = deviation(rows[BF16]["fixed_t_losses_other_order"],
                                                                    rows[BF16]["fixed_t_losses"])
    if FP8 in curves and BF16 in curves:
        compare["loss_curve_rel_fp8_vs_bf16"] = deviation(curves[FP8]["losses"], curves[BF16]["losses"])
        compare["step_speedup_fp8_over_bf16"] = curves[BF16]["median_s"] / curves[FP8]["median_s"]
    report["total_s"] = time.perf_counter() - clock
    save()
    print(json.dumps(compare, indent=1))
    print(f"total {report['total_s']:.0f} s; JSON: {json_path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
