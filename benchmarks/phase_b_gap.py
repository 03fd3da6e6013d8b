"""Phase (b) through ``train.py`` against the benchmark loop, and a 2-GPU kill and resume, step by step.

    bash benchmarks/phase_b_gap.sh                      # parts a and b on a 2-GPU host (about 6 min)
    bash benchmarks/phase_b_gap.sh --parts a            # one part: a (about 3.5 min), b (2.5), c (4-5)
    python benchmarks/phase_b_gap.py --tiny             # CPU rehearsal of every part's logic

Paper sizes, random weights, synthetic session shards (``benchmarks/strategies.py``), the official
tokenizer (``--tokenizer``; a missing folder stops the run, ``--tokenizer byte`` asks for the byte tokenizer).

a. Two processes at once, one GPU each. GPU 1: ``train.py``, phase (b) under ZeRO-2 with the config of
   the 44 % MFU run (batch 8 packed into 1,536-token rows, compiled layers, checkpointing, LoRA dropout
   0.05), every step's time from the throughput log and a ``trainer.profiler=pytorch`` trace of three
   steps. GPU 0: the benchmark loop of ``benchmarks/phase_b.py`` (``PhaseB.run_model``, backward,
   ``clip_grad_norm_``, fused AdamW on bf16 weights) on the same model, fed (i) ``train.py``'s own
   batches (its loader over the same shards: varying rows per batch, widths rounded to 64) and (ii)
   the benchmark's one fixed batch, first with LoRA dropout 0.05, then without (the benchmark's build):
   the gap split into data/shapes, dropout, and the engine (DeepSpeed ZeRO-2 and Lightning) with the
   loader. MFU by both formulas: the benchmark's (``phase_b.model_flops``: LM head at every token) and
   ``train.py``'s (``PhaseB.flops_per_batch``: LM head at the label positions only), over the bf16 peak
   measured in the run and over the 780.4 TFLOP/s every ``train.py`` figure used. Each side's profile:
   top kernels by GPU time, the trace summary of ``animegamer.training.trace_summary``.
b. Two GPUs: ``train.py`` phase (b) under ZeRO-2 (the lead's re-measured configuration: global batch
   4, packed, checkpointing, not compiled), SIGKILLed a few steps after the step-K checkpoint and
   restarted; the time of every step before the kill and after the restart, on the same steps.
   ``--b-gpus 1 --b-strategy ...`` asks the same of one GPU.
c. Phase (a2) weak scaling 1 -> 2 GPUs (``scripts/multinode_rehearsal.py --weak-phases a_joint``).

Results: ``$OUT/phase_b_gap.json`` (parts a and b, written after each; part (a)'s two sides also as each
ends, ``a_trainpy`` and ``a_loop_record``), part (c)'s own file. On one GPU part (a)'s sides run in turn and
take over 7 min, so each side's record and log tail are saved as it ends, before a time limit on the
whole run can cut the rest.
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "benchmarks")]

import strategies  # noqa: E402  (benchmarks/strategies.py: shards, overrides, launches)

log = logging.getLogger("phase_b_gap")

TRAINPY_PEAK_TFLOPS = 780.4  # the peak every train.py MFU in the docs divides by
RESULTS = "phase_b_gap.json"
WEAK_RESULTS = "weak_scaling_a_joint_h200x2.json"
TOP_KERNELS = 15
WARMUP_STEPS = 5  # a launch's first steps, left out of part (b)'s steady comparison
KERNEL_NAME_CHARS = 90
KERNEL_FAMILIES = {"dropout": ("dropout", "philox", "rand"), "optimizer": ("adam", "multi_tensor", "foreach"),
                   "collectives": ("nccl",), "copies": ("memcpy", "copy", "cast")}
# Part (a): the 44 % run's settings (benchmarks/results/phase_b_trainpy_pack_compile_h200.json).
A_BATCH, A_PACK = 8, 1536
HOST_READ_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero")
A_EXTRA = ["model.mllm.compile=true", f"phase.pack_tokens={A_PACK}"]


# ----------------------------------------------------------------------------------------- the loop

def loop_config(args, dropout: float):
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config, path_override

    overrides = ["experiment=paper_b", "model.mllm.path=''", "phase.init_from=''",
                 path_override("data.root", args.data), f"phase.batch_size={A_BATCH}", f"phase.pack_tokens={A_PACK}",
                 "phase.val_clips=0", "data.num_workers=0", "model.mllm.gradient_checkpointing=true",
                 f"model.mllm.lora_dropout={dropout}",
                 f"model.mllm.compile={str(not args.tiny).lower()}", "logger=none",
                 path_override("output_dir", Path(args.work) / "loop")]
    if args.tokenizer:
        overrides.append(path_override("model.mllm.tokenizer", args.tokenizer))
    if args.tiny:
        overrides += strategies.TINY
    return OmegaConf.to_object(compose_config("train", overrides))


def trainpy_batches(cfg, module, count: int, device: str) -> list[dict]:
    """The first ``count`` batches ``train.py``'s loader gives rank 0 of one process, on the device,
    floating tensors in bf16 (what DeepSpeed's bf16 mode does to a batch)."""
    import torch

    from animegamer.data.phase_b import SessionWindows, session_shards, train_loader

    dataset = SessionWindows(session_shards(cfg, "train"), module.tokenizer, module.ids, cfg.data.window_weights,
                             cfg.seed)
    batches = []
    for batch in train_loader(cfg, dataset, module.ids.pad, 0, 0, 1):
        batches.append({k: (v.to(device, torch.bfloat16 if v.is_floating_point() else None) if torch.is_tensor(v)
                            else v) for k, v in batch.items()})
        if len(batches) == count:
            return batches
    raise ValueError(f"{cfg.data.root}: fewer than {count} training batches")


def timed(step, batches: list[dict], device: str) -> list[float]:
    import torch

    times = []
    for batch in batches:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step(batch)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def profiled(step, batches: list[dict], folder: Path, name: str) -> dict:
    """A torch.profiler trace of ``batches`` (one warm-up step first), summarised."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from animegamer.training.trace_summary import summarise

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    path = folder / f"{name}.pt.trace.json"
    # the window's events are cleared when it closes: written from on_trace_ready, not after the block
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=len(batches) - 1),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(str(path))) as prof:
        for batch in batches:
            step(batch)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            prof.step()
    try:
        return trace_digest(path, summarise)
    except (OSError, ValueError, KeyError) as error:  # the timings matter more than their profile
        return {"error": f"{path}: {error}"}


def trace_digest(path: Path, summarise) -> dict:
    """The trace summary (per-step wall, GPU busy, kernels, syncs, top host operators) and the top
    kernels by GPU time per step."""
    trace = json.loads(path.read_text())
    summary = summarise(trace)
    steps = len(summary["steps"])
    by_kernel: dict[str, float] = {}
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and event.get("cat") == "kernel":
            name = str(event.get("name", ""))[:KERNEL_NAME_CHARS]
            by_kernel[name] = by_kernel.get(name, 0.0) + event.get("dur", 0) / 1e3
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:TOP_KERNELS]
    summary["top_kernels_ms_per_step"] = {name: round(ms / max(steps, 1), 2) for name, ms in top}
    # kernel families that one side has and the other not: LoRA dropout (fused by Inductor into kernels
    # named after it), the optimizer (DeepSpeed's flat fp32 step against fused AdamW), collectives, copies
    summary["kernel_families_ms_per_step"] = {
        family: round(sum(ms for name, ms in by_kernel.items() if any(w in name.lower() for w in words))
                      / max(steps, 1), 2) for family, words in KERNEL_FAMILIES.items()}
    summary["steps"] = [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}
                        for row in summary["steps"]]
    # reads of scalar values on the host: of device values (each waits for the GPU) and of CPU scalars (no
    # wait) alike; 988 a step on 2026-12-01, of which trainer.sync_debug found 28 waits (sync_sites.json)
    ops = summary.get("ops_per_step", {})
    summary["host_reads_per_step"] = {op: round(ops.get(op, 0.0), 1) for op in HOST_READ_OPS}
    return summary


def without_lora_dropout(module) -> int:
    """Replace every LoRA dropout by Identity (what peft builds for lora_dropout=0); returns how many."""
    import torch

    count = 0
    for sub in module.modules():
        dropouts = getattr(sub, "lora_dropout", None)
        if isinstance(dropouts, torch.nn.ModuleDict):
            for key in list(dropouts.keys()):
                if not isinstance(dropouts[key], torch.nn.Identity):
                    dropouts[key] = torch.nn.Identity()
                    count += 1
    return count


def run_loop(args) -> dict:
    """The benchmark loop on train.py's batches and on the benchmark's batch, with and without dropout."""
    import torch

    from _device import building, peaks
    from phase_b import framework_step, make_batch, model_flops
    from animegamer.phases.common import make_optimizer
    from animegamer.phases.phase_b import PhaseB

    device = "cpu" if args.tiny else "cuda"
    cfg = loop_config(args, dropout=0.05)
    peak = peaks(device)
    with building(device, torch.bfloat16):
        module = PhaseB(cfg)
    module.to(device)
    optimizer = make_optimizer(module.model, cfg.phase)["optimizer"]
    vocab = len(module.tokenizer)
    loader = trainpy_batches(cfg, module, args.loop_batches, device)
    fixed = make_batch(module.ids, module.tokenizer, module.model.num_query_tokens, module.model.rep_width, A_BATCH,
                       5, device, mixed=True, pack_tokens=A_PACK)
    step = lambda batch: framework_step(module, optimizer, batch, cfg.phase.grad_clip)()  # noqa: E731
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "bf16_peak_tflops": round(peak["measured_tflops"], 1), "tokenizer": args.tokenizer or "byte",
              "loader_shapes": [list(b["input_ids"].shape) for b in loader], "runs": {}}
    folder = args.work / "loop_traces"
    folder.mkdir(parents=True, exist_ok=True)

    def measure(name: str, batches: list[dict], warm: list[dict], profile: bool) -> None:
        first = timed(step, warm, device)  # compilation, new shapes' kernels (cuDNN graphs), allocator growth
        times = timed(step, batches, device)
        seconds = sum(times)
        bench = sum(model_flops(cfg, [int(n) for n in b["lengths"]], vocab) for b in batches)
        trainpy = sum(3 * module.flops_per_batch(b) for b in batches)
        row = {"warm_up_s": [round(t, 3) for t in first], "step_s": [round(t, 4) for t in times],
               "median_step_s": round(statistics.median(times), 4), "mean_step_s": round(seconds / len(times), 4),
               "real_tokens_per_step": sum(int(b["lengths"].sum()) for b in batches) / len(batches),
               "padded_tokens_per_step": sum(b["input_ids"].numel() for b in batches) / len(batches)}
        for label, flops in (("benchmark_formula", bench), ("trainpy_formula", trainpy)):
            rate = flops / seconds / 1e12
            row[f"mfu_{label}"] = round(rate / peak["measured_tflops"], 4)
            row[f"mfu_{label}_at_780"] = round(rate / TRAINPY_PEAK_TFLOPS, 4)
        if device == "cuda":
            row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if profile:
            row["profile"] = profiled(step, batches[: args.profile_steps + 1], folder, name.replace(" ", "_"))
        result["runs"][name] = row
        log.info("%s: %s", name, json.dumps({k: v for k, v in row.items() if k != "profile"}))
        save_part(args, "a_loop", result)

    # train.py's batches twice: the first pass meets each shape once (as train.py's first steps do)
    measure("trainpy batches, dropout 0.05", loader, loader, profile=True)
    measure("fixed batch, dropout 0.05", [fixed] * args.loop_steps, [fixed] * args.warmup, profile=False)
    result["dropouts_removed"] = without_lora_dropout(module.model)
    measure("fixed batch, dropout 0 (the benchmark)", [fixed] * args.loop_steps, [fixed] * args.warmup, profile=True)
    measure("trainpy batches, dropout 0", loader, loader[: args.warmup], profile=False)
    return result


# --------------------------------------------------------------------------------- train.py runs

def run_args(args, batch: int, checkpoint_every: int, extra: list[str], kill_delay: float = 0.0) -> Namespace:
    """What ``strategies.overrides`` / ``strategies.train`` read from their command line."""
    return Namespace(global_batch={"b": batch}, checkpoint_every=checkpoint_every, throughput_every=1,
                     peak=0.0 if args.tiny else TRAINPY_PEAK_TFLOPS, tiny=args.tiny, tokenizer=args.tokenizer,
                     extra=extra, kill_delay=kill_delay, run_timeout=args.run_timeout)


def per_step(out: Path) -> dict[str, list[dict]]:
    """Per attempt (metrics.attempt-N.csv, then metrics.csv): every throughput row (one per step)."""
    found = {}
    files = sorted((out / "logs").glob("metrics.attempt-*.csv")) + sorted((out / "logs").glob("metrics.csv"))
    for path in files:
        rows = []
        for row in csv.DictReader(open(path)):
            if row.get("perf/step_s"):
                rows.append({"step": int(row["step"]), "step_s": round(float(row["perf/step_s"]), 4),
                             **{key: round(float(row[f"perf/{key}"]), 4) for key in ("data_wait_fraction", "mfu",
                                                                                     "tokens_per_s", "alloc_retries",
                                                                                     "peak_mem_gib")
                                if row.get(f"perf/{key}")}})
        found[path.stem] = rows
    return found


def trainpy_profile(out: Path) -> dict:
    from animegamer.training.profiling import PROFILE_DIR
    from animegamer.training.trace_summary import summarise

    traces = sorted((out / PROFILE_DIR).glob("*.pt.trace.json"))
    return trace_digest(traces[-1], summarise) if traces else {"error": f"no trace under {out / PROFILE_DIR}"}


def trainpy_one_gpu(args, gpu: int | None) -> dict:
    """Part (a)'s train.py run: the 44 % configuration, per-step times, a profile of three steps."""
    out = args.work / "a_trainpy"
    shutil.rmtree(out, ignore_errors=True)
    out.with_suffix(".log").unlink(missing_ok=True)
    skip = args.a_steps - args.profile_steps - 2  # profiling.profiled_steps: skip + 2 .. skip + 1 + active
    profiler = [] if args.a_no_profiler else ["trainer.profiler=pytorch", f"trainer.profile_skip_steps={skip}",
                                              f"trainer.profile_active_steps={args.profile_steps}"]
    extra = ([] if args.tiny else A_EXTRA) + ["trainer.log_every_n_steps=1", *profiler, *args.a_extra]
    strategy = "ddp" if args.tiny else args.a_strategy
    run = run_args(args, A_BATCH, 10 ** 6, extra)
    record = {"strategy": strategy, "batch": A_BATCH, "steps": args.a_steps, "extra": extra,
              "profiled_steps": [skip + 2, skip + 1 + args.profile_steps]}
    try:
        record["run"] = strategies.train(run, "b", strategy, 1, args.data, out, args.a_steps, gpu=gpu)
    except Exception as error:  # noqa: BLE001 - keep the steps it logged and the other side's results
        record["error"] = str(error)[-3000:]
    try:
        record["per_step"] = per_step(out)
        rows = [r for rows in record["per_step"].values() for r in rows
                if r["step"] > args.warmup and not skip + 1 <= r["step"] <= skip + 1 + args.profile_steps]
        record["median_step_s_unprofiled"] = statistics.median(r["step_s"] for r in rows) if rows else None
        if rows and "mfu" in rows[0]:
            record["median_mfu_unprofiled_at_780"] = statistics.median(r["mfu"] for r in rows)
        record["profile"] = trainpy_profile(out)
        from animegamer.training.sync_sites import SITES_FILE

        sites = out / SITES_FILE  # with --a-extra trainer.sync_debug=true: the host's waits by line
        if sites.exists():
            record["sync_sites"] = json.loads(sites.read_text())
    except Exception as error:  # noqa: BLE001
        record["summary_error"] = repr(error)[-1000:]
    return record


def part_a(args) -> dict:
    """train.py on one GPU and the loop on the other, at the same time."""
    from concurrent.futures import ThreadPoolExecutor

    def kept(key: str, run, gpu: int | None) -> dict:
        # Saved the moment it ends: on one GPU the two sides run in turn and can outlast a time limit on
        # the whole run, which would lose a failed side's reason with an unsaved record.
        found = run(args, gpu)
        save_part(args, key, found)
        return found

    parallel = not args.tiny and len(strategies.visible_gpus()) > 1 and len(args.a_sides) == 2
    found = {"parallel": parallel}
    with ThreadPoolExecutor(2) as pool:
        runs = {}
        if "trainpy" in args.a_sides:
            runs["trainpy"] = pool.submit(kept, "a_trainpy", trainpy_one_gpu, 1 if parallel else None)
            if not parallel:
                runs["trainpy"].result()  # one device: in turn
        if "loop" in args.a_sides:
            runs["loop"] = pool.submit(kept, "a_loop_record", loop_subprocess, 0 if parallel else None)
        return found | {side: run.result() for side, run in runs.items()}


def loop_subprocess(args, gpu: int | None) -> dict:
    """The loop in its own process (own GPU, own CUDA context); its results come back through a file."""
    log_path = args.work / "loop.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--loop-only", "--work", str(args.work), "--out",
           str(args.work), "--data", str(args.data), "--tokenizer", args.tokenizer or "byte",
           "--loop-steps", str(args.loop_steps),
           "--loop-batches", str(args.loop_batches), "--profile-steps", str(args.profile_steps)] + (
        ["--tiny"] if args.tiny else [])
    proc = strategies.launch(cmd, log_path, gpu)
    try:
        code = strategies.wait(proc, log_path, args.run_timeout)
    except RuntimeError as error:
        return {"error": str(error)[-3000:]}
    found = json.loads((args.work / RESULTS).read_text()).get("a_loop", {}) if (args.work / RESULTS).exists() else {}
    if code != 0:
        found["error"] = f"exit {code}; log tail:\n{log_path.read_text()[-3000:]}"
    return found


