"""The two-node rehearsal on a two-GPU host, then weak scaling 1 -> 2 GPUs, through ``train.py``.

1. Rehearsal: phase (b) as two torchrun nodes of one GPU each (NCCL; ``scripts/two_nodes.py``), once
   uninterrupted, once with node 1 SIGKILLed a moment after a checkpoint and both nodes restarted;
   the restarted run's per-step loss (mean over the ranks) against the uninterrupted run's.
   Paper widths with ``--rehearsal-layers`` MLLM layers (random weights), ZeRO-2.
2. Weak scaling (``--weak-scaling``): per-GPU batch fixed (``--per-gpu a_joint=2 b=4``); per phase the
   1-GPU runs of the strategies side by side (one per GPU, so the host carries two training processes,
   as in the 2-GPU run), then each strategy on 2 GPUs (Lightning's launcher; ZeRO-2 of every phase
   before FSDP, so a short budget still covers both phases). Paper sizes, random weights, synthetic
   shards (``benchmarks/strategies.py`` builds the shards and the overrides); rank 0's step-time
   median after the first throughput window; efficiency = step time on 1 GPU / step time on 2.

``--tiny`` rehearses everything on CPU (tiny models, gloo, DDP). Results go to ``--out`` after every
run; no run starts when the time it took its phase before (or ``--estimate``) would pass ``--budget``.

    python scripts/multinode_rehearsal.py --weak-scaling --out $OUT            # two GPUs
    python scripts/multinode_rehearsal.py --tiny --weak-scaling --out /tmp/mn   # CPU
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "scripts")]

import strategies  # noqa: E402  (benchmarks/strategies.py: shards, overrides, launches, throughput)
import two_nodes  # noqa: E402
from _device import add_tokenizer_argument, official_tokenizer, run_stamp  # noqa: E402
from animegamer.contracts.checkpoint_names import checkpoint_step  # noqa: E402

log = logging.getLogger("multinode_rehearsal")

REHEARSAL_PHASE, REHEARSAL_STRATEGY = "b", "deepspeed_stage_2"
WEAK_PHASES = ("b", "a_joint")  # b first: the phase whose scaling was in doubt
WEAK_STRATEGIES = ("deepspeed_stage_2", "fsdp")
TINY_STRATEGIES = ("ddp",)  # CPU: the launch and measurement logic only
PEAK_TFLOPS = 780.4  # the bf16 matmul peak every MFU figure in the docs divides by (measured on these H200s)
NO_SAVES = 10 ** 6  # checkpoint and validation cadence of the weak-scaling runs: none inside the run
# Per phase: the runs' extra overrides on GPUs. Phase (b): SDPA's memory-efficient kernel, not cuDNN,
# whose per-shape graph builds (~0.4 s for each new packed length) land in a short run's first steps
# and would weigh on whichever run happened to meet more lengths; FSDP built on the GPU (start-up).
GPU_EXTRA = {"b": ["model.mllm.attention_backends=[efficient,math]"], "a_joint": []}
FSDP_EXTRA = ["trainer.fsdp_sharding=SHARD_GRAD_OP", "trainer.fsdp_init_device=gpu"]


def base_args(args, phase: str, global_batch: int, checkpoint_every: int, extra: list[str]) -> Namespace:
    """What ``strategies.overrides`` / ``strategies.train`` read from their command line."""
    return Namespace(global_batch={phase: global_batch}, checkpoint_every=checkpoint_every, throughput_every=5,
                     peak=0.0 if args.tiny else PEAK_TFLOPS, tiny=args.tiny, tokenizer=args.tokenizer, extra=extra,
                     kill_delay=0.0, run_timeout=args.run_timeout)


def phase_overrides(args, phase: str, strategy: str, gpus: int, global_batch: int, data: Path, out: Path,
                    steps: int, checkpoint_every: int, extra: list[str]) -> list[str]:
    run = base_args(args, phase, global_batch, checkpoint_every, extra)
    return strategies.overrides(run, phase, strategy, gpus, data, out, steps)


def rehearsal(args, data: Path, results: dict) -> None:
    """Uninterrupted two-node run, then the same run with node 1 killed and both restarted, then (with
    ``--single-node``) the same global batch on one node of as many GPUs."""
    extra = [] if args.tiny else [f"model.mllm.num_hidden_layers={args.rehearsal_layers}", *GPU_EXTRA["b"]]
    strategy = "ddp" if args.tiny else REHEARSAL_STRATEGY
    per_node = 0 if args.tiny else args.rehearsal_gpus_per_node  # 0: one CPU process per node
    world = two_nodes.NODES * max(per_node, 1)
    record: dict = {"phase": REHEARSAL_PHASE, "strategy": strategy, "nodes": two_nodes.NODES,
                    "gpus_per_node": per_node, "per_gpu_batch": args.rehearsal_batch,
                    "global_batch": args.rehearsal_batch * world, "steps": args.rehearsal_steps,
                    "checkpoint_every": args.rehearsal_checkpoint, "extra": extra}
    results["rehearsal"] = record
    runs = {}
    plan = [("uninterrupted", None)] + ([] if args.rehearsal_no_kill else [("killed", args.rehearsal_checkpoint)])
    for name, kill in plan:
        out = args.work / "rehearsal" / name
        shutil.rmtree(out, ignore_errors=True)
        overrides = [o for o in phase_overrides(args, REHEARSAL_PHASE, strategy, world,
                                                args.rehearsal_batch * world, data, out,
                                                args.rehearsal_steps, args.rehearsal_checkpoint, extra)
                     if not o.startswith("trainer.devices=")]  # two_nodes.py sets it per node
        started = time.perf_counter()
        try:
            runs[name] = two_nodes.run(overrides, args.work / "rehearsal" / f"{name}-logs",
                                       gpus_per_node=record["gpus_per_node"], kill_after=kill,
                                       kill_delay=args.kill_delay, limit_s=args.run_timeout,
                                       survivor_limit_s=args.survivor_limit)
        except Exception as error:  # noqa: BLE001 - keep what ran
            record[name] = {"error": str(error)[-3000:]}
            save(args, results)
            return
        runs[name]["seconds"] = round(time.perf_counter() - started, 1)
        runs[name]["perf"] = strategies.perf(out)
        runs[name]["loss_curve"] = {s: v for s, v in sorted(strategies.losses(out).items())}
        record[name] = {k: v for k, v in runs[name].items() if k != "overrides"}
        save(args, results)
    if args.single_node:
        single_node(args, data, strategy, world, extra, record, runs["uninterrupted"]["loss_curve"])
        save(args, results)
    if "killed" not in runs:
        return
    reference, killed = runs["uninterrupted"]["loss_curve"], runs["killed"]["loss_curve"]
    resumed = checkpoint_step(runs["killed"]["resumed_from"]) if runs["killed"]["resumed_from"] else None
    before = {s: v for s, v in killed.items() if resumed is None or s <= resumed}
    after = {s: v for s, v in killed.items() if resumed is not None and s > resumed}
    record["resumed_step"] = resumed
    record["killed_vs_uninterrupted"] = {
        "up_to_resume": {**strategies.compare(reference, before), "bitwise_equal_steps": _equal(reference, before)},
        "after_resume": {**strategies.compare(reference, after), "bitwise_equal_steps": _equal(reference, after)}}
    save(args, results)


def single_node(args, data: Path, strategy: str, world: int, extra: list[str], record: dict,
                two_node_losses: dict) -> None:
    """The rehearsal's global batch on one node of ``world`` GPUs (processes on CPU), uninterrupted; its
    per-step loss against the two-node run's."""
    out = args.work / "rehearsal" / "single_node"
    shutil.rmtree(out, ignore_errors=True)
    run = base_args(args, REHEARSAL_PHASE, args.rehearsal_batch * world, args.rehearsal_checkpoint, extra)
    found: dict = {"gpus": world}
    try:
        found["run"] = strategies.train(run, REHEARSAL_PHASE, strategy, world, data, out, args.rehearsal_steps)
        found["perf"] = strategies.perf(out)
        losses = {s: v for s, v in sorted(strategies.losses(out).items())}
        found["loss_curve"] = losses
        record["two_nodes_vs_single_node"] = {**strategies.compare(losses, two_node_losses),
                                              "bitwise_equal_steps": _equal(losses, two_node_losses)}
    except Exception as error:  # noqa: BLE001 - keep the two-node results
        found["error"] = str(error)[-3000:]
    record["single_node"] = found


