"""The GPU benchmark drivers in ``benchmarks/`` rehearsed on CPU with tiny models (``--tiny``), so
the scripts a device session relies on do not rot between sessions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
       "PYTHONPATH": f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}"}


def _run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_strategies_driver_stops_resumes_and_reuses(tmp_path):
    args = ["benchmarks/strategies.py", "--tiny", "--phases", "b", "--strategies", "ddp", "--gpus", "1",
            "--steps", "4", "--samples", "8", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "s.json")]
    printed = _run(*args)
    # progress is printed as it happens (a driver stopped by an outer limit still shows how far it got)
    assert printed.count("b_ddp_1gpu to step 2: launched") == 1 and "b_ddp_1gpu to step 4: exit 0" in printed
    record = json.loads((tmp_path / "s.json").read_text())["runs"]["b:ddp:1gpu"]
    assert "error" not in record, record.get("error")
    assert record["steps_logged"] == 4 and sorted(map(int, record["loss_curve"])) == [1, 2, 3, 4]
    assert "reused" not in record and set(record) >= {"first_half", "resumed"}
    # the save at the stop and each launch's time to its first step, fresh then resumed
    assert [step for step, _, _ in record["perf"]["saves"]][:1] == [2]
    assert [resumed for resumed, _ in record["perf"]["startups"]] == [False, True]
    log = (tmp_path / "work" / "runs" / "b_ddp_1gpu.log").read_text()
    assert "resuming from" in log and "step-0000002.ckpt" in log  # the second half resumed the first
    _run(*args)  # the same overrides again: the finished run is reused, not repeated
    again = json.loads((tmp_path / "s.json").read_text())["runs"]["b:ddp:1gpu"]
    assert again["reused"] is True and again["loss_curve"] == record["loss_curve"]
    longer = [*args[:args.index("--steps") + 1], "6", *args[args.index("--steps") + 2:]]
    _run(*longer)  # other overrides: measured afresh, not resumed from the step-4 run's checkpoint
    fresh = json.loads((tmp_path / "s.json").read_text())["runs"]["b:ddp:1gpu"]
    assert "reused" not in fresh and sorted(map(int, fresh["loss_curve"])) == [1, 2, 3, 4, 5, 6]
    log = (tmp_path / "work" / "runs" / "b_ddp_1gpu.log").read_text()
    assert log.count("resuming from") == 1 and "step-0000003.ckpt" in log


def test_phase_b_benchmark_plain_eager_and_compiled_beside_compiled_framework(tmp_path):
    out = tmp_path / "b.json"
    _run("benchmarks/phase_b.py", "--tiny", "--configs", "plain:2:0", "plain+compile:2:0", "framework-sdpa+compile:2:0",
         "--out", str(out))
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert set(runs) == {"plain:2:0", "plain+compile:2:0", "framework-sdpa+compile:2:0"}
    assert all(row["tokens_per_s"] > 0 for row in runs.values()), runs
    (c,) = report["comparisons"]  # the framework against the faster of the two plain rows, and each
    assert c["framework"] == "framework-sdpa+compile:2:0" and set(c["speedup_vs"]) == {"plain:2:0", "plain+compile:2:0"}
    assert c["best_plain_s"] == min(runs["plain:2:0"]["step_ms"], runs["plain+compile:2:0"]["step_ms"])


def test_phase_b_benchmark_packs_the_same_mixed_windows(tmp_path):
    out = tmp_path / "b.json"
    _run("benchmarks/phase_b.py", "--tiny", "--mixed", "--pack-tokens", "4096", "--configs", "framework-sdpa:5:0",
         "framework-sdpa+pack:5:0", "--out", str(out))
    padded, packed = (json.loads(out.read_text())["runs"][k] for k in ("framework-sdpa:5:0", "framework-sdpa+pack:5:0"))
    assert padded["tokens"] == packed["tokens"] and padded["batch"] == packed["batch"] == 5  # the same windows
    assert (padded["rows"], packed["rows"]) == (5, 1) and packed["padded_tokens"] < padded["padded_tokens"]
    assert padded["tokens"] < padded["padded_tokens"]  # windows of 1..5 turns: the padded batch pads


def test_phase_a_benchmark_framework_and_plain(tmp_path):
    _run("benchmarks/phase_a.py", "--tiny", "--gc", "0", "--only", "framework-true", "plain-bf16", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "phase_a_benchmark.json").read_text())["results"]
    assert [r["name"] for r in rows] == ["framework-true", "plain-bf16"]
    assert all("error" not in r and r["median_s"] > 0 for r in rows), rows


def test_phase_a_benchmark_passes_the_decoder_attention_to_the_framework(tmp_path):
    _run("benchmarks/phase_a.py", "--tiny", "--gc", "0", "--only", "framework-true", "--decoder-attention", "math",
         "--out", str(tmp_path))
    report = json.loads((tmp_path / "phase_a_benchmark.json").read_text())
    assert report["env"]["framework_attention_backends"] == ["math"]


def test_attention_kernel_benchmark_scores_against_float32(tmp_path):
    """On CPU only SDPA's math kernel runs; its bf16 deviation from float32 is bf16-sized, and the
    backward's gradients are compared too (the same output gradient for every kernel)."""
    _run("benchmarks/attention_kernels.py", "--tiny", "--out", str(tmp_path))
    result = json.loads((tmp_path / "attention_kernels.json").read_text())
    shape = result["shape"]
    assert shape["seq"] > shape["head_dim"] > 0 and shape["heads"] > 0
    math = result["kernels"]["math"]
    assert 1e-4 < math["sample"]["output_rel_l2"] < 1e-2  # bf16 rounding, not zero, not garbage
    assert all(1e-4 < math["train"][f"d{n}_rel_l2"] < 1e-2 for n in "qkv")
    assert math["sample"]["median_ms"] > 0 and math["train"]["median_ms"] > 0


