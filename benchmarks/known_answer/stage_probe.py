"""Does the way the motion scope is trained, late over a frozen base or from the start, decide the speed range
the decoder renders? Synthetic latents on the CPU, no VAE (:mod:`benchmarks.known_answer.motion_probe`):

    python -m benchmarks.known_answer.stage_probe [--base-steps 900]
        [--stage-steps 300] [--seeds 0 1 2] [--arms A B C D E F G] [--workers 2] [--json out.json]

The GPU known-answer benchmark trains its decoder in stages: a base (``a_base``) without the motion scope on
clips whose conditioning does not tell the speed, then phase (a1) (``a_warmup``: the new motion-scope
embedder alone over the frozen base) and (a2) (``a_joint``: + decoder LoRA and every block's AdaLN linear);
its sweeps render a compressed speed range. This probe replays those stages at CPU size, on translating
textures whose speed only the motion scope names (one fixed representation for every clip), with the
project's own parameter groups (:data:`animegamer.phases.groups.STAGE_GROUPS` resolved by
:func:`animegamer.phases.denoising.trained_parameters`, frozen by :func:`animegamer.phases.common.set_trainable`),
LoRA (:meth:`MotionScopeDecoder.add_lora`) and learning-rate schedule
(:func:`animegamer.phases.common.lr_lambda`), at the same total step count and on the same training draws:

- ``A``: the motion-scope decoder trained whole from the start, base + stage steps (``a_base``'s groups);
- ``B``: the recipe: a plain base (base steps), then a1 (half the stage steps) and a2 (the other half);
- ``C``: as B, but the stage trains the whole decoder with the embedder (base unfrozen, no LoRA);
- ``D``: as B with ``--long-factor`` times the stage steps;
- ``E``: as B with LoRA of ``--high-rank`` (the full width by default) instead of ``--lora-rank``;
- ``F``: as B without a1: a2's groups (embedder, LoRA, AdaLN) the whole stage;
- ``G``: as B with a1 alone: the embedder alone the whole stage.

Each trained decoder is swept (:func:`animegamer.evaluation.motion_sweep.sweep`: ``--clips`` noises, each
decoded with the same representation at every level's speed as its motion scope; speed of the latents by
:func:`animegamer.metrics.latent_motion.clip_speed`). Per arm over seeds: Spearman's rho between requested
and measured speed, the range ratio (mean measured speed at the fastest level minus at the still level, over
the same difference measured on true clips) and the mean measured speed per level. The plain base is swept
too (its motion scope absent: one speed whatever is asked).
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from multiprocessing import get_context
from typing import Callable, Optional

import torch
from omegaconf import OmegaConf
from torch import nn

from animegamer.config.compose import compose_config
from animegamer.config.schema import COSINE_SCHEDULE, CONSTANT_SCHEDULE, PhaseConfig
from animegamer.contracts.exports import A_BASE, A_JOINT, A_WARMUP
from animegamer.diffusion.sampler import sample
from animegamer.evaluation.motion_sweep import LATENT_SHIFT, LEVELS, sweep
from animegamer.metrics.latent_motion import clip_speed
from animegamer.phases.common import lr_lambda, set_trainable
from animegamer.phases.denoising import trained_parameters
from animegamer.phases.groups import STAGE_GROUPS
from animegamer.utils.text import doc_summary
from benchmarks.known_answer.experiments import TRAIN, search_path
from benchmarks.known_answer.motion_probe import LEVEL_SPEEDS, ProbeGeometry, probe_decoder, train, translating_clips

log = logging.getLogger(__name__)

ARMS = {
    "A": "motion scope from the start: whole decoder + embedder, base+stage steps",
    "B": "recipe: base without motion scope, frozen; a1 embedder, a2 + LoRA + AdaLN",
    "C": "as B, base unfrozen in the stage: whole decoder + embedder",
    "D": "as B, stage --long-factor x longer",
    "E": "as B, LoRA rank --high-rank",
    "F": "as B without a1: a2 (embedder + LoRA + AdaLN) the whole stage",
    "G": "as B with a1 alone: the embedder alone the whole stage",
}
BASE_ROW = "base"  # the plain base's own sweep (no motion scope)
# The GPU recipe's experiments whose schedules (warm-up share of the stage, cosine or constant) the probe's
# base and stages follow.
BASE_EXPERIMENT, STAGE_EXPERIMENT = "known_answer_gpu_base", "known_answer_gpu_a"
TRUTH_CLIPS = 16  # true clips per level whose measured speed is the range's reference


@dataclass(frozen=True)
class Settings:
    base_steps: int
    stage_steps: int
    long_factor: int
    lora_rank: int
    high_rank: int
    batch: int
    layers: int
    heads: int
    head_dim: int
    tokens: int
    clips: int
    sampling_steps: int
    lr: float


def recipe_schedule(experiment: str) -> tuple[float, bool]:
    """The warm-up's share of the stage and whether it decays by cosine, as the recipe's ``experiment`` sets."""
    phase = compose_config(TRAIN, [search_path(TRAIN), f"experiment={experiment}"]).phase
    return phase.warmup_steps / phase.max_steps, phase.lr_schedule == COSINE_SCHEDULE


def schedule(steps: int, warmup_share: float, cosine: bool) -> Callable[[int], float]:
    """The phases' learning-rate multiplier (:func:`animegamer.phases.common.lr_lambda`) for a stage of
    ``steps`` steps."""
    return lr_lambda(PhaseConfig(name="probe", max_steps=steps, warmup_steps=max(1, round(warmup_share * steps)),
                                 lr_schedule=COSINE_SCHEDULE if cosine else CONSTANT_SCHEDULE))


class Stack(nn.Module):
    """The reconstruction model's two halves as the phases name them (``encoder.*``, ``decoder.*``): here
    no encoder (the representation is one fixed tensor), so a stage's groups resolve to decoder tensors."""

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.encoder = nn.Module()
        self.decoder = decoder