def _equal(reference: dict, other: dict) -> int:
    return sum(reference.get(s) == v for s, v in other.items())


def weak_plan(phases: tuple, chosen: tuple, counts: list[int]) -> list[tuple[str, list[tuple[str, int]]]]:
    """The runs in order, as (phase, [(strategy, GPUs), ...] run at once): per phase the 1-GPU runs of
    every strategy side by side, then the first strategy at each larger count; the other strategies'
    larger counts after every phase's first, so a short budget still measures every phase under one
    strategy."""
    larger = [g for g in counts if g > 1]
    plan = []
    for phase in phases:
        plan.append((phase, [(strategy, 1) for strategy in chosen]))
        plan += [(phase, [(chosen[0], g)]) for g in larger]
    plan += [(phase, [(strategy, g)]) for strategy in chosen[1:] for g in larger for phase in phases]
    return plan


def weak_scaling(args, data: dict[str, Path], results: dict, deadline: float) -> None:
    table = results.setdefault("weak_scaling", {})
    chosen = TINY_STRATEGIES if args.tiny else tuple(args.weak_strategies)
    phases = tuple(args.weak_phases)
    batches = weak_plan(phases, chosen, args.weak_gpus)
    estimate = {phase: args.estimate for phase in phases}
    for phase, batch in batches:
        if time.monotonic() + estimate[phase] > deadline:
            log.warning("weak scaling: no time left for %s %s", phase, batch)
            table.setdefault("skipped", []).append(f"{phase}: {batch}")
            save(args, results)
            continue
        started = time.monotonic()
        parallel = 0 if args.tiny else len(batch)
        with ThreadPoolExecutor(max(parallel, 1)) as pool:
            list(pool.map(lambda job: one_run(args, data[phase], phase, *job, args.per_gpu[phase], table,
                                              gpu=(batch.index(job) if parallel > 1 else None)), batch))
        estimate[phase] = max(estimate[phase], time.monotonic() - started)
        for strategy in chosen:
            efficiency(table, phase, strategy, args.weak_gpus)
        save(args, results)


