"""Checks of settings that need no component's code, and the helpers every check uses.

Checks live in small functions, each returning a list of messages that name the config key, so a
user fixing a config sees everything wrong at once instead of one error per run. The pass that
composes them with each component's own checks is :mod:`animegamer.checks`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from animegamer.config.disk_checks import check_weight_folders
from animegamer.config.schema import NUM_MOTION_LEVELS, EncodersConfig, PipelineConfig
from animegamer.data.layout import MANIFEST

# decord 0.6 copies decoded frames with a 16-pixel-aligned line size: other widths fail to decode.
DECODER_WIDTH_MULTIPLE = 16


class ConfigError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{len(problems)} configuration problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


def choice(key: str, value: str, choices: Iterable[str]) -> list[str]:
    choices = tuple(choices)
    return [] if value in choices else [f"{key}={value!r} is not one of {choices}"]


def positive(prefix: str, node: object, names: Iterable[str]) -> list[str]:
    return [f"{prefix}.{n}={getattr(node, n)} must be > 0" for n in names if not getattr(node, n) > 0]


def local_folder(key: str, path: str) -> list[str]:
    if path and not Path(path).is_dir():
        return [f"{key}={path!r}: no such folder (put the weights there, see checkpoints/README.md, "
                f"or set it to '' for random weights)"]
    return []


def check_encoders(enc: EncodersConfig, which: tuple[str, ...] = ("t5", "clip", "vae")) -> list[str]:
    problems = []
    for name in which:
        problems += local_folder(f"model.encoders.{name}.path", getattr(enc, name).path)
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
    problems += positive("pipeline.clips", p.clips, ("fps", "frames", "height", "width", "stride_seconds"))
    problems += positive("pipeline", p, ("workers", "num_parts", "shots_per_task"))
    problems += positive("pipeline.writer", p.writer, ("maxcount",))
    problems += positive("pipeline.sessions", p.sessions, ("turns", "stride"))
    problems += positive("pipeline.motion", p.motion, ("analysis_width",))
    problems += positive("pipeline.shots", p.shots, ("analysis_width", "min_scene_frames"))
    if not 0 <= p.part < max(p.num_parts, 1):
        problems.append(f"pipeline.part={p.part} must be in [0, pipeline.num_parts={p.num_parts})")
    if p.clips.height % 2 or p.clips.width % DECODER_WIDTH_MULTIPLE:
        problems.append(f"pipeline.clips size {p.clips.width}x{p.clips.height}: width must be a multiple of "
                        f"{DECODER_WIDTH_MULTIPLE} (decord mis-copies other widths) and height even (yuv420p)")
    problems += choice("pipeline.shots.detector", p.shots.detector, ("content", "adaptive"))
    problems += choice("pipeline.motion.estimator", p.motion.estimator, ("farneback", "raft"))
    problems += choice("pipeline.motion.bins", p.motion.bins, ("quantile", "fixed"))
    problems += choice("pipeline.caption.backend", p.caption.backend, ("jsonl", "vlm", "http", "none"))
    problems += choice("pipeline.precompute.dtype", p.precompute.dtype, ("float32", "bfloat16", "float16"))
    for step in p.steps:
        problems += choice("pipeline.steps[]", step, PIPELINE_STEPS)
    edges = list(p.motion.fixed_edges)
    if len(edges) != NUM_MOTION_LEVELS - 1 or edges != sorted(edges):
        problems.append(f"pipeline.motion.fixed_edges={edges} must be {NUM_MOTION_LEVELS - 1} ascending values")
    if p.motion.estimator == "raft" and not Path(p.motion.raft_weights or "/nonexistent").is_file():
        problems.append(f"pipeline.motion.raft_weights={p.motion.raft_weights!r}: estimator=raft needs a local weights file")
    if set(p.steps or PIPELINE_STEPS) & set(CAPTION_STEPS):  # later steps never caption
        problems += _check_caption(p)
    problems += choice("pipeline.representations.dtype", p.representations.dtype, ("float16", "bfloat16", "float32"))
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


# An environment variable's name: what evaluation.judge.api_key_env must hold (the key stays in the environment).
ENV_VAR_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
JUDGE_TEMPERATURE_RANGE = (0.0, 2.0)  # what OpenAI-compatible servers accept


def check_judge(judge) -> list[str]:
    """``evaluation.judge``: an http(s) endpoint with a model name, or no endpoint (scores unavailable)."""
    key = "evaluation.judge"
    problems = []
    if judge.url and not judge.url.startswith(("http://", "https://")):
        problems.append(f"{key}.url={judge.url!r}: must be an http(s) base URL such as http://127.0.0.1:8000/v1 "
                        "(or '' for no judge)")
    if judge.url and not judge.model_name:
        problems.append(f"{key}.model_name is empty: name the model the endpoint at {judge.url} serves")
    if judge.api_key_env and not re.fullmatch(ENV_VAR_NAME, judge.api_key_env):
        problems.append(f"{key}.api_key_env must name an environment variable (letters, digits, _), not hold "
                        "a key: export the key in that variable instead")
    problems += positive(key, judge, ("samples", "frames_per_turn", "image_max_side", "max_tokens", "timeout_s"))
    if judge.retries < 0:
        problems.append(f"{key}.retries={judge.retries} must be >= 0")
    low, high = JUDGE_TEMPERATURE_RANGE
    if not low <= judge.temperature <= high:
        problems.append(f"{key}.temperature={judge.temperature} must be in [{low}, {high}]")
    return problems


def validate_eval_run(cfg) -> None:
    """Exports, shards and the model sizes an evaluation needs, all checked before anything loads."""
    # The composing pass moved to animegamer.checks; this function is to follow it there.
    from animegamer.checks import check_decoder_compile, check_export_sizes, check_mllm, check_tokenizer

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
    problems += check_judge(e.judge)
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
