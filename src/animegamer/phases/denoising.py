"""The denoising training both decoder phases share: draw t and noise, noise the latents, predict
the velocity, CogVideoX's loss. :class:`DenoisingPhase` holds the training, validation, optimiser,
throughput and checkpoint logic; a phase says only what the decoder is conditioned on
(:meth:`DenoisingPhase.condition`) and, where the batch is not ready to condition on, how to make it so
(:meth:`DenoisingPhase.inputs_of`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import lightning as L
import torch

from animegamer.checkpoints.export import save_export
from animegamer.config.schema import RunConfig
from animegamer.config.validate import vae_latent_shape
from animegamer.diffusion.loss import add_noise, cogvideox_v_loss
from animegamer.diffusion.schedule import alphas_cumprod
from animegamer.models.decoder import BASE_FOLDER
from animegamer.models.reconstruction import ReconstructionModel, build_reconstruction
from animegamer.phases.common import (clip_gradients, compute_dtype, init_exports, keep_trained, make_optimizer,
                                      micro_step, set_trainable, trainable_names)
from animegamer.phases.groups import ADALN, DECODER, ENCODER, LORA, MOTION_SCOPE
from animegamer.training.throughput import transformer_forward_flops
from animegamer.utils.randomness import SampleRandom, sample_positions
from animegamer.utils.state import submodule_state

# Validation timesteps: fixed, so the validation loss is comparable from step to step.
VAL_TIMESTEPS = (100, 300, 500, 700, 900)

Denoiser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x_t, t) -> velocity


def denoising_loss(denoise: Denoiser, latents: torch.Tensor, draw: SampleRandom,
                   alphas_cumprod: torch.Tensor, num_train_timesteps: int, dtype: torch.dtype,
                   t: torch.Tensor | None = None) -> torch.Tensor:
    """Loss of ``denoise`` on clean ``latents`` (B, T, C, H, W); ``t`` drawn uniformly unless given."""
    latents = latents.float()
    if t is None:
        t = draw.randint(num_train_timesteps)
    t = t.to(latents.device)
    noise = draw.randn(tuple(latents.shape[1:])).to(latents.device)  # no-op when drawn on the device
    x_t = add_noise(latents, noise, t, alphas_cumprod)
    return cogvideox_v_loss(denoise(x_t.to(dtype), t), latents, x_t, t, alphas_cumprod)


def validation_draw(seed: int, t_value: int, batch_idx: int, batch_size: int, device) -> SampleRandom:
    """Fixed noise per (timestep, validation sample): the validation curve compares like with like."""
    return SampleRandom(seed * 1_000 + t_value, range(batch_idx * batch_size, (batch_idx + 1) * batch_size), device)


def train_draw(module: L.LightningModule, batch_idx: int, batch_size: int) -> SampleRandom:
    """The step's per-sample randomness, keyed by each sample's global stream position."""
    trainer = module.trainer
    positions = sample_positions(micro_step(module, batch_idx), batch_size, trainer.global_rank, trainer.world_size)
    return SampleRandom(module.cfg.seed, positions, module.device)


class AlphasCumprod:
    """alpha_bar on the module's device, kept in float64 (not a buffer: Lightning's bf16-true would
    cast it, and alpha_bar_0 = 0.9975 rounds to 1.0)."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values

    def on(self, device: torch.device) -> torch.Tensor:
        if self.values.device != device:
            self.values = self.values.to(device)
        return self.values


def trained_parameters(model: ReconstructionModel, groups: tuple[str, ...]) -> list[str]:
    """The parameter names of the reconstruction model's groups (a phase spec's ``trains``), in order."""
    decoder = model.decoder
    by_group = {ENCODER: lambda: [f"encoder.{n}" for n, _ in model.encoder.named_parameters()],
                MOTION_SCOPE: lambda: [f"decoder.{n}" for n in decoder.motion_scope_parameters()],
                ADALN: lambda: [f"decoder.{n}" for n in decoder.adaln_parameters()],
                LORA: lambda: [f"decoder.{n}" for n in decoder.lora_parameters()],
                DECODER: lambda: [f"decoder.{n}" for n in decoder.base_parameters()]}
    unknown = [group for group in groups if group not in by_group]
    if unknown:
        raise ValueError(f"the reconstruction model has no parameter groups {unknown}; it has {tuple(by_group)}")
    return [name for group in groups for name in by_group[group]()]


