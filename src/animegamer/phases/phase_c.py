"""Phase (c): the decoder adapts to the MLLM's predicted representations.

The encoder is bypassed: the decoder is conditioned on phase (b)'s ``pred_rep`` for each clip (with
the true history), with the clip's true latents and flow as the target. Motion-scope embedder,
AdaLN modulation linears and LoRA train, starting from the phase (a) export.
"""
from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from animegamer.config.schema import RunConfig
from animegamer.diffusion.schedule import alphas_cumprod
from animegamer.models.reconstruction import ReconstructionModel, build_reconstruction
from animegamer.phases.common import init_exports, set_trainable
from animegamer.phases.denoising import VAL_TIMESTEPS, AlphasCumprod, denoising_loss, validation_draw
from animegamer.phases.phase_a import PhaseA, export_phase_a, train_draw, trained_parameters
from animegamer.phases.specs import LORA, PHASE_C, PHASES
from animegamer.utils.randomness import SampleRandom

ADAPTATION = PHASES[PHASE_C]


def adaptation_trainable(model: ReconstructionModel) -> list[str]:
    """Motion scope + AdaLN + LoRA of the decoder (its spec's); the encoder stays as phase (a) left it."""
    return trained_parameters(model, ADAPTATION.trains)


def rep_dropout(rep: torch.Tensor, uncond: torch.Tensor, p: float, draw: SampleRandom) -> torch.Tensor:
    """Replace a sample's representation by the unconditional one with probability ``p`` (CFG)."""
    drop = draw.rand() < p
    return torch.where(drop.to(rep.device).view(-1, 1, 1), uncond.to(rep.dtype).expand_as(rep), rep)


class PhaseC(L.LightningModule):
    # Frozen parameters the export carries besides what trains (prefixes relative to ``model``).
    export_extra = ("encoder.",)

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = build_reconstruction(cfg, init_exports(cfg.phase), with_lora=LORA in ADAPTATION.trains)
        self.trainable = set_trainable(self.model, adaptation_trainable(self.model))
        self._alphas_cumprod = AlphasCumprod(alphas_cumprod(cfg.model.diffusion))
        self.strict_loading = False  # checkpoints hold only what trains

    def loss(self, batch: dict, draw: SampleRandom, t: torch.Tensor | None = None,
             dropout: bool = True) -> torch.Tensor:
        rep = batch["pred_rep"].to(self.compute_dtype)
        if dropout:
            with torch.no_grad():
                rep = rep_dropout(rep, self.model.encoder.unconditional(), self.cfg.phase.unconditional_rep_prob,
                                  draw)
        denoise = lambda x_t, t: self.model.decoder(x_t, t, rep, batch["flow"])
        return denoising_loss(denoise, batch["latents"], draw, self._alphas_cumprod.on(self.device),
                              self.cfg.model.diffusion.num_train_timesteps, self.compute_dtype, t)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch, train_draw(self, batch_idx, self.batch_size_of(batch)))
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["flow"].shape[0], sync_dist=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        size = batch["flow"].shape[0]
        losses = [self.loss(batch, validation_draw(self.cfg.seed, t, batch_idx, size, self.device),
                            t=torch.full((size,), t, dtype=torch.long), dropout=False) for t in VAL_TIMESTEPS]
        self.log("val/loss", torch.stack(losses).mean(), batch_size=size, sync_dist=True)

    # The same decoder and bookkeeping as phase (a): its methods, shared without inheritance.
    configure_optimizers = PhaseA.configure_optimizers
    configure_gradient_clipping = PhaseA.configure_gradient_clipping
    compute_dtype = PhaseA.compute_dtype
    trainable_parameter_names = PhaseA.trainable_parameter_names
    batch_size_of = PhaseA.batch_size_of
    tokens_of = PhaseA.tokens_of
    flops_per_batch = PhaseA.flops_per_batch
    on_save_checkpoint = PhaseA.on_save_checkpoint


def export_phase_c(module: PhaseC, folder: str | Path, meta: dict, state: dict | None = None) -> Path:
    """Phase (a)'s layout plus the (frozen) encoder (``PhaseC.export_extra``), so the game's renderer
    loads from one folder."""
    return export_phase_a(module, folder, {**meta, "phase": PHASE_C}, state)
