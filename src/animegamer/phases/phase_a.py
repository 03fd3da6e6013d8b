"""Phase (a): the action-aware encoder and the motion-scope decoder learn to reconstruct clips.

Stage ``a_warmup`` trains the encoder and the motion-scope embedder only; ``a_joint`` adds decoder
LoRA and every block's AdaLN modulation linear. Stage ``a_base``, for presets without pretrained
weights, comes first: it trains the whole plain decoder (and an encoder) and exports the decoder as the
base. The decoder sees (noisy latents, timestep, representation, flow) and predicts the velocity; the
loss is CogVideoX's.
"""
from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch

from animegamer.config.schema import PhaseAConfig, RunConfig
from animegamer.diffusion.schedule import alphas_cumprod
from animegamer.models.decoder import BASE_FOLDER
from animegamer.models.reconstruction import ClipBatch, ReconstructionModel, build_reconstruction
from animegamer.phases.specs import ADALN, DECODER, ENCODER, LORA, MOTION_SCOPE, spec_for, spec_named
from animegamer.phases.denoising import VAL_TIMESTEPS, AlphasCumprod, denoising_loss, validation_draw
from animegamer.phases.common import (compute_dtype, clip_gradients, init_exports, keep_trained, make_optimizer,
                                      micro_step, set_trainable, trainable_names)
from animegamer.utils.randomness import SampleRandom, sample_positions
from animegamer.utils.state import submodule_state

log = logging.getLogger(__name__)

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


def stage_trainable(model: ReconstructionModel, stage: str) -> list[str]:
    """Exactly the parameter names a stage trains (asserted by name in the tests)."""
    return trained_parameters(model, spec_named(stage).trains)


