"""Seconds per game turn at paper scale, random weights, one GPU: the framework's ``Game`` beside plain libraries.

    python benchmarks/game_turn.py --tokenizer ../shared/reference/animegamer_tokenizer   # paper sizes, CUDA
    python benchmarks/game_turn.py --tiny                                                  # CPU smoke test
    python benchmarks/game_turn.py --sides framework --compile --attention fa4 --fp8 tensorwise   # FP8 + FA4 turn

A turn is split into the three stages ``Game.play_turn`` times:

- ``mllm``: one prefill of a 5-turn prompt (4 history turns + the new instruction, about 1,350 tokens
  with the official tokenizer), greedy generation of the 12 state tokens and the read of the N query
  positions through ``output_proj``;
- ``sample``: 50 DPM++ steps (diffusers' ``CogVideoXDPMScheduler``), CFG batched ([uncond; cond] in
  one call of batch 2), CogVideoX's dynamic guidance;
- ``vae_decode``: the CogVideoX VAE decoding (1, 5, 16, 60, 90) latents into 17 x 480 x 720 frames
  (to uint8 on the host).

Sides:

- ``framework``: ``Game(GameModels(PhaseB(cfg), ReconstructionModel(cfg) + decoder LoRA, FrozenVAE,
  level_flow, cfg))``, cfg composed from ``experiment=paper_eval`` with every weights path empty, built
  directly on the GPU in bf16. The turn is ``Game.play_turn`` itself and its own timings. A random MLLM
  generates garbage state tokens, which ``predict_next`` rightly rejects, so ``predict_fn`` is
  ``predict_next``'s body (``prompt_batch`` + ``generate``: the real prefill, 12 greedy tokens and query
  read) followed by ``parse_states``; only when that raises (malformed generation) does it hand fixed,
  valid states to the rest of the turn (with the MLLM's real representation). The JSON counts those
  fallbacks. The game starts with 4 played turns in its history, so every timed turn has the full
  5-turn window.
- ``plain``: what a user of the plain libraries writes for the same turn: ``MistralForCausalLM``
  (Mistral-7B sizes) ``generate(inputs_embeds=..., max_new_tokens=12)`` on the same prompt (history
  reps scattered into the embeddings through an input projection) plus a separate forward with the
  query mask for the representation; diffusers ``CogVideoXTransformer3DModel`` (CogVideoX-2B sizes,
  226 x 4096 text stream) in the loop of ``CogVideoXPipeline`` (CFG batched, dynamic guidance,
  ``CogVideoXDPMScheduler``, 50 steps); ``AutoencoderKLCogVideoX`` (2B sizes) decode. The plain
  decoder has no motion-scope embedder (standard CogVideoX-2B). Eager, PyTorch's own SDPA kernel order.
- ``plain+compile``: the same, with what a plain user gets from two lines: the transformer compiled
  (``transformer.compile(dynamic=False)``) and the denoising loop under SDPA's kernels in the order
  cuDNN first (``sdpa_kernel([...], set_priority=True)``). The best plain configuration.

Per side: median seconds per stage and per turn over the measured turns after the warm-up turn(s),
peak GPU memory (``max_memory_allocated``, weights included), and ``sampling``: milliseconds per
denoising step (the sample stage over the steps) and its MFU: the decoder's forward FLOPs on the CFG
batch (``phase_a.model_flops``, no LoRA branch) over the bf16 matmul peak measured in the same run
(``mfu``) and over the datasheet's dense bf16 figure (``mfu_datasheet``). ``comparisons``: the
framework's turn and sampling stage against the fastest plain side (best plain) and each plain side. The JSON (``$OUT/game_turn.json``
or ``--out``) is rewritten after every turn, so a run stopped by its time limit keeps what it measured;
``--side-timeout`` bounds each side (building included).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from _device import (add_tokenizer_argument, building, compare, mfu, official_tokenizer, peaks,  # noqa: E402 (benchmarks/ on sys.path)
                     prefer_cudnn_attention, run_stamp)
from animegamer.config.compose import carried_over, compose_config, path_override  # noqa: E402
from animegamer.game.models import play_dtype  # noqa: E402
from animegamer.models.attention_kernels import ATTENTION_BACKENDS
from animegamer.models.decoder import COMPILE_MODES
from animegamer.models.fp8 import FP8_RECIPES, OFF as FP8_OFF

LEVEL_FLOW = {1: 0.5, 2: 2.5, 3: 10.0, 4: 15.0, 5: 40.0}
STAGES = ("mllm", "sample", "vae_decode", "total")
HISTORY_TURNS = 4  # + the new turn = the 5-turn window of phase (b)
CFG_BATCH = 2  # [unconditional; conditional] in one decoder call
SIDES = ("framework", "plain", "plain+compile")
STATE_TOKENS = 12
# Fixed valid states: the played history and the fallback for a random MLLM's malformed generation.
STATES = [{"ML": 1 + k % 5, "SC": (k % 3) - 1, "ET": 1 - (k % 2) * 2, "ST": (k % 5) - 2} for k in range(16)]
# CogVideoX-2b's scheduler_config.json (what a plain diffusers user loads).
COGVIDEOX_2B_SCHEDULER = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                              beta_schedule="scaled_linear", clip_sample=False, prediction_type="v_prediction",
                              rescale_betas_zero_snr=True, set_alpha_to_one=True, snr_shift_scale=3.0,
                              steps_offset=0, timestep_spacing="trailing")


def instruction(k: int) -> str:
    return (f"Character: Qiqi; Motion: slowly walk along the cliff and turn to wave, take {k}; "
            f"Background: evening seaside with lanterns.")




class SideTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    """Raise SideTimeout in the main thread after ``seconds`` (0: no limit)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise SideTimeout(f"side stopped after {seconds} s")

    previous = signal.signal(signal.SIGALRM, handler)
    signal.alarm(int(seconds))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def compose(args):
    overrides = ["experiment=paper_eval", "model.mllm.path=''", "model.decoder.path=''",
                 "model.encoders.vae.path=''", "model.encoders.t5.path=''", "model.encoders.clip.path=''",
                 "model.mllm.lora_dropout=0"]
    if args.tokenizer:  # official_tokenizer's answer: '' = the byte tokenizer
        overrides.append(path_override("model.mllm.tokenizer", args.tokenizer))
    if args.attention:
        overrides.append(f"model.decoder.attention_backends=[{','.join(args.attention)}]")
    if args.compile:
        overrides.append("model.decoder.compile=true")
        overrides.append(f"model.decoder.compile_mode={args.compile_mode}")
    if args.vae_cudnn_benchmark:
        overrides.append("model.encoders.vae.cudnn_benchmark=true")
    if getattr(args, "vae_compile", False):  # the first decode compiles for about 100 s: give a warm-up turn
        overrides.append("model.encoders.vae.compile=true")
    if args.mllm_compile:
        overrides.append("model.mllm.compile=true")
    if getattr(args, "fp8", None):  # FP8 matmuls for the decoder's frozen linears (samples change: see fp8_decoder.py)
        overrides.append(f"model.decoder.fp8={args.fp8}")
    if getattr(args, "cache", None) is not None:  # the step cache (game_turn.py --cache): samples change
        overrides += ["model.diffusion.cache=first_block", f"model.diffusion.cache_threshold={args.cache}"]
    if args.tiny:
        overrides += ["model=tiny", "pipeline.clips.height=32", "pipeline.clips.width=48"]
    # The evaluation's settings (paper_eval), in the train root the phases' modules are built from.
    cfg = OmegaConf.to_object(carried_over("train", compose_config("evaluate", overrides)))
    if not args.tiny:  # the sizes this benchmark claims to measure
        m, d, c, v = cfg.model.mllm, cfg.model.decoder, cfg.pipeline.clips, cfg.model.encoders.vae
        checks = {"mllm 7B": (m.hidden_size, m.intermediate_size, m.num_hidden_layers, m.num_attention_heads,
                              m.num_key_value_heads) == (4096, 14336, 32, 32, 8),
                  "decoder 2B": (d.num_layers, d.num_attention_heads, d.attention_head_dim) == (30, 30, 64),
                  "50 steps, CFG 6, exponent 5": (cfg.model.diffusion.sampling_steps, cfg.model.diffusion.guidance_scale,
                                                   cfg.model.diffusion.guidance_exponent) == (50, 6.0, 5.0),
                  "17 x 480 x 720": (c.frames, c.height, c.width) == (17, 480, 720),
                  "VAE 2B": list(v.block_out_channels) == [128, 256, 256, 512] and v.layers_per_block == 3,
                  "all paths empty": not (m.path or d.path or v.path or cfg.model.encoders.t5.path
                                          or cfg.model.encoders.clip.path or m.official_checkpoint
                                          or d.official_checkpoint),
                  "window of 5": len(cfg.data.window_weights) == 5}
        wrong = [k for k, ok in checks.items() if not ok]
        if wrong:
            raise ValueError(f"composed config does not have the paper sizes: {wrong}")
    return cfg


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def to_frames(video: torch.Tensor) -> np.ndarray:
    return (video.float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()


def summarise(turns: list[dict], warmup: int) -> dict:
    measured = turns[warmup:]
    if not measured:
        return {}
    return {k: round(statistics.median(t[k] for t in measured), 4) for k in STAGES}


def sampling_step_flops(cfg, latent_shape, plain: bool) -> float:
    """Model FLOPs of one denoising step: the decoder's forward on the CFG batch, counted as phase (a)
    counts it, without LoRA branches (merged before play, or none)."""
    from phase_a import Shapes, model_flops

    from animegamer.models.encoder import representation_tokens

    _, frames, channels, height, width = latent_shape
    p, enc = cfg.model.decoder.patch_size, cfg.model.encoder
    shapes = Shapes(CFG_BATCH, (CFG_BATCH, frames, channels, height, width), (CFG_BATCH, enc.text_tokens, enc.text_dim),
                    (CFG_BATCH, enc.image_tokens, enc.image_dim), representation_tokens(enc),
                    frames * (height // p) * (width // p))
    return model_flops(cfg, shapes, plain=plain, lora=False)["forward"]


def sampling_summary(record: dict, cfg, peak: dict, plain: bool) -> dict:
    """Milliseconds per denoising step and the sampling stage's MFU, from the median sample stage."""
    seconds, steps = record["median"]["sample"], record["steps"]
    flops = sampling_step_flops(cfg, record["latent_shape"], plain)
    return {"step_ms": round(seconds / steps * 1e3, 2), "step_tflop": round(flops / 1e12, 3),
            **{k: round(x, 4) if x is not None else None for k, x in mfu(flops * steps, seconds, peak).items()}}


# --------------------------------------------------------------------------- framework
class PredictOrFixed:
    """``predict_next`` (prompt_batch + generate + parse_states), fixed valid states when the parse fails."""

    def __init__(self):
        self.calls, self.fallbacks, self.prompt_tokens, self.generated_tokens = 0, 0, 0, 0

    def __call__(self, model, tokenizer, ids, history, text, window_turns):
        from animegamer.mllm.predict import Prediction, generate, prompt_batch
        from animegamer.mllm.sequence import parse_states

        batch = prompt_batch(model, tokenizer, ids, history, text, window_turns)
        tokens, rep = generate(model, ids, batch)
        self.prompt_tokens, self.generated_tokens = int(batch["input_ids"].shape[1]), len(tokens)
        try:
            states = parse_states(ids, tokens, tokenizer)
        except ValueError:  # a random MLLM's garbage: the stages after it get valid states
            self.fallbacks += 1
            states = dict(STATES[self.calls % len(STATES)])
        self.calls += 1
        return Prediction(states, rep, tokens)


def build_framework(args, cfg, replica_device=None):
    """The framework's ``GameModels`` at ``cfg``'s sizes, random weights, on ``args.device`` in ``args.dtype``;
    with ``replica_device``, the decoder's copy for the second guidance branch there (``cfg_replica``), as
    ``load_game_models`` makes it."""
    from animegamer.game.models import GameModels, merge_for_play, renderer_for_play
    from animegamer.models.frozen_vae import FrozenVAE
    from animegamer.models.reconstruction import ReconstructionModel
    from animegamer.phases.phase_b import PhaseB

    with building(args.device, args.dtype):
        mllm = PhaseB(cfg)
        renderer = ReconstructionModel(cfg)
        renderer.decoder.add_lora()
        vae = FrozenVAE(cfg.model.encoders.vae, seed=cfg.model.encoders.seed, dtype=args.dtype)
    merge_for_play(mllm.model)  # what load_game_models does before play
    mllm = mllm.to(device=args.device, dtype=args.dtype).eval().requires_grad_(False)
    renderer, replica = renderer_for_play(renderer, args.device, args.dtype, replica_device)  # fp8 included
    vae = vae.to(device=args.device, dtype=args.dtype)
    return GameModels(mllm=mllm, renderer=renderer, vae=vae, level_flow=LEVEL_FLOW, cfg=cfg,
                      sources={"benchmark": "random weights"}, cfg_replica=replica)


def new_game(args, cfg, models):
    """A ``Game`` with 4 played turns in its history (every timed turn has the full window) and its
    ``PredictOrFixed``."""
    from animegamer.game.turns import Game
    from animegamer.mllm.predict import HistoryTurn
    from animegamer.mllm.sequence import Turn
    from animegamer.models.encoder import representation_tokens

    predict = PredictOrFixed()
    game = Game(models, seed=cfg.seed, window_turns=HISTORY_TURNS + 1, predict_fn=predict,
                sampling_steps=args.steps)
    n, d = representation_tokens(cfg.model.encoder), cfg.model.encoder.width
    generator = torch.Generator().manual_seed(1)
    # benchmark set-up through the private list
    game._history.extend(HistoryTurn(Turn(instruction(k), STATES[k]), torch.randn(n, d, generator=generator))
                         for k in range(HISTORY_TURNS))
    return game, predict


def run_framework(args, cfg, record) -> dict:
    t0 = time.perf_counter()
    models = build_framework(args, cfg)
    sync(args.device)
    record["build_s"] = round(time.perf_counter() - t0, 1)
    game, predict = new_game(args, cfg, models)
    record.update(steps=game.diffusion.sampling_steps, latent_shape=list(game.latent_shape), turns=[])
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        record["weights_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
    for k in range(args.warmup + args.turns):
        result = game.play_turn(instruction(HISTORY_TURNS + k))
        record["turns"].append({s: round(result.timings[s], 4) for s in STAGES})
        record.update(prompt_tokens=predict.prompt_tokens, generated_tokens=predict.generated_tokens,
                      fallback_states=predict.fallbacks, frames=list(result.frames.shape),
                      median=summarise(record["turns"], args.warmup))
        if record["median"]:
            record["sampling"] = sampling_summary(record, cfg, args.peak, plain=False)
        if args.device == "cuda":
            record["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        args.save()
        print(f"framework turn {k}: {record['turns'][-1]}", flush=True)
    return record


# --------------------------------------------------------------------------- plain libraries
def run_plain(args, cfg, record, compiled: bool = False) -> dict:
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDPMScheduler, CogVideoXTransformer3DModel
    from diffusers.utils.torch_utils import randn_tensor
    from transformers import MistralConfig, MistralForCausalLM

    from animegamer.mllm.collate import Example, collate_sequences, gather_queries, scatter_history
    from animegamer.mllm.masks import attention_mask_4d
    from animegamer.mllm.sequence import Turn, build_prompt
    from animegamer.models.encoder import representation_tokens
    from animegamer.models.game_mllm import game_tokenizer

    m, dec, vcfg, clips = cfg.model.mllm, cfg.model.decoder, cfg.model.encoders.vae, cfg.pipeline.clips
    n, d = representation_tokens(cfg.model.encoder), cfg.model.encoder.width
    text_dim = cfg.model.encoders.t5.d_model  # CogVideoX's text stream: T5 width (4096 for 2B)
    device, dtype = args.device, args.dtype
    tokenizer, ids = game_tokenizer(cfg)
    from animegamer.config.validate import vae_latent_shape

    latent_shape = (1, *vae_latent_shape(cfg.model.encoders, clips.frames, clips.height, clips.width))

    t0 = time.perf_counter()
    with building(device, dtype):
        config = MistralConfig(vocab_size=len(tokenizer), hidden_size=m.hidden_size,
                               intermediate_size=m.intermediate_size, num_hidden_layers=m.num_hidden_layers,
                               num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_key_value_heads,
                               max_position_embeddings=m.max_position_embeddings, rms_norm_eps=m.rms_norm_eps,
                               rope_theta=m.rope_theta, sliding_window=m.sliding_window, tie_word_embeddings=False,
                               attn_implementation="sdpa")
        llm = MistralForCausalLM(config)
        input_proj = torch.nn.Sequential(torch.nn.Linear(d, m.hidden_size), torch.nn.GELU(),
                                         torch.nn.Linear(m.hidden_size, m.hidden_size))
        output_proj = torch.nn.Sequential(torch.nn.Linear(m.hidden_size, text_dim), torch.nn.GELU(),
                                          torch.nn.Linear(text_dim, text_dim))
        transformer = CogVideoXTransformer3DModel(
            num_attention_heads=dec.num_attention_heads, attention_head_dim=dec.attention_head_dim,
            in_channels=dec.in_channels, out_channels=dec.out_channels, time_embed_dim=dec.time_embed_dim,
            text_embed_dim=text_dim, num_layers=dec.num_layers, sample_width=dec.sample_width,
            sample_height=dec.sample_height, sample_frames=dec.sample_frames, patch_size=dec.patch_size,
            max_text_seq_length=n, spatial_interpolation_scale=dec.spatial_interpolation_scale,
            temporal_interpolation_scale=dec.temporal_interpolation_scale, use_rotary_positional_embeddings=False)
        vae = AutoencoderKLCogVideoX(block_out_channels=tuple(vcfg.block_out_channels),
                                     down_block_types=("CogVideoXDownBlock3D",) * len(vcfg.block_out_channels),
                                     up_block_types=("CogVideoXUpBlock3D",) * len(vcfg.block_out_channels),
                                     layers_per_block=vcfg.layers_per_block, latent_channels=vcfg.latent_channels,
                                     norm_num_groups=vcfg.norm_num_groups,
                                     temporal_compression_ratio=vcfg.temporal_compression_ratio,
                                     scaling_factor=vcfg.scaling_factor)
    for module in (llm, input_proj, output_proj, transformer, vae):  # nn.Module.to: no diffusers fp32 warning
        torch.nn.Module.to(module, device=device, dtype=dtype).eval().requires_grad_(False)
    if compiled:  # the plain user's line; the first denoising step compiles
        transformer.compile(dynamic=False)
    # kernels are chosen when the compiled transformer is traced, so the preference spans the whole loop
    attention = (lambda: prefer_cudnn_attention(device)) if compiled else contextlib.nullcontext
    sync(device)
    record["build_s"] = round(time.perf_counter() - t0, 1)

    # The same 5-turn prompt the framework builds (4 history turns with their reps, the new turn up to <ML>).
    generator = torch.Generator().manual_seed(1)
    history = [Turn(instruction(k), STATES[k]) for k in range(HISTORY_TURNS)]
    prompt = build_prompt(ids, tokenizer, history, instruction(HISTORY_TURNS), n)
    reps = torch.randn(HISTORY_TURNS, n, d, generator=generator)
    batch = collate_sequences([Example(prompt, reps)], pad_id=ids.pad, padding_side="left")
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    mask = attention_mask_4d(batch["query_mask"], batch["padding_mask"], dtype=dtype)  # dense additive 4-D
    uncond = torch.zeros(1, n, text_dim, device=device, dtype=dtype)  # cached negative prompt embeds
    steps = args.steps or cfg.model.diffusion.sampling_steps
    scale, exponent = cfg.model.diffusion.guidance_scale, cfg.model.diffusion.guidance_exponent
    record.update(steps=steps, latent_shape=list(latent_shape), prompt_tokens=int(batch["input_ids"].shape[1]),
                  query_forward=not args.no_query_forward, turns=[])

    @torch.no_grad()
    def turn(seed: int) -> tuple[dict, tuple]:
        timings = {}
        start = time.perf_counter()
        # MLLM: generate on inputs_embeds (causal mask), then a forward with the query mask for the rep.
        embeds = llm.get_input_embeddings()(batch["input_ids"])
        embeds = scatter_history(embeds, input_proj(batch["history_reps"].to(dtype)), batch["history_index"])
        tokens = llm.generate(inputs_embeds=embeds, attention_mask=batch["padding_mask"].long(),
                              max_new_tokens=STATE_TOKENS, min_new_tokens=STATE_TOKENS, do_sample=False,
                              pad_token_id=ids.pad)
        if args.no_query_forward:
            cond = torch.randn(1, n, text_dim, device=device, dtype=dtype)
        else:
            out = llm(inputs_embeds=embeds, attention_mask=mask, position_ids=batch["position_ids"],
                      output_hidden_states=True)
            cond = output_proj(gather_queries(out.hidden_states[-1], batch["query_mask"], n))
        tokens = tokens.cpu()
        sync(device)
        timings["mllm"] = time.perf_counter() - start

        # Sampling: CogVideoXPipeline's denoising loop.
        t0 = time.perf_counter()
        scheduler = CogVideoXDPMScheduler(**COGVIDEOX_2B_SCHEDULER)
        scheduler.set_timesteps(steps, device=device)
        timesteps = scheduler.timesteps
        step_generator = torch.Generator().manual_seed(seed)
        latents = randn_tensor(latent_shape, generator=step_generator, device=torch.device(device), dtype=dtype)
        latents = latents * scheduler.init_noise_sigma
        prompt_embeds = torch.cat([uncond, cond])
        old_pred = None
        for i, t in enumerate(timesteps):
            x = scheduler.scale_model_input(torch.cat([latents] * CFG_BATCH), t)
            with attention():
                v = transformer(hidden_states=x, encoder_hidden_states=prompt_embeds, timestep=t.expand(x.shape[0]),
                                return_dict=False)[0].float()
            g = 1 + scale * (1 - math.cos(math.pi * ((steps - t.item()) / steps) ** exponent)) / 2
            v_uncond, v_cond = v.chunk(2)
            v = v_uncond + g * (v_cond - v_uncond)
            latents, old_pred = scheduler.step(v, old_pred, t, timesteps[i - 1] if i > 0 else None, latents,
                                               generator=step_generator, return_dict=False)
            latents = latents.to(dtype)
        sync(device)
        timings["sample"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        video = vae.decode(latents.permute(0, 2, 1, 3, 4) / vae.config.scaling_factor).sample  # (1, 3, T, H, W)
        frames = to_frames(((video.float() + 1) / 2).permute(0, 2, 3, 4, 1)[0])
        timings["vae_decode"] = time.perf_counter() - t0
        timings["total"] = time.perf_counter() - start
        return timings, (tuple(tokens.shape), frames.shape)

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        record["weights_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
    for k in range(args.warmup + args.turns):
        timings, (token_shape, frame_shape) = turn(1000 + k)
        record["turns"].append({s: round(timings[s], 4) for s in STAGES})
        record.update(generated_tokens=token_shape[-1], frames=list(frame_shape),
                      median=summarise(record["turns"], args.warmup))
        if record["median"]:
            record["sampling"] = sampling_summary(record, cfg, args.peak, plain=True)
        if device == "cuda":
            record["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        args.save()
        print(f"{'plain+compile' if compiled else 'plain'} turn {k}: {record['turns'][-1]}", flush=True)
    return record


# --------------------------------------------------------------------------- report
def comparisons(runs: dict) -> list[dict]:
    """The fastest framework side against the plain sides, by turn and by sampling stage."""
    rows = [{"name": side, "total": row["median"]["total"], "sample": row["median"]["sample"]}
            for side, row in runs.items() if row.get("median") and "error" not in row]
    framework = [r for r in rows if r["name"].startswith("framework")]
    plain = [r for r in rows if r["name"].startswith("plain")]
    if not framework or not plain:
        return []
    return [{"stage": stage, **compare(min(framework, key=lambda r: r[stage]), plain, stage)}
            for stage in ("total", "sample")]


def table(results: dict) -> str:
    lines = ["| side | mllm s | sample s | vae_decode s | total s | step ms | MFU | MFU datasheet | peak GiB | turns | note |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for side, row in results["runs"].items():
        med = row.get("median") or {}
        cells = [f"{med[s]:.3f}" if s in med else "-" for s in STAGES]
        sampling = row.get("sampling") or {}
        cells += [f"{sampling['step_ms']:.1f}" if sampling else "-"]
        cells += [f"{sampling[k] * 100:.1f} %" if sampling.get(k) is not None else "-" for k in ("mfu", "mfu_datasheet")]
        measured = max(0, len(row.get("turns", [])) - results["warmup"])
        note = row.get("error", "")
        if side.startswith("framework") and "fallback_states" in row:
            note = (note + "; " if note else "") + f"fixed states after {row['fallback_states']} malformed generations"
        peak = row.get("peak_gib")
        lines.append(f"| {side} | " + " | ".join(cells) + f" | {peak if peak is not None else '-'} | {measured} | {note} |")
    return "\n".join(lines)


def main() -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny configs on CPU, 2 sampling steps")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--turns", type=int, default=3, help="measured turns per side")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="sampling steps (default: the config's, 50)")
    parser.add_argument("--no-query-forward", action="store_true", help="plain side: skip the query forward")
    parser.add_argument("--side-timeout", type=int, default=0, help="seconds per side, building included")
    parser.add_argument("--deadline", type=int, default=0,
                        help="seconds for the whole run: a side also stops when it would pass this")
    add_tokenizer_argument(parser)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                        help="weights dtype (auto: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--attention", nargs="+", default=None, choices=ATTENTION_BACKENDS,
                        help="framework side: SDPA kernels in order of preference (default: the config's)")
    parser.add_argument("--compile", action="store_true", help="framework side: torch.compile the decoder")
    parser.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                        help="with --compile: model.decoder.compile_mode (reduce-overhead, max-autotune: CUDA graphs)")
    parser.add_argument("--mllm-compile", action="store_true",
                        help="framework side: model.mllm.compile (each Mistral layer compiled: prefill and decode)")
    parser.add_argument("--vae-cudnn-benchmark", action="store_true",
                        help="framework side: model.encoders.vae.cudnn_benchmark (cuDNN picks the VAE's conv algorithms)")
    parser.add_argument("--vae-compile", action="store_true",
                        help="framework side: model.encoders.vae.compile (the first decode compiles, ~100 s)")
    parser.add_argument("--cache", type=float, default=None, metavar="THRESHOLD",
                        help="framework side: model.diffusion.cache=first_block at this threshold "
                             "(benchmarks/step_cache.py measures what it changes)")
    parser.add_argument("--fp8", default=None, choices=[r for r in FP8_RECIPES if r != FP8_OFF],
                        help="framework side: model.decoder.fp8 (torchao float8 for the frozen base linears; "
                             "benchmarks/fp8_decoder.py measures what it changes)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.tokenizer = official_tokenizer(args.tokenizer, args.tiny)
    if args.compile_mode != "default" and not args.compile:
        parser.error("--compile-mode applies to --compile only")
    args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if args.dtype == "auto":
        args.dtype = play_dtype(args.device)
    else:
        args.dtype = getattr(torch, args.dtype)
    if args.tiny:
        args.steps = args.steps or 2
    out = args.out or Path(os.environ.get("OUT", ".")) / "game_turn.json"

    import diffusers
    import transformers

    args.peak = peaks(args.device)
    results = {**run_stamp(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "bf16_peak_tflops": round(args.peak["measured_tflops"], 1),
               "datasheet_bf16_tflops": args.peak["datasheet_tflops"],
               "dtype": str(args.dtype).removeprefix("torch."), "tiny": args.tiny, "warmup": args.warmup,
               "measured_turns": args.turns, "torch": torch.__version__, "transformers": transformers.__version__,
               "diffusers": diffusers.__version__, "level_flow": LEVEL_FLOW, "runs": {}}
    if out.exists():  # an earlier invocation's sides stay (one side per process is allowed)
        previous = json.loads(out.read_text())
        if previous.get("tiny") == args.tiny:
            results["runs"].update(previous.get("runs", {}))

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))

    args.save = save
    cfg = compose(args)
    results["tokenizer"] = cfg.model.mllm.tokenizer or "byte tokenizer (--tokenizer byte)"
    for side in args.sides:
        name = side
        compiled = "compile" if args.compile_mode == "default" else f"compile={args.compile_mode}"
        options = [flag for flag, on in ((compiled, args.compile), ("mllm-compile", args.mllm_compile),
                                         ("vae-cudnn-benchmark", args.vae_cudnn_benchmark),
                                         ("vae-compile", args.vae_compile),
                                         (f"fp8={args.fp8}", args.fp8)) if on]
        if side == "framework" and (args.attention or options):  # a variant: its own row
            name += f"[{'+'.join([*(args.attention or ['config']), *options])}]"
        record = results["runs"][name] = {}
        limit = args.side_timeout
        if args.deadline:
            left = max(1, int(args.deadline - (time.perf_counter() - started)))
            limit = min(limit, left) if limit else left
        try:
            with time_limit(limit):
                if side == "framework":
                    run_framework(args, cfg, record)
                else:
                    run_plain(args, cfg, record, compiled=side == "plain+compile")
        except (SideTimeout, torch.OutOfMemoryError, Exception) as error:  # keep what was measured
            record["error"] = f"{type(error).__name__}: {error}"[:500]
            print(f"{side}: {record['error']}", file=sys.stderr, flush=True)
        save()
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    results["comparisons"] = comparisons(results["runs"])
    save()
    print(json.dumps(results, indent=2))
    print(table(results))
    for c in results["comparisons"]:
        print(f"{c['stage']}: {c['framework']} {c['framework_s']:.3f} s, best plain {c['best_plain']} "
              f"{c['best_plain_s']:.3f} s: {c['speedup_vs_best_plain']:.2f}x; "
              + ", ".join(f"{k} {x:.2f}x" for k, x in c["speedup_vs"].items()), flush=True)


if __name__ == "__main__":
    main()
