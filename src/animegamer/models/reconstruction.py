"""The reconstruction model: the action-aware encoder and the motion-scope decoder as one module, and
the one place it is assembled and loaded.

Phases (a) and (c) train it, the game renders with it, evaluation reconstructs with it and the
pipeline's representation step runs its encoder: each builds it with :func:`build_reconstruction`
(or :func:`build_encoder`), so the order of the steps (seeded construction, decoder LoRA, official
checkpoint, exports) is the same wherever it is used.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

from animegamer.checkpoints.export import TRAINED_FILE, load_export
from animegamer.checkpoints.safe_load import safetensors_keys
from animegamer.config.schema import DiffusionConfig, RunConfig
from animegamer.diffusion.sampler import sample
from animegamer.models.decoder import MotionScopeDecoder
from animegamer.models.encoder import ActionAwareEncoder
from animegamer.models.fp8 import apply_decoder_fp8
from animegamer.models.lora import is_lora_name
from animegamer.models.official_decoder import load_official_decoder
from animegamer.utils.randomness import seeded

ENCODER = "encoder"  # the encoder's attribute, hence the prefix of its tensors in an export


@dataclass
class ClipBatch:
    """What the decoder trains on and reconstructs, whichever input path produced it."""

    latents: torch.Tensor  # (B, T', C, H', W') scaled VAE latents
    text: torch.Tensor  # (B, Lt, text_dim) T5 features
    image: torch.Tensor  # (B, P, image_dim) CLIP patch tokens
    flow: torch.Tensor  # (B,) motion-scope flow values


class ReconstructionModel(nn.Module):
    """Encoder + decoder as one module, so trainable sets and exports have stable names.

    Construction is seeded by ``cfg.seed``: random frozen weights must be rebuilt identically on
    resume and in every process, because checkpoints and exports hold only what trains."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        with seeded(cfg.seed):
            self.encoder = ActionAwareEncoder(cfg.model.encoder)
            self.decoder = MotionScopeDecoder(cfg.model.decoder, self.encoder.width, self.encoder.num_tokens)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, text: torch.Tensor, image: torch.Tensor,
                flow: torch.Tensor) -> torch.Tensor:
        return self.decoder(x_t, t, self.encoder(text, image), flow)

    @torch.no_grad()
    def reconstruct(self, clips: ClipBatch, diffusion: DiffusionConfig, generator: torch.Generator,
                    dtype: torch.dtype, steps: int = 0) -> torch.Tensor:
        """Sample latents (B, T', C, H', W') from the clips' own representation; ``steps`` replaces the
        configured number of sampling steps (0 keeps it)."""
        if steps:
            diffusion = replace(diffusion, sampling_steps=steps)
        cond = self.encoder(clips.text, clips.image)
        return sample(self.decoder, tuple(clips.latents.shape), cond, self.encoder.unconditional(), clips.flow,
                      diffusion, generator, dtype=dtype)


def import_official_decoder(model: ReconstructionModel, path: str) -> None:
    """The official decoder checkpoint into encoder and decoder; anything unplaced is an error. Its LoRA
    is kept as the decoder's adapter when the decoder has one, merged into the base weights otherwise."""
    report = load_official_decoder(path, model.encoder, model.decoder, merge_lora=not model.decoder.has_lora)
    if not report.ok:
        raise ValueError(f"{path}: {report.summary()}: unplaced {report.unplaced_keys[:10]}, "
                         f"unset {report.unset_parameters[:10]}")


def export_holds_lora(export: str | Path) -> bool:
    """Whether an export folder carries decoder LoRA tensors (its tensor names only; nothing is read)."""
    path = Path(export) / TRAINED_FILE
    if not path.exists():
        raise FileNotFoundError(f"{export}: not an export folder (no {TRAINED_FILE})")
    return any(is_lora_name(key) for key in safetensors_keys(path))


def build_reconstruction(cfg: RunConfig, exports: Sequence[str | Path] = (),
                         with_lora: Optional[bool] = None, play: bool = False) -> ReconstructionModel:
    """The reconstruction model of ``cfg``: seeded construction, the decoder's LoRA adapter when
    ``with_lora`` (None: when one of ``exports`` holds LoRA tensors), the official decoder checkpoint
    when the config names one, then each export (phase (a) or (c)) in order, each over the last.

    The adapter comes before the official import so that the official LoRA is kept as an adapter (not
    merged), and the exports come last because they hold what training changed. ``model.decoder.fp8``
    converts the decoder's frozen base linears after all of them (:mod:`.fp8`), except for ``play``, where
    the game's loader stores them in float8 once the LoRA is merged (:func:`.fp8.apply_play_fp8`)."""
    model = ReconstructionModel(cfg)
    if with_lora is None:
        with_lora = any(export_holds_lora(export) for export in exports)
    if with_lora:
        model.decoder.add_lora()
    if cfg.model.decoder.official_checkpoint:
        import_official_decoder(model, cfg.model.decoder.official_checkpoint)
    for export in exports:
        load_export(export, model)
    if not play:
        apply_decoder_fp8(model.decoder)  # last: the LoRA wrappers and every weight are in place
    return model


def build_encoder(cfg: RunConfig, exports: Sequence[str | Path] = ()) -> ActionAwareEncoder:
    """The encoder alone, built as :class:`ReconstructionModel` builds it (same seed, same weights),
    with the ``encoder.*`` tensors of each export loaded in order: what the pipeline's representation
    step needs without building the decoder."""
    with seeded(cfg.seed):
        holder = nn.ModuleDict({ENCODER: ActionAwareEncoder(cfg.model.encoder)})
    for export in exports:
        load_export(export, holder, prefixes=(f"{ENCODER}.",))
    return holder[ENCODER]
