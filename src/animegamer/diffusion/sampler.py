"""The decoder's sampler: DPM++ (2M SDE) over CogVideoX's schedule, with dynamic classifier-free guidance.

One step of the loop, for timestep t_i (999, 979, ..., 19 for 50 steps):
  1. run the denoiser on both branches: by default once on [uncond ; cond] stacked along the batch (one
     call, 2B samples, :class:`BatchedCFG`); ``cfg_parallel.TwoDeviceCFG`` runs each branch on its own GPU;
  2. guide: v = v_uncond + g_i (v_cond - v_uncond), g_i from :func:`dynamic_guidance_scale`;
  3. let diffusers' ``CogVideoXDPMScheduler.step`` move x_{t_i} to x_{t_{i+1}}: it turns v into x0,
     takes a second-order step using the previous step's x0 (first order on the first and last step)
     and adds fresh noise from ``generator`` (the solver is stochastic, so the generator fixes the result).
The last step goes to alpha_bar = 1 and returns the predicted x0 itself, with no noise added (the
official SAT sampler returns the last x0 prediction too). Guiding the velocity, as diffusers does, equals
guiding x0, as the SAT code does: x0 = sqrt(a) x_t - sqrt(1-a) v is affine in v with the same x_t in
both branches, and the guidance weights (1 - g, g) sum to one.

The guidance schedule copies CogVideoX: ``1 + s (1 - cos(pi ((N - t_i) / N) ** p)) / 2`` with N the
number of sampling steps and t_i the *training timestep* (0..999), not the step index. Both the official
SAT code (which AnimeGamer's decoder was trained and released with) and diffusers' CogVideoX pipeline
compute it that way; for 50 steps ``(N - t_i) / N`` runs from -18.98 to 0.62, so the scale swings
between 1 and 1 + s from step to step instead of decaying smoothly. The CogVideoX authors called the
wave a coincidence that they kept because it worked, and diffusers' maintainers have proposed the step
index instead. ``guidance_progress="step_index"`` gives the smooth schedule
(from 1 + s at the first step down to ~1), kept only as an option: the default reproduces the release.
"""
from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from typing import Callable, Optional, Sequence

import torch

from animegamer.config.schema import DiffusionConfig
from animegamer.diffusion.schedule import make_sampler_scheduler
from animegamer.diffusion.step_cache import sampling_cache

logger = logging.getLogger(__name__)

# denoise_fn(latents (B, T, C, H, W), timestep (B,) int64, rep (B, N, D), flow (B,) or None) -> v (B, T, C, H, W)
DenoiseFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]

GUIDANCE_BY_TIMESTEP = "timestep"  # CogVideoX (SAT and diffusers) and hence AnimeGamer's release
GUIDANCE_BY_STEP_INDEX = "step_index"  # the smooth cosine decay the formula was presumably meant to be
GUIDANCE_PROGRESS = (GUIDANCE_BY_TIMESTEP, GUIDANCE_BY_STEP_INDEX)
NO_GUIDANCE_SCALE = 1.0  # guidance_scale <= this: no unconditional branch at all (as diffusers decides)
LATENT_NDIM = 5  # (B, T, C, H, W)


def dynamic_guidance_scale(
    timestep: int,
    step_index: int,
    num_steps: int,
    scale: float,
    exponent: float,
    progress: str = GUIDANCE_BY_TIMESTEP,
) -> float:
    """Guidance weight of one sampling step: 1 + scale * (1 - cos(pi * x ** exponent)) / 2.

    x = (num_steps - timestep) / num_steps (CogVideoX's formula, the default) or
    x = (num_steps - step_index) / num_steps (``progress="step_index"``: 1 + scale at step 0, -> 1).
    Computed in Python float64 like the reference implementations: with the timestep form x ** 5 reaches
    ~ -2.5e6, and the cosine of it is only reproducible at double precision.
    """
    if progress not in GUIDANCE_PROGRESS:
        raise ValueError(f"progress must be one of {GUIDANCE_PROGRESS}, got {progress!r}")
    position = timestep if progress == GUIDANCE_BY_TIMESTEP else step_index
    x = (num_steps - position) / num_steps
    if x < 0 and not float(exponent).is_integer():
        raise ValueError(f"guidance exponent {exponent} must be an integer when (N - t) / N = {x:.3f} < 0 "
                         "(a negative base to a fractional power is not real)")
    return 1.0 + scale * (1.0 - math.cos(math.pi * x ** exponent)) / 2.0