def test_memory_sweep_reports_no_peak_on_cpu(tmp_path):
    out = tmp_path / "m.json"
    _run("benchmarks/memory.py", "--tiny", "--phases", "b", "--strategies", "ddp", "--max-batch", "2", "--samples", "8",
         "--work", str(tmp_path / "work"), "--out", str(out))
    row = json.loads(out.read_text())["runs"]["b:ddp"]
    # no CUDA peak on CPU: the batch is recorded as not measured and no budget answer is invented
    assert row["peak_gib"] == {"1": None} and set(row["largest_batch"].values()) == {None}


def test_memory_points_by_list_merge_earlier_results(tmp_path):
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": {
        "b:ddp:1gpu": {"global_batch": 4, "perf": {"peak_mem_gib": 22.05}},  # strategies.py, 1 GPU: merged
        "b:ddp:2gpu": {"global_batch": 4, "perf": {"peak_mem_gib": 18.3}},  # per GPU of 2: not a 1-GPU point
        "b:ddp": {"peak_gib": {"8": 40.5, "16": "OOM"}}}}))  # memory.py
    out = tmp_path / "m.json"
    printed = _run("benchmarks/memory.py", "--tiny", "--phases", "b", "--strategies", "ddp", "--batches", "b=1",
                   "--merge", str(earlier), "--samples", "8", "--work", str(tmp_path / "work"), "--out", str(out))
    assert printed.count("launched") == 1  # only the listed batch ran
    row = json.loads(out.read_text())["runs"]["b:ddp"]
    assert row["peak_gib"] == {"1": None, "4": 22.05, "8": 40.5, "16": "OOM"}
    assert row["merged_from"] == {"4": "earlier.json", "8": "earlier.json", "16": "earlier.json"}
    assert row["largest_batch"] == {"24GB": 4, "48GB": 8, "80GB": 8, "141GB": 8}
    assert row["bounded"] == {"24GB": True, "48GB": True, "80GB": True, "141GB": True}  # 8 over 24 GB, 16 OOM


