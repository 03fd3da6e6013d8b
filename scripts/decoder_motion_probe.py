"""Can a small decoder, trained for minutes with this framework's loss, schedule and sampler, render a
translating texture at the speed its conditioning names? Synthetic latents on the CPU, no VAE:

    PYTHONPATH=src:. python scripts/decoder_motion_probe.py [--condition vector|caption] [--snr-shift 3]
        [--steps 1500] [--guidance 1] [--sampling-steps 20]

Each sample is a smooth random texture (4 x 8 x 12 latents, 5 latent frames) moving left at one of the
known-answer levels' speeds in latent pixels per latent frame. Its representation is either a fixed random
vector per level (``vector``) or, as in the benchmark, a caption naming the speed ("Momo dashes rapidly in
the forest", with a random name and place) read by the `small` preset's random frozen T5 and a trainable
`ActionAwareEncoder` (``caption``; no image: its tokens are zeros). A 4-layer `MotionScopeDecoder` (width 128)
trains at batch 32 with `cogvideox_v_loss` (10 % of representations dropped, for guidance), then `sample`
draws 6 clips per level; the printed speed of each is the best shift between consecutive latent frames.
Measured 2026-12-01 (docs/plans/known_answer.md).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.diffusion.loss import add_noise, cogvideox_v_loss, sample_timesteps
from animegamer.diffusion.sampler import sample
from animegamer.diffusion.schedule import alphas_cumprod
from animegamer.metrics.latent_motion import shifted
from animegamer.models.decoder import MotionScopeDecoder
from animegamer.models.encoder import ActionAwareEncoder
from animegamer.models.frozen_encoders import build_frozen_encoders

SPEEDS = (0.0, 0.25, 0.8, 2.0, 4.5)  # latent px per latent frame, as the known-answer levels at 96 px wide
WORDS = ("stands quietly", "strolls slowly", "walks steadily", "runs quickly", "dashes rapidly")  # per level
NAMES = ("Qiqi", "Pazu", "Momo", "Lulu", "Tobi", "Rin")
PLACES = ("forest", "seaside", "kitchen", "snowfield", "city street", "meadow", "desert", "cave")
T, C, H, W = 5, 4, 8, 12  # latent frames, channels, height, width
WIDTH, BATCH, SAMPLES = 128, 32, 6
SEARCH = torch.arange(-6.0, 6.01, 0.125)  # candidate shifts between frames, latent px


def clips(levels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """(n, T, C, H, W): smooth textures moving left at each level's speed."""
    canvas = torch.randn(len(levels), C, H, W * 4, generator=g)
    canvas = F.avg_pool2d(F.pad(canvas, (1, 1, 1, 1), mode="circular"), 3, 1)
    canvas = canvas / canvas.std(dim=(1, 2, 3), keepdim=True)
    frames = [torch.stack([shifted(canvas[k], -SPEEDS[lv] * t)[..., :W] for k, lv in enumerate(levels.tolist())])
              for t in range(T)]
    return torch.stack(frames, 1)


def speed_of(x: torch.Tensor) -> list[float]:
    """Per clip of (B, T, C, H, W): the mean best leftward shift between consecutive frames (compared where
    both frames hold the same content)."""
    out = []
    for clip in x:
        best = [float(SEARCH[int(torch.stack([((shifted(clip[t], -float(s))[..., :W - 6] - clip[t + 1][..., :W - 6]) ** 2)
                                               .mean() for s in SEARCH]).argmin())]) for t in range(T - 1)]
        out.append(sum(best) / len(best))
    return out


