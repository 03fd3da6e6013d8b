"""One validation pass over a composed config: every problem is collected, then all are reported.

Checks live in small functions, each returning a list of messages that name the config key, so a
user fixing a config sees everything wrong at once instead of one error per run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from animegamer.config.disk_checks import (LORA_EXPORT_PHASES, check_export_sizes, check_shard_shapes,
                                           check_tokenizer, check_weight_folders, expected_shapes)
from animegamer.config.schema import NUM_MOTION_LEVELS, EncodersConfig, PipelineConfig
from animegamer.data.layout import MANIFEST

Check = Callable[[object], list[str]]
# decord 0.6 copies decoded frames with a 16-pixel-aligned line size: other widths fail to decode.
DECODER_WIDTH_MULTIPLE = 16


class ConfigError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{len(problems)} configuration problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


def _choice(key: str, value: str, choices: Iterable[str]) -> list[str]:
    choices = tuple(choices)
    return [] if value in choices else [f"{key}={value!r} is not one of {choices}"]


def _positive(prefix: str, node: object, names: Iterable[str]) -> list[str]:
    return [f"{prefix}.{n}={getattr(node, n)} must be > 0" for n in names if not getattr(node, n) > 0]


def _local_folder(key: str, path: str) -> list[str]:
    if path and not Path(path).is_dir():
        return [f"{key}={path!r}: no such folder (put the weights there, see checkpoints/README.md, "
                f"or set it to '' for random weights)"]
    return []


def check_encoders(enc: EncodersConfig, which: tuple[str, ...] = ("t5", "clip", "vae")) -> list[str]:
    problems = []
    for name in which:
        problems += _local_folder(f"model.encoders.{name}.path", getattr(enc, name).path)
    t5 = enc.t5
    if t5.d_kv * t5.num_heads <= 0 or t5.max_tokens <= 0:
        problems.append("model.encoders.t5: d_kv, num_heads and max_tokens must be > 0")
    clip = enc.clip
    if clip.image_size % clip.patch_size:
        problems.append(f"model.encoders.clip.image_size={clip.image_size} is not a multiple of patch_size={clip.patch_size}")
    if clip.hidden_size % clip.num_attention_heads:
        problems.append(f"model.encoders.clip.hidden_size={clip.hidden_size} is not divisible by num_attention_heads={clip.num_attention_heads}")
    vae = enc.vae
    if any(c % vae.norm_num_groups for c in vae.block_out_channels):
        problems.append(f"model.encoders.vae.block_out_channels={list(vae.block_out_channels)} must be multiples of norm_num_groups={vae.norm_num_groups}")
    return problems


def vae_spatial_factor(enc: EncodersConfig) -> int:
    return 2 ** (len(enc.vae.block_out_channels) - 1)


def vae_latent_shape(enc: EncodersConfig, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
    """(T', C, H', W') of a clip under the VAE config (the built VAE's ``latent_shape``, unbuilt)."""
    spatial = vae_spatial_factor(enc)
    return ((frames - 1) // enc.vae.temporal_compression_ratio + 1, enc.vae.latent_channels,
            height // spatial, width // spatial)


def check_pipeline(p: PipelineConfig, enc: EncodersConfig | None = None) -> list[str]:
    problems: list[str] = []
    problems += _positive("pipeline.clips", p.clips, ("fps", "frames", "height", "width", "stride_seconds"))
    problems += _positive("pipeline", p, ("workers", "num_parts", "shots_per_task"))
    problems += _positive("pipeline.writer", p.writer, ("maxcount",))
    problems += _positive("pipeline.sessions", p.sessions, ("turns", "stride"))
    problems += _positive("pipeline.motion", p.motion, ("analysis_width",))
    problems += _positive("pipeline.shots", p.shots, ("analysis_width", "min_scene_frames"))
    if not 0 <= p.part < max(p.num_parts, 1):
        problems.append(f"pipeline.part={p.part} must be in [0, pipeline.num_parts={p.num_parts})")
    if p.clips.height % 2 or p.clips.width % DECODER_WIDTH_MULTIPLE:
        problems.append(f"pipeline.clips size {p.clips.width}x{p.clips.height}: width must be a multiple of "
                        f"{DECODER_WIDTH_MULTIPLE} (decord mis-copies other widths) and height even (yuv420p)")
    problems += _choice("pipeline.shots.detector", p.shots.detector, ("content", "adaptive"))
    problems += _choice("pipeline.motion.estimator", p.motion.estimator, ("farneback", "raft"))
    problems += _choice("pipeline.motion.bins", p.motion.bins, ("quantile", "fixed"))
    problems += _choice("pipeline.caption.backend", p.caption.backend, ("jsonl", "vlm", "http", "none"))
    problems += _choice("pipeline.precompute.dtype", p.precompute.dtype, ("float32", "bfloat16", "float16"))
    for step in p.steps:
        problems += _choice("pipeline.steps[]", step, PIPELINE_STEPS)
    edges = list(p.motion.fixed_edges)
    if len(edges) != NUM_MOTION_LEVELS - 1 or edges != sorted(edges):
        problems.append(f"pipeline.motion.fixed_edges={edges} must be {NUM_MOTION_LEVELS - 1} ascending values")
    if p.motion.estimator == "raft" and not Path(p.motion.raft_weights or "/nonexistent").is_file():
        problems.append(f"pipeline.motion.raft_weights={p.motion.raft_weights!r}: estimator=raft needs a local weights file")
    if set(p.steps or PIPELINE_STEPS) & set(CAPTION_STEPS):  # later steps never caption
        problems += _check_caption(p)
    problems += _choice("pipeline.representations.dtype", p.representations.dtype, ("float16", "bfloat16", "float32"))
    if p.representations.export and not (Path(p.representations.export) / "trained.safetensors").is_file():
        problems.append(f"pipeline.representations.export={p.representations.export!r}: not a phase (a) export folder")
    if p.adaptation.export and not (Path(p.adaptation.export) / "trained.safetensors").is_file():
        problems.append(f"pipeline.adaptation.export={p.adaptation.export!r}: not a phase (b) export folder")
    if not p.toy_film and not p.inputs and ("process" in (p.steps or PIPELINE_STEPS)):
        problems.append("pipeline.inputs is empty: name films, folders or globs (or use data=toy)")
    if enc is not None:
        factor = vae_spatial_factor(enc)
        if p.clips.height % factor or p.clips.width % factor:
            problems.append(f"pipeline.clips size {p.clips.width}x{p.clips.height} must be a multiple of the VAE's "
                            f"spatial compression {factor}")
        if (p.clips.frames - 1) % enc.vae.temporal_compression_ratio:
            problems.append(f"pipeline.clips.frames={p.clips.frames} must be 1 + a multiple of the VAE's temporal "
                            f"compression {enc.vae.temporal_compression_ratio}")
    return problems


def _check_caption(p: PipelineConfig) -> list[str]:
    c = p.caption
    if c.backend == "jsonl" and not p.toy_film and not Path(c.path or "/nonexistent").exists():
        return [f"pipeline.caption.path={c.path!r}: the jsonl backend needs a caption file or folder"]
    if c.backend == "vlm" and not Path(c.model_path or "/nonexistent").is_dir():
        return [f"pipeline.caption.model_path={c.model_path!r}: the vlm backend needs a local model folder"]
    if c.backend == "http" and not c.url.startswith(("http://", "https://")):
        return [f"pipeline.caption.url={c.url!r}: the http backend needs an http(s) URL"]
    if c.num_frames <= 0 or c.num_frames > p.clips.frames:
        return [f"pipeline.caption.num_frames={c.num_frames} must be in 1..pipeline.clips.frames={p.clips.frames}"]
    return []


PIPELINE_STEPS = ("process", "finalize", "precompute", "sessions", "representations", "session_shards",
                  "adaptation")
# Steps that read the films and the caption source (finalize: its version is part of each task's fingerprint).
CAPTION_STEPS = ("process", "finalize")


def validate_pipeline_run(cfg) -> None:
    """Raise :class:`ConfigError` listing every problem of a pipeline run config."""
    problems = check_pipeline(cfg.pipeline, cfg.model.encoders)
    steps = cfg.pipeline.steps or PIPELINE_STEPS
    if "precompute" in steps and cfg.pipeline.precompute.enabled:
        problems += check_encoders(cfg.model.encoders)
        problems += check_weight_folders(cfg.model, ("t5", "clip", "vae"))
    reps, adaptation = cfg.pipeline.representations.export, cfg.pipeline.adaptation.export
    if reps and "representations" in steps:
        problems += check_export_sizes("pipeline.representations.export", reps, cfg.model, ("encoder",))
    if adaptation and "adaptation" in steps:
        problems += check_mllm(cfg.model)
        problems += check_tokenizer(cfg.model, [("pipeline.adaptation.export", adaptation)])
        problems += check_export_sizes("pipeline.adaptation.export", adaptation, cfg.model)
    if problems:
        raise ConfigError(problems)


PHASE_NAMES = ("a_warmup", "a_joint", "b", "c")


def check_training(cfg) -> list[str]:
    """Phase, model and data agreement: sizes between encoders, encoder and decoder, inputs present."""
    problems: list[str] = []
    phase, model = cfg.phase, cfg.model
    problems += _choice("phase.name", phase.name, PHASE_NAMES)
    problems += _choice("phase.input", phase.input, ("features", "clips"))
    problems += _choice("phase.lr_schedule", phase.lr_schedule, ("constant", "cosine"))
    problems += _choice("logger.kind", cfg.logger.kind, ("wandb", "tensorboard", "csv", "none"))
    problems += _choice("model.encoder.fusion", model.encoder.fusion, ("concat", "add", "cross_attention"))
    problems += _positive("phase", phase, ("max_steps", "lr", "batch_size"))
    for name in ("text_dropout", "image_dropout"):
        if not 0 <= getattr(phase, name) < 1:
            problems.append(f"phase.{name}={getattr(phase, name)} must be in [0, 1)")
    if phase.pack_tokens < 0 or (phase.pack_tokens and phase.name != "b"):
        problems.append(f"phase.pack_tokens={phase.pack_tokens}: must be >= 0, and only phase b packs sequences")
    if phase.pad_to_multiple < 0:
        problems.append(f"phase.pad_to_multiple={phase.pad_to_multiple}: must be >= 0")
    if phase.random_frame and phase.input != "clips":
        problems.append("phase.random_frame needs phase.input=clips: precomputed features hold the first frame only")
    enc, dec, frozen = model.encoder, model.decoder, model.encoders
    hidden = dec.num_attention_heads * dec.attention_head_dim
    if enc.width != hidden:
        problems.append(f"model.encoder.width={enc.width} != decoder hidden {dec.num_attention_heads}x"
                        f"{dec.attention_head_dim}={hidden} (the representation feeds the decoder's text stream)")
    if enc.text_dim != frozen.t5.d_model:
        problems.append(f"model.encoder.text_dim={enc.text_dim} != model.encoders.t5.d_model={frozen.t5.d_model}")
    if enc.text_tokens != frozen.t5.max_tokens:
        problems.append(f"model.encoder.text_tokens={enc.text_tokens} != model.encoders.t5.max_tokens={frozen.t5.max_tokens}")
    if enc.image_dim != frozen.clip.hidden_size:
        problems.append(f"model.encoder.image_dim={enc.image_dim} != model.encoders.clip.hidden_size={frozen.clip.hidden_size}")
    patches = (frozen.clip.image_size // frozen.clip.patch_size) ** 2
    if enc.image_tokens != patches:
        problems.append(f"model.encoder.image_tokens={enc.image_tokens} != CLIP patches ({frozen.clip.image_size}/"
                        f"{frozen.clip.patch_size})^2={patches}")
    if dec.in_channels != frozen.vae.latent_channels:
        problems.append(f"model.decoder.in_channels={dec.in_channels} != model.encoders.vae.latent_channels="
                        f"{frozen.vae.latent_channels}")
    from animegamer.models.attention_kernels import ATTENTION_BACKENDS

    for key, every in (("model.decoder", dec.gradient_checkpointing_every),
                       ("model.mllm", model.mllm.gradient_checkpointing_every)):
        if every < 1:
            problems.append(f"{key}.gradient_checkpointing_every={every} must be >= 1")

    for key, backends in (("model.decoder", dec.attention_backends), ("model.mllm", model.mllm.attention_backends)):
        for backend in backends:
            problems += _choice(f"{key}.attention_backends[]", str(backend), ATTENTION_BACKENDS)
    problems += check_decoder_compile(dec, training=True)
    if model.mllm.attention_backends and model.mllm.attention != "sdpa":
        problems.append(f"model.mllm.attention_backends={list(model.mllm.attention_backends)} orders SDPA's kernels, "
                        f"but model.mllm.attention={model.mllm.attention!r}: use sdpa or leave it empty")
    if phase.name == "b":
        problems += check_mllm(model)
        problems += check_tokenizer(model, [("phase.init_from", phase.init_from)] if phase.init_from else [])
        weights = list(cfg.data.window_weights)
        if not weights or any(not w >= 0 for w in weights) or not sum(weights) > 0:
            problems.append(f"data.window_weights={weights} must be >= 0 with a positive sum")
    problems += check_trainer(cfg)
    problems += check_weight_folders(model, ("mllm",) if phase.name == "b" else ("decoder",))
    if phase.init_from:
        problems += check_export_sizes("phase.init_from", phase.init_from, model)
    problems += _local_folder("model.decoder.path", dec.path)
    if dec.official_checkpoint and not Path(dec.official_checkpoint).exists():
        problems.append(f"model.decoder.official_checkpoint={dec.official_checkpoint!r}: no such file or folder")
    if phase.init_from and not Path(phase.init_from).is_dir():
        problems.append(f"phase.init_from={phase.init_from!r}: no such export folder (train the earlier stage first)")
    root = Path(cfg.data.root)
    if phase.name in ("b", "c"):
        folder = cfg.data.sessions if phase.name == "b" else cfg.data.adaptation
    else:
        folder = cfg.data.features if phase.input == "features" else cfg.data.clips
    shards = root / folder / MANIFEST
    if not shards.exists():
        problems.append(f"{shards}: missing; run the pipeline first (python -m data_pipeline ...) or set data.root")
    else:
        problems += check_shard_shapes(root / folder, expected_shapes(cfg))
    if not 0 < cfg.data.val_fraction < 1:
        problems.append(f"data.val_fraction={cfg.data.val_fraction} must be in (0, 1)")
    if cfg.data.bad_sample_budget < 0:
        problems.append(f"data.bad_sample_budget={cfg.data.bad_sample_budget} must be >= 0")
    return problems


def check_decoder_compile(dec, training: bool) -> list[str]:
    """``model.decoder.compile_mode``: a torch.compile mode, and CUDA graphs only where nothing trains."""
    from animegamer.config.schema import COMPILE_MODES, CUDA_GRAPH_MODES

    problems = _choice("model.decoder.compile_mode", str(dec.compile_mode), COMPILE_MODES)
    if dec.compile_mode != "default" and not dec.compile:
        problems.append(f"model.decoder.compile_mode={dec.compile_mode!r} needs model.decoder.compile=true")
    if training and dec.compile_mode in CUDA_GRAPH_MODES:
        problems.append(f"model.decoder.compile_mode={dec.compile_mode!r} records CUDA graphs, for sampling only "
                        "(the game, evaluation); training takes default or max-autotune-no-cudagraphs")
    return problems


def check_mllm(model) -> list[str]:
    """The MLLM against the encoder (query count, width) and its weight/tokenizer folders."""
    from animegamer.mllm.tokens import NUM_FRAME_TOKENS
    from animegamer.models.encoder import representation_tokens

    m = model.mllm
    problems = _local_folder("model.mllm.path", m.path) + _local_folder("model.mllm.tokenizer", m.tokenizer)
    queries = representation_tokens(model.encoder)
    if queries > NUM_FRAME_TOKENS:
        problems.append(f"the encoder gives {queries} representation tokens but the layout has only "
                        f"{NUM_FRAME_TOKENS} <frame_i> tokens for queries")
    if m.hidden_size % m.num_attention_heads or m.num_attention_heads % m.num_key_value_heads:
        problems.append(f"model.mllm: hidden_size={m.hidden_size}, num_attention_heads={m.num_attention_heads}, "
                        f"num_key_value_heads={m.num_key_value_heads} do not divide")
    problems += _choice("model.mllm.attention", m.attention, ("sdpa", "flex", "eager"))
    if m.official_checkpoint and not Path(m.official_checkpoint).exists():
        problems.append(f"model.mllm.official_checkpoint={m.official_checkpoint!r}: no such file")
    return problems


# --------------------------------------------------------------------------- trainer / strategy
KNOWN_PRECISIONS = ("transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true",
                    "bf16-mixed", "32-true", "64-true", "64", "32", "16", "bf16")
DEEPSPEED_PRECISIONS = ("32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")  # Lightning's DeepSpeed plugin

def check_trainer(cfg) -> list[str]:
    """Devices, strategy and precision, and the strategy against what the phase export needs."""
    from animegamer.training.profiling import PROFILERS, profiled_steps
    from animegamer.training.strategies import (DEEPSPEED_STRATEGIES, FSDP, FSDP_COMPUTE, FSDP_INIT_DEVICES,
                                                FSDP_SHARDINGS, STRATEGIES, is_deepspeed)

    t, phase = cfg.trainer, cfg.phase.name
    problems: list[str] = []
    if t.devices < 1 and t.devices != -1:
        problems.append(f"trainer.devices={t.devices} must be >= 1 (or -1: every visible device)")
    if t.num_nodes < 1:
        problems.append(f"trainer.num_nodes={t.num_nodes} must be >= 1")
    if t.accumulate_grad_batches < 1:
        problems.append(f"trainer.accumulate_grad_batches={t.accumulate_grad_batches} must be >= 1")
    problems += _choice("trainer.precision", str(t.precision), KNOWN_PRECISIONS)
    problems += _choice("trainer.profiler", str(t.profiler), PROFILERS)
    if t.profiler == "pytorch":
        if t.profile_skip_steps < 0 or t.profile_active_steps < 1:
            problems.append(f"trainer.profile_skip_steps={t.profile_skip_steps} must be >= 0 and "
                            f"trainer.profile_active_steps={t.profile_active_steps} >= 1")
        elif profiled_steps(t.profile_skip_steps, t.profile_active_steps)[-1] > cfg.phase.max_steps:
            window = profiled_steps(t.profile_skip_steps, t.profile_active_steps)
            problems.append(f"trainer.profiler=pytorch records steps {window[0]}..{window[-1]}, past "
                            f"phase.max_steps={cfg.phase.max_steps}: no trace would be written (lower "
                            f"trainer.profile_skip_steps)")
    strategy = str(t.strategy)
    if strategy not in STRATEGIES:
        problems.append(f"trainer.strategy={strategy!r} is not a known strategy; use one of {STRATEGIES}")
        return problems
    if is_deepspeed(strategy):
        if t.accelerator == "cpu":
            problems.append(f"trainer.strategy={strategy!r} needs trainer.accelerator=gpu: DeepSpeed has no CPU "
                            f"path here (use strategy=ddp or auto on CPU)")
        if str(t.precision) not in DEEPSPEED_PRECISIONS:
            problems.append(f"trainer.precision={t.precision!r} is not supported by trainer.strategy={strategy!r}; "
                            f"use one of {DEEPSPEED_PRECISIONS}")
    if strategy == FSDP:
        problems += _choice("trainer.fsdp_sharding", str(t.fsdp_sharding), FSDP_SHARDINGS)
    problems += _choice("trainer.fsdp_compute", str(t.fsdp_compute), FSDP_COMPUTE)
    problems += _choice("trainer.fsdp_init_device", str(t.fsdp_init_device), FSDP_INIT_DEVICES)
    if t.fsdp_init_device == "gpu" and strategy != FSDP:
        problems.append(f"trainer.fsdp_init_device=gpu applies to trainer.strategy=fsdp only (got {strategy!r}); "
                        f"the other strategies build on the GPU already")
    if t.fsdp_compute == "bf16" and strategy != FSDP:
        problems.append(f"trainer.fsdp_compute=bf16 applies to trainer.strategy=fsdp only (got {strategy!r}); "
                        f"DeepSpeed's bf16 mode is already bf16 compute with float32 master weights")
    elif t.fsdp_compute == "bf16" and str(t.precision) != "bf16-mixed":
        problems.append(f"trainer.fsdp_compute=bf16 is a bf16-mixed mode: set trainer.precision=bf16-mixed "
                        f"(got {t.precision!r})")
    if strategy == FSDP and t.accelerator == "cpu":
        problems.append("trainer.strategy='fsdp' needs trainer.accelerator=gpu (Lightning's FSDP has no CPU path; "
                        "use strategy=ddp on CPU)")
    # ZeRO-3 partitions every parameter; exports gather them (strategies.full_weights), but the peft
    # adapter folders of a_joint / b / c are not verified against ZeRO-3's partitioned LoRA tensors.
    if is_deepspeed(strategy) and DEEPSPEED_STRATEGIES[strategy][0] == 3 and phase in LORA_EXPORT_PHASES:
        problems.append(f"trainer.strategy={strategy!r} partitions the LoRA weights, and phase {phase!r} writes a "
                        f"peft LoRA adapter folder from them: use deepspeed_stage_2 (or deepspeed_stage_2_offload), "
                        f"fsdp or ddp")
    return problems


def frozen_encoders_needed(cfg) -> tuple[str, ...]:
    """Which frozen encoders a training run builds: all with raw clips, the VAE for validation videos."""
    if cfg.phase.name not in ("a_warmup", "a_joint"):
        return ()
    if cfg.phase.input == "clips":
        return ("t5", "clip", "vae")
    return ("vae",) if cfg.phase.val_clips > 0 else ()


def validate_train_run(cfg) -> None:
    """Raise :class:`ConfigError` listing every problem of a training run config."""
    needed = frozen_encoders_needed(cfg)
    problems = check_training(cfg) + check_encoders(cfg.model.encoders, needed)
    problems += check_weight_folders(cfg.model, needed)
    if problems:
        raise ConfigError(problems)


def validate_eval_run(cfg) -> None:
    """Exports, shards and the model sizes an evaluation needs, all checked before anything loads."""
    e = cfg.evaluation
    problems = []
    for key in ("mllm_export", "renderer_export"):
        path = getattr(e, key)
        if not path or not (Path(path) / "trained.safetensors").is_file():
            problems.append(f"evaluation.{key}={path!r}: not an export folder (train the phase first)")
    if e.reconstruction_export and not (Path(e.reconstruction_export) / "trained.safetensors").is_file():
        problems.append(f"evaluation.reconstruction_export={e.reconstruction_export!r}: not a phase (a) export folder")
    if e.benchmark and not Path(e.benchmark).is_file():
        problems.append(f"evaluation.benchmark={e.benchmark!r}: no such file")
    root = Path(cfg.data.root)
    for folder in (cfg.data.clips, cfg.data.sessions):
        if not (root / folder / MANIFEST).exists():
            problems.append(f"{root / folder}/manifest.json: missing; run the pipeline first")
    if e.games <= 0 or e.turns <= 0:
        problems.append("evaluation.games and evaluation.turns must be > 0")
    problems += check_mllm(cfg.model) + check_encoders(cfg.model.encoders, ("vae",))
    problems += check_decoder_compile(cfg.model.decoder, training=False)
    problems += check_tokenizer(cfg.model, [("evaluation.mllm_export", e.mllm_export)])
    problems += check_weight_folders(cfg.model, ("mllm", "decoder", "vae"))
    for key in ("mllm_export", "renderer_export", "reconstruction_export"):
        problems += check_export_sizes(f"evaluation.{key}", getattr(e, key), cfg.model)
    problems += check_evaluated_exports(cfg, ("mllm_export", "renderer_export", "reconstruction_export"))
    if not e.benchmark and (root / cfg.data.clips / MANIFEST).exists():
        from animegamer.preflight import evaluation_problems

        problems += evaluation_problems(cfg)
    if problems:
        raise ConfigError(problems)


def check_evaluated_exports(cfg, keys: tuple[str, ...]) -> list[str]:
    """The held-out split and clip size each evaluated export was trained with, against this evaluation's."""
    from animegamer.config.trained_data import clip_size_problems, split_problems

    exports = [(f"evaluation.{key}", getattr(cfg.evaluation, key)) for key in keys]
    renderers = [(k, f) for k, f in exports if not k.endswith("mllm_export")]
    return split_problems(cfg, exports) + clip_size_problems(cfg, renderers)