def test_memory_answers_without_a_larger_measured_point_are_lower_bounds(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from memory import summary, table

    row = summary({2: 36.2, 4: 63.4})  # GiB: 38.9 and 68.1 GB
    assert row["largest_batch"] == {"24GB": None, "48GB": 2, "80GB": 4, "141GB": 4}
    assert row["bounded"] == {"24GB": False, "48GB": True, "80GB": False, "141GB": False}
    assert table({"runs": {"a_joint:deepspeed_stage_2": row}}).splitlines()[-1].endswith("| ? | 2 | >=4 | >=4 |")
    assert summary({1: "OOM"})["bounded"]["24GB"] is True  # batch 1 does not fit: "-" is the answer


def test_game_turn_benchmark_framework_variant_and_plain(tmp_path):
    out = tmp_path / "g.json"
    _run("benchmarks/game_turn.py", "--tiny", "--sides", "framework", "plain", "--turns", "1", "--compile",
         "--compile-mode", "reduce-overhead", "--mllm-compile", "--vae-cudnn-benchmark", "--out", str(out))
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"framework[config+compile=reduce-overhead+mllm-compile+vae-cudnn-benchmark]", "plain"}
    for name, run in runs.items():
        assert "error" not in run, (name, run.get("error"))
        assert run["median"]["total"] > 0 and len(run["turns"]) == 2  # one warm-up turn, one measured


def test_game_turn_switches_reach_the_config(monkeypatch):
    from argparse import Namespace

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from game_turn import compose

    for on in (False, True):
        cfg = compose(Namespace(tokenizer=None, attention=None, tiny=True, compile=on, mllm_compile=on,
                                vae_cudnn_benchmark=on, vae_compile=on, compile_mode="reduce-overhead" if on else "default",
                                cache=0.1 if on else None, fp8="rowwise" if on else None))
        assert (cfg.model.decoder.compile, cfg.model.mllm.compile, cfg.model.encoders.vae.cudnn_benchmark,
                cfg.model.encoders.vae.compile) == (on,) * 4
        assert cfg.model.decoder.compile_mode == ("reduce-overhead" if on else "default")
        assert (cfg.model.diffusion.cache, cfg.model.diffusion.cache_threshold) == (
            ("first_block", 0.1) if on else ("none", 0.05))
        assert cfg.model.decoder.fp8 == ("rowwise" if on else "off")


def test_memory_batch_lists_are_sorted_unique_and_name_known_phases(monkeypatch):
    import pytest

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from memory import batch_lists

    assert batch_lists(["b=16,8,8", "c=1"], ["b", "c"]) == {"b": [8, 16], "c": [1]}
    for bad in (["a_join=1"], ["b"], ["b="], ["b=1", "b=2"]):
        with pytest.raises(ValueError, match="one of --phases"):
            batch_lists(bad, ["b", "c"])


def test_ratios_are_against_the_fastest_plain_row_and_mfu_has_both_denominators(monkeypatch):
    import pytest

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from _device import compare, mfu

    plain = [{"name": "plain", "s": 0.30}, {"name": "plain+compile", "s": 0.25}, {"name": "broken", "s": None}]
    c = compare({"name": "framework", "s": 0.20}, plain, "s")
    assert c["best_plain"] == "plain+compile" and c["best_plain_s"] == 0.25
    assert c["speedup_vs"] == pytest.approx({"plain+compile": 1.25, "plain": 1.5})
    assert c["speedup_vs_best_plain"] == c["speedup_vs"]["plain+compile"]
    assert compare({"name": "framework", "s": 0.20}, [], "s") == {}
    # 4e14 FLOP in 1 s: 50 % of a measured 800 TFLOP/s, 40 % of a datasheet 1000
    assert mfu(4e14, 1.0, {"measured_tflops": 800.0, "datasheet_tflops": 1000.0}) == pytest.approx(
        {"mfu": 0.5, "mfu_datasheet": 0.4})
    assert mfu(4e14, 1.0, {"measured_tflops": 800.0, "datasheet_tflops": None})["mfu_datasheet"] is None