def part_b(args) -> dict:
    """``--b-gpus`` GPUs (2), ``--b-strategy`` (ZeRO-2): killed after the step-K checkpoint, restarted; every
    step's time."""
    gpus = 1 if args.tiny else args.b_gpus
    strategy = "ddp" if args.tiny else args.b_strategy
    out = args.work / "b_killed"
    shutil.rmtree(out, ignore_errors=True)
    out.with_suffix(".log").unlink(missing_ok=True)
    # every step's row flushed to the CSV at once: the kill would lose the rows since the last flush
    run = run_args(args, args.b_batch, args.b_checkpoint, ["trainer.log_every_n_steps=1", *args.b_extra],
                   kill_delay=args.kill_delay)
    record = {"strategy": strategy, "gpus": gpus, "global_batch": args.b_batch, "steps": args.b_steps,
              "kill_after_checkpoint": args.b_checkpoint, "extra": list(args.b_extra)}
    try:
        record["run"] = strategies.train(run, "b", strategy, gpus, args.data, out, args.b_steps,
                                         kill_at=args.b_checkpoint)
        record["per_step"] = per_step(out)
        record["same_steps"] = same_steps(record["per_step"], args.b_checkpoint)
    except Exception as error:  # noqa: BLE001
        record["error"] = str(error)[-3000:]
    return record