def one_run(args, data: Path, phase: str, strategy: str, gpus: int, per_gpu: int, table: dict,
            gpu: int | None) -> None:
    name = f"{phase}:{strategy}:{gpus}gpu"
    out = args.work / "weak" / name.replace(":", "_")
    shutil.rmtree(out, ignore_errors=True)
    out.with_suffix(".log").unlink(missing_ok=True)
    extra = [] if args.tiny else [*GPU_EXTRA[phase], *(FSDP_EXTRA if strategy == "fsdp" else [])]
    kill = args.weak_kill_after or None  # a checkpoint every kill-after steps, the run killed after the first
    run = base_args(args, phase, per_gpu * gpus, kill or NO_SAVES, extra)
    record = {"phase": phase, "strategy": strategy, "gpus": gpus, "per_gpu_batch": per_gpu, "steps": args.steps,
              "extra": extra, "side_by_side": gpu is not None, "killed_after_checkpoint": kill}
    try:
        record["run"] = strategies.train(run, phase, strategy, gpus, data, out, args.steps, kill_at=kill, gpu=gpu)
        record["perf"] = strategies.perf(out)
        record["step_s_windows"] = step_windows(out)
    except Exception as error:  # noqa: BLE001 - keep the other runs
        record["error"] = str(error)[-3000:]
    table[name] = record
    log.info("%s: %s", name, json.dumps({k: v for k, v in record.items() if k not in ("error",)}))


