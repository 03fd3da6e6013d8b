"""Memory table: peak GPU memory per phase, strategy and batch size at paper scale, and the largest
batch that fits 24, 48, 80 and 141 GB (">=B" where no larger batch was measured over that budget).

Each point is a short ``train.py`` run on one GPU (random weights, synthetic shards of the true shapes,
``benchmarks/strategies.py``'s set-up) whose throughput log reports ``perf/peak_mem_gib``
(``torch.cuda.max_memory_allocated``, weights included). Batch sizes double until a run runs out of
memory or passes the largest budget; a budget's answer is the largest *measured* batch under it.

    python benchmarks/memory.py --phases a_joint b --strategies gpu deepspeed_stage_2 fsdp

``--batches b=8,16,32`` measures exactly those batches instead, each point its own job (so ``--parallel``
spreads points, not whole sweeps, over the GPUs); ``--merge earlier.json`` adds the points that an
earlier ``memory.py`` or ``strategies.py`` run measured on one GPU (``strategies.py`` 1-GPU runs use the
same overrides), each marked with the file it came from; ``--merge`` alone tabulates them without a
run. Launches dominate a sweep's time (about a minute each at paper scale), so a table is cheapest
built from known points plus the missing ones.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _device import add_tokenizer_argument, official_tokenizer  # noqa: E402
from strategies import PHASE_B, PRESETS, make_data, on_free_gpus, perf, save, stop_children, train  # noqa: E402  (benchmarks/ is not a package)

BUDGETS_GB = (24, 48, 80, 141)
GIB_PER_GB = 1e9 / 2**30
_POINTS = threading.Lock()  # points of one (phase, strategy) may finish on several GPUs at once


def fits(points: dict[int, float], budget_gb: float) -> int | None:
    """Largest measured batch whose peak (GiB) is within ``budget_gb`` (decimal GB, as GPUs are sold)."""
    ok = [batch for batch, gib in points.items() if isinstance(gib, float) and gib <= budget_gb * GIB_PER_GB]
    return max(ok) if ok else None


def bounded(points: dict[int, float | str | None], budget_gb: float) -> bool:
    """Whether ``fits`` is the answer rather than a lower bound: a larger batch was measured over the
    budget or ran out of memory (batches in between may still fit when the points are not consecutive)."""
    best = fits(points, budget_gb)
    over = lambda gib: gib == "OOM" or (isinstance(gib, float) and gib > budget_gb * GIB_PER_GB)
    if best is None:  # nothing measured fits: exact only if batch 1 itself was measured over it
        return over(points.get(1))
    return any(batch > best and over(gib) for batch, gib in points.items())


def measure_point(args, phase: str, strategy: str, batch: int, data: Path, gpu: int | None = None) -> float | str | None:
    """Peak GiB of one short run at ``batch`` (None: no CUDA peak logged; "OOM" / "failed")."""
    run_args = argparse.Namespace(**{**vars(args), "global_batch": {phase: batch}})  # points may run at once
    out = args.work / "memory" / f"{phase}_{strategy}_b{batch}"
    shutil.rmtree(out, ignore_errors=True)  # a re-run measures afresh, not resumes an earlier run's metrics
    out.with_suffix(".log").unlink(missing_ok=True)
    try:
        train(run_args, phase, strategy, 1, data, out, args.steps, gpu=gpu)
    except RuntimeError as error:  # out of memory (or another failure: recorded)
        print(f"{phase} {strategy} batch {batch}: {str(error)[-300:]}", flush=True)
        return "OOM" if "OutOfMemoryError" in str(error) or "out of memory" in str(error) else "failed"
    peak = perf(out).get("peak_mem_gib")
    print(f"{phase} {strategy} batch {batch}: {peak} GiB", flush=True)
    return peak


def summary(points: dict[int, float | str | None], sources: dict[int, str] | None = None) -> dict:
    """A (phase, strategy) row: peaks by batch (sorted) and the largest measured batch under each budget."""
    points = dict(sorted(points.items()))
    row = {"peak_gib": points, "largest_batch": {f"{gb}GB": fits(points, gb) for gb in BUDGETS_GB},
           "bounded": {f"{gb}GB": bounded(points, gb) for gb in BUDGETS_GB}}
    if sources:
        row["merged_from"] = {batch: sources[batch] for batch in sorted(sources)}
    return row


def sweep(args, phase: str, strategy: str, data: Path, gpu: int | None = None) -> dict:
    """Batches 1, 2, 4, ... up to ``--max-batch``, until a run fails or passes the largest budget."""
    points: dict[int, float | str | None] = {}
    batch = 1
    while batch <= args.max_batch:
        points[batch] = measure_point(args, phase, strategy, batch, data, gpu)
        if not isinstance(points[batch], float) or points[batch] > BUDGETS_GB[-1] * GIB_PER_GB:
            break  # failed, nothing measured, or beyond every budget
        batch *= 2
    return summary(points)


def merged_points(paths: list[Path]) -> dict[tuple[str, str], dict[int, tuple[float | str, str]]]:
    """(phase, strategy) -> batch -> (peak GiB or "OOM", source file) from earlier results files."""
    found: dict[tuple[str, str], dict[int, tuple[float | str, str]]] = {}
    for path in paths:
        runs = json.loads(path.read_text()).get("runs", {})
        for key, row in runs.items():
            parts = key.split(":")
            if len(parts) == 2 and isinstance(row, dict):  # memory.py: "phase:strategy"
                for batch, gib in row.get("peak_gib", {}).items():
                    if isinstance(gib, float) or gib == "OOM":
                        found.setdefault((parts[0], parts[1]), {})[int(batch)] = (gib, path.name)
            elif len(parts) == 3 and parts[2] == "1gpu" and isinstance(row, dict):  # strategies.py
                gib = row.get("perf", {}).get("peak_mem_gib")
                if isinstance(gib, float) and row.get("global_batch"):
                    found.setdefault((parts[0], parts[1]), {})[int(row["global_batch"])] = (gib, path.name)
    return found


def batch_lists(specs: list[str], phases: list[str]) -> dict[str, list[int]]:
    """``["b=8,16", "c=1"]`` -> {"b": [8, 16], "c": [1]} (each list sorted, without repeats)."""
    lists = {}
    for spec in specs:
        phase, _, values = spec.partition("=")
        if not values or phase not in phases or phase in lists:
            raise ValueError(f"--batches {spec!r}: expected PHASE=B1,B2,... once per PHASE, PHASE one of --phases {phases}")
        lists[phase] = sorted({int(v) for v in values.split(",")})
    return lists


def _answer(row: dict, budget: str) -> str:
    """"4", or ">=4" when no larger batch was measured over the budget, or "-" when nothing fits."""
    batch, exact = row["largest_batch"][budget], row.get("bounded", {}).get(budget, True)
    if batch is None:
        return "-" if exact else "?"
    return str(batch) if exact else f">={batch}"


def table(results: dict) -> str:
    lines = ["| phase | strategy | peak GiB by batch | " + " | ".join(f"fits {gb} GB" for gb in BUDGETS_GB) + " |",
             "|---|---|---|" + "---:|" * len(BUDGETS_GB)]
    for key, row in results["runs"].items():
        phase, strategy = key.split(":")
        peaks = ", ".join(f"{b}: {round(g, 1) if isinstance(g, float) else g or 'not measured'}"
                          for b, g in row["peak_gib"].items())
        fit = " | ".join(_answer(row, f"{gb}GB") for gb in BUDGETS_GB)
        lines.append(f"| {phase} | {strategy} | {peaks} | {fit} |")
    return "\n".join(lines)


def measure_listed(args, results: dict, data: dict, pairs: list, lists: dict[str, list[int]], known: dict) -> None:
    """The listed batches of every (phase, strategy), each point its own job, on top of the merged
    ``known`` points; a row is saved as soon as it has a point."""
    points = {pair: {b: gib for b, (gib, _) in known.get(pair, {}).items()} for pair in pairs}

    def record(pair) -> None:
        sources = {b: src for b, (_, src) in known.get(pair, {}).items() if b not in lists.get(pair[0], [])}
        save(args, results, ":".join(pair), summary(points[pair], sources))

    def measure(job, gpu) -> None:
        phase, strategy, batch = job
        peak = measure_point(args, phase, strategy, batch, data[phase], gpu)
        with _POINTS:
            points[(phase, strategy)][batch] = peak
            record((phase, strategy))

    for pair in pairs:  # merged points first: a row appears even before (or without) new points
        if points[pair]:
            record(pair)
    on_free_gpus([(p, s, b) for p, s in pairs for b in lists.get(p, [])], args.parallel, measure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", nargs="+", default=["a_joint", "b", "c"])
    parser.add_argument("--strategies", nargs="+", default=["deepspeed_stage_2", "fsdp"], choices=list(PRESETS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--samples", type=int, default=64)
    add_tokenizer_argument(parser)
    parser.add_argument("--run-timeout", type=float, default=300)
    parser.add_argument("--work", type=Path, default=Path("/tmp/memory"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "memory.json")
    parser.add_argument("--extra", nargs="*", default=[])
    parser.add_argument("--parallel", type=int, default=0, help="GPUs to share the sweeps out over (0 = in turn)")
    parser.add_argument("--tiny", action="store_true", help="tiny models on CPU (rehearse the driver)")
    parser.add_argument("--batches", nargs="*", default=[], help="PHASE=B1,B2,...: measure exactly these batches")
    parser.add_argument("--merge", nargs="*", type=Path, default=[], help="earlier results files to merge points from")
    args = parser.parse_args()
    args.tokenizer = official_tokenizer(args.tokenizer, args.tiny, needed=PHASE_B in args.phases)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_children)
    # strategies.train() reads these: one throughput row per 2 steps, a checkpoint only at the end,
    # and a nominal bf16 peak (the MFU it yields is not used here)
    args.checkpoint_every, args.kill_delay, args.throughput_every, args.peak = 10**6, 0.0, 2, 1.0
    results = {"budgets_gb": list(BUDGETS_GB), "runs": {}}
    data = {phase: make_data(phase, args.work / "data" / phase, args.samples, args.tiny) for phase in args.phases}
    pairs = [(p, s) for p in args.phases for s in args.strategies]
    known = merged_points(args.merge)
    lists = batch_lists(args.batches, args.phases)
    if lists or known:
        measure_listed(args, results, data, pairs, lists, known)
    else:
        def measure(job, gpu) -> None:
            phase, strategy = job
            save(args, results, f"{phase}:{strategy}", sweep(args, phase, strategy, data[phase], gpu))

        on_free_gpus(pairs, args.parallel, measure)
    print(table(results))


if __name__ == "__main__":
    main()
