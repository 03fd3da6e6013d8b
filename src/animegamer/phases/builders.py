"""How each phase is built for the trainer: its module and data, its export function, its own callbacks, and
its FSDP wrapping unit. Apart from :mod:`animegamer.phases.specs` (what a phase is and what it checks), which
the pre-flight reads without loading Lightning; this module loads the phases' LightningModules."""
from __future__ import annotations

import contextlib
import logging
from functools import partial
from typing import Any, Callable, NamedTuple

import torch

from animegamer.checkpoints.trained_data import at_clip_size, data_clip_size
from animegamer.config.schema import RunConfig
from animegamer.contracts.exports import A_BASE, A_JOINT, A_WARMUP, PHASE_B, PHASE_C
from animegamer.data import phase_a as data_a
from animegamer.data import phase_b as data_b
from animegamer.data.phase_c import adaptation_dataset
from animegamer.models.frozen_encoders import build_frozen_encoders
from animegamer.phases import phase_a, phase_b, phase_c
from animegamer.phases.common import cast_frozen
from animegamer.phases.specs import frozen_bf16_applies, spec_named
from animegamer.training.callbacks import ValidationVideos
from animegamer.training.shard_data import ShardData, clip_lookup

log = logging.getLogger(__name__)


class BuiltPhase(NamedTuple):
    """What the runner fits: the module, its data, how it exports, the phase's own callbacks."""

    module: Any
    data: Any
    export: Callable
    callbacks: list



# --------------------------------------------------------------------------- FSDP units
def _decoder_blocks() -> set[type]:
    from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock

    return {CogVideoXBlock}


def _mllm_blocks() -> set[type]:
    from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

    return {MistralDecoderLayer}


# --------------------------------------------------------------------------- builders
def _build_reconstruction(cfg: RunConfig, init: Callable = contextlib.nullcontext) -> BuiltPhase:
    frozen = build_frozen_encoders(cfg.model.encoders) if cfg.phase.input == data_a.CLIPS else None
    data = ShardData(data_a.phase_a_dataset(cfg, "train"), data_a.phase_a_dataset(cfg, "val"),
                     partial(data_a.train_loader, cfg), partial(data_a.val_loader, cfg))
    callbacks = []
    if cfg.phase.val_clips > 0 and len(data.val_set):
        lookup = clip_lookup(cfg, data.val_set.keys()[: cfg.phase.val_clips])
        # encoded at the frame rate the shards were cut at (pipeline.clips is the pipeline's setting)
        at_data_size = at_clip_size(cfg, data_clip_size(cfg.data.root, cfg.data.clips))
        callbacks.append(ValidationVideos(at_data_size, data.val_set, lookup, cfg.phase.val_every_n_steps,
                                          cfg.phase.val_clips, cfg.phase.val_sampling_steps))
    with init():
        module = phase_a.PhaseA(cfg, frozen)
    return BuiltPhase(module, data, phase_a.export_phase_a, callbacks)


def _build_game_state(cfg: RunConfig, init: Callable = contextlib.nullcontext) -> BuiltPhase:
    # Indexed before the MLLM is built (minutes at 7B): an empty training split fails in seconds.
    train_sessions, val_sessions = data_b.session_shards(cfg, "train"), data_b.session_shards(cfg, "val")
    with init():
        module = phase_b.PhaseB(cfg)
        if frozen_bf16_applies(cfg):  # autocast (bf16-mixed) computes with the bf16 base and float32 trainables
            count = cast_frozen(module.model, torch.bfloat16)
            log.info("phase.frozen_bf16: %d frozen tensors held in bfloat16", count)
    tokenizer, ids = module.tokenizer, module.ids
    data = ShardData(
        data_b.SessionWindows(train_sessions, tokenizer, ids, cfg.data.window_weights, cfg.seed),
        data_b.FullSessions(val_sessions, tokenizer, ids),
        lambda dataset, *position: data_b.train_loader(cfg, dataset, ids.pad, *position),
        lambda dataset: data_b.val_loader(cfg, dataset, ids.pad))
    return BuiltPhase(module, data, phase_b.export_phase_b, [])


def _build_adaptation(cfg: RunConfig, init: Callable = contextlib.nullcontext) -> BuiltPhase:
    data = ShardData(adaptation_dataset(cfg, "train"), adaptation_dataset(cfg, "val"),
                     partial(data_a.train_loader, cfg), partial(data_a.val_loader, cfg))
    with init():
        module = phase_c.PhaseC(cfg)
    return BuiltPhase(module, data, phase_c.export_phase_c, [])


class PhaseBuilder(NamedTuple):
    """How one phase is built: ``build(cfg, init)`` and its trained network's block classes."""

    build: Callable[..., BuiltPhase]  # (cfg, init) -> module, data, export, callbacks
    wrap_blocks: Callable[[], set[type]]  # FSDP's wrapping unit: its trained network's blocks


_RECONSTRUCTION = PhaseBuilder(_build_reconstruction, _decoder_blocks)
BUILDERS: dict[str, PhaseBuilder] = {A_BASE: _RECONSTRUCTION, A_WARMUP: _RECONSTRUCTION, A_JOINT: _RECONSTRUCTION,
                                     PHASE_B: PhaseBuilder(_build_game_state, _mllm_blocks),
                                     PHASE_C: PhaseBuilder(_build_adaptation, _decoder_blocks)}


def builder_for(cfg: RunConfig) -> PhaseBuilder:
    """The builder of the configured phase (``cfg.phase.name``; an unknown name is refused as the specs say)."""
    return BUILDERS[spec_named(cfg.phase.name).name]
