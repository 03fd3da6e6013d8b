"""Phase (b) training step on one GPU: the framework's step beside plain transformers + peft.

    python benchmarks/phase_b.py              # paper sizes (Mistral-7B, LoRA r 32), CUDA
    python benchmarks/phase_b.py --tiny       # tiny sizes on CPU, 2 steps: smoke test of every path

Random weights, no downloads. Batches are real 5-turn windows (about 1,450 tokens each: five turns of
226 frame tokens plus instruction and state tokens) built by the framework's own sequence builder
and collator, with the official tokenizer (``--tokenizer``; ``byte`` for the byte tokenizer of random builds). Both sides train the same set
(LoRA r 32 / alpha 32 on q/k/v/o/gate/up/down, RMSNorms, both embedding matrices, the projections),
in bf16 weights with fused AdamW, forward + backward + clip + step.

- ``framework-sdpa`` / ``framework-flex``: ``PhaseB.run_model`` (the training step's body) with
  ``model.mllm.attention`` = sdpa (boolean mask) or flex (FlexAttention block mask); ``+compile``
  compiles the layers (``model.mllm.compile``), ``+pack`` packs the batch into rows of ``--pack-tokens``
  (``phase.pack_tokens``) instead of padding it: with ``--mixed`` (windows of 1..5 turns, as training
  draws them) that is the packing speed-up measured against the padded batch of the same windows;
- ``plain``: ``MistralForCausalLM`` + ``peft.get_peft_model``, inputs_embeds with the history
  scattered in, the game-state attention mask as a dense additive 4-D float mask (what a plain
  transformers user passes), CE + MSE written inline; eager, PyTorch's own SDPA kernel order.
  ``plain+compile`` is the best plain configuration, what a plain user gets with two lines: each
  decoder layer compiled (``layer.compile()``, PyTorch's regional-compilation recipe: one graph for
  all 32 layers, the same compilation the framework uses) and SDPA's kernels in the order cuDNN
  first (``sdpa_kernel([...], set_priority=True)``).

Per configuration: median step time after warm-up, tokens/s (real tokens), MFU (6 x params x real tokens +
attention within each sequence) over the bf16 matmul peak measured in the same run (``mfu``) and over the
datasheet's dense bf16 figure (``mfu_datasheet``), and peak memory. ``comparisons`` sets, per batch and
checkpointing mode, the fastest framework configuration against the fastest plain one (best plain) and
against each plain one.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from _device import (add_tokenizer_argument, building, compare, mfu, official_tokenizer, peaks,  # noqa: E402 (benchmarks/ on sys.path)
                     prefer_cudnn_attention, run_stamp)
from animegamer.config.compose import compose_config, path_override
from animegamer.mllm.collate import Session, collate_sequences, make_example, scatter_history, gather_queries
from animegamer.mllm.masks import attention_mask_4d
from animegamer.mllm.packing import pack_sequences
from animegamer.mllm.sequence import IGNORE_INDEX, Turn
from animegamer.models.encoder import representation_tokens
from animegamer.phases.common import make_optimizer

PLAIN = ("plain", "plain+compile")  # eager with PyTorch's kernel order; the best plain configuration


def make_batch(ids, tokenizer, n: int, d: int, batch_size: int, turns: int, device: str, mixed: bool = False,
               pack_tokens: int = 0) -> dict:
    """``batch_size`` real windows with random (N, D) reps, collated by the framework: every window of
    ``turns`` turns, or with ``mixed`` of 1..``turns`` turns in turn (training's window mix); packed into
    rows of at most ``pack_tokens`` tokens when set (``mllm.packing``), else padded to the longest."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for i in range(batch_size):
        count = 1 + i % turns if mixed else turns
        session_turns = [Turn(f"Character: Qiqi; Motion: slowly walk along the cliff {i}-{t}; Background: evening seaside.",
                              {"ML": 1 + t % 5, "SC": t % 2, "ET": (t + 1) % 2, "ST": 1 - 2 * (t % 2)})
                         for t in range(count)]
        reps = torch.randn(count, n, d, generator=generator)
        examples.append(make_example(ids, tokenizer, Session(session_turns, reps)))
    if pack_tokens:
        batch = pack_sequences(examples, pad_id=ids.pad, capacity=pack_tokens, rep_dtype=torch.bfloat16)
    else:
        batch = collate_sequences(examples, pad_id=ids.pad, rep_dtype=torch.bfloat16)
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def model_flops(cfg, lengths: list[int], vocab: int) -> float:
    """Forward+backward FLOPs of real tokens: 6 x (non-embedding params) x tokens + attention
    12 x layers x H x (sum of each sequence's length^2); padding and packed neighbours do not count."""
    m = cfg.model.mllm
    head = m.hidden_size // m.num_attention_heads
    attn_params = m.hidden_size * head * (m.num_attention_heads * 2 + m.num_key_value_heads * 2)
    mlp_params = 3 * m.hidden_size * m.intermediate_size
    vocab_head = m.hidden_size * vocab
    dense = m.num_hidden_layers * (attn_params + mlp_params) + vocab_head
    attention = 12 * m.num_hidden_layers * m.hidden_size * sum(n * n for n in lengths)
    return 6 * dense * sum(lengths) + attention


def framework_step(module, optimizer, batch, grad_clip: float):
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = module.run_model(batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in module.parameters() if p.requires_grad], grad_clip)
        optimizer.step()
    return step