class Conditioning(torch.nn.Module):
    """Levels -> representations (n, N, WIDTH): a fixed vector per level, or captions through T5 + encoder."""

    def __init__(self, kind: str, model_cfg) -> None:
        super().__init__()
        self.kind = kind
        if kind == "vector":
            self.register_buffer("table", torch.randn(len(SPEEDS), WIDTH))
            self.tokens = 8
            return
        t5 = build_frozen_encoders(model_cfg.encoders, which=("t5",)).t5
        captions = [[f"{n} {w} in the {p}" for n in NAMES for p in PLACES] for w in WORDS]
        with torch.no_grad():  # (levels, captions, Lt, text_dim)
            self.register_buffer("text", torch.stack([t5.encode(c) for c in captions]))
        self.encoder = ActionAwareEncoder(replace(model_cfg.encoder, width=WIDTH))
        self.image = torch.zeros(1, model_cfg.encoder.image_tokens, model_cfg.encoder.image_dim)
        self.tokens = self.encoder.num_tokens

    def forward(self, levels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if self.kind == "vector":
            return self.table[levels][:, None, :].expand(len(levels), self.tokens, WIDTH).clone()
        which = torch.randint(0, self.text.shape[1], (len(levels),), generator=g)
        return self.encoder(self.text[levels, which], self.image.expand(len(levels), -1, -1))


def train(decoder: MotionScopeDecoder, cond: Conditioning, steps: int, diff, g: torch.Generator) -> float:
    """``steps`` steps of AdamW on what requires grad in both; returns the last loss."""
    ac = alphas_cumprod(diff)
    params = [p for p in (*decoder.parameters(), *cond.parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    started = time.time()
    for step in range(steps):
        levels = torch.randint(0, len(SPEEDS), (BATCH,), generator=g)
        x0, rep = clips(levels, g), cond(levels, g)
        rep = torch.where((torch.rand(BATCH, generator=g) < 0.1)[:, None, None], torch.zeros_like(rep), rep)
        t = sample_timesteps(BATCH, g, diff.num_train_timesteps)
        x_t = add_noise(x0, torch.randn(x0.shape, generator=g), t, ac)
        loss = cogvideox_v_loss(decoder(x_t, t, rep), x0, x_t, t, ac)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 250 == 0:
            print(f"step {step} loss {loss.item():.4f} {time.time() - started:.0f} s", flush=True)
    return round(loss.item(), 4)


@torch.no_grad()
def speeds(decoder: MotionScopeDecoder, cond: Conditioning, diff) -> dict:
    """Per level: the mean generated speed of ``SAMPLES`` clips, the truth's measured speed, the latents' std."""
    result = {}
    for level, speed in enumerate(SPEEDS):
        levels = torch.full((SAMPLES,), level)
        latents = sample(decoder, (SAMPLES, T, C, H, W), cond(levels, torch.Generator().manual_seed(level)),
                         torch.zeros(1, cond.tokens, WIDTH), None, diff, torch.Generator().manual_seed(level))
        result[speed] = {"generated": round(sum(speed_of(latents)) / SAMPLES, 2),
                         "truth": speed_of(clips(levels[:1], torch.Generator().manual_seed(level)))[0],
                         "std": round(float(latents.std()), 2)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--condition", choices=("vector", "caption"), default="vector")
    parser.add_argument("--snr-shift", type=float, default=3.0)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--guidance", type=float, default=1.0)
    parser.add_argument("--sampling-steps", type=int, default=20)
    parser.add_argument("--transfer-steps", type=int, default=0,
                        help="then, as phase (a1) over the decoder base: freeze the decoder, add LoRA, train a "
                             "fresh conditioning (encoder) with it for this many steps, and measure again")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model_cfg = OmegaConf.to_object(compose_config("train", ["model=small"])).model
    diff = replace(model_cfg.diffusion, snr_shift_scale=args.snr_shift, sampling_steps=args.sampling_steps,
                   guidance_scale=args.guidance)
    torch.manual_seed(0)
    cond = Conditioning(args.condition, model_cfg)
    decoder = MotionScopeDecoder(replace(model_cfg.decoder, num_layers=4, num_attention_heads=2, attention_head_dim=64,
                                         in_channels=C, out_channels=C, sample_frames=(T - 1) * 4 + 1, sample_height=H,
                                         sample_width=W, motion_scope=False, time_embed_dim=64, path=""),
                                 WIDTH, cond.tokens)
    g = torch.Generator().manual_seed(1)
    started = time.time()
    report = {**vars(args), "final_loss": train(decoder, cond, args.steps, diff, g)}
    report["speeds"] = speeds(decoder.eval(), cond, diff)
    if args.transfer_steps:
        decoder.add_lora()
        lora = set(decoder.lora_parameters())
        for name, param in decoder.named_parameters():
            param.requires_grad_(name in lora)
        fresh = Conditioning(args.condition, model_cfg)  # a new random encoder (or level vectors)
        report["transfer_loss"] = train(decoder.train(), fresh, args.transfer_steps, diff, g)
        report["transfer_speeds"] = speeds(decoder.eval(), fresh, diff)
    report["seconds"] = round(time.time() - started)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
