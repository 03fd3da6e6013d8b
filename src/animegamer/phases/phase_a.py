"""Phase (a): the action-aware encoder and the motion-scope decoder learn to reconstruct clips.

Stage ``a_warmup`` trains the encoder and the motion-scope embedder only; ``a_joint`` adds decoder
LoRA and every block's AdaLN modulation linear. The decoder sees (noisy latents, timestep,
representation, flow) and predicts the velocity; the loss is CogVideoX's (DESIGN section 5).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch

from animegamer.checkpoints.export import load_export
from animegamer.config.schema import RunConfig
from animegamer.diffusion.sampler import sample
from animegamer.diffusion.schedule import alphas_cumprod
from animegamer.models.decoder import MotionScopeDecoder
from animegamer.models.encoder import ActionAwareEncoder
from animegamer.phases.denoising import VAL_TIMESTEPS, AlphasCumprod, denoising_loss, validation_draw
from animegamer.phases.common import (SampleRandom, compute_dtype, clip_gradients, keep_trained, make_optimizer,
                                      micro_step, sample_positions, set_trainable, trainable_names)
from animegamer.utils.state import submodule_state

log = logging.getLogger(__name__)

WARMUP, JOINT = "a_warmup", "a_joint"
STAGES = (WARMUP, JOINT)


@dataclass
class ClipBatch:
    """What the decoder trains on, whichever input path produced it."""

    latents: torch.Tensor  # (B, T', C, H', W') scaled VAE latents
    text: torch.Tensor  # (B, Lt, text_dim) T5 features
    image: torch.Tensor  # (B, P, image_dim) CLIP patch tokens
    flow: torch.Tensor  # (B,) motion-scope flow values


class ReconstructionModel(torch.nn.Module):
    """Encoder + decoder as one module, so trainable sets and exports have stable names."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        # Seeded construction: random frozen weights must be rebuilt identically on resume, because
        # checkpoints and exports hold only what trains.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.encoder = ActionAwareEncoder(cfg.model.encoder)
            self.decoder = MotionScopeDecoder(cfg.model.decoder, self.encoder.width, self.encoder.num_tokens)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, text: torch.Tensor, image: torch.Tensor,
                flow: torch.Tensor) -> torch.Tensor:
        return self.decoder(x_t, t, self.encoder(text, image), flow)

    def unconditional(self, like: ClipBatch) -> torch.Tensor:
        """The CFG branch: the encoder on zeroed text and image features (SAT's unconditional)."""
        return self.encoder(torch.zeros_like(like.text[:1]), torch.zeros_like(like.image[:1]))


def import_official(model: ReconstructionModel, path: str) -> None:
    """The official decoder checkpoint into encoder and decoder; anything unplaced is an error."""
    from animegamer.models.official_decoder import load_official_decoder

    report = load_official_decoder(path, model.encoder, model.decoder, merge_lora=not model.decoder.has_lora)
    if not report.ok:
        raise ValueError(f"{path}: {report.summary()}: unplaced {report.unplaced_keys[:10]}, "
                         f"unset {report.unset_parameters[:10]}")


def stage_trainable(model: ReconstructionModel, stage: str) -> list[str]:
    """Exactly the parameter names a stage trains (asserted by name in the tests)."""
    names = [f"encoder.{n}" for n, _ in model.encoder.named_parameters()]
    names += [f"decoder.{n}" for n in model.decoder.motion_scope_parameters()]
    if stage == JOINT:
        names += [f"decoder.{n}" for n in model.decoder.adaln_parameters()]
        names += [f"decoder.{n}" for n in model.decoder.lora_parameters()]
    return names


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
        if cfg.phase.name not in STAGES:
            raise ValueError(f"phase.name={cfg.phase.name!r} is not a phase (a) stage {STAGES}")
        self.cfg = cfg
        self.model = ReconstructionModel(cfg)
        if cfg.phase.name == JOINT:
            self.model.decoder.add_lora()
        if cfg.model.decoder.official_checkpoint:
            import_official(self.model, cfg.model.decoder.official_checkpoint)
        if cfg.phase.init_from:
            load_export(cfg.phase.init_from, self.model)
        self.trainable = set_trainable(self.model, stage_trainable(self.model, cfg.phase.name))
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

    @torch.no_grad()
    def reconstruct(self, clips: ClipBatch, generator: torch.Generator, steps: int = 0) -> torch.Tensor:
        """Sample latents (B, T', C, H', W') from the clips' own representation (the sampler of DESIGN 5)."""
        diffusion = self.cfg.model.diffusion
        if steps:
            from dataclasses import replace

            diffusion = replace(diffusion, sampling_steps=steps)
        cond = self.model.encoder(clips.text, clips.image)
        return sample(self.model.decoder, tuple(clips.latents.shape), cond, self.model.unconditional(clips),
                      clips.flow, diffusion, generator, dtype=self.compute_dtype)

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
    """Export what phase (a) trained: tensors + json (always) and the LoRA as a peft adapter folder.

    ``state``: the tensors to export, gathered by an FSDP save (names relative to ``module.model``);
    None reads the module. ``module.export_extra`` adds frozen parameters by prefix (phase (c))."""
    from animegamer.checkpoints.export import save_export

    extra = tuple(getattr(module, "export_extra", ()))
    folder = save_export(folder, module.model, {"phase": module.cfg.phase.name, **meta}, extra, state)
    if module.model.decoder.has_lora:
        decoder_state = None if state is None else submodule_state(state, "decoder.")
        module.model.decoder.save_lora(Path(folder) / "lora", decoder_state)
    return Path(folder)
