"""CogVideoX-2B's noise schedule, built with diffusers' CogVideoX schedulers.

The schedule is CogVideoX-2B's: scaled-linear betas 0.00085..0.012 over 1000 steps,
an SD3-style SNR shift (``alpha_bar / (s + (1 - s) alpha_bar)``, s = 3) and then the zero-terminal-SNR
rescale of Lin et al. 2023 (so ``alpha_bar[999] == 0`` exactly: the last training step is pure noise),
v-prediction, "trailing" timestep spacing at sampling time (the first sampling step is t = 999, the
pure-noise step the model was trained on), and ``alpha_bar = 1`` after the last step.

These are the values of the released CogVideoX-2b ``scheduler_config.json``. Both schedulers are built
from diffusers rather than re-derived here so that the training loss, the sampler and any diffusers
pipeline agree to the bit on ``alphas_cumprod``; the order "shift, then rescale" is diffusers' (and the
official SAT code's) and matters, since rescaling after the shift keeps ``alpha_bar[0]`` at its
shifted value.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict

import torch

from animegamer.config.schema import DiffusionConfig

if TYPE_CHECKING:  # diffusers loads only when a scheduler is built
    from diffusers import CogVideoXDDIMScheduler, CogVideoXDPMScheduler

logger = logging.getLogger(__name__)

# Fixed parts of CogVideoX-2B's scheduler config: the pretrained decoder was trained with exactly these,
# so they are not configuration knobs (a different value would silently mismatch the weights).
PREDICTION_TYPE = "v_prediction"
TIMESTEP_SPACING = "trailing"
RESCALE_BETAS_ZERO_SNR = True
SET_ALPHA_TO_ONE = True  # alpha_bar after the last sampling step is 1: the final step returns x0
CLIP_SAMPLE = False
STEPS_OFFSET = 0

# alpha_bar at the last training step must be (numerically) zero; diffusers' rescale gives exactly 0.
ZERO_TERMINAL_SNR_TOLERANCE = 1e-8


def scheduler_kwargs(cfg: DiffusionConfig) -> Dict[str, Any]:
    """Constructor arguments shared by the training and the sampling scheduler."""
    return dict(
        num_train_timesteps=cfg.num_train_timesteps,
        beta_start=cfg.beta_start,
        beta_end=cfg.beta_end,
        beta_schedule=cfg.beta_schedule,
        snr_shift_scale=cfg.snr_shift_scale,
        prediction_type=PREDICTION_TYPE,
        timestep_spacing=TIMESTEP_SPACING,
        rescale_betas_zero_snr=RESCALE_BETAS_ZERO_SNR,
        set_alpha_to_one=SET_ALPHA_TO_ONE,
        clip_sample=CLIP_SAMPLE,
        steps_offset=STEPS_OFFSET,
    )


def make_train_scheduler(cfg: DiffusionConfig) -> "CogVideoXDDIMScheduler":
    """The training-time scheduler (diffusers' CogVideoX DDIM): ``add_noise``, ``get_velocity``, alphas.

    Our own training code uses :func:`alphas_cumprod` with :mod:`animegamer.diffusion.loss`; this object
    exists for callers that want diffusers' API (and for the tests that check the two agree).
    """
    from diffusers import CogVideoXDDIMScheduler

    return CogVideoXDDIMScheduler(**scheduler_kwargs(cfg))


def make_sampler_scheduler(cfg: DiffusionConfig) -> "CogVideoXDPMScheduler":
    """The sampling scheduler (diffusers' CogVideoX DPM++ 2M SDE), its timesteps set to ``cfg.sampling_steps``.

    diffusers' ``step`` takes the next timestep as ``t - num_train_timesteps // steps`` while "trailing"
    spacing rounds ``num_train_timesteps / steps``; the two agree only when the step count divides the
    number of training timesteps (true for the paper's 50), so other counts get a warning.
    """
    from diffusers import CogVideoXDPMScheduler

    steps = cfg.sampling_steps
    if not 0 < steps <= cfg.num_train_timesteps:
        raise ValueError(f"sampling_steps must be in [1, {cfg.num_train_timesteps}], got {steps}")
    if cfg.num_train_timesteps % steps != 0:
        logger.warning(
            "sampling_steps=%d does not divide num_train_timesteps=%d: diffusers' CogVideoX DPM step "
            "will look one timestep off at some steps (use a divisor, e.g. 50)", steps, cfg.num_train_timesteps)
    scheduler = CogVideoXDPMScheduler(**scheduler_kwargs(cfg))
    scheduler.set_timesteps(steps)
    return scheduler


def alphas_cumprod(cfg: DiffusionConfig) -> torch.Tensor:
    """``alpha_bar_t`` for t = 0..num_train_timesteps-1 (float64, CPU), after the SNR shift and rescale.

    Taken from the scheduler itself so there is one source of truth; checked for zero terminal SNR.
    """
    ac = make_train_scheduler(cfg).alphas_cumprod.detach().clone()
    check_zero_terminal_snr(ac)
    return ac


def signal_to_noise(ac: torch.Tensor) -> torch.Tensor:
    """SNR_t = alpha_bar_t / (1 - alpha_bar_t); 0 at the terminal step of a zero-SNR schedule."""
    return ac / (1.0 - ac)


def check_zero_terminal_snr(ac: torch.Tensor, tolerance: float = ZERO_TERMINAL_SNR_TOLERANCE) -> None:
    """Fail if the last step is not pure noise.

    The pretrained decoder (and our v-prediction loss at t = 999) assumes x_999 carries no signal; a
    schedule built without the rescale would leave a little signal there and sampling from pure noise
    would start off the training distribution (too-dark/too-bright videos, Lin et al. 2023).
    """
    terminal = float(ac[-1])
    if not 0.0 <= terminal <= tolerance:
        raise ValueError(f"terminal alpha_bar is {terminal:.3e}, expected ~0 (zero terminal SNR)")
    if not bool((ac[1:] <= ac[:-1]).all()):
        raise ValueError("alphas_cumprod must be non-increasing in t")
