"""``benchmarks/phase_b_gap.py``'s bookkeeping: per-step rows of each attempt of a killed run, the
steps both attempts ran, and the LoRA dropout switch of its loop."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]

import phase_b_gap  # noqa: E402  (benchmarks/ on the path)


def _write(path: Path, rows: list[tuple[int, float]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["step,train/loss,perf/step_s,perf/data_wait_fraction"]
    for step, seconds in rows:
        lines.append(f"{step},1.0,,")  # a loss row without throughput is skipped
        lines.append(f"{step},,{seconds},0.01")
    path.write_text("\n".join(lines) + "\n")


def test_per_step_reads_every_attempt_in_order_and_same_steps_compares_them(tmp_path):
    logs = tmp_path / "logs"
    # first attempt: steps 1..14, checkpoint at 10, killed after 14; the restart runs 11..20
    _write(logs / "metrics.attempt-1.csv", [(s, 0.5) for s in range(1, 15)])
    _write(logs / "metrics.csv", [(s, 0.9 if s <= 12 else 0.5) for s in range(11, 21)])
    attempts = phase_b_gap.per_step(tmp_path)
    assert list(attempts) == ["metrics.attempt-1", "metrics"]
    assert [r["step"] for r in attempts["metrics.attempt-1"]] == list(range(1, 15))
    assert attempts["metrics"][0] == {"step": 11, "step_s": 0.9, "data_wait_fraction": 0.01}
    same = phase_b_gap.same_steps(attempts, resumed_at=10)
    assert same["steps"] == [11, 12, 13, 14]
    assert same["before_s"] == [0.5] * 4 and same["after_s"] == [0.9, 0.9, 0.5, 0.5]
    assert same["median_before_s"] == 0.5 and same["median_after_s"] == pytest.approx(0.7)
    # past the kill: steps 15..20, the first five left out as the restart's warm-up
    assert same["after_later_median_s"] == 0.5
    assert same["first_attempt_steady_median_s"] == 0.5


def test_same_steps_compares_work_rates_at_the_same_process_age():
    """Steps of different batches take different times: the resumed launch is judged by MFU over its
    steps 6.. against the first launch's steps 6.., as many of each (warm-up of each launch left out)."""
    first = [{"step": s, "step_s": 1.0, "mfu": 0.30 if s > 5 else 0.01} for s in range(1, 14)]  # 8 steady
    last = [{"step": s, "step_s": 2.0, "mfu": 0.02 if s < 16 else (0.33 if s < 24 else 0.9)}
            for s in range(11, 31)]  # steps 16..23 are its 6th..13th; later ones must not count
    same = phase_b_gap.same_steps({"metrics.attempt-1": first, "metrics": last}, resumed_at=10)
    assert same["same_age_steps"] == 8
    assert same["first_launch_median_mfu"] == 0.30 and same["resumed_launch_median_mfu"] == 0.33
    assert same["resumed_over_first_mfu"] == pytest.approx(1.1)


def test_same_steps_says_when_the_run_was_not_restarted(tmp_path):
    _write(tmp_path / "logs" / "metrics.csv", [(s, 0.5) for s in range(1, 5)])
    assert "not killed and restarted" in phase_b_gap.same_steps(phase_b_gap.per_step(tmp_path), 2)["error"]


def test_without_lora_dropout_replaces_every_dropout():
    import torch
    from peft import LoraConfig, get_peft_model

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    model = get_peft_model(model, LoraConfig(r=2, lora_alpha=2, lora_dropout=0.5, target_modules=["0", "2"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.1)  # B starts at zero: make the LoRA branch (and its dropout) count
    x = torch.randn(8, 4)
    model.train()
    assert not torch.equal(model(x), model(x))  # dropout draws differ
    assert phase_b_gap.without_lora_dropout(model) == 2
    assert phase_b_gap.without_lora_dropout(model) == 0  # nothing left to replace
    assert torch.equal(model(x), model(x))


def test_trace_digest_sums_kernels_per_step_by_name_and_family(tmp_path):
    from animegamer.training.trace_summary import summarise

    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": i * 1000, "dur": 1000}
              for i in (1, 2)]
    for i in (1, 2):  # per step: a GEMM 300 us, a fused dropout 100 us, the optimizer 50 us
        for name, start, dur in (("sm90_xmma_gemm_bf16", 10, 300), ("triton_poi_fused_native_dropout_0", 320, 100),
                                 ("multi_tensor_apply_kernel<FusedAdam>", 430, 50)):
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": i * 1000 + start, "dur": dur})
        for start in (500, 700):  # two host reads of device values a step (.item())
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense", "ts": i * 1000 + start,
                           "dur": 5, "tid": 1, "pid": 1})
    path = tmp_path / "t.pt.trace.json"
    path.write_text(__import__("json").dumps({"traceEvents": events}))
    digest = phase_b_gap.trace_digest(path, summarise)
    assert digest["top_kernels_ms_per_step"] == {"sm90_xmma_gemm_bf16": 0.3, "triton_poi_fused_native_dropout_0": 0.1,
                                                  "multi_tensor_apply_kernel<FusedAdam>": 0.05}
    assert digest["kernel_families_ms_per_step"]["dropout"] == 0.1
    assert digest["kernel_families_ms_per_step"]["optimizer"] == 0.05
    assert digest["median_gpu_busy_ms"] == 0.45
    assert digest["host_reads_per_step"] == {"aten::_local_scalar_dense": 2.0, "aten::nonzero": 0.0,
                                             "aten::is_nonzero": 0.0}


def test_part_a_saves_each_side_when_it_ends(tmp_path, monkeypatch):
    """On one GPU the sides run in turn: train.py's record (with its error) is on disk before the loop
    starts, so a call that ends during the loop keeps it."""
    from argparse import Namespace

    args = Namespace(tiny=True, out=tmp_path, a_sides=["trainpy", "loop"])
    monkeypatch.setattr(phase_b_gap, "trainpy_one_gpu", lambda a, gpu: {"error": "exit 1; log tail: boom"})

    def loop_cut_short(a, gpu):
        saved = json.loads((tmp_path / phase_b_gap.RESULTS).read_text())
        assert saved["a_trainpy"] == {"error": "exit 1; log tail: boom"}
        raise KeyboardInterrupt  # the device call ends here

    monkeypatch.setattr(phase_b_gap, "loop_subprocess", loop_cut_short)
    with pytest.raises(KeyboardInterrupt):
        phase_b_gap.part_a(args)
    assert json.loads((tmp_path / phase_b_gap.RESULTS).read_text())["a_trainpy"]["error"].startswith("exit 1")
