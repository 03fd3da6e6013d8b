"""The decoder's diffusion process: schedule, training loss, DPM++ sampler and dynamic CFG (CPU, fast)."""
from __future__ import annotations

import math

import pytest
import torch

from animegamer.config.schema import DiffusionConfig
from animegamer.diffusion.loss import (
    add_noise,
    cogvideox_v_loss,
    sample_timesteps,
    timestep_interval_for_rank,
    v_to_x0,
    velocity,
)
from animegamer.diffusion.sampler import dynamic_guidance_scale, guidance_schedule, sample
from animegamer.diffusion.schedule import (
    alphas_cumprod,
    check_zero_terminal_snr,
    make_sampler_scheduler,
    make_train_scheduler,
    signal_to_noise,
)

# CogVideoX-2b's released scheduler_config.json, written out independently of the code under test.
COGVIDEOX_2B_SCHEDULER = dict(
    beta_end=0.012, beta_schedule="scaled_linear", beta_start=0.00085, clip_sample=False,
    num_train_timesteps=1000, prediction_type="v_prediction", rescale_betas_zero_snr=True,
    set_alpha_to_one=True, snr_shift_scale=3.0, steps_offset=0, timestep_spacing="trailing",
)
LATENT_SHAPE = (2, 3, 4, 6, 8)  # (B, T, C, H, W)
REP_TOKENS, REP_WIDTH = 5, 7


@pytest.fixture(scope="module")
def cfg() -> DiffusionConfig:
    return DiffusionConfig()


@pytest.fixture(scope="module")
def ac(cfg) -> torch.Tensor:
    return alphas_cumprod(cfg)


def _hand_alphas_cumprod() -> torch.Tensor:
    """Scaled-linear betas -> cumprod -> SNR shift 3 -> zero-terminal-SNR rescale, in float64."""
    betas = torch.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=torch.float64) ** 2
    a = torch.cumprod(1 - betas, 0)
    a = a / (3.0 - 2.0 * a)
    s = a.sqrt()
    s = (s - s[-1]) * s[0] / (s[0] - s[-1])
    return s ** 2


# --------------------------------------------------------------------------- schedule
def test_schedule_matches_diffusers_cogvideox_2b(cfg, ac):
    from diffusers import CogVideoXDDIMScheduler, CogVideoXDPMScheduler

    assert ac.shape == (1000,) and ac.dtype == torch.float64
    for cls in (CogVideoXDDIMScheduler, CogVideoXDPMScheduler):
        assert torch.equal(ac, cls(**COGVIDEOX_2B_SCHEDULER).alphas_cumprod)
    torch.testing.assert_close(ac, _hand_alphas_cumprod(), rtol=1e-12, atol=1e-15)
    for scheduler in (make_train_scheduler(cfg), make_sampler_scheduler(cfg)):
        for key, value in COGVIDEOX_2B_SCHEDULER.items():
            assert scheduler.config[key] == value, key


def test_terminal_snr_is_zero(ac):
    assert float(ac[-1]) == 0.0
    assert float(signal_to_noise(ac)[-1]) == 0.0
    assert 0.0 < float(ac[-2]) < 1e-6  # the step before still carries (a little) signal
    # alpha_bar_0 keeps its SNR-shifted value: a / (3 - 2a) with a = 1 - beta_start
    assert float(ac[0]) == pytest.approx(0.99915 / (3 - 2 * 0.99915), rel=1e-12)
    check_zero_terminal_snr(ac)


def test_zero_snr_check_rejects_plain_schedule():
    from diffusers import CogVideoXDDIMScheduler

    plain = CogVideoXDDIMScheduler(**{**COGVIDEOX_2B_SCHEDULER, "rescale_betas_zero_snr": False}).alphas_cumprod
    with pytest.raises(ValueError, match="zero terminal SNR"):
        check_zero_terminal_snr(plain)


def test_sampler_timesteps_are_trailing(cfg):
    timesteps = make_sampler_scheduler(cfg).timesteps.tolist()
    assert len(timesteps) == 50
    assert timesteps[0] == 999 and timesteps[-1] == 19
    assert all(a - b == 20 for a, b in zip(timesteps, timesteps[1:]))


