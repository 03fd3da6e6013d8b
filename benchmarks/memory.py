"""Memory table: peak GPU memory per phase, strategy and batch size at paper scale, and the largest
batch that fits 24, 48, 80 and 141 GB.

Each point is a short ``train.py`` run on one GPU (random weights, synthetic shards of the true shapes,
``benchmarks/strategies.py``'s set-up) whose throughput log reports ``perf/peak_mem_gib``
(``torch.cuda.max_memory_allocated``, weights included). Batch sizes double until a run runs out of
memory or passes the largest budget; a budget's answer is the largest *measured* batch under it.

    python benchmarks/memory.py --phases a_joint b --strategies gpu deepspeed_stage_2 fsdp
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from strategies import PRESETS, TOKENIZER, make_data, on_free_gpus, perf, save, stop_children, train  # noqa: E402  (benchmarks/ is not a package)

BUDGETS_GB = (24, 48, 80, 141)
GIB_PER_GB = 1e9 / 2**30


def fits(points: dict[int, float], budget_gb: float) -> int | None:
    """Largest measured batch whose peak (GiB) is within ``budget_gb`` (decimal GB, as GPUs are sold)."""
    ok = [batch for batch, gib in points.items() if isinstance(gib, float) and gib <= budget_gb * GIB_PER_GB]
    return max(ok) if ok else None


def sweep(args, phase: str, strategy: str, data: Path, gpu: int | None = None) -> dict:
    points: dict[int, float | str | None] = {}  # GiB, "OOM" / "failed", or None (no CUDA peak logged)
    batch = 1
    while batch <= args.max_batch:
        run_args = argparse.Namespace(**{**vars(args), "global_batch": {phase: batch}})  # sweeps may run at once
        out = args.work / "memory" / f"{phase}_{strategy}_b{batch}"
        try:
            train(run_args, phase, strategy, 1, data, out, args.steps, gpu=gpu)
            points[batch] = perf(out).get("peak_mem_gib")
        except RuntimeError as error:  # out of memory (or another failure: recorded, sweep stops)
            points[batch] = "OOM" if "OutOfMemoryError" in str(error) or "out of memory" in str(error) else "failed"
            print(f"{phase} {strategy} batch {batch}: {str(error)[-300:]}", flush=True)
            break
        print(f"{phase} {strategy} batch {batch}: {points[batch]} GiB", flush=True)
        if points[batch] is None or points[batch] > BUDGETS_GB[-1] * GIB_PER_GB:  # nothing measured / beyond
            break
        batch *= 2
    return {"peak_gib": points, "largest_batch": {f"{gb}GB": fits(points, gb) for gb in BUDGETS_GB}}


def table(results: dict) -> str:
    lines = ["| phase | strategy | peak GiB by batch | " + " | ".join(f"fits {gb} GB" for gb in BUDGETS_GB) + " |",
             "|---|---|---|" + "---:|" * len(BUDGETS_GB)]
    for key, row in results["runs"].items():
        phase, strategy = key.split(":")
        peaks = ", ".join(f"{b}: {round(g, 1) if isinstance(g, float) else g or 'not measured'}"
                          for b, g in row["peak_gib"].items())
        fit = " | ".join(str(row["largest_batch"][f"{gb}GB"] or "-") for gb in BUDGETS_GB)
        lines.append(f"| {phase} | {strategy} | {peaks} | {fit} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", nargs="+", default=["a_joint", "b", "c"])
    parser.add_argument("--strategies", nargs="+", default=["deepspeed_stage_2", "fsdp"], choices=list(PRESETS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    parser.add_argument("--run-timeout", type=float, default=300)
    parser.add_argument("--work", type=Path, default=Path("/tmp/memory"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "memory.json")
    parser.add_argument("--extra", nargs="*", default=[])
    parser.add_argument("--parallel", type=int, default=0, help="GPUs to share the sweeps out over (0 = in turn)")
    parser.add_argument("--tiny", action="store_true", help="tiny models on CPU (rehearse the driver)")
    args = parser.parse_args()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_children)
    # strategies.train() reads these: one throughput row per 2 steps, a checkpoint only at the end,
    # and a nominal bf16 peak (the MFU it yields is not used here)
    args.checkpoint_every, args.kill_delay, args.throughput_every, args.peak = 10**6, 0.0, 2, 1.0
    results = {"budgets_gb": list(BUDGETS_GB), "runs": {}}
    data = {phase: make_data(phase, args.work / "data" / phase, args.samples, args.tiny) for phase in args.phases}

    def measure(job, gpu) -> None:
        phase, strategy = job
        save(args, results, f"{phase}:{strategy}", sweep(args, phase, strategy, data[phase], gpu))

    on_free_gpus([(p, s) for p in args.phases for s in args.strategies], args.parallel, measure)
    print(table(results))


if __name__ == "__main__":
    main()
