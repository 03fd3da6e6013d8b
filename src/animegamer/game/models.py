"""What a game turn runs, loaded for play: the MLLM, the renderer (encoder and decoder), the VAE and the
motion level -> flow table, from trained exports (``load_game_models``), frozen and with LoRAs merged.

``animegamer.game`` plays with them; evaluation and the recipe load them here too.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch

from animegamer.checkpoints.trained_data import at_clip_size, renderer_clip_size
from animegamer.config.schema import RunConfig
from animegamer.config.validate import ConfigError
from animegamer.contracts.files import MANIFEST
from animegamer.data.words import training_word_tokenizer
from animegamer.diffusion.cfg_parallel import cfg_devices, replicate, two_device_predictor
from animegamer.diffusion.step_cache import caching, check_sampling_cache
from animegamer.errors import InvalidInputError
from animegamer.models.decoder import check_decoder_compile
from animegamer.models.fp8 import apply_play_fp8, check_play_fp8, refuse
from animegamer.models.frozen_encoders import build_frozen_encoders
from animegamer.models.game_mllm import build_game_mllm
from animegamer.models.reconstruction import build_reconstruction

log = logging.getLogger("animegamer.game")  # the game's logger: loading is part of starting a game

MOTION_LEVELS = (1, 2, 3, 4, 5)


@dataclass
class GameModels:
    """Everything a turn runs: MLLM (a ``TokenizedMLLM`` or any object with ``.model``, ``.tokenizer``,
    ``.ids``), renderer (``ReconstructionModel``: its encoder gives the unconditional branch, its decoder
    samples), the VAE, the level -> flow table and the run config."""

    mllm: object
    renderer: torch.nn.Module
    vae: torch.nn.Module
    level_flow: dict[int, float]
    cfg: RunConfig
    sources: dict = field(default_factory=dict)  # where the weights came from (recorded in game.json)
    # The decoder's copy on a second GPU: the conditional guidance branch runs there (model.decoder.cfg_parallel).
    cfg_replica: Optional[torch.nn.Module] = None

    def __post_init__(self) -> None:
        self.level_flow = check_level_flow(self.level_flow)

    @property
    def denoiser(self):
        """What the sampler runs: the decoder (guidance branches batched) or, with a replica, both
        decoders, one branch each."""
        return two_device_predictor(self.renderer.decoder, self.cfg_replica)

    @property
    def device(self) -> torch.device:
        return next(self.renderer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.renderer.parameters()).dtype


def check_level_flow(level_flow: Mapping) -> dict[int, float]:
    """``{level: flow}`` with int keys (a manifest's json has string keys); every level 1..5 present."""
    table = {int(k): float(v) for k, v in dict(level_flow).items()}
    missing = [level for level in MOTION_LEVELS if level not in table]
    if missing:
        raise ValueError(f"level_flow lacks motion levels {missing}: got {table}")
    return table


def read_level_flow(manifest: str | Path) -> dict[int, float]:
    """``motion_bins.level_flow`` of a pipeline manifest (a ``manifest.json`` or the folder holding one)."""
    path = Path(manifest)
    if path.is_dir():
        path = path / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidInputError(f"{path}: not a manifest (not JSON: {error})") from None
    try:
        table = data["motion_bins"]["level_flow"]
    except (KeyError, TypeError):
        message = f"{path}: no motion_bins.level_flow (not a clips/features/sessions manifest?)"
        raise InvalidInputError(message) from None
    return check_level_flow(table)


def _as_list(exports: str | Path | Sequence[str | Path] | None) -> list[str]:
    if exports is None or exports == "":
        return []
    if isinstance(exports, (str, Path)):
        return [str(exports)]
    return [str(e) for e in exports if str(e)]


def weights_problems(cfg: RunConfig, mllm_exports: Sequence[str], renderer_exports: Sequence[str]) -> list[str]:
    """A network with neither an export nor an official checkpoint to load: refused before anything is
    built (a random network would play noise)."""
    problems = []
    if not mllm_exports and not cfg.model.mllm.official_checkpoint:
        problems.append("no MLLM weights: give a phase (b) export or set model.mllm.official_checkpoint")
    if not renderer_exports and not cfg.model.decoder.official_checkpoint:
        problems.append("no renderer weights: give a phase (c) or (a) export or set "
                        "model.decoder.official_checkpoint")
    return problems


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def play_dtype(device: torch.device) -> torch.dtype:
    """Play's default dtype: bfloat16 on CUDA, float32 elsewhere."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def merge_for_play(model) -> None:
    """Playing never trains: fold a LoRA adapter (MLLM or decoder) into its weights, in float32 before
    the cast: one matmul per projection instead of three (the unmerged MLLM stage measured 2.2x the
    plain one)."""
    if model.has_lora:
        model.merge_lora()


def _frozen(module: torch.nn.Module, device, dtype) -> torch.nn.Module:
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


def renderer_for_play(renderer, device, dtype, replica_device=None):
    """``(renderer, replica)`` ready to play: the decoder's LoRA merged, frozen on ``device`` in ``dtype``,
    a copy of the decoder on ``replica_device`` for the second guidance branch (None: no copy), then under
    ``model.decoder.fp8`` each decoder's base weights stored in float8 (the copy is quantized on its own
    device rather than copied in float8)."""
    merge_for_play(renderer.decoder)
    renderer = _frozen(renderer, device, dtype)
    replica = replicate(renderer.decoder, replica_device) if replica_device is not None else None
    for decoder in (renderer.decoder, replica):
        if decoder is not None:
            apply_play_fp8(decoder)
    return renderer, replica


@torch.no_grad()
def load_game_mllm(cfg: RunConfig, exports: Sequence[str | Path], device: torch.device, dtype: torch.dtype):
    """The game-state MLLM of ``cfg`` with ``exports`` loaded over it, ready to play (LoRA merged,
    frozen); no export: the network as phase (b) starts from it (the untrained-game baseline)."""
    mllm = build_game_mllm(cfg, exports, words=training_word_tokenizer)
    merge_for_play(mllm.model)
    mllm.model = _frozen(mllm.model, device, dtype)
    return mllm


@torch.no_grad()
def load_game_models(cfg: RunConfig, mllm_export: str | Path | None,
                     renderer_export: str | Path | Sequence[str | Path] | None, level_flow: Mapping,
                     *, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> GameModels:
    """Build the MLLM, renderer and VAE from ``cfg`` and load the trained exports over them.

    ``mllm_export``: a phase (b) export folder. ``renderer_export``: a phase (c) export (it carries the
    encoder too, so it stands alone) or a phase (a) one, or several applied in order; the decoder
    gets its LoRA first when any of them holds LoRA tensors. Official checkpoints named in
    the config are imported before the exports, as the training phases do. Either export may be
    empty when the config's official checkpoint provides that network. Everything ends frozen, in
    eval mode, on ``device`` (CUDA when available) in ``dtype`` (bfloat16 on CUDA, float32 on CPU).
    """
    problems = check_decoder_compile(cfg.model.decoder, training=False)
    problems += check_sampling_cache(cfg.model.diffusion, cfg.model.decoder)
    if problems:
        raise ConfigError(problems)
    device = torch.device(device or default_device())
    # refused here, before any build; with the step cache one GPU runs both branches (diffusion/step_cache.py)
    branch_devices = None if caching(cfg.model.diffusion) else cfg_devices(cfg.model.decoder.cfg_parallel, device)
    dtype = dtype or play_dtype(device)
    refuse(check_play_fp8(cfg.model.decoder, branch_devices or [device], dtype))  # nothing to check when off
    level_flow = check_level_flow(level_flow)
    mllm_exports, renderer_exports = _as_list(mllm_export), _as_list(renderer_export)
    problems = weights_problems(cfg, mllm_exports, renderer_exports)
    if problems:
        raise ConfigError(problems)
    cfg = at_clip_size(cfg, renderer_clip_size(renderer_exports))  # render at the trained clip size

    mllm = load_game_mllm(cfg, mllm_exports, device, dtype)
    renderer = build_reconstruction(cfg, renderer_exports, play=True)
    renderer, replica = renderer_for_play(renderer, device, dtype, branch_devices[1] if branch_devices else None)

    vae = build_frozen_encoders(cfg.model.encoders, device=device, dtype=dtype, which=("vae",)).vae
    sources = {"mllm": mllm_exports, "renderer": renderer_exports, "device": str(device),
               "dtype": str(dtype).removeprefix("torch."),
               "official": {"mllm": cfg.model.mllm.official_checkpoint,
                            "decoder": cfg.model.decoder.official_checkpoint},
               "cfg_devices": [str(d) for d in branch_devices] if branch_devices else [str(device)]}
    log.info("game models on %s (%s): mllm %s, renderer %s; guidance branches on %s", device, dtype, mllm_exports,
             renderer_exports, sources["cfg_devices"])
    return GameModels(mllm, renderer, vae, level_flow, cfg, sources, cfg_replica=replica)
