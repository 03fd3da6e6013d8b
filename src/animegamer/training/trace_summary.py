"""Where a profiled step's time goes, from the Chrome trace ``trainer.profiler=pytorch`` writes.

    python -m animegamer.training.trace_summary outputs/run/profile/*.pt.trace.json

Per recorded step (``ProfilerStep#N``: one training batch; under gradient accumulation several make
an optimizer step): the step's wall time on the host; the GPU work the step launched (matched to its
launch through the trace's correlation ids, so a kernel that runs on after the host moved on still
counts for the step that launched it): busy time (the union of kernel, copy and memset intervals) and
kernel count; launches; the host time blocked on the device (synchronising calls and copies to the
host); and the host time of Lightning's hooks. A GPU busy for a small fraction of the step while launching thousands of short
kernels is bound by launch overhead (``torch.compile``, larger batches); long synchronising calls
point at a ``.item()``-style read in the step.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Tuple
from animegamer.utils.text import doc_summary

STEP_PREFIX = "ProfilerStep#"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
BLOCKING = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")
ASYNC_COPY = "cudaMemcpyAsync"  # blocks the host only when it copies to pageable host memory
HOOK_PREFIX = "["  # Lightning's record_function names: "[LightningModule]PhaseB.optimizer_step"
TOP_HOOKS = 12
TOP_OPS = 10
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")  # host events that nest on a thread


def _busy(intervals: Iterable[Tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _inside(events: List[dict], start: float, stop: float) -> List[dict]:
    return [e for e in events if start <= e["ts"] < stop]


def _correlation(event: dict):
    return (event.get("args") or {}).get("correlation")


def _blocking(call: dict, device_by_id: Dict) -> bool:
    if call["name"] in BLOCKING:
        return True
    work = device_by_id.get(_correlation(call))
    name = str(work.get("name", "")) if work is not None else ""
    return call["name"] == ASYNC_COPY and "DtoH" in name and "Pageable" in name


def self_times(events: List[dict]) -> List[Tuple[dict, float]]:
    """(event, self time in us) for each ``cpu_op``: its duration less that of the host events directly
    nested in it on its thread (operators it calls, runtime calls such as kernel launches)."""
    by_thread: Dict = defaultdict(list)
    for e in events:
        if e.get("cat") in HOST_CATEGORIES:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    nested_us: Dict[int, float] = defaultdict(float)
    for thread in by_thread.values():
        stack: List[dict] = []
        for e in sorted(thread, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                nested_us[id(stack[-1])] += e["dur"]
            stack.append(e)
    return [(e, e["dur"] - nested_us[id(e)]) for e in events if e.get("cat") == "cpu_op"]


def _operator_times(events: List[dict], windows: List[Tuple[float, float]]) -> Tuple[Dict, Dict]:
    """Per step: each operator's own host time (ms) and its calls, over every thread (backward's too)."""
    op_ms, op_calls = defaultdict(float), defaultdict(float)
    for op, self_us in self_times(events):
        if any(start <= op["ts"] < stop for start, stop in windows):
            op_ms[op["name"]] += self_us / 1e3 / len(windows)
            op_calls[op["name"]] += 1 / len(windows)
    return op_ms, dict(op_calls)


def summarise(trace: Dict) -> Dict:
    """The per-step breakdown of one trace (times in ms)."""
    complete = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in complete if str(e.get("name", "")).startswith(STEP_PREFIX)), key=lambda e: e["ts"])
    if not steps:
        raise ValueError("the trace has no ProfilerStep# ranges: was it written by trainer.profiler=pytorch?")
    device = [e for e in complete if e.get("cat") in DEVICE_CATEGORIES]
    runtime = [e for e in complete if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    hooks = [e for e in complete if e.get("cat") == "user_annotation" and str(e["name"]).startswith(HOOK_PREFIX)]
    launched_at = {_correlation(e): e["ts"] for e in runtime if _correlation(e) is not None}
    device_by_id = {_correlation(e): e for e in device if _correlation(e) is not None}
    rows, hook_ms = [], defaultdict(float)
    windows = [(s["ts"], s["ts"] + s["dur"]) for s in steps]
    for step, (start, stop) in zip(steps, windows):
        # device work belongs to the step that launched it (its own start time when the launch is unknown)
        work = [e for e in device if start <= launched_at.get(_correlation(e), e["ts"]) < stop]
        calls = _inside(runtime, start, stop)
        rows.append({
            "step": step["name"],
            "wall_ms": step["dur"] / 1e3,
            "gpu_busy_ms": _busy((e["ts"], e["ts"] + e["dur"]) for e in work) / 1e3,
            "kernels": sum(e.get("cat") == "kernel" for e in work),
            "launches": sum(e["name"] in LAUNCH_NAMES for e in calls),
            "sync_ms": sum(e["dur"] for e in calls if _blocking(e, device_by_id)) / 1e3,
        })
        for hook in _inside(hooks, start, stop):
            hook_ms[hook["name"]] += hook["dur"] / 1e3 / len(steps)

    def median(key: str) -> float:
        return statistics.median(row[key] for row in rows)

    wall, busy = median("wall_ms"), median("gpu_busy_ms")
    op_ms, op_calls = _operator_times(complete, windows)
    return {
        "steps": rows,
        "median_wall_ms": wall,
        "median_gpu_busy_ms": busy,
        "gpu_busy_fraction": busy / wall if wall else 0.0,
        "median_kernels": median("kernels"),
        "median_sync_ms": median("sync_ms"),
        "hooks_ms": dict(sorted(hook_ms.items(), key=lambda kv: -kv[1])[:TOP_HOOKS]),
        # host time per step spent in each operator itself (not in what it calls), and calls per step
        "top_ops_self_ms": {name: ms for name, ms in sorted(op_ms.items(), key=lambda kv: -kv[1])[:TOP_OPS]},
        "ops_per_step": op_calls,
    }


def render(summary: Dict) -> str:
    lines = [f"{'step':<18}{'wall ms':>10}{'GPU busy ms':>13}{'kernels':>9}{'launches':>10}{'sync ms':>9}"]
    for row in summary["steps"]:
        lines.append(f"{row['step']:<18}{row['wall_ms']:>10.1f}{row['gpu_busy_ms']:>13.1f}{row['kernels']:>9d}"
                     f"{row['launches']:>10d}{row['sync_ms']:>9.1f}")
    lines.append(f"median: wall {summary['median_wall_ms']:.1f} ms, GPU busy {summary['median_gpu_busy_ms']:.1f} ms "
                 f"({100 * summary['gpu_busy_fraction']:.0f} %), {summary['median_kernels']:.0f} kernels, "
                 f"{summary['median_sync_ms']:.1f} ms waiting on the device")
    lines.append("host time per step of Lightning's hooks (ms, nested hooks overlap):")
    lines += [f"  {ms:9.1f}  {name}" for name, ms in summary["hooks_ms"].items()]
    calls = summary["ops_per_step"]
    lines.append(f"host time per step inside PyTorch operators themselves (ms; calls per step); "
                 f"{sum(calls.values()):.0f} operator calls per step, nested calls included:")
    lines += [f"  {ms:9.2f}  {name} ({calls[name]:g})" for name, ms in summary["top_ops_self_ms"].items()]
    return "\n".join(lines)


def summarise_file(path: str | Path) -> Dict:
    with open(path) as f:
        return summarise(json.load(f))


def trace_rank(trace: Dict) -> int | None:
    """The global rank Kineto recorded in a trace of a distributed run (None outside one)."""
    return (trace.get("distributedInfo") or {}).get("rank")


def write_summaries(folder: str | Path, since: float = 0.0, rank: int | None = None,
                    prefix: str = "") -> List[Path]:
    """``<trace>.summary.txt`` beside each trace of ``folder`` whose name starts with ``prefix``,
    modified at or after ``since`` (a time stamp) and, with ``rank``, recorded by that global rank
    (Lightning names files by local rank only, which repeats on every node); returns the files written."""
    written = []
    for path in sorted(Path(folder).glob(f"{prefix}*.pt.trace.json")):
        if path.stat().st_mtime < since:
            continue
        with open(path) as f:
            trace = json.load(f)
        if rank is not None and trace_rank(trace) not in (None, rank):
            continue
        out = path.with_name(path.name.replace(".pt.trace.json", ".summary.txt"))
        out.write_text(render(summarise(trace)) + "\n")
        written.append(out)
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    for path in args.traces:
        summary = summarise_file(path)
        print(json.dumps(summary, indent=1) if args.json else f"== {path}\n{render(summary)}")


if __name__ == "__main__":
    main()