def same_steps(attempts: dict[str, list[dict]], resumed_at: int) -> dict:
    """The steps both attempts ran (after the checkpoint, before the kill): step time before and after."""
    if len(attempts) < 2:
        return {"error": f"{len(attempts)} attempt(s) logged: the run was not killed and restarted"}
    first, last = list(attempts.values())[0], list(attempts.values())[-1]
    before = {r["step"]: r["step_s"] for r in first if r["step"] > resumed_at}
    after = {r["step"]: r["step_s"] for r in last}
    common = sorted(set(before) & set(after))
    later = [after[s] for s in sorted(after) if s not in before]
    return {**steady_work_rates(first, last), "steps": common, "before_s": [before[s] for s in common],
            "after_s": [after[s] for s in common],
            "median_before_s": statistics.median(before[s] for s in common) if common else None,
            "median_after_s": statistics.median(after[s] for s in common) if common else None,
            # the restarted run's steps past the kill, first five (its warm-up) apart
            "after_later_median_s": statistics.median(later[5:]) if len(later) > 5 else None,
            "first_attempt_steady_median_s": (statistics.median(r["step_s"] for r in first[5:])
                                              if len(first) > 5 else None)}


def steady_work_rates(first: list[dict], last: list[dict]) -> dict:
    """MFU (work over time) of the two launches at the same process age: each one's steps after its
    first five (warm-up), as many from each. Batches differ from step to step (packed rows of 1..5-turn
    windows, 15-33 % MFU at paper size), so step times of different steps do not compare, and a median
    over a later stretch of the run would compare other batches too; work rates at equal age do."""
    if not first or "mfu" not in first[0]:
        return {}
    count = min(len(first), len(last)) - WARMUP_STEPS
    if count <= 0:
        return {}
    before = [r["mfu"] for r in first[WARMUP_STEPS:WARMUP_STEPS + count]]
    after = [r["mfu"] for r in last[WARMUP_STEPS:WARMUP_STEPS + count]]
    return {"same_age_steps": count, "first_launch_median_mfu": statistics.median(before),
            "resumed_launch_median_mfu": statistics.median(after),
            "resumed_over_first_mfu": statistics.median(after) / statistics.median(before)}


