"""Game turn with the two guidance branches on two GPUs against one GPU, and VAE decode options, at paper
sizes with random weights (``benchmarks/game_turn.py``'s framework side: ``build_framework``, ``new_game``).

    python benchmarks/game_turn_two_gpu.py --tokenizer .device_wheels/animegamer_tokenizer --steps 20 \\
        --compile --deadline 200                                       # 2 GPUs, about 4 min with imports
    python benchmarks/game_turn_two_gpu.py --tiny --vae-reps 1         # CPU smoke test (the CPU twice), ~3 min
    python benchmarks/game_turn_two_gpu.py --vae-only --compile        # one GPU: phases 3 and 5 only, ~1.5 min

Phases, in this order, each stopped by ``--deadline`` (the JSON is rewritten after each):

1. ``compiled/two_gpus`` (``--compile``): game turns (``Game.play_turn``) with the guidance branches on two
   GPUs (``GameModels.cfg_replica`` on the second: ``TwoDeviceCFG``), both decoders compiled in place as
   ``model.decoder.compile=true`` does (``transformer.compile(dynamic=False)``; both compile at batch 1 in
   the warm-up turn); ``--warmup`` + ``--turns`` turns, medians of mllm / sample / vae_decode / total.
2. ``eager``: the same turns eager on one GPU (no replica: CFG as one batch of 2) and on two. Then, per
   mode, one ``sample`` from the same noise and reps: the latents' max |diff| between the modes and of
   their decoded frames in 8-bit levels (``two_vs_one``); with two devices the host time to issue each
   branch per step (how long the second GPU waits for the first branch's launches).
3. ``vae``: ``FrozenVAE.decode`` of (1, 5, 16, 60, 90) latents (17 x 480 x 720, to uint8 on the host) the
   framework's way (bf16, 2 latent frames a pass as diffusers does, no tiling) and with options: fp32;
   cuDNN's benchmark mode; channels_last_3d weights (``model.encoders.vae.channels_last``); both; all
   latent frames in one pass (changes the GroupNorm statistics, so the frames); median of ``--vae-reps``
   after one warm-up each; each option's frames against the framework's: max and mean |diff| in 8-bit
   levels and the share of values that differ.
4. ``compiled/one_gpu`` (``--compile``, time allowing): one GPU compiled (batch 2 compiles again); with
   both compiled modes, their ``two_vs_one``.
5. ``vae.options.compile`` (``--compile``, time allowing): ``model.encoders.vae.compile`` (the VAE's
   decoder compiled in place).

``--steps`` bounds the sampling steps (default: the config's 50): ``sample_s_at_config_steps`` scales the
measured sampling stage to the config's step count (per-step time x steps) and ``total_at_config_steps``
adds it to the measured mllm and vae_decode stages; the JSON says which numbers are measured and which
scaled.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _device import add_tokenizer_argument, building, official_tokenizer, peaks, run_stamp  # noqa: E402
from game_turn import (HISTORY_TURNS, STAGES, SideTimeout, build_framework, compose, instruction,  # noqa: E402
                       new_game, summarise, time_limit)

from animegamer.diffusion.cfg_parallel import TwoDeviceCFG  # noqa: E402
from animegamer.diffusion.sampler import sample  # noqa: E402
from animegamer.models.frozen_vae import conv3d_memory_format  # noqa: E402

MODES = ("one_gpu", "two_gpus")
EQUALITY_SEED = 7
LEVEL = 3  # the motion level of the equality sample's flow


def sync_all(devices) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """What the game keeps of a decoded clip (Game: round(clamp(x, 0, 1) * 255) as uint8)."""
    return (video.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()


def frame_diff(a: np.ndarray, b: np.ndarray) -> dict:
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {"max_levels": int(d.max()), "mean_levels": round(float(d.mean()), 5),
            "share_differing": round(float((d > 0).mean()), 6), "share_over_1_level": round(float((d > 1).mean()), 6)}


class Timed:
    """A denoiser that records the host time its call takes to return (launch time on CUDA: no sync)."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, []

    def __call__(self, *args):
        t0 = time.perf_counter()
        out = self.fn(*args)
        self.seconds.append(time.perf_counter() - t0)
        return out