# --------------------------------------------------------------------------- loss
def _random_case(ac, t_values, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = len(t_values)
    shape = (b,) + LATENT_SHAPE[1:]
    x0 = torch.randn(shape, generator=g, dtype=dtype)
    eps = torch.randn(shape, generator=g, dtype=dtype)
    t = torch.tensor(t_values, dtype=torch.long)
    return x0, eps, t, add_noise(x0, eps, t, ac)


def test_add_noise_and_velocity_match_diffusers(cfg, ac):
    x0, eps, t, x_t = _random_case(ac, [0, 1, 500, 998, 999])
    scheduler = make_train_scheduler(cfg)
    torch.testing.assert_close(x_t, scheduler.add_noise(x0, eps, t))
    torch.testing.assert_close(velocity(x0, eps, t, ac), scheduler.get_velocity(x0, eps, t))


def test_v_to_x0_inverts_the_true_velocity(ac):
    x0, eps, t, x_t = _random_case(ac, [0, 250, 999], dtype=torch.float64)
    torch.testing.assert_close(v_to_x0(x_t, velocity(x0, eps, t, ac), t, ac), x0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_weighted_x0_loss_equals_v_mse(ac, dtype, rtol):
    """The identity of the loss docstring: w_t (x0_hat - x0)^2 == (v_hat - v)^2, per sample."""
    t_values = [0, 1, 17, 400, 750, 998, 999]
    x0, eps, t, x_t = _random_case(ac, t_values, dtype)
    v_hat = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    v_mse = (v_hat - velocity(x0, eps, t, ac)).square().flatten(1).mean(1)  # (B,)
    per_sample = cogvideox_v_loss(v_hat, x0, x_t, t, ac, reduction="none")
    assert per_sample.shape == (len(t_values),)
    torch.testing.assert_close(per_sample, v_mse, rtol=rtol, atol=0)
    torch.testing.assert_close(cogvideox_v_loss(v_hat, x0, x_t, t, ac), v_mse.mean(), rtol=rtol, atol=0)


def test_loss_is_zero_for_the_true_velocity(ac):
    x0, eps, t, x_t = _random_case(ac, [0, 3, 500, 999])
    loss = cogvideox_v_loss(velocity(x0, eps, t, ac), x0, x_t, t, ac, reduction="none")
    assert float(loss.max()) < 1e-9


@pytest.mark.parametrize("t_value", [0, 999])
def test_loss_finite_at_the_ends_in_bfloat16(ac, t_value):
    """t = 0 has the largest weight (1 / (1 - a) ~ 400), t = 999 has a = 0: both must stay finite and
    equal to the v-MSE with bf16 latents and a bf16 network output (x_t built from the same bf16 x0)."""
    x0, eps, t, _ = _random_case(ac, [t_value] * 3)
    x0 = x0.to(torch.bfloat16)
    x_t = add_noise(x0, eps, t, ac)
    assert x_t.dtype == torch.float32
    v_hat = (velocity(x0, eps, t, ac) + 0.1 * torch.randn_like(eps)).to(torch.bfloat16)
    loss = cogvideox_v_loss(v_hat, x0, x_t, t, ac)
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    v_mse = (v_hat.float() - velocity(x0, eps, t, ac)).square().mean()
    assert float(loss) == pytest.approx(float(v_mse), rel=1e-3)


def test_low_precision_alphas_are_rejected(ac):
    """A bf16 copy of alpha_bar (a module buffer under bf16-true precision) must fail, not divide by ~0."""
    assert float(1 - ac[0].to(torch.bfloat16).float()) in (0.0, 2 ** -8)  # the rounding this guards against
    x0, eps, t, x_t = _random_case(ac, [0, 999])
    with pytest.raises(ValueError, match="float32 or float64"):
        cogvideox_v_loss(x0, x0, x_t, t, ac.to(torch.bfloat16))
    add_noise(x0, eps, t, ac.float())  # float32 is fine


def test_loss_gradient_is_finite(ac):
    x0, eps, t, x_t = _random_case(ac, [0, 999])
    v_hat = torch.zeros_like(x0, requires_grad=True)
    cogvideox_v_loss(v_hat, x0, x_t, t, ac).backward()
    assert torch.isfinite(v_hat.grad).all()


def test_sample_timesteps_uniform_and_seeded():
    t1 = sample_timesteps(4096, torch.Generator().manual_seed(3), 1000)
    t2 = sample_timesteps(4096, torch.Generator().manual_seed(3), 1000)
    assert torch.equal(t1, t2) and t1.dtype == torch.long and t1.shape == (4096,)
    assert int(t1.min()) >= 0 and int(t1.max()) <= 999
    assert abs(float(t1.float().mean()) - 499.5) < 15  # uniform mean; std of the mean ~ 4.5
    sliced = sample_timesteps(512, torch.Generator().manual_seed(0), 1000, low=250, high=375)
    assert int(sliced.min()) >= 250 and int(sliced.max()) < 375


@pytest.mark.parametrize("world_size,groups", [(1, 1), (3, 1), (4, 4), (8, 8), (16, 8)])
def test_timestep_intervals_cover_the_range(world_size, groups):
    intervals = [timestep_interval_for_rank(r, world_size, 1000) for r in range(world_size)]
    assert len(set(intervals)) == groups
    covered = sorted(set(intervals))
    assert covered[0][0] == 0 and covered[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))


# --------------------------------------------------------------------------- dynamic CFG
def test_guidance_formula_hand_computed(cfg):
    """Paper setting (scale 6, exponent 5, 50 steps): x = (50 - t) / 50 with t the training timestep."""
    timesteps = make_sampler_scheduler(cfg).timesteps.tolist()
    g = guidance_schedule(timesteps, scale=6.0, exponent=5.0)
    # step 0, t = 999: x = -18.98, x^5 = -2464803.8..., cos(pi x^5) = -0.71300...
    assert g[0] == pytest.approx(1 + 6 * (1 - math.cos(math.pi * (-18.98) ** 5)) / 2, abs=1e-9)
    assert g[0] == pytest.approx(2.2915, abs=1e-4)
    assert g[1] == pytest.approx(2.5435, abs=1e-4)  # t = 979
    assert g[2] == pytest.approx(6.9744, abs=1e-4)  # t = 959
    # last step, t = 19: x = 0.62, x^5 = 0.0916133, cos(0.287813) = 0.958866 -> 1 + 6 * 0.020567
    assert g[-1] == pytest.approx(1.1234, abs=1e-4)
    assert all(1.0 <= v <= 7.0 for v in g)


def test_guidance_matches_published_values():
    """Values posted in diffusers PR #13172 for guidance_scale 4, 50 steps: old (timestep) and new (index)."""
    timesteps = list(range(999, 0, -20))
    by_t = guidance_schedule(timesteps, 4.0, 5.0)
    by_i = guidance_schedule(timesteps, 4.0, 5.0, progress="step_index")
    published_t = [1.8610, 2.0290, 4.9829, 4.6136, 2.1921, 3.1813, 1.0251, 3.1136, 1.4120]
    published_i = [5.00, 4.91, 4.67, 4.34, 3.96, 3.56, 3.17, 2.81, 2.49, 2.21]
    assert by_t[:9] == pytest.approx(published_t, abs=1e-4)
    assert by_i[:10] == pytest.approx(published_i, abs=5e-3)
    assert guidance_schedule(timesteps, 4.0, 5.0, dynamic=False) == [4.0] * 50


def test_guidance_rejects_fractional_exponent_on_negative_base():
    with pytest.raises(ValueError, match="integer"):
        dynamic_guidance_scale(999, 0, 50, 6.0, 5.5)
    assert dynamic_guidance_scale(999, 0, 50, 6.0, 5.5, progress="step_index") == pytest.approx(7.0)


# --------------------------------------------------------------------------- sampler
def _reps(batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cond = torch.randn(batch, REP_TOKENS, REP_WIDTH, generator=g)
    uncond = torch.zeros(1, REP_TOKENS, REP_WIDTH)
    flow = torch.rand(batch, generator=g) * 10
    return cond, uncond, flow


def _oracle_velocity(x_t: torch.Tensor, t: torch.Tensor, x0: torch.Tensor, ac: torch.Tensor) -> torch.Tensor:
    """The velocity that makes x_t come from x0: eps = (x_t - sqrt(a) x0) / sqrt(1-a), v = sqrt(a) eps - sqrt(1-a) x0,
    i.e. v = (sqrt(a) x_t - x0) / sqrt(1 - a)  (1 - a > 0 at every timestep)."""
    a = ac[t].float().reshape(-1, 1, 1, 1, 1)
    return (a.sqrt() * x_t - x0) / (1 - a).sqrt()


def test_sampler_recovers_x0_with_an_oracle(ac):
    """An oracle velocity for a known x0 must bring pure noise back to x0 (the last step returns x0)."""
    cfg = DiffusionConfig(guidance_scale=1.0)
    target = torch.randn(LATENT_SHAPE, generator=torch.Generator().manual_seed(5))
    cond, _, flow = _reps(LATENT_SHAPE[0])
    out = sample(lambda x, t, rep, f: _oracle_velocity(x, t, target, ac), LATENT_SHAPE, cond, None, flow, cfg,
                 torch.Generator().manual_seed(0))
    assert out.shape == LATENT_SHAPE and out.dtype == torch.float32
    torch.testing.assert_close(out, target, rtol=0, atol=1e-4)


def test_sampler_guidance_combines_branches(cfg, ac):
    """cond branch -> x0_c, uncond branch -> x0_u: the result is x0_u + g_last (x0_c - x0_u), g_last at t = 19.

    This pins the branch order, the guidance formula at the last step and the v -> x0 convention at once.
    """
    g = torch.Generator().manual_seed(6)
    x0_c, x0_u = torch.randn(LATENT_SHAPE, generator=g), torch.randn(LATENT_SHAPE, generator=g)
    cond, uncond, flow = _reps(LATENT_SHAPE[0])
    batch = LATENT_SHAPE[0]

    def denoise(x, t, rep, f):
        assert x.shape[0] == 2 * batch and torch.equal(rep[:batch], uncond.expand(batch, -1, -1))
        assert torch.equal(f, torch.cat([flow, flow]))
        target = torch.cat([x0_u, x0_c])
        return _oracle_velocity(x, t, target, ac)

    out = sample(denoise, LATENT_SHAPE, cond, uncond, flow, cfg, torch.Generator().manual_seed(0))
    g_last = dynamic_guidance_scale(19, 49, 50, cfg.guidance_scale, cfg.guidance_exponent)
    torch.testing.assert_close(out, x0_u + g_last * (x0_c - x0_u), rtol=0, atol=1e-3)


def test_sampler_matches_gaussian_data_distribution(ac):
    """With the exact denoiser of x0 ~ N(mu, s^2) the stochastic DPM++ sampler must return that distribution.

    250 steps: the SDE solver plugs E[x0 | x_t] into each posterior step and so under-disperses slightly
    at coarse steps (measured std 0.67 at 50 steps, 0.68 at 100, 0.70 from 250 on); a sign or
    coefficient error would move the mean or the std far more than the tolerances.
    """
    mu, std = 0.5, 0.7
    shape = (4, 4, 4, 16, 16)  # 16384 independent scalars

    def optimal_velocity(x_t, t, rep, f):
        a = ac[t].float().reshape(-1, 1, 1, 1, 1)
        x0_hat = mu + a.sqrt() * std ** 2 / (a * std ** 2 + 1 - a) * (x_t - a.sqrt() * mu)  # E[x0 | x_t]
        return (a.sqrt() * x_t - x0_hat) / (1 - a).sqrt()

    cond, _, flow = _reps(shape[0])
    out = sample(optimal_velocity, shape, cond, None, flow, DiffusionConfig(guidance_scale=1.0, sampling_steps=250),
                 torch.Generator().manual_seed(0))
    assert float(out.mean()) == pytest.approx(mu, abs=0.025)  # std of the mean ~ 0.0055
    assert float(out.std()) == pytest.approx(std, rel=0.025)


def _toy_denoiser(calls: list):
    """A fixed nonlinear function of every input; records the batch size of each call."""
    def denoise(x, t, rep, f):
        calls.append(x.shape[0])
        scale = (t.float() / 1000).reshape(-1, 1, 1, 1, 1)
        context = rep.mean(dim=(1, 2)).reshape(-1, 1, 1, 1, 1) + 0.01 * f.reshape(-1, 1, 1, 1, 1)
        return torch.tanh(x) * scale + context
    return denoise


def test_sampler_shape_and_determinism(cfg):
    cond, uncond, flow = _reps(LATENT_SHAPE[0])
    run = lambda seed, dtype=torch.float32: sample(  # noqa: E731
        _toy_denoiser([]), LATENT_SHAPE, cond, uncond, flow, cfg, torch.Generator().manual_seed(seed), dtype)
    a, b, c = run(0), run(0), run(1)
    assert a.shape == LATENT_SHAPE and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    assert torch.isfinite(a).all()
    low = run(0, torch.bfloat16)  # the denoiser's inputs in bf16, the solver in float32
    assert low.dtype == torch.float32 and torch.isfinite(low).all()


def test_sampler_skips_uncond_without_guidance():
    batch, steps = LATENT_SHAPE[0], 10
    cond, uncond, flow = _reps(batch)
    for scale, expected in [(1.0, batch), (0.5, batch), (6.0, 2 * batch)]:
        calls: list = []
        cfg = DiffusionConfig(sampling_steps=steps, guidance_scale=scale)
        sample(_toy_denoiser(calls), LATENT_SHAPE, cond, uncond if scale > 1 else None, flow, cfg,
               torch.Generator().manual_seed(0))
        assert calls == [expected] * steps, scale


def test_sampler_marks_steps_only_for_a_cuda_graph_decoder(monkeypatch):
    """A decoder replaying CUDA graphs gets one step mark per denoising step; others none (the mark
    imports the compiler, seconds on a fresh process)."""
    marks: list = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    cond, uncond, flow = _reps(LATENT_SHAPE[0])
    cfg = DiffusionConfig(sampling_steps=4, guidance_scale=6.0)
    for graphs in (False, True):
        denoise = _toy_denoiser([])
        graphed = lambda *args, fn=denoise: fn(*args)  # noqa: E731
        graphed.uses_cuda_graphs = graphs
        sample(graphed, LATENT_SHAPE, cond, uncond, flow, cfg, torch.Generator().manual_seed(0))
        assert len(marks) == (4 if graphs else 0)


def test_sampler_rejects_missing_uncond():
    cond, _, flow = _reps(LATENT_SHAPE[0])
    with pytest.raises(ValueError, match="uncond"):
        sample(_toy_denoiser([]), LATENT_SHAPE, cond, None, flow, DiffusionConfig(), torch.Generator())
