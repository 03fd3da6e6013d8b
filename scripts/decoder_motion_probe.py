"""Can a small decoder, trained for minutes with this framework's loss, schedule and sampler, render a
translating texture at the speed its conditioning names? Synthetic latents on the CPU, no VAE:

    PYTHONPATH=src:. python scripts/decoder_motion_probe.py [--condition vector|caption|motion-scope]
        [--snr-shift 3] [--steps 1500] [--guidance 1] [--sampling-steps 20]

Each sample is a smooth random texture (:mod:`benchmarks.known_answer.motion_probe`: 4 x 8 x 16 latents, 5 latent frames)
moving left at one of the known-answer levels' speeds in latent px per latent frame. What tells the decoder
the speed: a fixed random vector per level as its representation (``vector``); as in the benchmark, a caption
naming the speed ("Momo dashes rapidly in the forest", with a random name and place) read by the `small`
preset's random frozen T5 and a trainable `ActionAwareEncoder` (``caption``; no image: its tokens are zeros);
or the motion scope alone, the level's speed as its flow value beside one fixed representation for every
level (``motion-scope``). A 4-layer `MotionScopeDecoder` (width 128) trains at batch 32 with
`cogvideox_v_loss` (10 % of representations dropped, for guidance), then the motion sweep
(:mod:`animegamer.evaluation.motion_sweep`) samples 6 clips, each from one noise at every level; printed per
level: the mean generated speed (the best shift between consecutive latent frames), the truth's and the
latents' standard deviation, and the sweep's rank correlation between asked and generated speed.
Measurements: docs/plans/known_answer.md.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import replace

import torch
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.diffusion.sampler import sample
from animegamer.metrics.latent_motion import clip_speed
from animegamer.evaluation.motion_sweep import LATENT_SHIFT, LEVELS, sweep
from animegamer.models.encoder import ActionAwareEncoder
from animegamer.models.frozen_encoders import build_frozen_encoders
from animegamer.utils.text import doc_summary
from benchmarks.known_answer.motion_probe import LEVEL_SPEEDS, ProbeGeometry, probe_decoder, train, translating_clips

WORDS = ("stands quietly", "strolls slowly", "walks steadily", "runs quickly", "dashes rapidly")  # per level
NAMES = ("Qiqi", "Pazu", "Momo", "Lulu", "Tobi", "Rin")
PLACES = ("forest", "seaside", "kitchen", "snowfield", "city street", "meadow", "desert", "cave")
GEOMETRY = ProbeGeometry()
HEAD_DIM, HEADS = 64, 2
WIDTH = HEAD_DIM * HEADS
BATCH, SAMPLES = 32, 6
VECTOR_TOKENS = 8
MOTION_SCOPE = "motion-scope"


class Conditioning(torch.nn.Module):
    """Levels -> representations (n, N, WIDTH): a fixed vector per level, captions through T5 + encoder, or
    one fixed vector whatever the level (the motion scope then carries it)."""

    def __init__(self, kind: str, model_cfg) -> None:
        super().__init__()
        self.kind = kind
        if kind != "caption":
            self.register_buffer("table", torch.randn(len(LEVEL_SPEEDS) if kind == "vector" else 1, WIDTH))
            self.tokens = VECTOR_TOKENS
            return
        t5 = build_frozen_encoders(model_cfg.encoders, which=("t5",)).t5
        captions = [[f"{n} {w} in the {p}" for n in NAMES for p in PLACES] for w in WORDS]
        with torch.no_grad():  # (levels, captions, Lt, text_dim)
            self.register_buffer("text", torch.stack([t5.encode(c) for c in captions]))
        self.encoder = ActionAwareEncoder(replace(model_cfg.encoder, width=WIDTH))
        self.image = torch.zeros(1, model_cfg.encoder.image_tokens, model_cfg.encoder.image_dim)
        self.tokens = self.encoder.num_tokens

    def forward(self, levels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if self.kind != "caption":
            rows = levels if self.kind == "vector" else torch.zeros_like(levels)
            return self.table[rows][:, None, :].expand(len(levels), self.tokens, WIDTH).clone()
        which = torch.randint(0, self.text.shape[1], (len(levels),), generator=g)
        return self.encoder(self.text[levels, which], self.image.expand(len(levels), -1, -1))


def fit(decoder, cond: Conditioning, steps: int, diff, g: torch.Generator) -> float:
    """``steps`` steps on clips of random levels (the level's speed as the flow when the decoder reads one)."""
    speeds = torch.tensor(LEVEL_SPEEDS)

    def draw(generator: torch.Generator):
        levels = torch.randint(0, len(LEVEL_SPEEDS), (BATCH,), generator=generator)
        flow = speeds[levels] if decoder.cfg.motion_scope else None
        return translating_clips(speeds[levels], generator, GEOMETRY), cond(levels, generator), flow

    return round(train(decoder, [*decoder.parameters(), *cond.parameters()], draw, steps, diff, g), 4)


@torch.no_grad()
def speeds(decoder, cond: Conditioning, diff) -> dict:
    """The motion sweep over ``SAMPLES`` noises; per level the mean generated speed, the truth's measured
    speed and the latents' standard deviation."""
    spread: dict[int, list[float]] = {level: [] for level in LEVELS}

    def render(index: int, speed: float) -> torch.Tensor:
        level = LEVEL_SPEEDS.index(speed)
        rep = cond(torch.tensor([level]), torch.Generator().manual_seed(index))
        flow = torch.tensor([speed]) if decoder.cfg.motion_scope else None
        latents = sample(decoder, (1, *GEOMETRY.shape), rep, torch.zeros(1, cond.tokens, WIDTH), flow, diff,
                         torch.Generator().manual_seed(index))
        spread[LEVELS[level]].append(float(latents.std()))
        return latents

    found = sweep(render, SAMPLES, dict(zip(LEVELS, LEVEL_SPEEDS)),
                  {LATENT_SHIFT: lambda latents: [clip_speed(x[0]) for x in latents]})["measures"][LATENT_SHIFT]
    truth = translating_clips(torch.tensor(LEVEL_SPEEDS), torch.Generator().manual_seed(0), GEOMETRY)
    return {"rank_correlation": found["rank_correlation"], "rising_share": found["rising_share"],
            "levels": {speed: {"generated": round(mean, 2), "truth": clip_speed(truth[i]),
                               "std": round(sum(spread[LEVELS[i]]) / SAMPLES, 2)}
                       for i, (speed, mean) in enumerate(zip(LEVEL_SPEEDS, found["mean_per_level"]))}}


def main() -> None:
    parser = argparse.ArgumentParser(description=doc_summary(__doc__))
    parser.add_argument("--condition", choices=("vector", "caption", MOTION_SCOPE), default="vector")
    parser.add_argument("--snr-shift", type=float, default=3.0)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--guidance", type=float, default=1.0)
    parser.add_argument("--sampling-steps", type=int, default=20)
    parser.add_argument("--transfer-steps", type=int, default=0,
                        help="then, as phase (a1) over the decoder base: freeze the decoder, add LoRA, train a "
                             "fresh conditioning (encoder) with it for this many steps, and measure again")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(2)
    model_cfg = OmegaConf.to_object(compose_config("train", ["model=small"])).model
    diff = replace(model_cfg.diffusion, snr_shift_scale=args.snr_shift, sampling_steps=args.sampling_steps,
                   guidance_scale=args.guidance)
    torch.manual_seed(0)
    cond = Conditioning(args.condition, model_cfg)
    decoder = probe_decoder(model_cfg.decoder, GEOMETRY, cond.tokens, heads=HEADS, head_dim=HEAD_DIM,
                            motion_scope=args.condition == MOTION_SCOPE)
    g = torch.Generator().manual_seed(1)
    started = time.time()
    report = {**vars(args), "final_loss": fit(decoder, cond, args.steps, diff, g)}
    report["speeds"] = speeds(decoder.eval(), cond, diff)
    if args.transfer_steps:
        decoder.add_lora()
        lora = set(decoder.lora_parameters())
        for name, param in decoder.named_parameters():
            param.requires_grad_(name in lora)
        fresh = Conditioning(args.condition, model_cfg)  # a new random encoder (or level vectors)
        report["transfer_loss"] = fit(decoder.train(), fresh, args.transfer_steps, diff, g)
        report["transfer_speeds"] = speeds(decoder.eval(), fresh, diff)
    report["seconds"] = round(time.time() - started)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