# --------------------------------------------------------------------------- phases
def vae_options(args, models, latents, results, left) -> None:
    """Each decode option: median seconds (sync included, to uint8 on the host) and 8-bit diff."""
    vae = models.vae
    device = args.devices[0]
    record = results["vae"] = {"latents": list(latents.shape), "reps": args.vae_reps, "options": {}}
    reference = {}  # the framework's frames

    def timed_decode(module) -> tuple[float, np.ndarray]:
        sync_all([device])
        t0 = time.perf_counter()
        frames = to_uint8(module.decode(latents)[0])
        return time.perf_counter() - t0, frames

    def measure(name, module, note="") -> None:
        if left() < args.vae_option_budget:
            record["options"][name] = {"skipped": "deadline"}
            return
        first, frames = timed_decode(module)  # warm-up (cuDNN's search, a compilation)
        times = [timed_decode(module)[0] for _ in range(args.vae_reps)]
        row = {"median_s": round(statistics.median(times), 4), "first_s": round(first, 3),
               "times": [round(t, 4) for t in times]}
        if note:
            row["note"] = note
        if reference:
            row["vs_framework"] = frame_diff(frames, reference["frames"])
        else:
            reference["frames"] = frames
        record["options"][name] = row
        print(f"vae {name}: {row}", flush=True)
        args.save()

    measure("framework", vae, "bf16, 2 latent frames a pass (diffusers' default), no tiling")
    fp32 = copy.deepcopy(vae).to(torch.float32)
    measure("fp32", fp32)
    del fp32
    vae.cudnn_benchmark = True
    measure("cudnn_benchmark", vae)
    vae.cudnn_benchmark = False
    conv3d_memory_format(vae.model, torch.channels_last_3d)
    measure("channels_last_3d", vae)
    vae.cudnn_benchmark = True
    measure("channels_last_3d+cudnn_benchmark", vae)
    vae.cudnn_benchmark = False
    conv3d_memory_format(vae.model, torch.contiguous_format)
    frames_per_pass = vae.model.num_latent_frames_batch_size
    vae.model.num_latent_frames_batch_size = latents.shape[1]
    measure("one_pass", vae, "all latent frames in one pass: GroupNorm over all frames, other frames")
    vae.model.num_latent_frames_batch_size = frames_per_pass
    args.save()


def play_turns(args, cfg, models, record, left) -> None:
    """``--warmup`` + ``--turns`` game turns; medians and the config-step scaling."""
    game, predict = new_game(args, cfg, models)
    record.update(steps=game.diffusion.sampling_steps, config_steps=cfg.model.diffusion.sampling_steps, turns=[])
    for d in args.devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)
    for k in range(args.warmup + args.turns):
        if k >= args.warmup and record["turns"] and left() < 1.5 * record["turns"][-1]["total"]:
            record["stopped"] = "deadline"
            break
        result = game.play_turn(instruction(HISTORY_TURNS + k))
        record["turns"].append({s: round(result.timings[s], 4) for s in STAGES})
        record["median"] = summarise(record["turns"], args.warmup)
        record["fallback_states"] = predict.fallbacks
        if record["median"]:
            med, steps = record["median"], record["steps"]
            step_s = med["sample"] / steps
            record["step_ms"] = round(step_s * 1e3, 2)
            record["sample_s_at_config_steps"] = round(step_s * record["config_steps"], 4)
            record["total_at_config_steps"] = round(med["mllm"] + step_s * record["config_steps"] + med["vae_decode"], 4)
        record["peak_gib"] = [round(torch.cuda.max_memory_allocated(d) / 2**30, 2) for d in args.devices
                              if d.type == "cuda"]
        args.save()
        print(f"{record['name']} turn {k}: {record['turns'][-1]}", flush=True)


def equality_sample(args, cfg, models, replica, two: bool, record) -> torch.Tensor:
    """One ``sample`` from fixed noise and reps on one or two devices (the turns' step count); for two,
    the host time to issue each branch."""
    from animegamer.models.encoder import representation_tokens

    device = args.devices[0]
    n, d = representation_tokens(cfg.model.encoder), cfg.model.encoder.width
    g = torch.Generator().manual_seed(EQUALITY_SEED)
    cond = torch.randn(1, n, d, generator=g).to(device)
    uncond = models.renderer.encoder.unconditional()
    flow = torch.tensor([models.level_flow[LEVEL]], device=device)
    clips = cfg.pipeline.clips
    shape = (1, *models.vae.latent_shape(clips.frames, clips.height, clips.width))
    diffusion = dataclasses.replace(cfg.model.diffusion, sampling_steps=args.steps or cfg.model.diffusion.sampling_steps)
    if two:
        first, second = Timed(models.renderer.decoder), Timed(replica)
        denoiser = TwoDeviceCFG(first, second, args.devices)
    else:
        denoiser = models.renderer.decoder
    sync_all(args.devices)
    t0 = time.perf_counter()
    latents = sample(denoiser, shape, cond, uncond, flow, diffusion, torch.Generator().manual_seed(EQUALITY_SEED),
                     dtype=models.dtype)
    sync_all(args.devices)
    record["equality_sample_s"] = round(time.perf_counter() - t0, 4)
    if two:
        record["issue_ms_per_step"] = {"first_branch": round(statistics.median(first.seconds) * 1e3, 3),
                                       "second_branch": round(statistics.median(second.seconds) * 1e3, 3)}
    return latents.cpu()