def guidance_schedule(
    timesteps: Sequence[int],
    scale: float,
    exponent: float,
    dynamic: bool = True,
    progress: str = GUIDANCE_BY_TIMESTEP,
) -> list[float]:
    """The guidance weight of every sampling step (constant ``scale`` when ``dynamic`` is False)."""
    num_steps = len(timesteps)
    if not dynamic:
        return [float(scale)] * num_steps
    return [dynamic_guidance_scale(int(t), i, num_steps, scale, exponent, progress) for i, t in enumerate(timesteps)]


def _match_batch(rep: torch.Tensor, batch: int, name: str) -> torch.Tensor:
    """Expand a (1, N, D) representation to (batch, N, D); a (batch, N, D) one passes through."""
    if rep.ndim != 3 or rep.shape[0] not in (1, batch):
        raise ValueError(f"{name} must have shape (1 or {batch}, N, D), got {tuple(rep.shape)}")
    return rep.expand(batch, -1, -1)


class VelocityPredictor(ABC):
    """One guided velocity prediction per sampling step: the sampler's loop calls it and nothing else.

    ``__call__(latents, timestep, cond, uncond, flow, guidance, dtype)`` returns the guided velocity,
    float32 (B, T, C, H, W) on ``latents``' device; ``uncond`` is None without guidance. Subclasses decide
    where the two branches run (:class:`BatchedCFG` here, ``cfg_parallel.TwoDeviceCFG`` on two devices).
    """

    uses_cuda_graphs: bool = False  # a compiled decoder replaying CUDA graphs: the loop marks every step

    @abstractmethod
    def __call__(self, latents: torch.Tensor, timestep: int, cond: torch.Tensor, uncond: Optional[torch.Tensor],
                 flow: Optional[torch.Tensor], guidance: float, dtype: torch.dtype) -> torch.Tensor:
        """The guided velocity of one step."""


class BatchedCFG(VelocityPredictor):
    """Both branches as one batch of 2B, unconditional first (diffusers' order), on the denoiser's device.

    The network then sees the same batch shape at every step, and one big call beats two small ones on a
    GPU. The flow (motion scope) is not a guidance condition: both branches get the same value.
    """

    def __init__(self, denoise_fn: DenoiseFn) -> None:
        self.denoise_fn = denoise_fn
        self.uses_cuda_graphs = bool(getattr(denoise_fn, "uses_cuda_graphs", False))

    def __call__(self, latents, timestep, cond, uncond, flow, guidance, dtype):
        guided = uncond is not None
        x_in = torch.cat([latents, latents]) if guided else latents  # (B or 2B, T, C, H, W)
        rep_in = torch.cat([uncond, cond]) if guided else cond  # (B or 2B, N, D)
        flow_in = None if flow is None else (torch.cat([flow, flow]) if guided else flow)  # (B or 2B,)
        t_in = torch.full((x_in.shape[0],), timestep, dtype=torch.long, device=latents.device)  # (B or 2B,)
        v = self.denoise_fn(x_in.to(dtype), t_in, rep_in.to(dtype), flow_in).float()
        if not guided:
            return v
        v_uncond, v_cond = v.chunk(2)
        return guide(v_uncond, v_cond, guidance)


def guide(v_uncond: torch.Tensor, v_cond: torch.Tensor, guidance: float) -> torch.Tensor:
    """Classifier-free guidance of the two float32 velocities: v_u + g (v_c - v_u)."""
    return v_uncond + guidance * (v_cond - v_uncond)


def as_velocity_predictor(denoise_fn: "DenoiseFn | VelocityPredictor") -> VelocityPredictor:
    """A :class:`VelocityPredictor` as it is; a plain denoiser (the decoder) with its branches batched."""
    return denoise_fn if isinstance(denoise_fn, VelocityPredictor) else BatchedCFG(denoise_fn)