def step_windows(out: Path) -> list[float]:
    """Rank 0's step time of every throughput window, in order (the first one holds the warm-up)."""
    import csv

    return [round(float(r["perf/step_s"]), 4) for path in sorted((out / "logs").glob("metrics*.csv"))
            for r in csv.DictReader(open(path)) if r.get("perf/step_s")]


def efficiency(table: dict, phase: str, strategy: str, counts: list[int]) -> None:
    """Weak scaling at every measured count: step time on 1 GPU / step time on N (``...:efficiency`` for
    N = 2, as in the first two-GPU results; ``...:efficiency:Ngpu`` for larger N)."""
    one = table.get(f"{phase}:{strategy}:1gpu", {})
    t1 = one.get("perf", {}).get("step_s")
    for count in (g for g in counts if g > 1):
        many = table.get(f"{phase}:{strategy}:{count}gpu", {})
        tn = many.get("perf", {}).get("step_s")
        if t1 and tn:
            key = f"{phase}:{strategy}:efficiency" + ("" if count == 2 else f":{count}gpu")
            table[key] = {"step_s_1gpu": t1, f"step_s_{count}gpu": tn, "weak_scaling": round(t1 / tn, 3),
                          # spread: the same ratio from the slowest and fastest windows after warm-up
                          "range": _range(one.get("step_s_windows", []), many.get("step_s_windows", []))}


def _range(one: list[float], two: list[float]) -> list[float] | None:
    one, two = one[1:] or one, two[1:] or two
    if not one or not two:
        return None
    return [round(min(one) / max(two), 3), round(max(one) / min(two), 3)]


