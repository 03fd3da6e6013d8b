"""Probe: phase (b)'s compiled, checkpointed decoder layers across a change of batch shape.

``train.py`` phase (b) with ``model.mllm.compile=true`` and gradient checkpointing stopped with a
``CheckpointError`` at the first batch with fewer rows (2026-12-01, one H200, twice). This runs the
same layers (paper width, ``--layers`` of them, LoRA, bf16, random weights) on a sequence of batch
shapes, one variant per process (fresh compile caches), with Dynamo's recompile and graph-break logs,
and records which variants train every step. The ``fewer_main_threads`` variants reproduce the cause
found in the end: the main thread's CPU thread count lowered (``models/recompute.py``, ``forward_state``).

    python benchmarks/compile_checkpoint_probe.py                 # every variant, one GPU
    python benchmarks/compile_checkpoint_probe.py --tiny          # CPU, tiny sizes: the logic only
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# rows x length of each step: the packed batches of the failing run (8 rows, then a 7-row batch), then
# batches on both sides of one of Inductor's fusion thresholds (rows x length < 8192) that split the two
# compilations in the failing run
SHAPES = ((8, 1536), (8, 1344), (8, 1472), (7, 1344), (7, 1408), (8, 1280), (5, 1344), (8, 1344))
STATIC = ((8, 1536),) * len(SHAPES)
TINY_SHAPES = ((4, 96), (4, 80), (3, 96), (3, 64))
VARIANTS = {
    "as_trainpy": dict(shapes="varied"),
    "no_dropout": dict(shapes="varied", lora_dropout=0.0),
    "static_shapes": dict(shapes="static"),
    "mark_rows_dynamic": dict(shapes="varied", mark_dynamic=True),
    "not_compiled": dict(shapes="varied", compile=False),
    # the cause (2026-12-01): the main thread's CPU thread count lowered, as Lightning does for DeepSpeed,
    # with the recomputation pinned to it (the fix) and without (the code before the fix: it should fail)
    "fewer_main_threads": dict(shapes="varied", main_threads=True),
    "fewer_main_threads_unpinned": dict(shapes="varied", main_threads=True, unpinned=True),
}


def run_variant(name: str, tiny: bool, layers: int) -> dict:
    import torch

    from animegamer.config.schema import MLLMConfig
    from animegamer.models.mllm import GameStateMLLM

    spec = VARIANTS[name]
    device = "cpu" if tiny else "cuda"
    base = MLLMConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                      lora_rank=4, lora_alpha=8.0) if tiny else MLLMConfig()
    cfg = dataclasses.replace(base, num_hidden_layers=layers, vocab_size=1024, gradient_checkpointing=True,
                              compile=spec.get("compile", True),
                              lora_dropout=spec.get("lora_dropout", base.lora_dropout))
    shapes = (TINY_SHAPES if tiny else SHAPES) if spec["shapes"] == "varied" else (
        (TINY_SHAPES[0],) * len(TINY_SHAPES) if tiny else STATIC)
    dtype = torch.float32 if tiny else torch.bfloat16
    torch.manual_seed(0)
    model = GameStateMLLM(cfg, rep_width=64, num_query_tokens=4, vocab_size=1024, dtype=dtype).to(device).train()
    if spec.get("unpinned"):
        from animegamer.models.recompute import checkpoint_every

        checkpoint_every(model.causal_lm.model.layers, 1, None)
    if spec.get("main_threads"):
        torch.set_num_threads(max(1, torch.get_num_threads() // 2))
    steps = []
    for rows, length in shapes:
        ids = torch.randint(0, 1024, (rows, length), device=device)
        if spec.get("mark_dynamic"):
            torch._dynamo.maybe_mark_dynamic(ids, 0)
        started = time.perf_counter()
        try:
            loss = model(ids, labels=ids)["loss"]
            loss.backward()
        except Exception as error:  # noqa: BLE001 - the record is the point
            steps.append({"rows": rows, "length": length, "error": f"{type(error).__name__}: {str(error)[:1500]}"})
            break
        if device == "cuda":
            torch.cuda.synchronize()
        steps.append({"rows": rows, "length": length, "loss": float(loss), "s": round(time.perf_counter() - started, 2)})
    return {"ok": all("error" not in s for s in steps) and len(steps) == len(shapes), "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_variant(args.one, args.tiny, args.layers)), flush=True)
        return
    import torch
    import transformers

    results = {"torch": torch.__version__, "transformers": transformers.__version__, "variants": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.variants:
        env = {**os.environ, "TORCH_LOGS": "recompiles,graph_breaks"}
        cmd = [sys.executable, __file__, "--one", name, "--layers", str(args.layers)] + (["--tiny"] if args.tiny else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        lines = (proc.stdout + proc.stderr).splitlines()
        found = next((json.loads(line[7:]) for line in lines if line.startswith("RESULT ")), {"ok": False})
        found["exit"] = proc.returncode
        found["dynamo_log"] = [line[:400] for line in lines if "ecompil" in line or "raph break" in line][:40]
        if proc.returncode:
            found["tail"] = "\n".join(lines[-30:])
        results["variants"][name] = found
        print(name, json.dumps({k: found[k] for k in ("ok", "exit")}), flush=True)
        (args.out / "compile_checkpoint_probe.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
