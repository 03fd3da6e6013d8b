"""Checks of settings that need no component's code, and the helpers every check uses.

Checks live in small functions, each returning a list of messages that name the config key, so a
user fixing a config sees everything wrong at once instead of one error per run. Each entry point's
pre-flight composes them with each component's own checks (training: :mod:`animegamer.phases.preflight`,
evaluation: :mod:`animegamer.evaluation.preflight`, the pipeline: ``data_pipeline.config_checks``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from animegamer.config.schema import NUM_MOTION_LEVELS, EncodersConfig, PipelineConfig
from animegamer.errors import UserError
from animegamer.utils.http import client_setting_problems, redact

# decord 0.6 copies decoded frames with a 16-pixel-aligned line size: other widths fail to decode.
DECODER_WIDTH_MULTIPLE = 16


class ConfigError(UserError, ValueError):
    """Every problem the configuration check found, one per line (the message names each config key)."""

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


def check_checkpoints(c) -> list[str]:
    """``checkpoint.*``: a save every N >= 1 steps; ``keep_last`` -1 (all), 0 (no periodic saves) or K."""
    problems = [] if c.every_n_steps >= 1 else [f"checkpoint.every_n_steps={c.every_n_steps} must be >= 1 (a save "
                                                  "every N steps; checkpoint.keep_last=0 turns the periodic saves off)"]
    if c.keep_last < -1:
        problems.append(f"checkpoint.keep_last={c.keep_last} must be -1 (keep all), 0 (no periodic saves) or a count")
    return problems


def check_bad_sample_budget(budget: int) -> list[str]:
    """``data.bad_sample_budget``: how many bad samples a run may skip (training/bad_data.py), so >= 0."""
    return [] if budget >= 0 else [f"data.bad_sample_budget={budget} must be >= 0"]


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
    problems += client_setting_problems("pipeline.caption", p.caption)  # whatever the backend: the config is recorded
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
        problems.append("pipeline.inputs is empty: name films, folders or globs (or use source=toy)")
    problems += _check_toy_film(p)
    if enc is not None:
        factor = vae_spatial_factor(enc)
        if p.clips.height % factor or p.clips.width % factor:
            problems.append(f"pipeline.clips size {p.clips.width}x{p.clips.height} must be a multiple of the VAE's "
                            f"spatial compression {factor}")
        tc = enc.vae.temporal_compression_ratio
        if (p.clips.frames - 1) % tc:
            problems.append(f"pipeline.clips.frames={p.clips.frames} must be 1 + a multiple of the VAE's temporal "
                            f"compression {tc}")
        elif (p.clips.frames - 1) // tc % 2:
            # diffusers' CogVideoX VAE decodes the latent frames after the first in pairs: an even latent
            # count comes back with extra frames (13 frames -> 4 latent frames -> 16 frames decoded).
            problems.append(f"pipeline.clips.frames={p.clips.frames} gives an even number of latent frames "
                            f"({(p.clips.frames - 1) // tc + 1}), which the VAE does not decode back to "
                            f"{p.clips.frames} frames: use 1 + a multiple of {2 * tc} (e.g. 17 or 49)")
    return problems


def _check_toy_film(p: PipelineConfig) -> list[str]:
    """The toy film replaces the run's films and captions: a user's own ones given beside it would be
    dropped unread, so the combination is refused with what to drop."""
    if not p.toy_film or not set(p.steps or PIPELINE_STEPS) & set(CAPTION_STEPS):
        return []
    given = []
    if p.inputs:
        given.append(f"pipeline.inputs={list(p.inputs)}")
    if p.caption.path:
        given.append(f"pipeline.caption.path={p.caption.path!r}")
    if not given:
        return []
    named = " and ".join(given)
    return [f"pipeline.toy_film=true (source=toy, the default) replaces {named} with the toy film and its captions: "
            f"add source=films to process your own films (pipeline.inputs and their caption file), or drop {named} "
            f"to use the toy film"]


def _check_caption(p: PipelineConfig) -> list[str]:
    """The backend's source (one per backend) and the frames it is shown, each reported."""
    c = p.caption
    problems = []
    if c.backend == "jsonl" and not p.toy_film and not c.path:
        problems.append(f"pipeline.caption.path={c.path!r}: the jsonl backend needs a caption file or folder")
    elif c.backend == "jsonl" and not p.toy_film and not Path(c.path).exists():
        problems.append(f"pipeline.caption.path={c.path!r}: {c.path} does not exist (the jsonl backend reads a "
                        f"caption file or a folder of them)")
    if c.backend == "vlm" and not Path(c.model_path or "/nonexistent").is_dir():
        problems.append(f"pipeline.caption.model_path={c.model_path!r}: the vlm backend needs a local model folder")
    if c.backend == "http" and not c.url.startswith(("http://", "https://")):
        problems.append(f"pipeline.caption.url={redact(c.url)!r}: the http backend needs an http(s) URL")
    if c.num_frames <= 0 or c.num_frames > p.clips.frames:
        problems.append(f"pipeline.caption.num_frames={c.num_frames} must be in 1..pipeline.clips.frames="
                        f"{p.clips.frames}")
    return problems