def run_modes(args, cfg, models, replica, results, phase: str, order, left, limit: float = 0) -> None:
    """Turns and the equality sample per mode; ``limit``: seconds for all of it (0: until the deadline)."""
    started = time.perf_counter()
    if limit:
        left_overall = left
        left = lambda: min(left_overall(), limit - (time.perf_counter() - started))  # noqa: E731
    block = results.setdefault(phase, {})
    latents = args.latents.setdefault(phase, {})  # the equality samples, kept off the JSON
    for mode in order:
        record = block[mode] = {"name": f"{phase}/{mode}"}
        if left() < args.mode_budget:
            record["skipped"] = "deadline"
            continue
        game_models = dataclasses.replace(models, cfg_replica=replica if mode == "two_gpus" else None)
        try:
            with time_limit(int(max(1, left()))):
                play_turns(args, cfg, game_models, record, left)
                if left() > 2 * record.get("median", {}).get("sample", 0) + 5:
                    latents[mode] = equality_sample(args, cfg, models, replica, mode == "two_gpus", record)
        except (SideTimeout, torch.OutOfMemoryError, Exception) as error:  # keep what was measured
            record["error"] = f"{type(error).__name__}: {error}"[:500]
            print(f"{phase}/{mode}: {record['error']}", file=sys.stderr, flush=True)
        args.save()
    if len(latents) == 2 and "two_vs_one" not in block:
        a, b = latents["one_gpu"], latents["two_gpus"]
        with torch.no_grad():
            frames = {m: to_uint8(models.vae.decode(x)[0]) for m, x in latents.items()}
        block["two_vs_one"] = {"latents_max_abs_diff": float((a - b).abs().max()),
                               "latents_max_abs": float(a.abs().max()),
                               "frames": frame_diff(frames["one_gpu"], frames["two_gpus"])}
        print(f"{phase} two vs one: {block['two_vs_one']}", flush=True)
    rows = {m: block[m] for m in MODES if block.get(m, {}).get("median")}
    if len(rows) == 2:
        one, two = rows["one_gpu"], rows["two_gpus"]
        block["speedup"] = {"turn": round(one["median"]["total"] / two["median"]["total"], 3),
                            "sample": round(one["median"]["sample"] / two["median"]["sample"], 3),
                            "turn_at_config_steps": round(one["total_at_config_steps"] / two["total_at_config_steps"], 3)}
    args.save()


def compile_decoders(models, replica, on: bool) -> None:
    """What ``model.decoder.compile=true`` does, in place on both decoders (the first call of a shape
    compiles), or back to eager; switched on again, each gets its first compiled wrapper back, with the
    graphs that wrapper compiled."""
    for decoder in (models.renderer.decoder, replica):
        transformer = decoder.transformer
        if not on:
            transformer._compiled_call_impl = None
        elif not hasattr(transformer, "_benchmark_compiled"):
            transformer.compile(dynamic=False, mode=decoder.cfg.compile_mode)
            transformer._benchmark_compiled = transformer._compiled_call_impl
        else:
            transformer._compiled_call_impl = transformer._benchmark_compiled


def build_vae(args, cfg) -> SimpleNamespace:
    """Only the frozen VAE at ``cfg``'s sizes (``--vae-only``), as ``build_framework`` builds it."""
    from animegamer.models.frozen_vae import FrozenVAE

    with building(args.device, args.dtype):
        vae = FrozenVAE(cfg.model.encoders.vae, seed=cfg.model.encoders.seed, dtype=args.dtype)
    return SimpleNamespace(vae=vae.to(device=args.device, dtype=args.dtype))


def vae_compile(args, models, latents, results, left) -> None:
    """``model.encoders.vae.compile``: the VAE's decoder compiled in place, timed as the options are."""
    if left() <= 60:
        return
    record = results["vae"]["options"]
    models.vae.model.decoder.compile(dynamic=False)
    try:
        with time_limit(int(left())), torch.no_grad():
            t0 = time.perf_counter()
            models.vae.decode(latents)  # the compilation
            first = time.perf_counter() - t0
            times, frames = [], None
            for _ in range(args.vae_reps):
                sync_all(args.devices[:1])
                t0 = time.perf_counter()
                frames = to_uint8(models.vae.decode(latents)[0])
                times.append(time.perf_counter() - t0)
            models.vae.model.decoder._compiled_call_impl = None
            eager = to_uint8(models.vae.decode(latents)[0])
            record["compile"] = {"median_s": round(statistics.median(times), 4), "first_s": round(first, 2),
                                 "vs_framework": frame_diff(frames, eager)}
    except (SideTimeout, Exception) as error:
        record["compile"] = {"error": f"{type(error).__name__}: {error}"[:500]}
    print(f"vae compile: {record['compile']}", flush=True)




