"""Phase (a): the action-aware encoder and the motion-scope decoder learn to reconstruct clips.

Stage ``a_warmup`` trains the encoder and the motion-scope embedder only; ``a_joint`` adds decoder
LoRA and every block's AdaLN modulation linear. Stage ``a_base``, for presets without pretrained
weights, comes first: it trains the whole plain decoder (and an encoder) and exports the decoder as the
base. The decoder sees (noisy latents, timestep, representation, flow) and predicts the velocity; the
loss is CogVideoX's.
"""
from __future__ import annotations

from pathlib import Path

import torch

from animegamer.config.schema import RunConfig
from animegamer.models.reconstruction import ClipBatch, ReconstructionModel
from animegamer.phases.denoising import Denoiser, DenoisingPhase, export_denoising, trained_parameters
from animegamer.phases.groups import STAGE_GROUPS
from animegamer.utils.randomness import SampleRandom


def stage_trainable(model: ReconstructionModel, stage: str) -> list[str]:
    """Exactly the parameter names a stage trains (asserted by name in the tests)."""
    return trained_parameters(model, STAGE_GROUPS[stage])


def cfg_dropout(text: torch.Tensor, image: torch.Tensor, p_text: float, p_image: float,
                draw: SampleRandom) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero each branch per sample with its probability, so the model also learns the unconditional."""
    batch = text.shape[0]
    keep_text = (draw.rand() >= p_text).to(text)
    keep_image = (draw.rand() >= p_image).to(image)
    return text * keep_text.view(batch, 1, 1), image * keep_image.view(batch, 1, 1)


class PhaseA(DenoisingPhase):
    """The decoder conditioned on the encoder's representation of the clip's motion text and frame."""

    def __init__(self, cfg: RunConfig, frozen=None) -> None:
        groups = STAGE_GROUPS.get(cfg.phase.name)
        if groups is None:
            raise ValueError(f"phase.name={cfg.phase.name!r} is not a phase (a) stage")
        super().__init__(cfg, groups)
        # Frozen encoders (VAE, T5, CLIP) stay out of the module tree: never saved, never optimised.
        self._frozen = [frozen]

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

    def inputs_of(self, batch: dict) -> ClipBatch:
        return self.to_clip_batch(batch)

    def condition(self, clips: ClipBatch, draw: SampleRandom, dropout: bool) -> tuple[torch.Tensor, Denoiser]:
        phase = self.cfg.phase
        text, image = clips.text, clips.image
        if dropout:
            text, image = cfg_dropout(text, image, phase.text_dropout, phase.image_dropout, draw)
        return clips.latents, lambda x_t, t: self.model(x_t, t, text, image, clips.flow)

    def reconstruct(self, clips: ClipBatch, generator: torch.Generator, steps: int = 0) -> torch.Tensor:
        """Sample latents (B, T', C, H', W') from the clips' own representation (the game's sampler)."""
        return self.model.reconstruct(clips, self.cfg.model.diffusion, generator, self.compute_dtype, steps)


def export_phase_a(module: PhaseA, folder: str | Path, meta: dict, state: dict | None = None) -> Path:
    """Phase (a)'s export (:func:`export_denoising`)."""
    return export_denoising(module, folder, meta, state)