def decoder_tokens(cfg: RunConfig, rep_tokens: int, batch: dict) -> int:
    """N + T' x (H'/p) x (W'/p): the decoder's joint sequence for this batch's latents."""
    latents = batch["latents"] if "latents" in batch else None
    if latents is None:  # raw clips: the VAE's geometry
        t, _, h, w = vae_latent_shape(cfg.model.encoders, *batch["video"].shape[1:4])
    else:
        t, _, h, w = latents.shape[1:]
    p = cfg.model.decoder.patch_size
    return rep_tokens + t * (h // p) * (w // p)


def decoder_flops(cfg: RunConfig, rep_tokens: int, batch: dict) -> float:
    """Forward FLOPs of the CogVideoX decoder on a batch (the frozen encoders are not counted)."""
    dec = cfg.model.decoder
    hidden = dec.num_attention_heads * dec.attention_head_dim
    tokens = decoder_tokens(cfg, rep_tokens, batch)
    size = batch["flow"].shape[0]
    return size * transformer_forward_flops(tokens, hidden, dec.num_layers, 4 * hidden)


class DenoisingPhase(L.LightningModule):
    """A phase that trains the reconstruction model's decoder (with its encoder where the phase says)
    to denoise clip latents. Subclasses implement :meth:`condition`."""

    # Frozen parameters the export carries besides what trains (prefixes relative to ``model``).
    export_extra: tuple[str, ...] = ()

    def __init__(self, cfg: RunConfig, trains: tuple[str, ...]) -> None:
        super().__init__()
        self.cfg, self.trains = cfg, tuple(trains)
        self.model = build_reconstruction(cfg, init_exports(cfg.phase), with_lora=LORA in trains)
        self.trainable = set_trainable(self.model, trained_parameters(self.model, trains))
        self._alphas_cumprod = AlphasCumprod(alphas_cumprod(cfg.model.diffusion))
        # Checkpoints hold only what trains; frozen weights are rebuilt from the config on resume.
        self.strict_loading = False

    @property
    def alphas_cumprod(self) -> torch.Tensor:
        return self._alphas_cumprod.on(self.device)

    @property
    def compute_dtype(self) -> torch.dtype:
        return compute_dtype(self.model)

    def trainable_parameter_names(self) -> list[str]:
        return trainable_names(self.model)

    # ----------------------------------------------------------------------- the phase's hooks
    def inputs_of(self, batch: dict) -> Any:
        """What :meth:`condition` reads, made once per batch (validation conditions on it at every
        timestep); the batch itself unless a phase says otherwise."""
        return batch

    def condition(self, inputs: Any, draw: SampleRandom, dropout: bool) -> tuple[torch.Tensor, Denoiser]:
        """The clean latents and the decoder conditioned on this phase's representation; ``dropout``
        replaces conditions by the unconditional ones with the phase's probabilities (drawn from
        ``draw`` before the timestep and noise)."""
        raise NotImplementedError

    # ----------------------------------------------------------------------- training
    def diffusion_loss(self, inputs: Any, draw: SampleRandom, t: torch.Tensor | None = None,
                       dropout: bool = True) -> torch.Tensor:
        latents, denoise = self.condition(inputs, draw, dropout)
        return denoising_loss(denoise, latents, draw, self.alphas_cumprod,
                              self.cfg.model.diffusion.num_train_timesteps, self.compute_dtype, t)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        # On the module's device: drawing the (B, T, C, H, W) noise on the CPU stalled the GPU every step.
        size = self.batch_size_of(batch)
        loss = self.diffusion_loss(self.inputs_of(batch), train_draw(self, batch_idx, size))
        self.log("train/loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return make_optimizer(self.model, self.cfg.phase)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        clip_gradients(self, gradient_clip_val, self.cfg.trainer.max_nonfinite_in_row)

    # ----------------------------------------------------------------------- validation
    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """Diffusion loss at fixed timesteps and noise: a curve comparable from step to step."""
        inputs = self.inputs_of(batch)
        size = self.batch_size_of(batch)
        losses = [self.diffusion_loss(inputs, validation_draw(self.cfg.seed, t_value, batch_idx, size, self.device),
                                      t=torch.full((size,), t_value, dtype=torch.long), dropout=False)
                  for t_value in VAL_TIMESTEPS]
        loss = torch.stack(losses).mean()
        self.log("val/loss", loss, batch_size=size, sync_dist=True)
        return loss

    # ----------------------------------------------------------------------- throughput
    def batch_size_of(self, batch: dict) -> int:
        return int(batch["flow"].shape[0])

    def tokens_of(self, batch: dict) -> int:
        """Joint decoder tokens per batch: representation + latent patches."""
        return self.batch_size_of(batch) * decoder_tokens(self.cfg, self.model.encoder.num_tokens, batch)

    def flops_per_batch(self, batch: dict) -> float:
        return decoder_flops(self.cfg, self.model.encoder.num_tokens, batch)

    # ----------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        keep_trained(checkpoint, self.trainable)


def export_denoising(module: DenoisingPhase, folder: str | Path, meta: dict, state: dict | None = None) -> Path:
    """Export what a denoising phase trained: tensors + json (always), the LoRA as a peft adapter
    folder, and a stage that trains the whole decoder (``a_base``) its transformer as a diffusers folder
    (``BASE_FOLDER``), the base later stages load as ``model.decoder.path``.

    ``state``: the tensors to export, gathered by an FSDP save (names relative to ``module.model``);
    None reads the module. ``module.export_extra`` adds frozen parameters by prefix (phase (c))."""
    folder = save_export(folder, module.model, {"phase": module.cfg.phase.name, **meta}, module.export_extra, state)
    decoder = module.model.decoder
    decoder_state = None if state is None else submodule_state(state, "decoder.")
    if decoder.has_lora:
        decoder.save_adapter(Path(folder) / "lora", decoder_state)
    if DECODER in module.trains:
        decoder.save_base(Path(folder) / BASE_FOLDER, decoder_state)
    return Path(folder)
