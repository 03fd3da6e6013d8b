"""Phase (a2) training step on one GPU: the framework's own step beside plain diffusers + peft.

    python benchmarks/phase_a.py                  # paper sizes, CUDA, main variants x {no GC, GC} (~6 min on an H200)
    python benchmarks/phase_a.py --extras         # + SDPA backends (flash / cudnn / efficient) and TF32
    python benchmarks/phase_a.py --tiny           # tiny config on CPU, 2 steps: a smoke test of every code path
    python benchmarks/phase_a.py --gc 0 --only plain-bf16 framework-mixed    # a subset, by exact variant name
    python benchmarks/phase_a.py --profile        # + a torch.profiler table of one step of a few variants

Needs diffusers, peft, lightning, hydra-core and omegaconf (see benchmarks/README.md for a GPU machine
that lacks some). Exit status 1 when any variant failed (its error is in the table and the JSON).

Random weights, no downloads. Paper scale: latents (1, 5, 16, 60, 90) (17 frames at 480x720), T5 features
(1, 30, 4096), CLIP patch tokens (1, 196, 768), representation 226 x 1920, batch 1. Phase a2 (``a_joint``):
decoder LoRA r 64 alpha 1 on to_q/to_k/to_v/to_out.0, every block's AdaLN modulation linears, the encoder
and the motion-scope embedder train; everything else is frozen.

What is timed (forward + backward + gradient clipping + optimizer step, one sample):

- ``framework-*``: ``PhaseA`` built from the composed config (``experiment=paper_a_joint`` with random
  weights), stepped the way Lightning's automatic optimisation steps it: ``zero_grad`` ->
  ``SampleRandom`` + ``diffusion_loss`` (the body of ``training_step``, generator on the GPU, CFG dropout,
  float32 loss) inside the precision's autocast -> ``backward`` -> ``clip_grad_norm_(grad_clip)`` ->
  fused AdamW from ``configure_optimizers`` -> LR scheduler. ``-mixed`` is Lightning's ``bf16-mixed``
  (what ``configs/trainer/gpu.yaml`` uses: float32 weights and optimizer, ``torch.autocast(bfloat16)``);
  ``-true`` is ``bf16-true`` (the module cast to bfloat16, no autocast, bfloat16 optimizer states).
- ``lightning-*``: the same module under a real ``lightning.Trainer`` (``bf16-mixed`` or ``bf16-true``,
  ``gradient_clip_val=phase.grad_clip``), timed between consecutive ``on_train_batch_start`` hooks (batch
  transfer, logging and hooks included). ``lightning-mixed+clip-hook`` clips in a module hook instead of
  through Lightning's precision plugin (a benchmark-only subclass; see benchmarks/README.md for why).
- ``plain-*``: diffusers ``CogVideoXTransformer3DModel`` at CogVideoX-2B sizes (its own ``text_proj`` on
  (1, 226, 4096) inputs, no encoder, no motion scope), peft LoRA with the same targets via ``add_adapter``,
  AdaLN linears trainable, fused AdamW, the v-prediction MSE written inline with on-GPU randomness.
  ``-bf16`` is the usual pure-bf16 recipe (weights, grads and Adam states in bfloat16); ``-mixed`` is
  float32 weights + autocast, the framework's precision. ``+compile`` is the best plain configuration,
  what a plain user gets with two lines: ``transformer.compile(dynamic=False)`` and SDPA's kernels in
  the order cuDNN first (``sdpa_kernel([...], set_priority=True)``); without it, eager with PyTorch's
  own kernel order.
- ``diag-*``: diagnostics, not the framework: the framework step with one thing changed in this script
  (never in src/) to test a hypothesis about where time goes: ``rep-bf16`` (encoder output cast to bf16
  under autocast), ``cuda-rng`` (the step generator on the GPU), ``frozen-bf16`` (frozen weights stored
  in bf16 under autocast), ``fp32-master`` (bf16 module, float32 master weights and Adam states for the
  trainable parameters).

Every variant runs without and with gradient checkpointing (``--gc``). Per variant: median step time
over ``--steps`` steps after ``--warmup`` steps, from CUDA events recorded between consecutive steps
(steps run back to back, as in training; min and max are in the JSON), samples/s, video tokens/s, MFU, peak memory
(``torch.cuda.max_memory_allocated``, reset after the build so it counts weights, optimizer state and
activations). MFU = model FLOPs per step / step time / the bf16 matmul peak measured in the same run
(8192^3 products); ``mfu_datasheet`` divides by the datasheet's dense bf16 figure instead (989 TFLOP/s on
an H100 SXM or H200). Model FLOPs are written out in ``model_flops``: 3 x the forward (forward + backward,
the usual convention, even though frozen weights need no weight gradient); recomputation under gradient
checkpointing is not counted. ``mfu_needed`` uses the FLOPs this step actually has to do (frozen linears
2 x forward, trainable ones and attention 3 x forward).

Results are printed as a table and written to ``$OUT/phase_a_benchmark.json`` (or ``--out``), with
``comparisons``: per precision and checkpointing mode, the fastest framework row against the fastest
plain row (the best plain configuration) and every other plain row.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from animegamer.utils.text import doc_summary

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a bare checkout (the GPU machine) has no installed package
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from _device import compare, mfu, peaks, prefer_cudnn_attention, run_stamp  # noqa: E402  (benchmarks/ on sys.path)
from animegamer.models.attention_kernels import ATTENTION_BACKENDS  # noqa: E402

PAPER_LATENT_FRAMES = 5  # (17 - 1) // 4 + 1
VAE_TEMPORAL = 4


# --------------------------------------------------------------------------- config and shapes
def run_config(tiny: bool, extra: list[str] = ()):
    """The composed training config of phase a2 at paper (or tiny) sizes, random weights."""
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config

    overrides = ["experiment=paper_a_joint", "model.decoder.path=''", "phase.init_from=''", "logger=none"]
    if tiny:
        overrides.append("model=tiny")
    return OmegaConf.to_object(compose_config("train", overrides + list(extra)))


@dataclass
class Shapes:
    batch: int
    latents: tuple  # (B, T', C, H', W')
    text: tuple  # (B, Lt, text_dim)
    image: tuple  # (B, Li, image_dim)
    rep_tokens: int  # N
    video_tokens: int  # T' * H'/p * W'/p

    @property
    def seq(self) -> int:
        return self.rep_tokens + self.video_tokens


def shapes_of(cfg) -> Shapes:
    enc, dec = cfg.model.encoder, cfg.model.decoder
    b = cfg.phase.batch_size
    h, w = dec.sample_height, dec.sample_width  # paper: 60 x 90 latents of a 480 x 720 clip
    p = dec.patch_size
    return Shapes(b, (b, PAPER_LATENT_FRAMES, dec.in_channels, h, w), (b, enc.text_tokens, enc.text_dim),
                  (b, enc.image_tokens, enc.image_dim), enc.text_tokens + enc.image_tokens,
                  PAPER_LATENT_FRAMES * (h // p) * (w // p))


# --------------------------------------------------------------------------- FLOPs
def model_flops(cfg, shapes: Shapes, plain: bool = False, lora: bool = True) -> dict:
    """FLOPs of one training step, written out (multiply-add = 2 FLOPs).

    Per transformer block, on the joint sequence S = N + video tokens (every projection and the
    feed-forward run on all S tokens, text stream included):
      linear  = 2 * S * (4 D^2 [q, k, v, out] + 2 D * 4D [feed-forward] + 4 * r * 2D [LoRA A and B])
      attn    = 4 * S^2 * D              (Q K^T and P V, 2 S^2 D each, over all heads)
      adaln   = 2 * 2 * time_dim * 6D    (two modulation linears on one vector per sample)
    Outside the blocks: patch embedding 2 * Sv * (C p^2) * D, output projection 2 * Sv * D * (C p^2),
    the encoder MLPs (framework) or the frozen text_proj (plain) on the N representation tokens, the
    time / motion-scope embedders (one vector).
    Training step = 3 x forward (forward + backward). Gradient-checkpointing recomputation is NOT
    counted (it is not model work). ``needed`` counts what the step really has to compute: frozen
    linears forward + input gradient (2x), trainable ones and attention 3x. ``lora=False``: a network
    with no LoRA branch (merged for play, or none).
    """
    dec, enc = cfg.model.decoder, cfg.model.encoder
    d = dec.num_attention_heads * dec.attention_head_dim
    r = dec.lora_rank
    s, sv, n = shapes.seq, shapes.video_tokens, shapes.rep_tokens
    c, p, te, layers = dec.in_channels, dec.patch_size, dec.time_embed_dim, dec.num_layers
    frozen_block = 2 * s * (4 * d * d + 2 * d * 4 * d)
    lora_block = 2 * s * (4 * r * 2 * d) if lora else 0
    attn_block = 4 * s * s * d
    adaln_block = 2 * 2 * te * 6 * d
    patch = 2 * sv * (c * p * p) * d
    proj_out = 2 * sv * d * (dec.out_channels * p * p) + 2 * te * 2 * d  # + final AdaLN linear
    time_emb = 2 * (d * te + te * te)
    if plain:
        rep = 2 * n * 4096 * d  # CogVideoX-2B's frozen text_proj (T5 width 4096)
        motion = 0
        rep_trainable = False
    else:
        rep = 2 * (enc.text_tokens * (enc.text_dim * d + d * d) + enc.image_tokens * (enc.image_dim * d + d * d))
        motion = 2 * (d * te + te * te)
        rep_trainable = True
    b = shapes.batch
    forward = b * (layers * (frozen_block + lora_block + attn_block + adaln_block) + patch + proj_out + time_emb
                   + rep + motion)
    needed = b * (layers * (2 * frozen_block + 3 * lora_block + 3 * attn_block + 3 * adaln_block) + patch
                  + 2 * proj_out + time_emb + (3 if rep_trainable else 1) * rep + 3 * motion)
    return {"forward": forward, "step": 3 * forward, "needed": needed,
            "per_block_forward": {"linear_frozen": frozen_block, "lora": lora_block, "attention": attn_block,
                                  "adaln": adaln_block},
            "seq": s, "video_tokens": sv, "rep_tokens": n, "hidden": d, "layers": layers}


# --------------------------------------------------------------------------- device helpers
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cleanup(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def host_cpu_counters() -> list[int] | None:
    """Aggregate /proc/stat CPU jiffies (user nice system idle iowait irq softirq steal), or None."""
    try:
        with open("/proc/stat") as handle:
            return [int(x) for x in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def host_cpu_share(before, after) -> dict | None:
    """Busy and steal fractions of the host's CPUs between two counter reads (steal: a VM's lost time)."""
    if not before or not after:
        return None
    delta = [b - a for a, b in zip(before, after)]
    total = sum(delta) or 1
    return {"busy": round(1 - (delta[3] + delta[4]) / total, 4), "steal": round(delta[7] / total, 4)}


def sdpa_context(backend: str, device: torch.device):
    """``default``: PyTorch's own kernel order; ``prefer-cudnn``: every kernel allowed, cuDNN tried
    first (the plain user's line); a kernel's name: that kernel only."""
    if backend == "default":
        return contextlib.nullcontext()
    if backend == "prefer-cudnn":
        return prefer_cudnn_attention(device)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend])


def autocast_context(device: torch.device, mixed: bool, cache_enabled: bool = True):
    if not mixed:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache_enabled)


@contextlib.contextmanager
def lightning_forward_context(device: torch.device, mixed: bool):
    """Lightning's precision plugin around training_step.

    bf16-mixed: ``torch.autocast(bfloat16, cache_enabled=False)``; bf16-true: default dtype bfloat16
    (so tensors created without a dtype inside the step, e.g. the noise, are bfloat16).
    """
    if mixed:
        with autocast_context(device, True, cache_enabled=False):
            yield
        return
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        yield
    finally:
        torch.set_default_dtype(default)


def residual_dtype_probe(blocks) -> tuple[Callable[[], str], Callable[[], None]]:
    """Record the dtype of the residual stream entering the first transformer block."""
    seen: dict = {}

    def hook(_module, args, kwargs):
        hs = kwargs.get("hidden_states", args[0] if args else None)
        ehs = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        seen["dtype"] = f"{str(hs.dtype).removeprefix('torch.')}/{str(ehs.dtype).removeprefix('torch.')}"

    handle = blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
    return (lambda: seen.get("dtype", "?")), handle.remove


# --------------------------------------------------------------------------- variants
@dataclass
class Variant:
    name: str
    kind: str  # framework | lightning | plain
    mixed: bool  # bf16-mixed (fp32 weights + autocast) vs pure bf16
    gc: bool
    sdpa: str = "default"
    tf32: bool = False
    diag: str = ""  # framework diagnostics: rep_bf16 (cast the representation to bf16 under autocast)
    note: str = ""
    compile: bool = False  # framework: model.decoder.compile=true; plain: transformer.compile (first step compiles)


@dataclass
class Built:
    step: Callable[[int], torch.Tensor]  # step index -> loss
    params_trainable: int
    params_total: int
    residual_dtype: Callable[[], str]
    teardown: list = field(default_factory=list)
    plain: bool = False


def synthetic_batch(shapes: Shapes, device: torch.device, dtype: torch.dtype = torch.float32, seed: int = 1) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)
    batch = {"latents": torch.randn(shapes.latents, generator=g), "text": torch.randn(shapes.text, generator=g),
             "image": torch.randn(shapes.image, generator=g),
             "flow": torch.full((shapes.batch,), 2.5)}
    return {k: v.to(device=device, dtype=dtype if k != "flow" else torch.float32) for k, v in batch.items()}


def _build_on(device: torch.device, make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """Initialise random weights directly on the device (seconds instead of a minute on CPU at 1.7B params)."""
    try:
        with torch.device(device):
            return make()
    except Exception as error:  # noqa: BLE001 - fall back to a CPU build, then move
        print(f"  (build on {device} failed: {error!r}; building on CPU)", flush=True)
        return make().to(device)


def build_framework(v: Variant, cfg, shapes: Shapes, device: torch.device) -> Built:
    from animegamer.phases.phase_a import PhaseA
    from animegamer.utils.randomness import SampleRandom, sample_positions

    if v.compile:
        from dataclasses import replace

        cfg = replace(cfg, model=replace(cfg.model, decoder=replace(cfg.model.decoder, compile=True)))
    module = _build_on(device, lambda: PhaseA(cfg))
    module.to(device)  # also sets LightningModule.device, which diffusion_loss reads
    if not v.mixed:
        module.to(torch.bfloat16)  # Lightning bf16-true
    if "frozen_bf16" in v.diag:
        # Hypothesis test: frozen weights stored in bf16 (no per-step autocast weight casts, half the
        # weight memory); what trains stays float32 under autocast.
        for p in module.parameters():
            if not p.requires_grad:
                p.data = p.data.to(torch.bfloat16)
    module.model.decoder.set_gradient_checkpointing(v.gc)
    module.train()
    opt_cfg = module.configure_optimizers()
    optimizer, scheduler = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    masters = None
    if "fp32_master" in v.diag:
        # Hypothesis test: bf16 module (the fast path) + float32 master copies of what trains, the optimizer
        # stepping the masters (Megatron / DeepSpeed style), so updates are not rounded to bf16.
        from animegamer.phases.common import lr_lambda

        masters = [p.detach().float() for p in params]
        by_id = {id(p): m for p, m in zip(params, masters)}
        groups = [{"params": [by_id[id(p)] for p in g["params"]], "weight_decay": g["weight_decay"]}
                  for g in optimizer.param_groups]
        ph = cfg.phase
        optimizer = torch.optim.AdamW(groups, lr=ph.lr, betas=tuple(ph.betas), eps=ph.eps,
                                      fused=device.type == "cuda" or None)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(ph))
    # Lightning's bf16-true converts the batch's floating tensors to bf16; bf16-mixed leaves them.
    batch = synthetic_batch(shapes, device, torch.float32 if v.mixed else torch.bfloat16)
    clip_val = cfg.phase.grad_clip
    dtype_of, remove = residual_dtype_probe(module.model.decoder.transformer.transformer_blocks)
    teardown = [remove]
    if "rep_bf16" in v.diag:
        # Hypothesis test only: under autocast the encoder's final LayerNorm returns float32, the decoder's
        # text_proj is Identity, and torch.cat([fp32 rep, bf16 patches]) promotes the whole residual stream.
        def cast(_m, _inputs, out):
            return out.to(torch.bfloat16) if torch.is_autocast_enabled(device.type) else out

        teardown.append(module.model.encoder.register_forward_hook(cast).remove)

    def step(i: int) -> torch.Tensor:
        # Lightning automatic optimisation, precision plugin and gradient clipping, in order.
        optimizer.zero_grad(set_to_none=True)
        with lightning_forward_context(device, v.mixed):
            # training_step: (seed, micro step, rank) on the module's device (the GPU since the fix the
            # cuda_rng diagnostic motivated; the diagnostic is now the same as the framework step)
            draw = SampleRandom(cfg.seed, sample_positions(i, shapes.batch, 0, 1), device)
            loss = module.diffusion_loss(module.to_clip_batch(batch), draw)
        loss.backward()
        if masters is not None:
            for p, m in zip(params, masters):
                m.grad = p.grad.float()
                p.grad = None
            if clip_val:
                torch.nn.utils.clip_grad_norm_(masters, clip_val)
            optimizer.step()
            with torch.no_grad():
                torch._foreach_copy_(params, masters)
            scheduler.step()
            return loss
        if clip_val:
            torch.nn.utils.clip_grad_norm_(params, clip_val)
        optimizer.step()
        scheduler.step()
        return loss

    n_train = sum(p.numel() for p in params)
    n_total = sum(p.numel() for p in module.parameters())
    built = Built(step, n_train, n_total, dtype_of, teardown)
    built.module = module  # kept alive for the profiler / teardown
    return built


def build_plain(v: Variant, cfg, shapes: Shapes, device: torch.device) -> Built:
    """diffusers + peft, the way a diffusers LoRA training script would write it."""
    from diffusers import CogVideoXDDIMScheduler, CogVideoXTransformer3DModel
    from peft import LoraConfig

    dec = cfg.model.decoder
    kwargs = dict(num_attention_heads=dec.num_attention_heads, attention_head_dim=dec.attention_head_dim,
                  in_channels=dec.in_channels, out_channels=dec.out_channels, time_embed_dim=dec.time_embed_dim,
                  num_layers=dec.num_layers, sample_width=dec.sample_width, sample_height=dec.sample_height,
                  sample_frames=dec.sample_frames, patch_size=dec.patch_size,
                  max_text_seq_length=shapes.rep_tokens, spatial_interpolation_scale=dec.spatial_interpolation_scale,
                  text_embed_dim=4096 if cfg.model.name == "paper" else cfg.model.encoder.text_dim)
    torch.manual_seed(0)
    model = _build_on(device, lambda: CogVideoXTransformer3DModel(**kwargs))
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=dec.lora_rank, lora_alpha=dec.lora_alpha, init_lora_weights=True,
                                 target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name or (name.startswith("transformer_blocks.") and
                                             (".norm1.linear." in name or ".norm2.linear." in name)))
    model.to(device)
    if not v.mixed:
        model.to(torch.bfloat16)
    if v.gc:
        model.enable_gradient_checkpointing()
    if v.compile:  # the one line a diffusers user adds; fixed shapes, as in the framework's decoder
        model.compile(dynamic=False)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.phase.lr, betas=tuple(cfg.phase.betas),
                                  weight_decay=cfg.phase.weight_decay, eps=cfg.phase.eps,
                                  fused=device.type == "cuda" or None)
    sched = CogVideoXDDIMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                                   beta_schedule="scaled_linear", snr_shift_scale=3.0,
                                   prediction_type="v_prediction", rescale_betas_zero_snr=True,
                                   timestep_spacing="trailing", set_alpha_to_one=True, clip_sample=False)
    ac = sched.alphas_cumprod.to(device=device, dtype=torch.float32)
    wdtype = torch.float32 if v.mixed else torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(1)
    x0 = torch.randn(shapes.latents, generator=g).to(device)
    text_width = kwargs["text_embed_dim"]
    prompt = torch.randn((shapes.batch, shapes.rep_tokens, text_width), generator=g).to(device=device, dtype=wdtype)
    dtype_of, remove = residual_dtype_probe(model.transformer_blocks)

    def step(i: int) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with autocast_context(device, v.mixed):
            t = torch.randint(0, 1000, (shapes.batch,), device=device)
            noise = torch.randn_like(x0)
            a = ac[t].view(-1, 1, 1, 1, 1)
            x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
            target = a.sqrt() * noise - (1 - a).sqrt() * x0
            pred = model(hidden_states=x_t.to(wdtype), encoder_hidden_states=prompt, timestep=t,
                         return_dict=False)[0]
            loss = torch.nn.functional.mse_loss(pred.float(), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.phase.grad_clip)
        optimizer.step()
        return loss

    built = Built(step, sum(p.numel() for p in params), sum(p.numel() for p in model.parameters()), dtype_of,
                  [remove], plain=True)
    built.module = model
    return built


# --------------------------------------------------------------------------- timing
def time_steps(step: Callable[[int], torch.Tensor], device: torch.device, warmup: int, steps: int) -> dict:
    """Back-to-back steps; per-step times from events recorded between consecutive steps."""
    losses, first = [], None
    for i in range(warmup):
        t0 = time.perf_counter()
        losses.append(step(i).detach())
        if i == 0:  # a compiled variant compiles here: the one-off cost a run pays
            sync(device)
            first = time.perf_counter() - t0
    sync(device)
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        wall = time.perf_counter()
        for i in range(steps):
            events[i].record()
            losses.append(step(warmup + i).detach())
        events[-1].record()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - wall
        times = [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(steps)]
    else:
        times, wall = [], time.perf_counter()
        for i in range(steps):
            t0 = time.perf_counter()
            losses.append(step(warmup + i).detach())
            times.append(time.perf_counter() - t0)
        wall = time.perf_counter() - wall
    values = [float(x) for x in losses]
    if not all(math.isfinite(x) for x in values):
        raise FloatingPointError(f"non-finite loss: {values}")
    return {"times_s": times, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "wall_per_step_s": wall / steps, "first_step_s": first, "losses": values}


def run_lightning(v: Variant, cfg, shapes: Shapes, device: torch.device, warmup: int, steps: int) -> dict:
    """The framework module under a real Lightning Trainer (bf16-mixed), timed by a callback."""
    import lightning as L

    from animegamer.phases.phase_a import PhaseA

    cls = PhaseA
    if "clip_hook" in v.diag:
        class ClipHookPhaseA(PhaseA):
            """Benchmark-only: clip with torch directly. Lightning's MixedPrecision.clip_gradients refuses
            optimizers with ``_step_supports_amp_scaling`` (fused AdamW), although bf16 has no scaler."""

            def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
                if gradient_clip_val:
                    torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]],
                                                   gradient_clip_val)

        cls = ClipHookPhaseA
    module = _build_on(device, lambda: cls(cfg))
    module.model.decoder.set_gradient_checkpointing(v.gc)
    dtype_of, remove = residual_dtype_probe(module.model.decoder.transformer.transformer_blocks)
    batch = synthetic_batch(shapes, torch.device("cpu"))
    total = warmup + steps
    loader = torch.utils.data.DataLoader([{k: x[0] for k, x in batch.items()}] * total, batch_size=shapes.batch)

    class Timer(L.Callback):
        def __init__(self):
            self.events, self.starts, self.losses, self.wall = [], [], [], None

        def on_train_batch_start(self, trainer, pl_module, b, batch_idx):
            if batch_idx == warmup:
                sync(device)
                self.wall = time.perf_counter()
            if batch_idx >= warmup:
                if device.type == "cuda":
                    e = torch.cuda.Event(enable_timing=True)
                    e.record()
                    self.events.append(e)
                else:
                    self.starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer, pl_module, outputs, b, batch_idx):
            self.losses.append(outputs["loss"].detach())

        def on_train_end(self, trainer, pl_module):
            if device.type == "cuda":
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                self.events.append(e)
            else:
                self.starts.append(time.perf_counter())
            sync(device)
            self.wall = time.perf_counter() - self.wall

    timer = Timer()
    accelerator = "gpu" if device.type == "cuda" else "cpu"
    trainer = L.Trainer(accelerator=accelerator, devices=1, precision="bf16-mixed" if v.mixed else "bf16-true",
                        max_steps=total,
                        gradient_clip_val=cfg.phase.grad_clip or None, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, callbacks=[timer], default_root_dir=str(ROOT / "outputs" / "bench_tmp"))
    cleanup(device)
    trainer.fit(module, train_dataloaders=loader)
    if device.type == "cuda":
        times = [timer.events[i].elapsed_time(timer.events[i + 1]) / 1e3 for i in range(len(timer.events) - 1)]
    else:
        times = [timer.starts[i + 1] - timer.starts[i] for i in range(len(timer.starts) - 1)]
    values = [float(x) for x in timer.losses]
    if not all(math.isfinite(x) for x in values):
        raise FloatingPointError(f"non-finite loss: {values}")
    result = {"times_s": times, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
              "wall_per_step_s": timer.wall / steps, "losses": values}
    params = [p for p in module.parameters() if p.requires_grad]
    result.update(params_trainable=sum(p.numel() for p in params),
                  params_total=sum(p.numel() for p in module.parameters()), residual_dtype=dtype_of())
    remove()
    del trainer, module, loader, timer
    return result


def profile_step(built: Built, device: torch.device, warm: int, path: Path) -> dict:
    """One profiled step (after a warm step): kernel time by category and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    built.step(warm)
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        built.step(warm + 1)
        sync(device)
    wall = time.perf_counter() - t0
    avgs = prof.key_averages()
    sort_key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    try:
        table = avgs.table(sort_by=sort_key, row_limit=45, max_name_column_width=110)
    except Exception:  # noqa: BLE001 - older key names
        table = avgs.table(sort_by="self_cuda_time_total", row_limit=45)
    path.write_text(table)
    cats: dict = {}
    kernels = []
    if device.type == "cuda":
        rows = [e for e in avgs if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        if not rows:  # some versions keep kernels out of key_averages: fall back to the raw events
            rows = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        for e in rows:
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = getattr(e, "self_cuda_time_total", 0.0)
            name = getattr(e, "key", getattr(e, "name", "?")).lower()
            if any(k in name for k in ("flash", "fmha", "cudnn", "attention", "sdpa")):
                cat = "attention"
            elif any(k in name for k in ("gemm", "nvjet", "xmma", "cutlass", "sm90", "matmul", "wgmma")):
                cat = "matmul"
            elif "memcpy" in name or "memset" in name:
                cat = "memcpy/memset"
            elif "layer_norm" in name or "layernorm" in name:
                cat = "layer_norm"
            elif "adam" in name or "foreach" in name or "multi_tensor" in name:
                cat = "optimizer/clip"
            else:
                cat = "elementwise/other"
            cats[cat] = cats.get(cat, 0.0) + us / 1e6
            kernels.append((us / 1e6, getattr(e, "count", 1), getattr(e, "key", getattr(e, "name", "?"))[:120]))
    kernels.sort(reverse=True)
    return {"wall_s": wall, "kernel_s_by_category": {k: round(x, 5) for k, x in sorted(cats.items())},
            "kernel_s_total": round(sum(cats.values()), 5),
            "top_kernels": [{"s": round(s, 5), "count": c, "name": n} for s, c, n in kernels[:25]],
            "table_file": path.name}


# --------------------------------------------------------------------------- main
def variants(args, device: torch.device) -> list[Variant]:
    out = []
    for gc_on in args.gc:
        g = bool(gc_on)
        out += [
            Variant("framework-mixed", "framework", True, g, note="the project's step (Lightning bf16-mixed)"),
            Variant("framework-true", "framework", False, g, note="the project's step, Lightning bf16-true"),
            Variant("plain-bf16", "plain", False, g, note="diffusers+peft, pure bf16 (reference recipe)"),
            Variant("plain-mixed", "plain", True, g, note="diffusers+peft, fp32 weights + autocast"),
            Variant("plain-bf16+compile", "plain", False, g, sdpa="prefer-cudnn", compile=True,
                    note="diffusers+peft, pure bf16, transformer.compile + cuDNN attention first (best plain)"),
            Variant("plain-mixed+compile", "plain", True, g, sdpa="prefer-cudnn", compile=True,
                    note="diffusers+peft, fp32 weights + autocast, transformer.compile + cuDNN attention first"),
            Variant("lightning-mixed", "lightning", True, g, note="framework under lightning.Trainer (as shipped)"),
            Variant("lightning-mixed+clip-hook", "lightning", True, g, diag="clip_hook",
                    note="lightning.Trainer, clipping through a module hook (benchmark-only patch)"),
            Variant("lightning-true", "lightning", False, g, note="framework under lightning.Trainer bf16-true"),
            Variant("diag-rep-bf16", "framework", True, g, diag="rep_bf16",
                    note="framework-mixed, encoder output cast to bf16 (hypothesis test)"),
            Variant("diag-cuda-rng", "framework", True, g, diag="cuda_rng",
                    note="framework-mixed, step generator on the GPU (hypothesis test)"),
            Variant("diag-rep-bf16+cuda-rng", "framework", True, g, diag="rep_bf16,cuda_rng",
                    note="framework-mixed, both changes"),
            Variant("diag-true+cuda-rng", "framework", False, g, diag="cuda_rng",
                    note="framework-true, step generator on the GPU"),
            Variant("diag-frozen-bf16", "framework", True, g, diag="frozen_bf16",
                    note="framework-mixed, frozen weights stored in bf16"),
            Variant("diag-true+fp32-master", "framework", False, g, diag="fp32_master",
                    note="framework-true + fp32 master weights/Adam for the trainable params"),
            Variant("diag-true+fp32-master+cuda-rng", "framework", False, g, diag="fp32_master,cuda_rng",
                    note="framework-true + fp32 masters + GPU generator"),
            Variant("framework-true+compile", "framework", False, g, compile=True,
                    note="framework-true, model.decoder.compile=true"),
            Variant("framework-mixed+compile", "framework", True, g, compile=True,
                    note="framework-mixed, model.decoder.compile=true"),
        ]
    # Config-only options (no src change): SDPA backend and TF32, on the framework's mode without GC.
    for backend in ("flash", "cudnn", "efficient"):
        out.append(Variant(f"framework-mixed+sdpa={backend}", "framework", True, False, sdpa=backend))
        out.append(Variant(f"plain-bf16+sdpa={backend}", "plain", False, False, sdpa=backend))
    out.append(Variant("framework-mixed+tf32", "framework", True, False, tf32=True))
    out.append(Variant("framework-true+sdpa=cudnn", "framework", False, False, sdpa="cudnn"))
    out.append(Variant("framework-mixed+sdpa=cudnn", "framework", True, True, sdpa="cudnn"))
    out.append(Variant("plain-bf16+sdpa=cudnn", "plain", False, True, sdpa="cudnn"))
    if device.type != "cuda":  # cuDNN and memory-efficient attention kernels exist on CUDA only
        out = [v for v in out if v.sdpa in ("default", "prefer-cudnn", "flash", "math")]
    if args.only:
        return [v for v in out if v.name in args.only]
    if not args.extras:
        out = [v for v in out if (v.sdpa == "default" or v.compile) and not v.tf32]
    return out


PROFILED = ("framework-mixed", "plain-bf16", "plain-mixed", "framework-true", "diag-true+fp32-master")


def fmt_row(r: dict) -> str:
    if "error" in r:
        return f"{r['name']:<28} gc={int(r['gc'])}  ERROR {r['error'][:90]}"
    sheet = f"{r['mfu_datasheet'] * 100:6.1f}%" if r.get("mfu_datasheet") is not None else f"{'-':>7}"
    return (f"{r['name']:<28} gc={int(r['gc'])} {r['median_s'] * 1e3:9.1f} {r['samples_per_s']:8.3f} "
            f"{r['video_tokens_per_s']:10.0f} {r['mfu'] * 100:6.1f}% {sheet} {r['mfu_needed'] * 100:6.1f}% "
            f"{r['peak_mem_gib']:8.2f} {r['residual_dtype']:>17}")


HEADER = (f"{'variant':<28} {'gc':4} {'step ms':>9} {'sample/s':>8} {'vtok/s':>10} {'MFU':>7} {'MFUds':>7} "
          f"{'MFUneed':>7} {'peak GiB':>8} {'residual dtype':>17}")


def comparisons(rows: list[dict]) -> list[dict]:
    """Per precision and checkpointing mode: the fastest framework row against the plain rows."""
    out = []
    ok = [r for r in rows if "error" not in r]
    for precision, gc_on in sorted({(r["precision"], r["gc"]) for r in ok}):
        same = [r for r in ok if (r["precision"], r["gc"]) == (precision, gc_on)]
        framework = sorted((r for r in same if r["kind"] == "framework"), key=lambda r: r["median_s"])
        plain = [r for r in same if r["kind"] == "plain"]
        if framework and plain:
            out.append({"precision": precision, "gc": gc_on, **compare(framework[0], plain, "median_s")})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=doc_summary(__doc__))
    ap.add_argument("--tiny", action="store_true", help="tiny config on CPU (smoke test)")
    ap.add_argument("--device", default=None, help="default: cuda if available (never with --tiny unless given)")
    ap.add_argument("--warmup", type=int, default=None, help="default 3 (tiny: 1)")
    ap.add_argument("--steps", type=int, default=None, help="default 10 (tiny: 2)")
    ap.add_argument("--gc", type=int, nargs="+", default=[0, 1], help="gradient checkpointing modes to run")
    ap.add_argument("--only", nargs="+", default=None,
                    help="exact variant names to run, extras included (default: the main variants)")
    ap.add_argument("--extras", action="store_true", help="also the config-only options (SDPA backends, TF32)")
    ap.add_argument("--profile", action="store_true", help=f"profile one step (no GC) of {', '.join(PROFILED)}")
    ap.add_argument("--decoder-attention", nargs="+", default=None, choices=ATTENTION_BACKENDS,
                    help="framework side: model.decoder.attention_backends (e.g. fa4); default: the config's")
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "outputs" / "benchmarks")))
    args = ap.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu"))
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    steps = args.steps if args.steps is not None else (2 if args.tiny else 10)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = run_config(args.tiny, [f"model.decoder.attention_backends=[{','.join(args.decoder_attention)}]"]
                     if args.decoder_attention else [])
    shapes = shapes_of(cfg)
    import diffusers
    import lightning
    import peft

    env = {**run_stamp(), "torch": torch.__version__, "diffusers": diffusers.__version__, "peft": peft.__version__,
           "lightning": lightning.__version__, "python": platform.python_version(), "device": str(device),
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
           "cfg_model": cfg.model.name, "trainer_precision_in_config": cfg.trainer.precision,
           "framework_attention_backends": list(cfg.model.decoder.attention_backends),
           "warmup": warmup, "steps": steps, "shapes": shapes.__dict__ | {"seq": shapes.seq}}
    print(json.dumps(env), flush=True)
    peak = peaks(device)
    print(f"bf16 matmul peak: {peak['measured_tflops']:.1f} TFLOP/s measured (median of {peak['matmul']['n']}^3 "
          f"products; best {peak['matmul']['max_tflops']:.1f}); datasheet dense bf16 {peak['datasheet_tflops']}",
          flush=True)
    flops = {"framework": model_flops(cfg, shapes), "plain": model_flops(cfg, shapes, plain=True)}
    print(f"model FLOPs/step (3 x fwd): framework {flops['framework']['step'] / 1e12:.2f} T, plain "
          f"{flops['plain']['step'] / 1e12:.2f} T; S = {shapes.seq}", flush=True)
    report = {"env": env, "peak": peak, "flops": flops, "results": [], "profiles": {}}
    json_path = out / "phase_a_benchmark.json"

    def save():
        json_path.write_text(json.dumps(report, indent=1))

    for v in variants(args, device):
        print(f"-- {v.name} gc={int(v.gc)} sdpa={v.sdpa} tf32={v.tf32}", flush=True)
        row = {"name": v.name, "kind": v.kind, "precision": "bf16-mixed" if v.mixed else "bf16-true",
               "gc": v.gc, "sdpa": v.sdpa, "tf32": v.tf32, "note": v.note}
        cleanup(device)
        torch.backends.cuda.matmul.allow_tf32 = v.tf32
        torch.backends.cudnn.allow_tf32 = v.tf32
        built = None
        cpu0 = host_cpu_counters()
        try:
            with sdpa_context(v.sdpa, device):
                t0 = time.perf_counter()
                if v.kind == "lightning":
                    res = run_lightning(v, cfg, shapes, device, warmup, steps)
                    build_s = None
                    mem_after_build = None
                else:
                    built = (build_plain if v.kind == "plain" else build_framework)(v, cfg, shapes, device)
                    build_s = time.perf_counter() - t0
                    sync(device)
                    mem_after_build = torch.cuda.memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    stats0 = torch.cuda.memory_stats(device) if device.type == "cuda" else {}
                    res = time_steps(built.step, device, warmup, steps)
                    if device.type == "cuda":
                        stats1 = torch.cuda.memory_stats(device)
                        res["allocator"] = {k: stats1.get(k, 0) - stats0.get(k, 0) for k in
                                            ("num_alloc_retries", "num_device_alloc", "num_device_free")}
                    res.update(params_trainable=built.params_trainable, params_total=built.params_total,
                               residual_dtype=built.residual_dtype())
                    if args.profile and v.name in PROFILED and not v.gc:
                        prof = profile_step(built, device, warmup + steps, out / f"profile_{v.name.replace('+', '_').replace('=', '_')}_gc0.txt")
                        report["profiles"][v.name] = prof
                        print(f"   profile: {json.dumps(prof['kernel_s_by_category'])} kernels "
                              f"{prof['kernel_s_total'] * 1e3:.1f} ms of {prof['wall_s'] * 1e3:.1f} ms wall", flush=True)
            f = flops["plain" if v.kind == "plain" else "framework"]
            med = res["median_s"]
            row.update(res)
            row.update(build_s=build_s, mem_after_build_gib=mem_after_build,
                       peak_mem_gib=(torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda"
                                     else float("nan")),
                       samples_per_s=shapes.batch / med, video_tokens_per_s=shapes.batch * shapes.video_tokens / med,
                       model_tflops_per_s=f["step"] / med / 1e12, **mfu(f["step"], med, peak),
                       mfu_needed=mfu(f["needed"], med, peak)["mfu"])
        except Exception as error:  # noqa: BLE001 - keep the other variants' numbers
            traceback.print_exc()
            row["error"] = repr(error)
        finally:
            if built is not None:
                for fn in built.teardown:
                    fn()
            del built
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = True
        row["host_cpu"] = host_cpu_share(cpu0, host_cpu_counters())
        report["results"].append(row)
        print("   " + fmt_row(row), flush=True)
        save()
        cleanup(device)

    print()
    print(f"Phase a2 step, {env['gpu']}, torch {env['torch']}, diffusers {env['diffusers']}, peft {env['peft']}; "
          f"median of {steps} after {warmup} warm-up; bf16 peak {peak['measured_tflops']:.0f} TFLOP/s measured "
          f"(MFU), {peak['datasheet_tflops']} datasheet (MFUds); "
          f"model FLOPs/step {flops['framework']['step'] / 1e12:.1f} T (framework), "
          f"{flops['plain']['step'] / 1e12:.1f} T (plain)")
    print(HEADER)
    for row in report["results"]:
        print(fmt_row(row))
    report["comparisons"] = comparisons(report["results"])
    for c in report["comparisons"]:
        print(f"{c['precision']} gc={int(c['gc'])}: {c['framework']} {c['framework_s'] * 1e3:.1f} ms, best plain "
              f"{c['best_plain']} {c['best_plain_s'] * 1e3:.1f} ms: {c['speedup_vs_best_plain']:.2f}x; against each "
              f"plain row " + ", ".join(f"{k} {x:.2f}x" for k, x in c["speedup_vs"].items()))
    save()
    print(f"\nJSON: {json_path}")
    return 0 if all("error" not in r for r in report["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
