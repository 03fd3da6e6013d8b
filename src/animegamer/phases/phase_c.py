"""Phase (c): the decoder adapts to the MLLM's predicted representations.

The encoder is bypassed: the decoder is conditioned on phase (b)'s ``pred_rep`` for each clip (with
the true history), with the clip's true latents and flow as the target. Motion-scope embedder,
AdaLN modulation linears and LoRA train, starting from the phase (a) export.
"""
from __future__ import annotations

from pathlib import Path

import torch

from animegamer.config.schema import RunConfig
from animegamer.contracts.exports import PHASE_C
from animegamer.models.reconstruction import ReconstructionModel
from animegamer.phases.denoising import Denoiser, DenoisingPhase, export_denoising, trained_parameters
from animegamer.phases.groups import ADAPTATION_GROUPS
from animegamer.utils.randomness import SampleRandom


def adaptation_trainable(model: ReconstructionModel) -> list[str]:
    """Motion scope + AdaLN + LoRA of the decoder (its spec's); the encoder stays as phase (a) left it."""
    return trained_parameters(model, ADAPTATION_GROUPS)


def rep_dropout(rep: torch.Tensor, uncond: torch.Tensor, p: float, draw: SampleRandom) -> torch.Tensor:
    """Replace a sample's representation by the unconditional one with probability ``p`` (CFG)."""
    drop = draw.rand() < p
    return torch.where(drop.to(rep.device).view(-1, 1, 1), uncond.to(rep.dtype).expand_as(rep), rep)


class PhaseC(DenoisingPhase):
    """The decoder conditioned on phase (b)'s predicted representation (``pred_rep``)."""

    export_extra = ("encoder.",)

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg, ADAPTATION_GROUPS)

    def condition(self, batch: dict, draw: SampleRandom, dropout: bool) -> tuple[torch.Tensor, Denoiser]:
        rep = batch["pred_rep"].to(self.compute_dtype)
        if dropout:
            with torch.no_grad():
                rep = rep_dropout(rep, self.model.encoder.unconditional(), self.cfg.phase.unconditional_rep_prob,
                                  draw)
        return batch["latents"], lambda x_t, t: self.model.decoder(x_t, t, rep, batch["flow"])


def export_phase_c(module: PhaseC, folder: str | Path, meta: dict, state: dict | None = None) -> Path:
    """Phase (a)'s layout plus the (frozen) encoder (``PhaseC.export_extra``), so the game's renderer
    loads from one folder."""
    return export_denoising(module, folder, {**meta, "phase": PHASE_C}, state)