PIPELINE_STEPS = ("process", "finalize", "precompute", "sessions", "representations", "session_shards",
                  "adaptation")
# Steps that read the films and the caption source (finalize: its version is part of each task's fingerprint).
CAPTION_STEPS = ("process", "finalize")


# Lightning's accelerators that need CUDA. Several CPU processes train with the cpu preset and DDP instead.
GPU_ACCELERATORS = ("gpu", "cuda")
ACCELERATORS = ("cpu", *GPU_ACCELERATORS)  # what the strategies and the GPU check know (no TPU, no MPS)
LOCAL_PROCESSES_ENV = "LOCAL_WORLD_SIZE"  # processes per node, set by torchrun
CPU_PROCESSES = 2  # processes per node suggested where the config asks for every visible GPU (devices=-1)


def check_gpu_available(trainer) -> list[str]:
    """A GPU accelerator where torch sees no CUDA device: refused before the run folder is written (Lightning
    stops only once the trainer starts), naming the CPU settings of the same layout."""
    import torch  # the config layer loads no torch until a training run's checks ask for a device

    if str(trainer.accelerator).lower() not in GPU_ACCELERATORS or torch.cuda.is_available():
        return []
    per_node = int(os.environ.get(LOCAL_PROCESSES_ENV) or (trainer.devices if trainer.devices > 0 else CPU_PROCESSES))
    refusal = (f"trainer.accelerator={trainer.accelerator!r} needs a CUDA GPU, and torch sees none on this machine: "
               "train on the CPU with trainer=cpu")
    if per_node * int(trainer.num_nodes) == 1:  # one process: the CPU run is the same layout
        return [refusal]
    cpu = f"trainer=cpu trainer.strategy=ddp trainer.devices={per_node} trainer.num_nodes={trainer.num_nodes}"
    return [f"{refusal}, or in several CPU processes with {cpu} (trainer.devices processes on each of "
            "trainer.num_nodes machines; under torchrun, --nproc_per_node and --nnodes)"]


def device_problems(device: str | None, named: str, on_cpu: str) -> list[str]:
    """A device torch cannot name, or a CUDA one torch does not see on this machine: refused before any model
    is built (torch would stop at the first tensor moved there). ``named``: the setting as the user gave it
    (``--device cuda``, ``pipeline.precompute.device='cuda'``); ``on_cpu``: how to run on the CPU instead.
    None (a command's default device) is never refused."""
    import torch  # the config layer loads no torch until a command's checks ask for a device

    if device is None:
        return []
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        return [f"{named}: not a device torch knows (cuda, cuda:N or cpu)"]
    if parsed.type != "cuda":
        return []
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not visible:
        return [f"{named} needs a CUDA GPU, and torch sees none on this machine: run on the CPU with {on_cpu}"]
    if parsed.index is not None and parsed.index >= visible:
        return [f"{named}: torch sees {visible} CUDA device(s) on this machine (cuda:0 to cuda:{visible - 1}; "
                "CUDA_VISIBLE_DEVICES)"]
    return []


PIPELINE_DEVICES = ("precompute", "representations", "adaptation")  # the pipeline steps that set their own device


def check_pipeline_devices(p: PipelineConfig, steps: Iterable[str]) -> list[str]:
    """The devices of the pipeline steps among ``steps`` that run a model (:data:`PIPELINE_DEVICES`)."""
    problems = []
    for step in PIPELINE_DEVICES:
        if step in steps:
            key, device = f"pipeline.{step}.device", getattr(p, step).device
            problems += device_problems(device, f"{key}={device!r}", f"{key}=cpu")
    return problems


SEED_RANGE = (0, 2**32 - 1)  # what numpy, torch and Lightning's seed_everything take


def seed_problems(named: str, value: int) -> list[str]:
    """A seed out of :data:`SEED_RANGE`, named as the user set it (``seed=-1``, ``--seed -1``)."""
    low, high = SEED_RANGE
    return [] if low <= value <= high else [f"{named} must be in [{low}, {high}]"]


def check_seeds(cfg) -> list[str]:
    """The command's ``seed`` and the random builds' ``model.encoders.seed``, in :data:`SEED_RANGE` (a seed out of
    it would stop the run only once the first stage seeds its draws)."""
    return [problem for key, value in (("seed", cfg.seed), ("model.encoders.seed", cfg.model.encoders.seed))
            for problem in seed_problems(f"{key}={value}", value)]