def test_phase_a_compares_the_fastest_framework_row_per_precision_and_checkpointing(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from phase_a import comparisons

    def row(name, kind, precision, gc, seconds):
        return {"name": name, "kind": kind, "precision": precision, "gc": gc, "median_s": seconds}

    rows = [row("framework-true", "framework", "bf16-true", False, 0.23),
            row("framework-true+compile", "framework", "bf16-true", False, 0.19),
            row("plain-bf16", "plain", "bf16-true", False, 0.233),
            row("plain-bf16+compile", "plain", "bf16-true", False, 0.187),
            row("plain-mixed", "plain", "bf16-mixed", False, 0.28),  # no framework row in this mode
            {**row("framework-mixed", "framework", "bf16-mixed", True, 0.1), "error": "OOM"}]
    (c,) = comparisons(rows)
    assert (c["precision"], c["gc"], c["framework"], c["best_plain"]) == ("bf16-true", False, "framework-true+compile",
                                                                         "plain-bf16+compile")
    assert abs(c["speedup_vs_best_plain"] - 0.187 / 0.19) < 1e-12 and c["speedup_vs_best_plain"] < 1  # slower: said so


def test_sampling_step_flops_count_the_cfg_batch_without_lora(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from game_turn import sampling_step_flops
    from phase_a import run_config

    cfg = run_config(tiny=False)
    flops = sampling_step_flops(cfg, (1, 5, 16, 60, 90), plain=False)
    # per block at batch 1 (6,976 tokens, width 1,920): 0.6172 TFLOP of frozen linears, 0.3737 of attention;
    # 30 blocks, CFG batch 2; everything else (patch, output, AdaLN, embedders) is under 1 %
    core = 2 * 30 * (617_191_833_600 + 373_743_943_680)
    assert core < flops < 1.01 * core  # a LoRA branch would add 1.4 %, batch 1 would halve it


def test_compile_checkpoint_probe_records_every_variant(tmp_path):
    """The probe of the phase (b) CheckpointError (its cause: the main thread's lowered CPU thread count);
    on CPU backward shares the main thread, so every variant trains."""
    variants = ["fewer_main_threads", "not_compiled"]
    printed = _run("benchmarks/compile_checkpoint_probe.py", "--tiny", "--variants", *variants, "--out", str(tmp_path))
    found = json.loads((tmp_path / "compile_checkpoint_probe.json").read_text())["variants"]
    assert sorted(found) == sorted(variants) and all(f"{name} " in printed for name in variants)
    for name, record in found.items():
        assert record["ok"] and record["exit"] == 0, (name, record.get("tail"))
        assert len(record["steps"]) == 4 and all("loss" in step for step in record["steps"])


def test_paper_size_benchmarks_need_the_official_tokenizer_or_byte_by_name(monkeypatch, tmp_path):
    """A missing tokenizer folder stops a paper-size benchmark with a message naming it and the way out;
    it fell back silently once, and the run's figures were of another vocabulary and other token counts."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import pytest
    from _device import official_tokenizer

    assert official_tokenizer(tmp_path / "missing", tiny=True) == ""
    assert official_tokenizer("byte", tiny=False) == ""
    assert official_tokenizer(tmp_path / "missing", tiny=False, needed=False) == ""  # e.g. phase (a2) only
    assert official_tokenizer(tmp_path, tiny=False) == str(tmp_path.resolve())
    for missing in (tmp_path / "missing", "", None):
        with pytest.raises(SystemExit, match="no such folder.*official tokenizer.*--tokenizer byte"):
            official_tokenizer(missing, tiny=False)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "phase_b_gap.py"), "--parts", "a",
                           "--tokenizer", str(tmp_path / "missing"), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert done.returncode != 0 and f"--tokenizer {tmp_path / 'missing'}: no such folder" in done.stderr
    assert not (tmp_path / "work").exists()  # stopped before any data was written
