"""Forward noising, velocity targets and CogVideoX's training loss.

Notation: a = alpha_bar_t (from :func:`animegamer.diffusion.schedule.alphas_cumprod`), eps ~ N(0, I).

    x_t = sqrt(a) x0 + sqrt(1-a) eps            (forward process)
    v   = sqrt(a) eps - sqrt(1-a) x0            (velocity, the network's target)
    x0  = sqrt(a) x_t - sqrt(1-a) v             (inverse, exact for the true v)

Latents are (B, T, C, H, W) in CogVideoX's layout; every function works for any (B, ...) shape.
Coefficients are gathered per sample and computed in at least float32: near t = 0 the loss divides by
1 - a ~ 2.5e-3, and bfloat16's 3 significant digits would turn rounding error into loss.
"""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

REDUCTIONS = ("mean", "none")
ALPHAS_DTYPES = (torch.float32, torch.float64)  # lower precision cannot represent 1 - alpha_bar near t = 0


def _alpha_bar(ac: torch.Tensor, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """alpha_bar_t of each sample, shaped (B, 1, ..., 1) to broadcast against ``like``.

    The dtype is at least float32 (float64 stays float64), whatever the dtype of ``like``.
    """
    if t.ndim != 1 or t.shape[0] != like.shape[0]:
        raise ValueError(f"t must have shape (B,) = ({like.shape[0]},), got {tuple(t.shape)}")
    if t.dtype.is_floating_point:
        raise ValueError(f"t must hold integer timesteps, got {t.dtype}")
    if ac.dtype not in ALPHAS_DTYPES:
        # e.g. a module buffer cast by .to(torch.bfloat16) / bf16-true precision: bf16 spacing near 1 is
        # 2^-8, so alpha_bar_0 = 0.99745 rounds to 0.99609 or 1.0 and 1 - alpha_bar_0 can become 0.
        raise ValueError(f"alphas_cumprod must be float32 or float64, got {ac.dtype}")
    dtype = torch.promote_types(like.dtype, torch.float32)
    a = ac.to(device=like.device)[t.to(like.device)].to(dtype)  # (B,)
    return a.reshape((-1,) + (1,) * (like.ndim - 1))


def _coefficients(ac: torch.Tensor, t: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sqrt(a_t), sqrt(1 - a_t)), each (B, 1, ..., 1)."""
    a = _alpha_bar(ac, t, like)
    return a.sqrt(), (1.0 - a).sqrt()


def add_noise(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, ac: torch.Tensor) -> torch.Tensor:
    """x_t = sqrt(a_t) x0 + sqrt(1 - a_t) eps; (B, ...) -> (B, ...) in at least float32.

    Keep this float32 x_t for the loss and cast only the network's input copy to the compute dtype:
    the loss reconstructs x0 from x_t, and a rounded x_t would leak into the loss near t = 0.
    """
    sa, s1a = _coefficients(ac, t, x0)
    return sa * x0 + s1a * noise


def velocity(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, ac: torch.Tensor) -> torch.Tensor:
    """v = sqrt(a_t) eps - sqrt(1 - a_t) x0: the v-prediction target; (B, ...) -> (B, ...)."""
    sa, s1a = _coefficients(ac, t, x0)
    return sa * noise - s1a * x0


def v_to_x0(x_t: torch.Tensor, v: torch.Tensor, t: torch.Tensor, ac: torch.Tensor) -> torch.Tensor:
    """x0 = sqrt(a_t) x_t - sqrt(1 - a_t) v: the clean latent a velocity implies; (B, ...) -> (B, ...)."""
    sa, s1a = _coefficients(ac, t, x_t)
    return sa * x_t - s1a * v


def cogvideox_v_loss(
    model_output: torch.Tensor,
    x0: torch.Tensor,
    x_t: torch.Tensor,
    t: torch.Tensor,
    ac: torch.Tensor,
    reduction: str = "mean",
) -> torch.Tensor:
    """CogVideoX's training loss: weighted L2 between the x0 implied by the predicted velocity and x0.

    loss_b = mean_{T,C,H,W} [ w_t (x0_hat - x0)^2 ],  x0_hat = sqrt(a) x_t - sqrt(1-a) v_hat,  w_t = 1/(1-a)

    It is computed in this form (and not as the plain v-MSE) because it is how the official CogVideoX /
    AnimeGamer training computes it, but the two are the same number. For x_t built from (x0, eps):

        x0_hat - x0 = sqrt(a) x_t - sqrt(1-a) v_hat - x0
                    = [a x0 + sqrt(a(1-a)) eps - x0] - sqrt(1-a) v_hat
                    = sqrt(1-a) [sqrt(a) eps - sqrt(1-a) x0] - sqrt(1-a) v_hat
                    = -sqrt(1-a) (v_hat - v)
        => w_t (x0_hat - x0)^2 = (1-a) / (1-a) * (v_hat - v)^2 = (v_hat - v)^2

    so the loss equals mean (v_hat - v)^2 exactly (tests/test_diffusion.py checks it). Numerics: 1 - a is
    >= ~2.5e-3 at t = 0 (so w <= ~400) and 1 at t = 999 (zero terminal SNR, a = 0); everything runs in
    float32 so the huge-weight-times-tiny-error product at t = 0 stays finite and accurate.

    Args:
        model_output: predicted velocity v_hat, (B, T, C, H, W), any float dtype.
        x0: clean latents, (B, T, C, H, W).
        x_t: the noisy latents the network saw: the float32 tensor :func:`add_noise` made from this
            very ``x0`` (rounding either one separately, e.g. x0 to bf16 after noising, shows up in the
            loss amplified by w_t ~ 400 near t = 0).
        t: (B,) integer timesteps.
        ac: alphas_cumprod, (num_train_timesteps,).
        reduction: "mean" -> scalar (per-sample mean over T,C,H,W, then batch mean); "none" -> (B,).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if model_output.shape != x0.shape or x_t.shape != x0.shape:
        raise ValueError(f"shape mismatch: model_output {tuple(model_output.shape)}, "
                         f"x0 {tuple(x0.shape)}, x_t {tuple(x_t.shape)}")
    dtype = torch.promote_types(x0.dtype, torch.float32)
    v_hat, x0, x_t = model_output.to(dtype), x0.to(dtype), x_t.to(dtype)
    weight = 1.0 / (1.0 - _alpha_bar(ac, t, x0))  # (B, 1, 1, 1, 1)
    x0_hat = v_to_x0(x_t, v_hat, t, ac)
    per_sample = (weight * (x0_hat - x0).square()).flatten(1).mean(dim=1)  # (B,)
    return per_sample.mean() if reduction == "mean" else per_sample


def sample_timesteps(
    batch: int,
    generator: torch.Generator | None,
    num_train_timesteps: int,
    low: int = 0,
    high: int | None = None,
) -> torch.Tensor:
    """(batch,) training timesteps drawn uniformly from [low, high) (default: all of [0, T)), int64.

    Drawn on the generator's device, so a seeded CPU generator gives the same timesteps everywhere.
    ``low``/``high`` take a rank's slice from :func:`timestep_interval_for_rank`.
    """
    high = num_train_timesteps if high is None else high
    if not 0 <= low < high <= num_train_timesteps:
        raise ValueError(f"need 0 <= low < high <= {num_train_timesteps}, got [{low}, {high})")
    device = generator.device if generator is not None else None
    return torch.randint(low, high, (batch,), generator=generator, device=device, dtype=torch.long)


def timestep_interval_for_rank(rank: int, world_size: int, num_train_timesteps: int) -> tuple[int, int]:
    """The [low, high) timestep slice of one data-parallel rank for stratified timestep sampling.

    CogVideoX's official fine-tuning (SAT ``DiscreteSampling(uniform_sampling=True)``) splits the ranks
    into G contiguous groups, G the largest divisor of ``world_size`` that also divides the number of
    timesteps, and gives group g the slice [g T/G, (g+1) T/G): every optimizer step then sees timesteps
    spread over the whole range, which lowers the variance of the global-batch loss. With one rank the
    slice is everything. Optional: plain uniform sampling is the same objective in expectation.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    groups = max(g for g in range(1, world_size + 1) if world_size % g == 0 and num_train_timesteps % g == 0)
    ranks_per_group = world_size // groups
    width = num_train_timesteps // groups
    group = rank // ranks_per_group
    return group * width, (group + 1) * width