@torch.no_grad()
def sample(
    denoise_fn: "DenoiseFn | VelocityPredictor",
    shape: Sequence[int],
    cond: torch.Tensor,
    uncond: Optional[torch.Tensor],
    flow: Optional[torch.Tensor],
    cfg: DiffusionConfig,
    generator: Optional[torch.Generator],
    dtype: torch.dtype = torch.float32,
    *,
    dynamic_cfg: bool = True,
    guidance_progress: str = GUIDANCE_BY_TIMESTEP,
    latents: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Sample decoder latents (B, T, C, H, W), float32, with ``cfg.sampling_steps`` DPM++ steps.

    Args:
        denoise_fn: the decoder, returning the predicted velocity (see ``DenoiseFn``), its two guidance
            branches run as one batch; or a :class:`VelocityPredictor` that places them itself (e.g.
            ``cfg_parallel.TwoDeviceCFG``: one branch per GPU).
        shape: (B, T, C, H, W) of the latents, e.g. (B, 5, 16, 60, 90) for 17 frames at 480x720.
        cond: (B, N, D) representation of the turn (encoder output or the MLLM's prediction).
        uncond: (B or 1, N, D) unconditional representation (the encoder on empty text and a zero
            image, built by the caller); unused, and may be None, when ``cfg.guidance_scale <= 1``.
        flow: (B,) motion-scope flow values, or None for a decoder without motion scope.
        cfg: sampling_steps, guidance_scale, guidance_exponent and the schedule.
        generator: seeds the initial noise and the solver's per-step noise: same generator state,
            same latents. A CPU generator also works for CUDA latents (diffusers draws on its device).
        dtype: the dtype the denoiser's inputs are cast to; the solver state stays float32.
        dynamic_cfg: CogVideoX's dynamic guidance (default) or the constant ``cfg.guidance_scale``.
        guidance_progress: "timestep" (CogVideoX, default) or "step_index"; see the module docstring.
        latents: optional starting noise (B, T, C, H, W) instead of drawing it from ``generator``.
    """
    from diffusers.utils.torch_utils import randn_tensor

    shape = tuple(int(s) for s in shape)
    if len(shape) != LATENT_NDIM:
        raise ValueError(f"shape must be (B, T, C, H, W), got {shape}")
    batch, device = shape[0], cond.device
    cond = _match_batch(cond, batch, "cond")
    if flow is not None and tuple(flow.shape) != (batch,):
        raise ValueError(f"flow must have shape ({batch},), got {tuple(flow.shape)}")
    use_guidance = cfg.guidance_scale > NO_GUIDANCE_SCALE
    if use_guidance and uncond is None:
        raise ValueError(f"guidance_scale={cfg.guidance_scale} > 1 needs an uncond representation")
    uncond = _match_batch(uncond, batch, "uncond") if use_guidance else None

    scheduler = make_sampler_scheduler(cfg)
    timesteps = [int(t) for t in scheduler.timesteps]  # trailing spacing: 999, 979, ..., 19 for 50 steps
    guidances = guidance_schedule(timesteps, cfg.guidance_scale, cfg.guidance_exponent, dynamic_cfg,
                                  guidance_progress)
    logger.info("sampling %s latents: %d DPM++ steps, guidance %s (scale %.2f, exponent %.1f, by %s)",
                shape, len(timesteps), "off" if not use_guidance else ("dynamic" if dynamic_cfg else "constant"),
                cfg.guidance_scale, cfg.guidance_exponent, guidance_progress)

    if latents is None:
        latents = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
    elif tuple(latents.shape) != shape:
        raise ValueError(f"latents must have shape {shape}, got {tuple(latents.shape)}")
    latents = latents.to(device=device, dtype=torch.float32) * scheduler.init_noise_sigma  # x_999: pure noise

    predict = as_velocity_predictor(denoise_fn)
    old_x0: Optional[torch.Tensor] = None  # the previous step's x0 prediction, for the 2nd-order update
    with sampling_cache(denoise_fn, cfg.cache, cfg.cache_threshold):
        for i, t in enumerate(timesteps):
            # A decoder compiled with CUDA graphs (model.decoder.compile_mode) reuses its output buffers: each
            # step's call starts a new replay, the previous step's outputs being no longer read.
            if predict.uses_cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            v = predict(latents, t, cond, uncond, flow, guidances[i], dtype)
            t_back = timesteps[i - 1] if i > 0 else None  # the timestep old_x0 was predicted at
            latents, old_x0 = scheduler.step(v, old_x0, t, t_back, latents, generator=generator, return_dict=False)
            logger.debug("step %d/%d t=%d guidance=%.3f", i + 1, len(timesteps), t, guidances[i])
    return latents