def train_stage(decoder, stage: str, steps: int, warmup_share: float, cosine: bool, draw, diffusion,
                generator: torch.Generator, lr: float) -> float:
    """Train what phase (a)'s ``stage`` trains (its :data:`STAGE_GROUPS`), everything else frozen."""
    stack = Stack(decoder)
    names = set_trainable(stack, trained_parameters(stack, STAGE_GROUPS[stage]))
    log.info("  stage %s: %d steps, %d tensors (%d parameters) train", stage, steps, len(names),
             sum(p.numel() for p in decoder.parameters() if p.requires_grad))
    decoder.train()
    return train(decoder, decoder.parameters(), draw, steps, diffusion, generator, lr=lr,
                 lr_factor=schedule(steps, warmup_share, cosine))


def quiet() -> None:
    """The sampler's per-call notes (one per rendering) would bury the probe's own lines."""
    logging.getLogger("animegamer.diffusion.sampler").setLevel(logging.WARNING)


def run_seed(seed: int, arms: tuple[str, ...], settings: Settings) -> dict:
    """Every arm for one seed (one process, one thread): the decoders' initial weights, the representation,
    the training draws and the sweep's noises are the seed's, shared by the arms."""
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [seed {seed}] %(message)s", datefmt="%H:%M:%S",
                        force=True)  # a pool's worker runs seed after seed
    quiet()
    s = settings
    model = OmegaConf.to_object(compose_config("train", ["model=small"])).model
    base_schedule, stage_schedule = recipe_schedule(BASE_EXPERIMENT), recipe_schedule(STAGE_EXPERIMENT)
    diffusion = replace(model.diffusion, sampling_steps=s.sampling_steps, guidance_scale=1.0)
    geometry = ProbeGeometry()
    speeds = torch.tensor(LEVEL_SPEEDS)
    width = s.heads * s.head_dim

    def build(motion_scope: bool):
        torch.manual_seed(seed)  # the same transformer initialisation whether or not it has the embedder
        return probe_decoder(model.decoder, geometry, s.tokens, layers=s.layers, heads=s.heads, head_dim=s.head_dim,
                             motion_scope=motion_scope)

    rep = torch.randn(1, s.tokens, width, generator=torch.Generator().manual_seed(10_000 + seed))

    def draw(generator: torch.Generator):
        levels = torch.randint(0, len(LEVEL_SPEEDS), (s.batch,), generator=generator)
        return translating_clips(speeds[levels], generator, geometry), rep.expand(s.batch, -1, -1), speeds[levels]

    @torch.no_grad()
    def measure(decoder) -> dict:
        decoder.eval()

        def render(clip: int, flow: float) -> torch.Tensor:  # one noise per clip, whatever the level
            return sample(decoder, (1, *geometry.shape), rep, None, torch.tensor([flow]), diffusion,
                          torch.Generator().manual_seed(20_000 + clip))

        found = sweep(render, s.clips, dict(zip(LEVELS, LEVEL_SPEEDS)),
                      {LATENT_SHIFT: lambda latents: [clip_speed(x[0]) for x in latents]})["measures"][LATENT_SHIFT]
        return {"rho": found["rank_correlation"], "rising": found["rising_share"],
                "per_level": [float(v) for v in found["mean_per_level"]]}

    truth_gen = torch.Generator().manual_seed(30_000 + seed)
    truth = [statistics.fmean(clip_speed(x) for x in translating_clips(speeds[[k] * TRUTH_CLIPS], truth_gen, geometry))
             for k in range(len(LEVEL_SPEEDS))]
    true_range = truth[-1] - truth[0]

    def summary(found: dict, loss: float, seconds: float, steps: str) -> dict:
        per_level = found["per_level"]
        return {**found, "range_ratio": (per_level[-1] - per_level[0]) / true_range, "loss": loss,
                "seconds": round(seconds, 1), "steps": steps}

    results: dict[str, dict] = {"truth": {"per_level": truth}}
    total = s.base_steps + s.stage_steps
    if "A" in arms:
        started = time.perf_counter()
        log.info("arm A: %s", ARMS["A"])
        decoder = build(True)
        loss = train_stage(decoder, A_BASE, total, *base_schedule, draw, diffusion,
                           torch.Generator().manual_seed(seed), s.lr)
        results["A"] = summary(measure(decoder), loss, time.perf_counter() - started, f"{total}")
        log.info("arm A: %s", results["A"])
    staged = [arm for arm in arms if arm != "A"]
    if not staged:
        return results
    started = time.perf_counter()
    log.info("base: %d steps without motion scope", s.base_steps)
    base = build(False)
    generator = torch.Generator().manual_seed(seed)  # the same draws as arm A's first base_steps
    base_loss = train_stage(base, A_BASE, s.base_steps, *base_schedule, draw, diffusion, generator, s.lr)
    base_seconds = time.perf_counter() - started
    after_base = generator.get_state()  # every stage goes on with the draws arm A saw next
    results[BASE_ROW] = summary(measure(base), base_loss, base_seconds, f"{s.base_steps}+0")
    log.info("base: %s", results[BASE_ROW])

    def over_base() -> tuple[nn.Module, torch.Generator]:
        """The motion-scope decoder holding the base's weights, its new embedder at its zero-output init (as
        ``model.decoder.path`` loads a base), and the training draws where the base left them."""
        decoder = build(True)
        missing, unexpected = decoder.load_state_dict(base.state_dict(), strict=False)
        if unexpected or sorted(missing) != sorted(decoder.motion_scope_parameters()):
            raise RuntimeError(f"base does not fit: missing {missing}, unexpected {unexpected}")
        return decoder, torch.Generator().set_state(after_base.clone())

    for arm in staged:
        started = time.perf_counter()
        log.info("arm %s: %s", arm, ARMS[arm])
        decoder, g = over_base()
        if arm in ("C", "G"):
            stage = s.stage_steps
            loss = train_stage(decoder, A_BASE if arm == "C" else A_WARMUP, stage, *stage_schedule, draw,
                               diffusion, g, s.lr)
        elif arm == "F":
            stage = s.stage_steps
            decoder.add_lora(decoder.lora_config(rank=s.lora_rank, alpha=float(s.lora_rank)))
            loss = train_stage(decoder, A_JOINT, stage, *stage_schedule, draw, diffusion, g, s.lr)
        else:
            stage = s.stage_steps * (s.long_factor if arm == "D" else 1)
            rank = s.high_rank if arm == "E" else s.lora_rank
            train_stage(decoder, A_WARMUP, stage // 2, *stage_schedule, draw, diffusion, g, s.lr)
            decoder.add_lora(decoder.lora_config(rank=rank, alpha=float(rank)))  # alpha / r = 1, as `small`
            loss = train_stage(decoder, A_JOINT, stage - stage // 2, *stage_schedule, draw, diffusion, g,
                               s.lr)
        results[arm] = summary(measure(decoder), loss, base_seconds + time.perf_counter() - started,
                               f"{s.base_steps}+{stage}")
        log.info("arm %s: %s", arm, results[arm])
    return results


def mean_sd(values: list[Optional[float]]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "n/a"
    sd = statistics.stdev(known) if len(known) > 1 else 0.0
    missing = f" ({len(values) - len(known)} undefined)" if len(known) < len(values) else ""
    return f"{statistics.fmean(known):.2f} ± {sd:.2f}{missing}"


def table(by_seed: dict[int, dict], arms: tuple[str, ...]) -> str:
    levels = " | ".join(f"@{v:g}" for v in LEVEL_SPEEDS)
    lines = [f"| arm | steps | rho | range ratio | rising share | {levels} | final loss | s/seed |",
             "|" + "---|" * (7 + len(LEVEL_SPEEDS))]
    rows = [BASE_ROW, *arms] if any(arm != "A" for arm in arms) else [*arms]
    seeds = sorted(by_seed)
    for row in rows:
        found = [by_seed[seed][row] for seed in seeds]
        per_level = " | ".join(f"{statistics.fmean(f['per_level'][k] for f in found):.2f}"
                               for k in range(len(LEVEL_SPEEDS)))
        name = f"{row}: {ARMS[row]}" if row in ARMS else "base alone (no motion scope)"
        lines.append(f"| {name} | {found[0]['steps']} | {mean_sd([f['rho'] for f in found])} | "
                     f"{mean_sd([f['range_ratio'] for f in found])} | {mean_sd([f['rising'] for f in found])} | "
                     f"{per_level} | {statistics.fmean(f['loss'] for f in found):.4f} | "
                     f"{statistics.fmean(f['seconds'] for f in found):.0f} |")
    truth = " | ".join(f"{statistics.fmean(by_seed[seed]['truth']['per_level'][k] for seed in seeds):.2f}"
                       for k in range(len(LEVEL_SPEEDS)))
    lines.append(f"| true clips (measured) | | 1 | 1 | 1 | {truth} | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=doc_summary(__doc__),
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--base-steps", type=int, default=900, help="N: the plain base's steps")
    parser.add_argument("--stage-steps", type=int, default=300, help="M: the motion-scope stage's (a1 + a2) steps")
    parser.add_argument("--long-factor", type=int, default=4, help="arm D's stage is this many times M")
    parser.add_argument("--lora-rank", type=int, default=16,
                        help="the recipe's LoRA rank (`small`: 64 of width 256; here a quarter of the width too)")
    parser.add_argument("--high-rank", type=int, default=64, help="arm E's LoRA rank")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=sorted(ARMS))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=4, help="the representation's tokens")
    parser.add_argument("--clips", type=int, default=6, help="noises swept at every level")
    parser.add_argument("--sampling-steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of every stage (the recipe's)")
    parser.add_argument("--workers", type=int, default=1, help="seeds run in parallel, one thread each")
    parser.add_argument("--json", type=str, default="", help="also write the per-seed results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    quiet()
    settings = Settings(base_steps=args.base_steps, stage_steps=args.stage_steps, long_factor=args.long_factor,
                        lora_rank=args.lora_rank, high_rank=args.high_rank, batch=args.batch, layers=args.layers,
                        heads=args.heads, head_dim=args.head_dim, tokens=args.tokens, clips=args.clips,
                        sampling_steps=args.sampling_steps, lr=args.lr)
    arms = tuple(sorted(set(args.arms)))
    started = time.perf_counter()
    log.info("arms %s, seeds %s, %s", arms, args.seeds, settings)
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
            futures = {seed: pool.submit(run_seed, seed, arms, settings) for seed in args.seeds}
            by_seed = {seed: future.result() for seed, future in futures.items()}
    else:
        by_seed = {seed: run_seed(seed, arms, settings) for seed in args.seeds}
    wall = time.perf_counter() - started
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"settings": asdict(settings), "arms": {a: ARMS[a] for a in arms}, "wall_seconds": wall,
                       "seeds": by_seed}, out, indent=1)
    sys.stdout.write(f"{table(by_seed, arms)}\n\nseeds {args.seeds}; wall time {wall:.0f} s\n")


if __name__ == "__main__":
    main()
