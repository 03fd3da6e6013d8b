"""``trainer.profiler``: a profiled tiny run writes its trace and tables and trains as usual."""
from __future__ import annotations

import json

import pytest

from phase_b_helpers import tiny_b_cfg, write_synthetic_sessions

from animegamer.phases.run import train
from animegamer.training.trace_summary import render, summarise, summarise_file, write_summaries


def test_pytorch_profiler_writes_a_trace_of_the_requested_steps(tmp_path):
    root = write_synthetic_sessions(tmp_path / "data", sessions=8)
    composed, cfg = tiny_b_cfg(root, tmp_path / "run", "phase.max_steps=5", "checkpoint.every_n_steps=100",
                               "trainer.profiler=pytorch", "trainer.profile_skip_steps=1",
                               "trainer.profile_active_steps=2")
    train(cfg, composed)
    folder = tmp_path / "run" / "profile"
    traces = list(folder.glob("*.pt.trace.json"))
    assert len(traces) == 1, sorted(p.name for p in folder.iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == 2  # the active window only (steps 3 and 4), after the skipped and warm-up steps
    assert any(e.get("name", "").startswith("aten::mm") or e.get("name", "") == "aten::addmm" for e in events)
    assert not any(str(e.get("name", "")).startswith("[pl][module]") for e in events)  # no per-module hooks
    table = (folder / "fit-ops.txt").read_text()
    assert "CPU total" in table and "Optimizer.step" in table
    summary = summarise_file(traces[0])  # written beside the trace too, checked on known data below
    assert [row["step"] for row in summary["steps"]] == sorted(steps) and summary["median_wall_ms"] > 0
    assert summary["median_gpu_busy_ms"] == 0 and summary["median_kernels"] == 0  # a CPU run launches none
    assert any("optimizer_step" in hook for hook in summary["hooks_ms"])
    assert (folder / traces[0].name.replace(".pt.trace.json", ".summary.txt")).exists()


def _x(name, cat, ts_ms, dur_ms, correlation=None):
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts_ms * 1e3, "dur": dur_ms * 1e3}
    if correlation is not None:
        event["args"] = {"correlation": correlation}
    return event