def cfg_dropout(text: torch.Tensor, image: torch.Tensor, p_text: float, p_image: float,
                draw: SampleRandom) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero each branch per sample with its probability, so the model also learns the unconditional."""
    batch = text.shape[0]
    keep_text = (draw.rand() >= p_text).to(text)
    keep_image = (draw.rand() >= p_image).to(image)
    return text * keep_text.view(batch, 1, 1), image * keep_image.view(batch, 1, 1)


class PhaseA(L.LightningModule):
    def __init__(self, cfg: RunConfig, frozen=None) -> None:
        super().__init__()
        spec = spec_for(cfg)
        if spec.config is not PhaseAConfig:
            raise ValueError(f"phase.name={cfg.phase.name!r} is not a phase (a) stage")
        self.cfg = cfg
        self.model = build_reconstruction(cfg, init_exports(cfg.phase), with_lora=LORA in spec.trains)
        self.trainable = set_trainable(self.model, trained_parameters(self.model, spec.trains))
        self._alphas_cumprod = AlphasCumprod(alphas_cumprod(cfg.model.diffusion))
        # Frozen encoders (VAE, T5, CLIP) stay out of the module tree: never saved, never optimised.
        self._frozen = [frozen]
        # Checkpoints hold only what trains; frozen weights are rebuilt from the config on resume.
        self.strict_loading = False

    @property
    def alphas_cumprod(self) -> torch.Tensor:
        return self._alphas_cumprod.on(self.device)

    # ----------------------------------------------------------------------- data
    @property
    def frozen(self):
        return self._frozen[0]

    def to_clip_batch(self, batch: dict) -> ClipBatch:
        """Features path: tensors straight from the feature shards. Clips path: encoders run here."""
        if "latents" in batch:
            return ClipBatch(batch["latents"], batch["text"], batch["image"], batch["flow"])
        frozen = self.frozen
        video = batch["video"]  # (B, T, H, W, 3) uint8
        with torch.no_grad():
            latents = frozen.vae.encode(video).to(self.compute_dtype)
            text = frozen.t5.encode(list(batch["motion_text"])).to(self.compute_dtype)
            image = frozen.clip.encode(batch["frame"]).to(self.compute_dtype)
        return ClipBatch(latents, text, image, batch["flow"])

    # ----------------------------------------------------------------------- training
    def diffusion_loss(self, clips: ClipBatch, draw: SampleRandom, t: torch.Tensor | None = None,
                       dropout: bool = True) -> torch.Tensor:
        phase = self.cfg.phase
        text, image = clips.text, clips.image
        if dropout:
            text, image = cfg_dropout(text, image, phase.text_dropout, phase.image_dropout, draw)
        denoise = lambda x_t, t: self.model(x_t, t, text, image, clips.flow)
        return denoising_loss(denoise, clips.latents, draw, self.alphas_cumprod,
                              self.cfg.model.diffusion.num_train_timesteps, self.compute_dtype, t)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        # On the module's device: drawing the (B, T, C, H, W) noise on the CPU stalled the GPU every step.
        loss = self.diffusion_loss(self.to_clip_batch(batch), train_draw(self, batch_idx, self.batch_size_of(batch)))
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["flow"].shape[0], sync_dist=True)
        return loss

    def configure_optimizers(self):
        return make_optimizer(self.model, self.cfg.phase)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        clip_gradients(self, gradient_clip_val, self.cfg.trainer.max_nonfinite_in_row)

    # ----------------------------------------------------------------------- validation
    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """Diffusion loss at fixed timesteps and noise: a curve comparable from step to step."""
        clips = self.to_clip_batch(batch)
        losses = []
        size = clips.latents.shape[0]
        for t_value in VAL_TIMESTEPS:
            draw = validation_draw(self.cfg.seed, t_value, batch_idx, size, self.device)
            t = torch.full((size,), t_value, dtype=torch.long)
            losses.append(self.diffusion_loss(clips, draw, t=t, dropout=False))
        loss = torch.stack(losses).mean()
        self.log("val/loss", loss, batch_size=clips.latents.shape[0], sync_dist=True)
        return loss

    def reconstruct(self, clips: ClipBatch, generator: torch.Generator, steps: int = 0) -> torch.Tensor:
        """Sample latents (B, T', C, H', W') from the clips' own representation (the game's sampler)."""
        return self.model.reconstruct(clips, self.cfg.model.diffusion, generator, self.compute_dtype, steps)

    @property
    def compute_dtype(self) -> torch.dtype:
        return compute_dtype(self.model)

    def trainable_parameter_names(self) -> list[str]:
        return trainable_names(self.model)

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


def train_draw(module: L.LightningModule, batch_idx: int, batch_size: int) -> SampleRandom:
    """The step's per-sample randomness, keyed by each sample's global stream position."""
    trainer = module.trainer
    positions = sample_positions(micro_step(module, batch_idx), batch_size, trainer.global_rank, trainer.world_size)
    return SampleRandom(module.cfg.seed, positions, module.device)


def decoder_tokens(cfg: RunConfig, rep_tokens: int, batch: dict) -> int:
    """N + T' x (H'/p) x (W'/p): the decoder's joint sequence for this batch's latents."""
    latents = batch["latents"] if "latents" in batch else None
    if latents is None:  # raw clips: the VAE's geometry
        from animegamer.config.validate import vae_latent_shape

        t, _, h, w = vae_latent_shape(cfg.model.encoders, *batch["video"].shape[1:4])
    else:
        t, _, h, w = latents.shape[1:]
    p = cfg.model.decoder.patch_size
    return rep_tokens + t * (h // p) * (w // p)


def decoder_flops(cfg: RunConfig, rep_tokens: int, batch: dict) -> float:
    """Forward FLOPs of the CogVideoX decoder on a batch (the frozen encoders are not counted)."""
    from animegamer.training.throughput import transformer_forward_flops

    dec = cfg.model.decoder
    hidden = dec.num_attention_heads * dec.attention_head_dim
    tokens = decoder_tokens(cfg, rep_tokens, batch)
    size = batch["flow"].shape[0]
    return size * transformer_forward_flops(tokens, hidden, dec.num_layers, 4 * hidden)


def export_phase_a(module: PhaseA, folder: str | Path, meta: dict, state: dict | None = None) -> Path:
    """Export what phase (a) trained: tensors + json (always), the LoRA as a peft adapter folder, and
    a stage that trains the whole decoder (``a_base``) its transformer as a diffusers folder
    (``BASE_FOLDER``), the base later stages load as ``model.decoder.path``.

    ``state``: the tensors to export, gathered by an FSDP save (names relative to ``module.model``);
    None reads the module. ``module.export_extra`` adds frozen parameters by prefix (phase (c))."""
    from animegamer.checkpoints.export import save_export

    extra = tuple(getattr(module, "export_extra", ()))
    folder = save_export(folder, module.model, {"phase": module.cfg.phase.name, **meta}, extra, state)
    decoder = module.model.decoder
    decoder_state = None if state is None else submodule_state(state, "decoder.")
    if decoder.has_lora:
        decoder.save_adapter(Path(folder) / "lora", decoder_state)
    if DECODER in spec_for(module.cfg).trains:
        decoder.save_base(Path(folder) / BASE_FOLDER, decoder_state)
    return Path(folder)