def main() -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny configs on the CPU (both 'devices' the CPU)")
    parser.add_argument("--steps", type=int, default=0, help="sampling steps (default: the config's, 50)")
    parser.add_argument("--turns", type=int, default=2, help="measured turns per mode")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--compile", action="store_true", help="also the compiled phase (and the VAE's)")
    parser.add_argument("--vae-reps", type=int, default=3)
    parser.add_argument("--deadline", type=int, default=200, help="seconds for the whole run (after imports)")
    add_tokenizer_argument(parser)
    parser.add_argument("--reserve", type=int, default=60,
                        help="with --compile: seconds kept for the eager and VAE phases after the compiled one")
    parser.add_argument("--vae-only", action="store_true",
                        help="one GPU: only the VAE decode options (and with --compile the compiled VAE)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.tokenizer = official_tokenizer(args.tokenizer, args.tiny)
    args.attention, args.compile_mode, args.vae_cudnn_benchmark, args.mllm_compile = None, "default", False, False
    compile_phase, args.compile = args.compile, False  # built eager; compiled in place later
    if args.tiny:
        args.device, args.dtype = "cpu", torch.float32
        args.devices = (torch.device("cpu"), torch.device("cpu"))
        args.steps = args.steps or 2
    else:
        needed = 1 if args.vae_only else 2
        if not torch.cuda.is_available() or torch.cuda.device_count() < needed:
            sys.exit(f"needs {needed} CUDA devices, {torch.cuda.device_count() if torch.cuda.is_available() else 0} visible")
        args.device, args.dtype = "cuda:0", torch.bfloat16
        args.devices = tuple(torch.device("cuda", i) for i in range(needed))
        torch.cuda.set_device(0)
    # per-phase guards: the VAE options take ~1 s each on an H200; a mode needs its warm-up and a turn
    args.vae_option_budget = 3 if args.tiny else 8
    args.mode_budget = 5 if args.tiny else 25
    out = args.out or Path(os.environ.get("OUT", ".")) / "game_turn_two_gpu.json"

    def left() -> float:
        return args.deadline - (time.perf_counter() - started)

    peak = peaks(args.devices[0])
    results = {**run_stamp(), "how": " ".join(["python benchmarks/game_turn_two_gpu.py", *sys.argv[1:]]),
               "device": torch.cuda.get_device_name(0) if not args.tiny else "cpu",
               "devices": [str(d) for d in args.devices], "torch": torch.__version__, "dtype": str(args.dtype),
               "tiny": args.tiny, "warmup": args.warmup, "measured_turns": args.turns,
               "bf16_peak_tflops": round(peak["measured_tflops"], 1)}

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))

    args.save = save
    cfg = compose(args)
    t0 = time.perf_counter()
    models = build_vae(args, cfg) if args.vae_only else build_framework(args, cfg, replica_device=args.devices[1])
    replica = None if args.vae_only else models.cfg_replica
    sync_all(args.devices)
    results["build_s"] = round(time.perf_counter() - t0, 1)
    save()

    clips = cfg.pipeline.clips
    latents = torch.randn(1, *models.vae.latent_shape(clips.frames, clips.height, clips.width),
                          generator=torch.Generator().manual_seed(3))
    args.latents = {}
    if args.vae_only:
        with torch.no_grad():
            vae_options(args, models, latents, results, left)
        if compile_phase:
            vae_compile(args, models, latents, results, left)
        finish(results, started, save)
        return
    # The headline first (two GPUs, compiled: both decoders compile at batch 1 in the warm-up turn), then
    # eager one vs two GPUs in one run, the VAE's options, and one GPU compiled (batch 2 compiles again).
    if compile_phase:
        compile_decoders(models, replica, on=True)
        # bounded, so that a slow compilation still leaves the eager and VAE phases their time
        run_modes(args, cfg, models, replica, results, "compiled", ("two_gpus",), left,
                  limit=max(1.0, left() - args.reserve))
        compile_decoders(models, replica, on=False)
    run_modes(args, cfg, models, replica, results, "eager", MODES, left)
    with torch.no_grad():
        vae_options(args, models, latents, results, left)
    if compile_phase:
        compile_decoders(models, replica, on=True)
        run_modes(args, cfg, models, replica, results, "compiled", ("one_gpu",), left)
        vae_compile(args, models, latents, results, left)
    finish(results, started, save)


def finish(results: dict, started: float, save) -> None:
    results["wall_s"] = round(time.perf_counter() - started, 1)
    save()
    gc.collect()
    print(json.dumps({k: v for k, v in results.items() if k in ("vae", "eager", "compiled", "wall_s")}, indent=1))


if __name__ == "__main__":
    main()
