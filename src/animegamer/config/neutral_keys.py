"""The settings that never change what a run computes: logging, checkpointing, the same computation
scheduled differently (memory, kernels, compilation, packing), sampling, the pipeline's execution. A resume may
change them (:mod:`animegamer.training.run_record`), and a pipeline step's fingerprint leaves the model's
ones out (the adaptation step's predictions do not depend on them)."""
from __future__ import annotations

from typing import Any

# Keys (or key prefixes, ending in '.') whose value never changes what a run computes.
ALLOWED = (
    "logger.", "log_level", "evaluation.", "output_dir", "checkpoint.", "lock_wait_seconds",
    "phase.val_every_n_steps", "phase.val_clips", "phase.val_sampling_steps",
    "trainer.log_every_n_steps", "trainer.throughput_every_n_steps", "trainer.peak_tflops", "trainer.profiler",
    "trainer.profile_skip_steps", "trainer.profile_active_steps", "trainer.sync_debug", "trainer.preemption_signals",
    "trainer.max_nonfinite_in_row", "data.num_workers", "data.bad_sample_budget", "data.remote_retries",
    "data.remote_timeout_s",
    # The same computation, scheduled differently (memory, kernels, compilation, packing: tested equal).
    "trainer.benchmark", "trainer.deterministic", "trainer.fsdp_init_device",
    "phase.pack_tokens", "phase.pad_to_multiple", "phase.frozen_bf16",
    "model.decoder.gradient_checkpointing", "model.decoder.gradient_checkpointing_every",
    "model.decoder.attention_backends", "model.decoder.compile", "model.decoder.compile_mode",
    "model.decoder.cfg_parallel",
    "model.mllm.gradient_checkpointing", "model.mllm.gradient_checkpointing_every",
    "model.mllm.attention_backends", "model.mllm.attention", "model.mllm.compile", "model.mllm.constrained_states",
    "model.encoders.vae.tiling", "model.encoders.vae.cudnn_benchmark", "model.encoders.vae.channels_last",
    "model.encoders.vae.compile",
    # Sampling: read by the game, the evaluation and validation's samples, never by a training loss or a
    # pipeline step (phase (c) adapts to the MLLM's representations, not to sampled clips).
    "model.diffusion.sampling_steps", "model.diffusion.guidance_scale", "model.diffusion.guidance_exponent",
    "model.diffusion.cache", "model.diffusion.cache_threshold",
    # The pipeline's execution (the shards it writes do not depend on these).
    "pipeline.workers", "pipeline.lock_wait_seconds", "pipeline.part", "pipeline.num_parts", "pipeline.steps", "pipeline.precompute.device",
    "pipeline.precompute.batch_size", "pipeline.representations.device", "pipeline.representations.batch_size",
    "pipeline.adaptation.device", "pipeline.adaptation.batch_size",
)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are values, compared whole."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