def save(args, results: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    for key, name in (("rehearsal", args.rehearsal_name), ("weak_scaling", args.weak_name)):
        if key in results:
            path = args.out / name
            partial = path.with_name(path.name + ".partial")
            partial.write_text(json.dumps({**results["stamp"], "peak_tflops": PEAK_TFLOPS, key: results[key],
                                           "notes": args.notes}, indent=2))
            os.replace(partial, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CPU, tiny models, gloo")
    parser.add_argument("--no-rehearsal", action="store_true")
    parser.add_argument("--weak-scaling", action="store_true")
    parser.add_argument("--rehearsal-layers", type=int, default=4, help="MLLM layers of the rehearsal (paper widths)")
    parser.add_argument("--rehearsal-batch", type=int, default=4, help="windows per GPU")
    parser.add_argument("--rehearsal-steps", type=int, default=40)
    parser.add_argument("--rehearsal-gpus-per-node", type=int, default=1,
                        help="GPUs of each of the two nodes (4 on an 8-GPU host: two nodes of 4)")
    parser.add_argument("--single-node", action="store_true",
                        help="also the rehearsal's global batch on one node of as many GPUs, losses compared")
    parser.add_argument("--rehearsal-checkpoint", type=int, default=10, help="checkpoint cadence; node 1 dies after the first")
    parser.add_argument("--kill-delay", type=float, default=1.0, help="seconds between the checkpoint and the kill")
    parser.add_argument("--rehearsal-no-kill", action="store_true",
                        help="the uninterrupted two-node run only (and --single-node's), not the killed one")
    parser.add_argument("--survivor-limit", type=float, default=30.0,
                        help="seconds node 0 gets to stop by itself (NCCL may wait on a dead peer until its timeout)")
    parser.add_argument("--weak-phases", nargs="+", default=list(WEAK_PHASES), choices=list(WEAK_PHASES))
    parser.add_argument("--weak-strategies", nargs="+", default=list(WEAK_STRATEGIES), choices=list(WEAK_STRATEGIES))
    parser.add_argument("--per-gpu", nargs="+", default=["a_joint=2", "b=4"], help="per-GPU batch per phase")
    parser.add_argument("--weak-gpus", nargs="+", type=int, default=[1, 2],
                        help="GPU counts of weak scaling, 1 first (e.g. 1 2 4 8 on an 8-GPU host)")
    parser.add_argument("--weak-kill-after", type=int, default=0,
                        help="kill and resume every weak-scaling run: a checkpoint every K steps, killed after the "
                             "first (its save and resumed start-up times are recorded); 0: no kill")
    parser.add_argument("--steps", type=int, default=20, help="steps of each weak-scaling run")
    parser.add_argument("--samples", type=int, default=32)
    add_tokenizer_argument(parser)
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole driver")
    parser.add_argument("--estimate", type=float, default=90.0, help="seconds a weak-scaling run is assumed to take")
    parser.add_argument("--run-timeout", type=float, default=400.0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/multinode"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--rehearsal-name", default="multinode_h200x2.json")
    parser.add_argument("--weak-name", default="weak_scaling_h200x2.json")
    parser.add_argument("--notes", default="")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for signum in (signal.SIGTERM, signal.SIGINT):  # stopped from outside: no weak-scaling run left on a GPU
        signal.signal(signum, strategies.stop_children)
    deadline = time.monotonic() + args.budget
    args.per_gpu = {k: int(v) for k, v in (item.split("=") for item in args.per_gpu)}
    args.weak_gpus = sorted(set(args.weak_gpus))
    if args.weak_gpus[0] != 1:
        parser.error(f"--weak-gpus {args.weak_gpus}: weak scaling needs the 1-GPU runs (start with 1)")
    if args.weak_kill_after and args.weak_kill_after >= args.steps:
        parser.error(f"--weak-kill-after {args.weak_kill_after} must be below --steps {args.steps}")
    results: dict = {"stamp": run_stamp()}
    phases = ({REHEARSAL_PHASE} if not args.no_rehearsal else set()) | (set(args.weak_phases) if args.weak_scaling else set())
    args.tokenizer = official_tokenizer(args.tokenizer, args.tiny, needed=strategies.PHASE_B in phases)
    data = {p: strategies.make_data(p, args.work / "data" / p, args.samples, args.tiny) for p in sorted(phases)}
    if not args.no_rehearsal:
        rehearsal(args, data[REHEARSAL_PHASE], results)
    if args.weak_scaling:
        weak_scaling(args, data, results, deadline)
    print(summary(results))


def summary(results: dict) -> str:
    """A short table for the end of the output: the rehearsal's kill and losses, each weak-scaling run."""
    lines = []
    rehearsal_record = results.get("rehearsal", {})
    for name in (n for n in ("uninterrupted", "killed", "single_node") if n in rehearsal_record):
        run = rehearsal_record.get(name, {})
        lines.append(f"rehearsal {name}: {run.get('error', '')[-500:] or json.dumps({k: run.get(k) for k in ('seconds', 'kill', 'resumed_from', 'perf')})}")
    if "killed_vs_uninterrupted" in rehearsal_record:
        lines.append(f"rehearsal losses, killed vs uninterrupted: {json.dumps(rehearsal_record['killed_vs_uninterrupted'])}")
    if "two_nodes_vs_single_node" in rehearsal_record:
        lines.append(f"rehearsal losses, two nodes vs one: {json.dumps(rehearsal_record['two_nodes_vs_single_node'])}")
    for name, run in results.get("weak_scaling", {}).items():
        shown = run if ":efficiency" in name or name == "skipped" else {
            k: run.get(k) for k in ("perf", "step_s_windows", "run", "error") if run.get(k)}
        lines.append(f"{name}: {json.dumps(shown)[:1500]}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