def part_c(args) -> dict:
    """Phase (a2) weak scaling through the two-node rehearsal driver."""
    cmd = [sys.executable, str(ROOT / "scripts" / "multinode_rehearsal.py"), "--no-rehearsal", "--weak-scaling",
           "--weak-phases", "a_joint", "--weak-strategies", *args.c_strategies, "--out", str(args.out),
           "--weak-name", WEAK_RESULTS, "--budget", str(args.c_budget), "--work", str(args.work / "weak")]
    if args.tiny:
        cmd.append("--tiny")
    code = subprocess.run(cmd, cwd=ROOT).returncode
    path = args.out / WEAK_RESULTS
    return {"exit": code, "file": WEAK_RESULTS if path.exists() else None}


def save_part(args, key: str, value: dict) -> None:
    path = args.out / RESULTS
    args.out.mkdir(parents=True, exist_ok=True)
    found = json.loads(path.read_text()) if path.exists() else {}
    found[key] = value
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(found, indent=1))
    os.replace(partial, path)


def main() -> None:
    from _device import add_tokenizer_argument, official_tokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["a", "b"], choices=["a", "b", "c"])
    parser.add_argument("--tiny", action="store_true", help="CPU, tiny models: the logic of every part")
    parser.add_argument("--loop-only", action="store_true", help=argparse.SUPPRESS)  # part (a)'s loop process
    add_tokenizer_argument(parser)
    parser.add_argument("--data", type=Path, default=None, help="phase (b) shards (default: written under --work)")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--a-steps", type=int, default=30, help="train.py steps of part (a)")
    parser.add_argument("--a-sides", nargs="+", default=["trainpy", "loop"], choices=["trainpy", "loop"],
                        help="part (a)'s sides to run (both by default)")
    # 2026-12-01: without the profiler, train.py stopped with the same CheckpointError (fixed since: the
    # recomputation's thread count, benchmarks/README.md, phase (b) section)
    parser.add_argument("--a-no-profiler", action="store_true", help="part (a)'s train.py without the profiler")
    parser.add_argument("--a-extra", nargs="*", default=[], help="more train.py overrides for part (a)")
    parser.add_argument("--a-strategy", default="deepspeed_stage_2", choices=sorted(strategies.PRESETS),
                        help="part (a)'s train.py engine (gpu: one device, no engine; the loop has none)")
    parser.add_argument("--loop-steps", type=int, default=8, help="timed steps of the loop on the fixed batch")
    parser.add_argument("--loop-batches", type=int, default=8, help="train.py batches the loop runs (twice)")
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--b-steps", type=int, default=30)
    parser.add_argument("--b-batch", type=int, default=4, help="global batch of part (b)")
    parser.add_argument("--b-checkpoint", type=int, default=10, help="checkpoint cadence; the kill follows the first")
    parser.add_argument("--kill-delay", type=float, default=5.0, help="seconds between the checkpoint and the kill")
    parser.add_argument("--b-gpus", type=int, default=2, help="GPUs of part (b)")
    parser.add_argument("--b-strategy", default="deepspeed_stage_2", choices=sorted(strategies.PRESETS),
                        help="part (b)'s trainer preset")
    parser.add_argument("--b-extra", nargs="*", default=[], help="more train.py overrides for part (b)")
    parser.add_argument("--c-strategies", nargs="+", default=["deepspeed_stage_2", "fsdp"])
    parser.add_argument("--c-budget", type=float, default=300.0)
    parser.add_argument("--run-timeout", type=float, default=400.0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/phase_b_gap"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for signum in (signal.SIGTERM, signal.SIGINT):  # stopped from outside: no training run left on a GPU
        signal.signal(signum, strategies.stop_children)
    if args.tiny:
        args.a_steps, args.loop_steps, args.loop_batches, args.profile_steps = 6, 2, 2, 1
        args.b_steps, args.b_checkpoint, args.kill_delay, args.samples, args.warmup = 6, 2, 12.0, 16, 1
    args.tokenizer = official_tokenizer(args.tokenizer, args.tiny, needed=bool({"a", "b"} & set(args.parts)))
    args.work.mkdir(parents=True, exist_ok=True)
    # the loop's process reads the shards its parent wrote (the parent's train.py run reads them at once)
    args.data = args.data or strategies.make_data("b", args.work / "data" / "b", args.samples, args.tiny)
    if args.loop_only:
        save_part(args, "a_loop", run_loop(args))
        return
    from _device import run_stamp

    save_part(args, "stamp", {**run_stamp(), "tokenizer": args.tokenizer or "byte", "argv": sys.argv[1:]})
    for part, run in (("a", part_a), ("b", part_b), ("c", part_c)):
        if part in args.parts:
            started = time.perf_counter()
            found = run(args)
            found["seconds"] = round(time.perf_counter() - started, 1)
            save_part(args, part, found)
            print(f"part {part}: {json.dumps(summary(part, found))}", flush=True)


def summary(part: str, found: dict) -> dict:
    """The lines the lead reads first."""
    if part == "a":
        loop = {name: {k: row.get(k) for k in ("median_step_s", "mfu_trainpy_formula", "mfu_trainpy_formula_at_780",
                                                 "mfu_benchmark_formula")}
                for name, row in found.get("loop", {}).get("runs", {}).items()}
        trainpy = found.get("trainpy", {})
        wanted = ("median_step_s_unprofiled", "median_mfu_unprofiled_at_780", "error")
        memory = [r["peak_mem_gib"] for rows in trainpy.get("per_step", {}).values() for r in rows if "peak_mem_gib" in r]
        return {"trainpy": {k: trainpy.get(k) for k in wanted}
                | {"host_reads_per_step": trainpy.get("profile", {}).get("host_reads_per_step"),
                   "peak_mem_gib": max(memory, default=None)}, "loop": loop,
                "loop_error": found.get("loop", {}).get("error")}
    if part == "b":
        same = found.get("same_steps", {})
        return {k: same.get(k) for k in ("median_before_s", "median_after_s", "after_later_median_s",
                                         "first_attempt_steady_median_s", "error")} | {"error": found.get("error")}
    return found


if __name__ == "__main__":
    main()
