"""Each training phase in one place: its config, what it trains and exports, the shards it reads, the
weights and frozen encoders it loads, and its own checks. How a phase is built (its module and data, its
FSDP wrapping unit) is in :mod:`animegamer.phases.builders`, so the pre-flight reads this table without
loading Lightning or the networks.

Whatever depends on which phase runs (the train command, the pre-flight, the recipes) asks
:func:`spec_for` or :data:`PHASES`, and hands the generic trainer (``animegamer.training``) what it
needs of the spec as arguments (the folder of the samples, whether the export writes a LoRA adapter).
The parameter groups a phase trains are named in :mod:`animegamer.phases.groups`, which its module
resolves to parameters. What an export holds, which the game and the evaluation read, is in
``animegamer.contracts.exports``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from animegamer.config.schema import PhaseAConfig, PhaseBConfig, PhaseCConfig, PhaseConfig, RunConfig
from animegamer.config.validate import choice
from animegamer.contracts.exports import A_BASE, A_JOINT, A_WARMUP, EXPORTS, PHASE_B, PHASE_C, ExportContract
from animegamer.contracts.shards import IMAGE, LATENTS, PRED_REP, REPS, TEXT
from animegamer.data import phase_a as data_a
from animegamer.mllm.collate import check_window_weights
from animegamer.models.checks import check_tokenizer
from animegamer.models.encoder import representation_tokens
from animegamer.models.mllm import check_mllm
from animegamer.phases.groups import ADAPTATION_GROUPS, MLLM, STAGE_GROUPS
from animegamer.training.strategies import BF16_MIXED, FSDP, is_deepspeed


@dataclass(frozen=True)
class PhaseSpec:
    """One phase (or stage of phase (a)): everything that depends on which phase runs."""

    name: str
    config: type[PhaseConfig]  # its config dataclass (configs/phase/<name>.yaml defaults to it)
    trains: tuple[str, ...]  # parameter groups it trains (its module's; phases/denoising.py resolves the decoder's)
    exports: ExportContract
    # data.<key> of the folder of its samples; None: phase (a)'s ``input`` names it (features | clips).
    samples: Optional[str]
    sample_shapes: Callable[[RunConfig], dict[str, tuple]]  # .npy members it reads (None = any size)
    weights: tuple[str, ...]  # model weight folders it loads (config.disk_checks.check_weight_folders parts)
    frozen_encoders: Callable[[RunConfig], tuple[str, ...]]  # frozen encoders a run builds
    checks: tuple[Callable[[RunConfig], list[str]], ...]  # its own config fields and what only it needs

    def sample_key(self, phase: PhaseConfig | Mapping) -> str:
        """``data.<key>`` of its sample shards, from the phase config (typed, or a resolved dict)."""
        if self.samples is not None:
            return self.samples
        return phase["input"] if isinstance(phase, Mapping) else phase.input


# --------------------------------------------------------------------------- shard contracts
def _latents(cfg: RunConfig) -> tuple:
    return (None, cfg.model.encoders.vae.latent_channels, None, None)


def _representation(cfg: RunConfig) -> tuple[int, int]:
    return representation_tokens(cfg.model.encoder), cfg.model.encoder.width


def _feature_shapes(cfg: RunConfig) -> dict[str, tuple]:
    """Precomputed features (clips are decoded whole, their size is the pipeline's business)."""
    if cfg.phase.input != data_a.FEATURES:
        return {}
    enc = cfg.model.encoder
    return {LATENTS: _latents(cfg), TEXT: (enc.text_tokens, enc.text_dim), IMAGE: (enc.image_tokens, enc.image_dim)}


def _session_shapes(cfg: RunConfig) -> dict[str, tuple]:
    return {REPS: (None, *_representation(cfg))}


def _adaptation_shapes(cfg: RunConfig) -> dict[str, tuple]:
    return {LATENTS: _latents(cfg), PRED_REP: _representation(cfg)}


def _reconstruction_encoders(cfg: RunConfig) -> tuple[str, ...]:
    """All with raw clips; the VAE for validation videos."""
    if cfg.phase.input == data_a.CLIPS:
        return ("t5", "clip", "vae")
    return ("vae",) if cfg.phase.val_clips > 0 else ()


def _no_encoders(cfg: RunConfig) -> tuple[str, ...]:
    return ()


# --------------------------------------------------------------------------- each phase's own checks
def _probability(key: str, value: float) -> list[str]:
    return [] if 0 <= value < 1 else [f"{key}={value} must be in [0, 1)"]


def check_reconstruction_phase(cfg: RunConfig) -> list[str]:
    phase = cfg.phase
    problems = choice("phase.input", phase.input, data_a.INPUTS)
    problems += _probability("phase.text_dropout", phase.text_dropout)
    problems += _probability("phase.image_dropout", phase.image_dropout)
    if phase.random_frame and phase.input != data_a.CLIPS:
        problems.append(f"phase.random_frame needs phase.input={data_a.CLIPS}: precomputed features hold the first "
                        f"frame only")
    return problems


def check_base_phase(cfg: RunConfig) -> list[str]:
    if not cfg.model.decoder.motion_scope:
        return []
    return [f"phase.name={A_BASE!r} pre-trains a plain video diffusion transformer (the stand-in of CogVideoX's "
            f"pre-training): set model.decoder.motion_scope=false; phase {A_WARMUP} adds the motion-scope embedder "
            f"over it, zero-initialised"]


def check_game_state_phase(cfg: RunConfig) -> list[str]:
    phase = cfg.phase
    problems = []
    if phase.pack_tokens < 0:
        problems.append(f"phase.pack_tokens={phase.pack_tokens}: must be >= 0")
    if phase.pad_to_multiple < 0:
        problems.append(f"phase.pad_to_multiple={phase.pad_to_multiple}: must be >= 0")
    problems += check_frozen_bf16(cfg)
    problems += check_mllm(cfg.model)
    problems += check_tokenizer(cfg.model, [("phase.init_from", phase.init_from)] if phase.init_from else [])
    problems += check_window_weights("data.window_weights", cfg.data.window_weights)
    return problems


def check_frozen_bf16(cfg: RunConfig) -> list[str]:
    """``phase.frozen_bf16=true`` only where the base is otherwise float32 under autocast: bf16-mixed without an
    engine that casts the weights itself (the default, null, turns it on exactly there)."""
    return frozen_bf16_problems(cfg) if cfg.phase.frozen_bf16 else []


def frozen_bf16_problems(cfg: RunConfig) -> list[str]:
    """Why holding the frozen base in bf16 does not apply to this run (empty when it does)."""
    t = cfg.trainer
    if t.strategy == FSDP:
        return ["phase.frozen_bf16=true: FSDP shards units of one dtype; use trainer.fsdp_compute=bf16 instead"]
    if is_deepspeed(t.strategy):
        return [f"phase.frozen_bf16=true: {t.strategy}'s bf16 mode already holds every weight in bf16; drop it"]
    if t.precision != BF16_MIXED:
        return [f"phase.frozen_bf16=true needs trainer.precision={BF16_MIXED} (autocast runs the bf16 base with the "
                f"float32 trainables), got {t.precision!r}"]
    return []


def frozen_bf16_applies(cfg: RunConfig) -> bool:
    """``phase.frozen_bf16`` as set, or (null) wherever it applies."""
    wanted = cfg.phase.frozen_bf16
    return not frozen_bf16_problems(cfg) if wanted is None else bool(wanted)


def check_adaptation_phase(cfg: RunConfig) -> list[str]:
    return _probability("phase.unconditional_rep_prob", cfg.phase.unconditional_rep_prob)


# --------------------------------------------------------------------------- the phases
_RECONSTRUCTION = dict(config=PhaseAConfig, samples=None, sample_shapes=_feature_shapes, weights=("decoder",),
                       frozen_encoders=_reconstruction_encoders, checks=(check_reconstruction_phase,))

PHASES: dict[str, PhaseSpec] = {spec.name: spec for spec in (
    # Phase (a)'s stages on its samples (each trains its groups.STAGE_GROUPS). The base's export also
    # holds the transformer as a diffusers folder that later stages load as model.decoder.path.
    PhaseSpec(A_BASE, trains=STAGE_GROUPS[A_BASE], exports=EXPORTS[A_BASE],
              **{**_RECONSTRUCTION, "checks": (check_reconstruction_phase, check_base_phase)}),
    PhaseSpec(A_WARMUP, trains=STAGE_GROUPS[A_WARMUP], exports=EXPORTS[A_WARMUP], **_RECONSTRUCTION),
    PhaseSpec(A_JOINT, trains=STAGE_GROUPS[A_JOINT], exports=EXPORTS[A_JOINT], **_RECONSTRUCTION),
    PhaseSpec(PHASE_B, config=PhaseBConfig, trains=(MLLM,),
              exports=EXPORTS[PHASE_B],
              samples="sessions", sample_shapes=_session_shapes, weights=("mllm",), frozen_encoders=_no_encoders,
              checks=(check_game_state_phase,)),
    # The decoder (encoder bypassed) on the MLLM's predicted representations; the export carries the encoder.
    PhaseSpec(PHASE_C, config=PhaseCConfig, trains=ADAPTATION_GROUPS,
              exports=EXPORTS[PHASE_C],
              samples="adaptation", sample_shapes=_adaptation_shapes, weights=("decoder",),
              frozen_encoders=_no_encoders, checks=(check_adaptation_phase,)),
)}


def spec_named(name: str) -> PhaseSpec:
    try:
        return PHASES[name]
    except KeyError:
        raise ValueError(f"phase.name={name!r} is not a phase; phases: {tuple(PHASES)}") from None


def spec_for(cfg: RunConfig) -> PhaseSpec:
    """The spec of the configured phase (``cfg.phase.name``)."""
    return spec_named(cfg.phase.name)
