"""Can a small decoder, trained for minutes with this framework's loss, schedule and sampler, render a
translating texture at the speed its conditioning names? Synthetic latents on the CPU, no VAE or encoder:

    PYTHONPATH=src:. python scripts/decoder_motion_probe.py SNR_SHIFT TRAIN_STEPS GUIDANCE SAMPLING_STEPS

Each sample is a smooth random texture (4 x 8 x 12 latents, 5 latent frames) moving left at one of the
known-answer levels' speeds in latent pixels per latent frame; its representation is a fixed random vector
per level. A 4-layer `MotionScopeDecoder` (width 128) trains at batch 32 with `cogvideox_v_loss` (10 % of
representations dropped for guidance), then `sample` draws 6 clips per level; the printed speed of each is
the best shift between consecutive latent frames. Measured 2026-12-01 (docs/plans/known_answer.md): 1500
steps (~4 min on 2 cores) render every level's speed, at guidance 1 and 6; guidance 6 doubles the latents'
standard deviation.
"""
import json, sys, time
from dataclasses import replace
import torch, torch.nn.functional as F
from omegaconf import OmegaConf
from animegamer.config.compose import compose_config
from animegamer.models.decoder import MotionScopeDecoder
from animegamer.diffusion.loss import add_noise, cogvideox_v_loss, sample_timesteps
from animegamer.diffusion.schedule import alphas_cumprod
from animegamer.diffusion.sampler import sample

torch.set_num_threads(2)
SHIFT, STEPS, GUIDE, SAMPLING = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
SPEEDS = [0.0, 0.25, 0.8, 2.0, 4.5]  # latent px per latent frame, as the known-answer levels at 96 px wide
T, C, H, W, N = 5, 4, 8, 12, 8
cfg = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model
dec_cfg = replace(cfg.decoder, num_layers=4, num_attention_heads=2, attention_head_dim=64, in_channels=C, out_channels=C,
                  sample_frames=(T - 1) * 4 + 1, sample_height=H, sample_width=W, motion_scope=False, time_embed_dim=64)
diff = replace(cfg.diffusion, snr_shift_scale=SHIFT, sampling_steps=SAMPLING, guidance_scale=GUIDE)
torch.manual_seed(0)
model = MotionScopeDecoder(dec_cfg, 128, N)
level_emb = torch.randn(len(SPEEDS), 128)
ac = alphas_cumprod(diff)

def shift_w(x, s):  # x (..., W) translated by s px (content moves right for s > 0), linear interpolation
    i = int(torch.floor(torch.tensor(s))); f = s - i
    a = torch.roll(x, i, -1); b = torch.roll(x, i + 1, -1)
    return a * (1 - f) + b * f

def batch(n, g):
    levels = torch.randint(0, len(SPEEDS), (n,), generator=g)
    canvas = torch.randn(n, C, H, W * 4, generator=g)
    canvas = F.avg_pool2d(F.pad(canvas, (1, 1, 1, 1), mode="circular"), 3, 1)  # smooth texture
    canvas = canvas / canvas.std(dim=(1, 2, 3), keepdim=True)
    frames = [torch.stack([shift_w(canvas[k], -SPEEDS[l] * t)[..., :W] for k, l in enumerate(levels.tolist())]) for t in range(T)]
    x0 = torch.stack(frames, 1)  # (n, T, C, H, W)
    rep = level_emb[levels][:, None, :].expand(n, N, 128).clone()
    return x0, rep, levels

def speed_of(x):  # mean translation per frame of (B, T, C, H, W): the best candidate shift between frames
    cands = torch.arange(-6.0, 6.01, 0.125)
    out = []
    for b in range(x.shape[0]):
        est = []
        for t in range(T - 1):
            errs = [((shift_w(x[b, t], -float(s))[..., :W - 6] - x[b, t + 1][..., :W - 6]) ** 2).mean() for s in cands]
            est.append(float(cands[int(torch.stack(errs).argmin())]))
        out.append(sum(est) / len(est))
    return out

g = torch.Generator().manual_seed(1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
t0 = time.time()
for step in range(STEPS):
    x0, rep, _ = batch(32, g)
    drop = torch.rand(32, generator=g) < 0.1
    rep = torch.where(drop[:, None, None], torch.zeros_like(rep), rep)
    t = sample_timesteps(32, g, diff.num_train_timesteps)
    noise = torch.randn(x0.shape, generator=g)
    xt = add_noise(x0, noise, t, ac)
    loss = cogvideox_v_loss(model(xt, t, rep), x0, xt, t, ac)
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 250 == 0: print(step, round(loss.item(), 4), round(time.time() - t0), flush=True)
model.eval()
res = {}
with torch.no_grad():
    for l, v in enumerate(SPEEDS):
        rep = level_emb[l][None, None].expand(6, N, 128).clone()
        lat = sample(model, (6, T, C, H, W), rep, torch.zeros(1, N, 128), None, diff, torch.Generator().manual_seed(l))
        truth, _, _ = batch(6, torch.Generator().manual_seed(100 + l))
        truth = torch.stack([shift_w(truth[0, 0], -v * t)[..., :W] for t in range(T)])[None]
        res[v] = {"generated": round(sum(speed_of(lat)) / 6, 2), "truth_measured": speed_of(truth)[0], "std": round(float(lat.std()), 2)}
print(json.dumps({"shift": SHIFT, "steps": STEPS, "guidance": GUIDE, "sampling": SAMPLING, "loss": round(loss.item(), 4),
                  "seconds": round(time.time() - t0), "speeds": res}), flush=True)