def plain_step(model, input_proj, output_proj, optimizer, batch, grad_clip: float, n: int):
    """transformers + peft as a plain user writes it: dense 4-D additive mask, CE + MSE inline."""
    mask = attention_mask_4d(batch["query_mask"], batch["padding_mask"], dtype=torch.bfloat16)
    params = [p for p in list(model.parameters()) + list(input_proj.parameters()) + list(output_proj.parameters())
              if p.requires_grad]

    def step():
        optimizer.zero_grad(set_to_none=True)
        embeds = model.get_input_embeddings()(batch["input_ids"])
        embeds = scatter_history(embeds, input_proj(batch["history_reps"]), batch["history_index"])
        out = model(inputs_embeds=embeds, attention_mask=mask, position_ids=batch["position_ids"],
                    output_hidden_states=True)
        labels = batch["labels"][:, 1:]
        lm = F.cross_entropy(out.logits[:, :-1].float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        pred = output_proj(gather_queries(out.hidden_states[-1], batch["query_mask"], n))
        loss = lm + F.mse_loss(pred.float(), batch["target_rep"].float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        optimizer.step()
    return step


def time_steps(step, steps: int, warmup: int, device: str) -> tuple[float, float]:
    """(median seconds per step, peak GiB)."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup + steps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return statistics.median(times), peak




def compose(tiny: bool, attention: str, gc: bool, tokenizer: str = "", compiled: bool = False):
    overrides = ["experiment=paper_b", "model.mllm.path=''", f"model.mllm.attention={attention}",
                 f"model.mllm.gradient_checkpointing={str(gc).lower()}", "model.mllm.lora_dropout=0",
                 f"model.mllm.compile={str(compiled).lower()}"]
    if tokenizer:  # official_tokenizer's answer: '' = the byte tokenizer
        overrides.append(path_override("model.mllm.tokenizer", tokenizer))
    if tiny:
        overrides += ["model=tiny"]
    return OmegaConf.to_object(compose_config("train", overrides))


def run_framework(args, variant: str, batch_size: int, gc: bool, peak: dict) -> dict:
    """``variant``: the attention kind, then ``+compile`` for ``model.mllm.compile`` and/or ``+pack`` to
    pack the batch into rows of ``--pack-tokens`` (e.g. ``sdpa+compile+pack``)."""
    from animegamer.phases.phase_b import PhaseB

    attention, *options = variant.split("+")
    unknown = set(options) - {"compile", "pack"}
    if unknown:
        raise ValueError(f"unknown framework options {sorted(unknown)} in {variant!r}: compile, pack")
    cfg = compose(args.tiny, attention, gc, args.tokenizer, compiled="compile" in options)
    with building(args.device, torch.bfloat16):
        module = PhaseB(cfg)
    module.to(args.device)
    optimizer = make_optimizer(module.model, cfg.phase)["optimizer"]
    batch = make_batch(module.ids, module.tokenizer, module.model.num_query_tokens, module.model.rep_width,
                       batch_size, args.turns, args.device, args.mixed, args.pack_tokens if "pack" in options else 0)
    seconds, memory = time_steps(framework_step(module, optimizer, batch, cfg.phase.grad_clip), args.steps,
                                 args.warmup, args.device)
    result = summarise(cfg, batch, seconds, memory, peak, len(module.tokenizer))
    del module, optimizer
    return result


def run_plain(args, batch_size: int, gc: bool, peak: dict, compiled: bool = False) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import MistralConfig, MistralForCausalLM

    from animegamer.models.game_mllm import game_tokenizer

    cfg = compose(args.tiny, "sdpa", gc, args.tokenizer)
    m = cfg.model.mllm
    n, d = representation_tokens(cfg.model.encoder), cfg.model.encoder.width
    tokenizer, ids = game_tokenizer(cfg)
    with building(args.device, torch.bfloat16):
        config = MistralConfig(vocab_size=len(tokenizer), hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                               num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
                               num_key_value_heads=m.num_key_value_heads, max_position_embeddings=m.max_position_embeddings,
                               rms_norm_eps=m.rms_norm_eps, rope_theta=m.rope_theta, sliding_window=m.sliding_window,
                               attn_implementation="sdpa")
        model = MistralForCausalLM(config)
        input_proj = torch.nn.Sequential(torch.nn.Linear(d, m.hidden_size), torch.nn.GELU(), torch.nn.Linear(m.hidden_size, m.hidden_size))
        output_proj = torch.nn.Sequential(torch.nn.Linear(m.hidden_size, d), torch.nn.GELU(), torch.nn.Linear(d, d))
    model = get_peft_model(model, LoraConfig(r=m.lora_rank, lora_alpha=m.lora_alpha, lora_dropout=0.0,
                                             target_modules=list(m.lora_targets)))
    for name, param in model.named_parameters():
        if "norm" in name or "embed_tokens" in name or "lm_head" in name:
            param.requires_grad_(True)
    if gc:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    if compiled:  # after peft, so the LoRA branches are inside the compiled layers
        for layer in model.get_base_model().model.layers:
            layer.compile()
    params = [p for p in list(model.parameters()) + list(input_proj.parameters()) + list(output_proj.parameters())
              if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.phase.lr, fused=args.device == "cuda" or None)
    batch = make_batch(ids, tokenizer, n, d, batch_size, args.turns, args.device, args.mixed)
    # kernels are chosen when the layers are traced (the first step), so the preference spans every step
    with prefer_cudnn_attention(args.device) if compiled else contextlib.nullcontext():
        seconds, memory = time_steps(plain_step(model, input_proj, output_proj, optimizer, batch,
                                                cfg.phase.grad_clip, n), args.steps, args.warmup, args.device)
    del model, optimizer
    return summarise(cfg, batch, seconds, memory, peak, len(tokenizer))


def summarise(cfg, batch: dict, seconds: float, memory: float, peak: dict, vocab: int) -> dict:
    lengths = [int(n) for n in batch["lengths"]]
    tokens = sum(lengths)
    length, rows = batch["input_ids"].shape[1], batch["input_ids"].shape[0]
    utilisation = mfu(model_flops(cfg, lengths, vocab), seconds, peak)
    return {"batch": len(lengths), "rows": rows, "seq_len": length, "tokens": tokens,
            "padded_tokens": rows * length, "step_ms": round(seconds * 1e3, 1),
            "tokens_per_s": round(tokens / seconds, 1),
            **{k: round(x, 4) if x is not None else None for k, x in utilisation.items()},
            "peak_gib": round(memory, 2) if memory == memory else None}


def comparisons(runs: dict) -> list[dict]:
    """Per (batch, checkpointing): the fastest framework configuration against the plain ones."""
    rows = [{"name": spec, "gc": spec.rsplit(":", 1)[1], **row} for spec, row in runs.items() if "error" not in row]
    out = []
    for batch, gc in sorted({(r["batch"], r["gc"]) for r in rows}):
        same = [r for r in rows if (r["batch"], r["gc"]) == (batch, gc)]
        framework = sorted((r for r in same if r["name"].startswith("framework")), key=lambda r: r["step_ms"])
        plain = [r for r in same if r["name"].startswith("plain")]
        if framework and plain:
            out.append({"batch": batch, "gc": gc == "1", **compare(framework[0], plain, "step_ms")})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--mixed", action="store_true", help="windows of 1..--turns turns (training's mix), not all --turns")
    parser.add_argument("--pack-tokens", type=int, default=1536, help="row capacity of the +pack variants")
    parser.add_argument("--configs", nargs="+", default=["plain:4:0", "plain:8:1", "framework-sdpa:4:0",
                                                          "framework-sdpa:8:1", "framework-flex:4:0", "framework-flex:8:1"],
                        help="name:batch:gc triples; plain, plain+compile or framework-<attention>[+compile][+pack]")
    parser.add_argument("--out", type=Path, default=None)
    add_tokenizer_argument(parser)
    args = parser.parse_args()
    args.tokenizer = official_tokenizer(args.tokenizer, args.tiny)
    args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if args.tiny:
        args.steps, args.warmup = 2, 1
    import peft
    import transformers

    peak = peaks(args.device)
    results = {**run_stamp(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
               "mixed_windows": args.mixed, "warmup": args.warmup, "steps": args.steps,
               "bf16_peak_tflops": round(peak["measured_tflops"], 1),
               "datasheet_bf16_tflops": peak["datasheet_tflops"], "runs": {}}
    out = args.out or Path(os.environ.get("OUT", ".")) / "phase_b_benchmark.json"
    for spec in args.configs:
        name, batch, gc = spec.split(":")
        batch, gc = int(batch), gc == "1"
        try:
            if name in PLAIN:
                row = run_plain(args, batch, gc, peak, compiled=name == "plain+compile")
            elif name.startswith("framework-"):
                row = run_framework(args, name.split("-", 1)[1], batch, gc, peak)
            else:
                raise ValueError(f"unknown configuration {name!r} in {spec!r}: {', '.join(PLAIN)} "
                                 f"or framework-<attention>[+compile][+pack]")
        except torch.OutOfMemoryError:
            row = {"error": "out of memory"}
        results["runs"][spec] = row
        results["comparisons"] = comparisons(results["runs"])
        out.write_text(json.dumps(results, indent=2))  # a run cut short keeps what it measured
        print(f"{spec:24s} {row}", flush=True)  # the benchmark's report is its output
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps(results, indent=2))
    for c in results["comparisons"]:
        print(f"batch {c['batch']} gc={int(c['gc'])}: {c['framework']} {c['framework_s']} ms, best plain "
              f"{c['best_plain']} {c['best_plain_s']} ms: {c['speedup_vs_best_plain']:.2f}x; "
              + ", ".join(f"{k} {x:.2f}x" for k, x in c["speedup_vs"].items()), flush=True)


if __name__ == "__main__":
    main()