def _known_trace() -> dict:
    """Two steps of 10 ms. Step 1 launches k1 (1..4 ms), k2 (3..6) and k4 (launched at 9 ms, runs 9.5..12.5,
    past the step's end): busy 5 + 3 ms, 3 kernels, all its own. Step 2 launches k3 (12.5..14) and three
    async copies: to pageable host memory (1.5 ms, blocks the host), to pinned host memory (0.4 ms) and
    to the device (0.5 ms), which do not; a stream wait does not block either."""
    x = _x
    return {"traceEvents": [
        x("ProfilerStep#5", "user_annotation", 0, 10), x("ProfilerStep#6", "user_annotation", 10, 10),
        x("cudaLaunchKernel", "cuda_runtime", 0.5, 0.01, 1), x("k1", "kernel", 1, 3, 1),
        x("cudaLaunchKernel", "cuda_runtime", 1, 0.01, 2), x("k2", "kernel", 3, 3, 2),
        x("cudaLaunchKernel", "cuda_runtime", 9, 0.01, 4), x("k4", "kernel", 9.5, 3, 4),
        x("cudaLaunchKernel", "cuda_runtime", 11, 0.01, 3), x("k3", "kernel", 12.5, 1.5, 3),
        x("cudaMemcpyAsync", "cuda_runtime", 15, 1.5, 5), x("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 15, 0.1, 5),
        x("cudaMemcpyAsync", "cuda_runtime", 16.6, 0.4, 7), x("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 16.6, 0.1, 7),
        x("cudaMemcpyAsync", "cuda_runtime", 17, 0.5, 6), x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 17, 0.1, 6),
        x("cudaStreamWaitEvent", "cuda_runtime", 18, 0.7),
        x("[LightningModule]PhaseB.optimizer_step", "user_annotation", 0.2, 9),
        x("[LightningModule]PhaseB.optimizer_step", "user_annotation", 10.2, 7),
        {"ph": "i", "name": "instant", "ts": 3}]}


def test_trace_summary_on_a_trace_with_known_answers():
    summary = summarise(_known_trace())
    first, second = summary["steps"]
    assert (first["gpu_busy_ms"], first["kernels"], first["launches"], first["sync_ms"]) == (8.0, 3, 3, 0.0)
    assert (second["kernels"], second["launches"], second["sync_ms"]) == (1, 1, 1.5)
    assert second["gpu_busy_ms"] == pytest.approx(1.8)  # k3 and the three copies
    assert summary["median_wall_ms"] == 10.0 and summary["gpu_busy_fraction"] == pytest.approx(0.49)
    assert summary["hooks_ms"] == {"[LightningModule]PhaseB.optimizer_step": 8.0}
    assert "49 %" in render(summary)


def test_operator_self_times_subtract_what_they_call():
    """A (0.5..5.5 ms) calls B (1..3), which makes a 0.5 ms runtime call; C runs 1 ms on another thread
    (autograd's); D lies outside the recorded steps. Per step (2 steps): A 1.5 ms, B 0.75, C 0.5."""
    def op(name, ts, dur, tid, cat="cpu_op"):
        return {**_x(name, cat, ts, dur), "pid": 1, "tid": tid}

    trace = _known_trace()
    trace["traceEvents"] += [op("aten::A", 0.5, 5, 1), op("aten::B", 1, 2, 1),
                             op("cudaFuncGetAttributes", 1.5, 0.5, 1, cat="cuda_runtime"),
                             op("aten::C", 11, 1, 2), op("aten::D", 25, 1, 1)]
    summary = summarise(trace)
    assert summary["top_ops_self_ms"] == {"aten::A": 1.5, "aten::B": 0.75, "aten::C": 0.5}
    assert summary["ops_per_step"] == {"aten::A": 0.5, "aten::B": 0.5, "aten::C": 0.5}
    assert "     1.50  aten::A (0.5)" in render(summary)


def test_summaries_cover_this_runs_rank_zero_traces_only(tmp_path):
    import os

    def write(name, rank=None, age=0.0):
        trace = {**_known_trace(), **({"distributedInfo": {"rank": rank, "world_size": 4}} if rank is not None else {})}
        path = tmp_path / name
        path.write_text(json.dumps(trace))
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime - age))

    write("fit-ops-0-step.1.pt.trace.json", rank=0)
    write("fit-ops-0-step.2.pt.trace.json", rank=2)  # another node's local rank 0
    write("fit-ops-1-step.3.pt.trace.json", rank=1)  # another local rank
    write("fit-ops-0-step.4.pt.trace.json", rank=0, age=3600)  # an earlier run's
    since = (tmp_path / "fit-ops-0-step.1.pt.trace.json").stat().st_mtime - 60
    written = write_summaries(tmp_path, since=since, rank=0, prefix="fit-ops-0-")
    assert [p.name for p in written] == ["fit-ops-0-step.1.summary.txt"]


def test_an_unreadable_trace_is_reported_not_raised(tmp_path, caplog):
    from types import SimpleNamespace

    from animegamer.training.profiling import summarise_traces

    folder = tmp_path / "profile"
    folder.mkdir()
    (folder / "fit-ops-step.1.pt.trace.json").write_text("{ not json")
    cfg = SimpleNamespace(trainer=SimpleNamespace(profiler="pytorch"), output_dir=str(tmp_path))
    with caplog.at_level("WARNING"):
        summarise_traces(cfg, SimpleNamespace(is_global_zero=True, world_size=1), since=0.0)
    assert "could not summarise the profiler traces" in caplog.text


def test_simple_profiler_times_the_hooks(tmp_path):
    root = write_synthetic_sessions(tmp_path / "data", sessions=8)
    composed, cfg = tiny_b_cfg(root, tmp_path / "run", "phase.max_steps=3", "checkpoint.every_n_steps=100",
                               "trainer.profiler=simple")
    train(cfg, composed)
    table = (tmp_path / "run" / "profile" / "fit-hooks.txt").read_text()
    assert "run_training_batch" in table and "optimizer_step" in table


def test_profiler_settings_are_checked(tmp_path):
    from test_config_faults import problems_of

    from animegamer.phases.preflight import validate_train_run

    root = write_synthetic_sessions(tmp_path / "data", sessions=8)
    cases = {("trainer.profiler=nsight",): "trainer.profiler='nsight' is not one of",
             ("trainer.profiler=pytorch", "trainer.profile_active_steps=0"): "trainer.profile_active_steps=0 >= 1",
             ("trainer.profiler=pytorch", "trainer.profile_skip_steps=5", "phase.max_steps=6"):
                 "records steps 7..9, past phase.max_steps=6"}
    for overrides, expected in cases.items():
        _, cfg = tiny_b_cfg(root, tmp_path / "run", *overrides)
        problems = problems_of(validate_train_run, cfg)
        assert any(expected in problem for problem in problems), problems
