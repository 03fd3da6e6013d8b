"""Weak scaling through ``train.py`` (``scripts/multinode_rehearsal.py --weak-scaling``): the order of the
runs at any GPU count, the efficiency at each count, and a CPU rehearsal (tiny phase (b), gloo, 1 and 2
processes) with a kill and resume in each run whose save and start-up times reach the results."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "benchmarks")]

import multinode_rehearsal as rehearsal  # noqa: E402


def test_plan_runs_one_gpu_side_by_side_then_each_count_first_strategy_first():
    plan = rehearsal.weak_plan(("b", "a_joint"), ("deepspeed_stage_2", "fsdp"), [1, 2, 4, 8])
    assert plan[:4] == [("b", [("deepspeed_stage_2", 1), ("fsdp", 1)]), ("b", [("deepspeed_stage_2", 2)]),
                        ("b", [("deepspeed_stage_2", 4)]), ("b", [("deepspeed_stage_2", 8)])]
    assert plan[4] == ("a_joint", [("deepspeed_stage_2", 1), ("fsdp", 1)])
    assert plan[8:] == [("b", [("fsdp", 2)]), ("a_joint", [("fsdp", 2)]), ("b", [("fsdp", 4)]),
                        ("a_joint", [("fsdp", 4)]), ("b", [("fsdp", 8)]), ("a_joint", [("fsdp", 8)])]
    # the two-GPU host's plan is the one the first results were measured with
    assert rehearsal.weak_plan(("b",), ("ddp",), [1, 2]) == [("b", [("ddp", 1)]), ("b", [("ddp", 2)])]


def test_efficiency_at_every_count():
    table = {f"b:ddp:{g}gpu": {"perf": {"step_s": s}, "step_s_windows": [9.0, s, s]}
             for g, s in ((1, 1.0), (2, 1.25), (8, 2.0))}
    rehearsal.efficiency(table, "b", "ddp", [1, 2, 4, 8])
    assert table["b:ddp:efficiency"]["weak_scaling"] == 0.8
    assert table["b:ddp:efficiency:8gpu"]["weak_scaling"] == 0.5 and table["b:ddp:efficiency:8gpu"]["range"] == [0.5, 0.5]
    assert "b:ddp:efficiency:4gpu" not in table  # not measured


def test_counts_are_checked_before_anything_runs(tmp_path):
    done = subprocess.run([sys.executable, "scripts/multinode_rehearsal.py", "--tiny", "--no-rehearsal",
                           "--weak-scaling", "--weak-gpus", "2", "4", "--work", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "start with 1" in done.stderr
    assert not (tmp_path / "data").exists()


# The two CPU rehearsals: driver arguments, and the file each writes under its --out folder.
WEAK = (["--no-rehearsal", "--weak-scaling", "--weak-phases", "b", "--weak-gpus", "1", "2", "--weak-kill-after", "2",
         "--steps", "12"], "weak_scaling_h200x2.json")
# The two-node kill and resume is tests/test_multinode.py's: here the two-node run against one node alone.
TWO_NODES = (["--single-node", "--rehearsal-no-kill", "--rehearsal-steps", "4", "--rehearsal-checkpoint", "2",
              "--survivor-limit", "3"],
             "multinode_h200x2.json")
REHEARSALS = {"weak": WEAK, "two_nodes": TWO_NODES}
TESTS = {"weak": "test_cpu_weak_scaling_with_a_kill_and_resume_in_each_run",  # the test that reads each
         "two_nodes": "test_cpu_rehearsal_two_nodes_equal_one_node_of_as_many_processes"}
LIMIT_S = 840  # per driver, on a loaded CI machine


@pytest.fixture(scope="module")
def rehearsals(request, tmp_path_factory):
    """name -> wait(): the selected CPU rehearsals, started at once when the first test needs one (their
    processes mostly wait on one another, so side by side they share the cores); wait() returns the
    driver's results once it has exited 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    selected = {item.name for item in request.session.items}
    started = {}
    for name, (args, results) in REHEARSALS.items():
        if TESTS[name] not in selected:
            continue
        work = tmp_path_factory.mktemp(name)
        with open(work / "stdout", "w") as out, open(work / "stderr", "w") as err:
            started[name] = (subprocess.Popen([sys.executable, "scripts/multinode_rehearsal.py", "--tiny", *args,
                                               "--samples", "16", "--work", str(work / "work"), "--out",
                                               str(work / "out")], cwd=ROOT, env=env, stdout=out, stderr=err),
                             work, results)

    def wait(name: str) -> dict:
        process, work, results = started[name]
        process.wait(timeout=LIMIT_S)
        assert process.returncode == 0, (work / "stdout").read_text()[-2000:] + (work / "stderr").read_text()[-3000:]
        return json.loads((work / "out" / results).read_text())

    yield wait
    for process, _, _ in started.values():  # a test that failed before it waited: its driver still ends here
        try:
            process.wait(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.timeout(900)
def test_cpu_weak_scaling_with_a_kill_and_resume_in_each_run(rehearsals):
    table = rehearsals("weak")["weak_scaling"]
    for gpus in (1, 2):
        run = table[f"b:ddp:{gpus}gpu"]
        assert "error" not in run and run["killed_after_checkpoint"] == 2
        assert run["run"]["killed"] is True  # 12 steps take seconds: the kill lands before the end
        assert [resumed for resumed, _ in run["perf"]["startups"]] == [False, True]  # killed, then resumed
        assert [step for step, _, _ in run["perf"]["saves"]][0] == 2 and all(s >= 0 for _, s, _ in run["perf"]["saves"])
    assert table["b:ddp:efficiency"]["weak_scaling"] > 0


@pytest.mark.timeout(900)
def test_cpu_rehearsal_two_nodes_equal_one_node_of_as_many_processes(rehearsals):
    """The rehearsal's global batch on one node (2 CPU processes, DDP) against the two-node run (one
    process per node): the same per-step losses, bitwise (same world of two ranks, same all-reduce)."""
    record = rehearsals("two_nodes")["rehearsal"]
    assert record["global_batch"] == 2 * record["per_gpu_batch"] and "error" not in record["single_node"]
    assert record["single_node"]["gpus"] == 2 and len(record["single_node"]["loss_curve"]) == 4
    assert record["two_nodes_vs_single_node"] == {"steps": 4, "max_rel_diff": 0.0, "median_rel_diff": 0.0,
                                                  "bitwise_equal_steps": 4}


def test_a_kill_waits_for_the_checkpoint_and_its_save_row_in_the_log(tmp_path):
    """The kill lands only once the checkpoint is complete and the training log holds its save row:
    killed between the two, a launch's rows (its start-up time among them) would never reach the log."""
    import strategies
    from animegamer.contracts.checkpoint_names import CHECKPOINT_DIR, checkpoint_name

    (tmp_path / CHECKPOINT_DIR).mkdir()
    (tmp_path / CHECKPOINT_DIR / checkpoint_name(2)).write_bytes(b"saved")
    assert not strategies.saved_and_logged(tmp_path, 2)  # saved, the log not yet flushed
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text("step,perf/startup_s,ckpt/save_s\n1,3.0,\n")
    assert not strategies.saved_and_logged(tmp_path, 2)
    (tmp_path / "logs" / "metrics.csv").write_text("step,perf/startup_s,ckpt/save_s\n1,3.0,\n2,,0.4\n")
    assert strategies.saved_and_logged(tmp_path, 2) and not strategies.saved_and_logged(tmp_path, 4)
