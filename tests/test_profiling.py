"""``trainer.profiler``: a profiled tiny run writes its trace and tables and trains as usual."""
from __future__ import annotations

import json

from phase_b_helpers import tiny_b_cfg, write_synthetic_sessions

from animegamer.training.runner import train


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
    table = (folder / "fit-ops.txt").read_text()
    assert "CPU total" in table and "Optimizer.step" in table


def test_simple_profiler_times_the_hooks(tmp_path):
    root = write_synthetic_sessions(tmp_path / "data", sessions=8)
    composed, cfg = tiny_b_cfg(root, tmp_path / "run", "phase.max_steps=3", "checkpoint.every_n_steps=100",
                               "trainer.profiler=simple")
    train(cfg, composed)
    table = (tmp_path / "run" / "profile" / "fit-hooks.txt").read_text()
    assert "run_training_batch" in table and "optimizer_step" in table


def test_profiler_settings_are_checked(tmp_path):
    from test_config_faults import problems_of

    from animegamer.config.validate import validate_train_run

    root = write_synthetic_sessions(tmp_path / "data", sessions=8)
    cases = {("trainer.profiler=nsight",): "trainer.profiler='nsight' is not one of",
             ("trainer.profiler=pytorch", "trainer.profile_active_steps=0"): "trainer.profile_active_steps=0 >= 1",
             ("trainer.profiler=pytorch", "trainer.profile_skip_steps=5", "phase.max_steps=6"):
                 "records steps 7..9, past phase.max_steps=6"}
    for overrides, expected in cases.items():
        _, cfg = tiny_b_cfg(root, tmp_path / "run", *overrides)
        problems = problems_of(validate_train_run, cfg)
        assert any(expected in problem for problem in problems), problems
