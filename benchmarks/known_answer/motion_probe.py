"""Synthetic moving latents and a small decoder trained on them with this framework's loss, schedule and
sampler: a check, in minutes on a CPU, of whether the decoder's conditioning can set the speed of what it
renders, with no VAE, no pixels and no data set in the way.

Each clip is a smooth random texture (:class:`ProbeGeometry`: channels x height x width latents over a few
latent frames) moving left at one speed, in latent px per latent frame. :data:`LEVEL_SPEEDS` are the
known-answer levels' speeds at its 96-px-wide clips; the `small` preset's VAE compresses 4x in space and in
time, so a latent px per latent frame is an output px per frame and the same numbers serve as the motion
scope's flow values. :func:`train` fits any denoiser on batches a caller draws (what conditions the speed:
the representation, the motion scope, or both, is the caller's choice); the speed of a generated clip is
:func:`animegamer.metrics.latent_motion.clip_speed`.

``scripts/decoder_motion_probe.py`` conditions the speed through the representation (a vector per level,
or captions through T5 and the encoder); ``tests/test_motion_sweep.py`` through the motion scope alone.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional

import torch
import torch.nn.functional as F

from animegamer.config.schema import DecoderConfig, DiffusionConfig
from animegamer.diffusion.loss import add_noise, cogvideox_v_loss, sample_timesteps
from animegamer.diffusion.schedule import alphas_cumprod
from animegamer.metrics.latent_motion import shifted
from animegamer.models.decoder import MotionScopeDecoder

log = logging.getLogger(__name__)

LEVEL_SPEEDS = (0.0, 0.25, 0.8, 2.0, 4.5)  # latent px per latent frame (= output px per frame in `small`)
TEXTURE_REPEATS = 4  # the texture is this many clip widths wide: room for the fastest clip's whole pan
TEXTURE_BLUR = 3  # box blur (latent px) that makes the texture smooth enough to track a sub-pixel shift
VAE_FRAMES_PER_LATENT = 4  # the decoder's position grid counts output frames: (T' - 1) * 4 + 1
UNCONDITIONAL_SHARE = 0.1  # representations replaced by zeros in training, as phase (a) drops them for guidance
LEARNING_RATE = 1e-3
LOG_EVERY = 250  # steps


@dataclass(frozen=True)
class ProbeGeometry:
    """The synthetic clips' latent shape (T', C, H, W)."""

    frames: int = 5
    channels: int = 4
    height: int = 8
    width: int = 16

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.frames, self.channels, self.height, self.width


Batch = tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]  # clean latents, representations, flows
Denoiser = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


def translating_clips(speeds: torch.Tensor, generator: torch.Generator,
                      geometry: ProbeGeometry = ProbeGeometry()) -> torch.Tensor:
    """(n, T', C, H, W): a fresh smooth texture per clip, moving left at each of ``speeds`` (n,) latent px
    per latent frame, each texture normalised to unit standard deviation."""
    frames, channels, height, width = geometry.shape
    canvas = torch.randn(len(speeds), channels, height, width * TEXTURE_REPEATS, generator=generator)
    pad = TEXTURE_BLUR // 2
    canvas = F.avg_pool2d(F.pad(canvas, (pad, pad, pad, pad), mode="circular"), TEXTURE_BLUR, 1)
    canvas = canvas / canvas.std(dim=(1, 2, 3), keepdim=True)
    clips = [torch.stack([shifted(canvas[k], -float(speed) * t)[..., :width] for t in range(frames)])
             for k, speed in enumerate(speeds.tolist())]
    return torch.stack(clips)


def probe_decoder(base: DecoderConfig, geometry: ProbeGeometry, rep_tokens: int, layers: int = 4, heads: int = 2,
                  head_dim: int = 64, time_embed_dim: int = 64, motion_scope: bool = False) -> MotionScopeDecoder:
    """A small :class:`MotionScopeDecoder` (random weights, ``base``'s other settings) over the geometry's
    latents; its representation is ``rep_tokens`` tokens of its width (``heads * head_dim``)."""
    cfg = replace(base, num_layers=layers, num_attention_heads=heads, attention_head_dim=head_dim,
                  in_channels=geometry.channels, out_channels=geometry.channels,
                  sample_frames=(geometry.frames - 1) * VAE_FRAMES_PER_LATENT + 1, sample_height=geometry.height,
                  sample_width=geometry.width, motion_scope=motion_scope, time_embed_dim=time_embed_dim, path="",
                  official_checkpoint="", compile=False, fp8="off", gradient_checkpointing=False)
    return MotionScopeDecoder(cfg, heads * head_dim, rep_tokens)


def train(denoise: Denoiser, parameters: Iterable[torch.nn.Parameter], draw: Callable[[torch.Generator], Batch],
          steps: int, diffusion: DiffusionConfig, generator: torch.Generator, lr: float = LEARNING_RATE,
          lr_factor: Optional[Callable[[int], float]] = None) -> float:
    """``steps`` AdamW steps of CogVideoX's v-loss on the batches ``draw`` returns (a share of the
    representations zeroed, as phase (a) trains the unconditional branch); returns the last step's loss.
    ``lr_factor``: the learning rate's multiplier at each step (a warm-up and decay such as
    :func:`animegamer.phases.common.lr_lambda`'s); None keeps ``lr`` throughout."""
    ac = alphas_cumprod(diffusion)
    optimizer = torch.optim.AdamW([p for p in parameters if p.requires_grad], lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor) if lr_factor is not None else None
    started = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        x0, rep, flow = draw(generator)
        dropped = torch.rand(len(x0), generator=generator) < UNCONDITIONAL_SHARE
        rep = torch.where(dropped[:, None, None], torch.zeros_like(rep), rep)
        t = sample_timesteps(len(x0), generator, diffusion.num_train_timesteps)
        x_t = add_noise(x0, torch.randn(x0.shape, generator=generator), t, ac)
        loss = cogvideox_v_loss(denoise(x_t, t, rep, flow), x0, x_t, t, ac)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if step % LOG_EVERY == 0:
            log.info("probe step %d loss %.4f (%.0f s)", step, loss.item(), time.perf_counter() - started)
    return float(loss.item())
