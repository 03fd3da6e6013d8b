"""The known-answer learning benchmark: does training give a game that works?

    python -m benchmarks.known_answer OUT [--size ci|gpu] [--seed N] [--words level|shared] [override ...]

Toy films whose states and motion levels are known (:mod:`benchmarks.known_answer.data`) go through the
whole recipe (:func:`animegamer.recipe.run_recipe`: pipeline clips -> the frozen VAE trained on them ->
precompute and sessions -> the decoder base pre-trained on them -> phase (a1, a2) ->
representations -> phase (b) -> adaptation -> phase (c) -> evaluation on held-out shots), then the
baselines are scored in the same evaluation code:

* the untrained game, majority-class and copy-the-last-turn states (``evaluation.baselines``);
* the phase (a2) renderer decoding a clip from another clip's representation (does the decoder use its
  conditioning?; ``reconstruction.baselines``);
* the game rendered by the phase (a2) decoder instead of the phase (c) one (does adaptation help?);
* the Table 3 ablations without the motion-scope input and without the warm-up: each a2 stage trained
  as its own model and scored as the renderer of the same game and on reconstruction;
* at gpu size, in every reconstruction, the motion sweep (``evaluation.motion_sweep``,
  :mod:`animegamer.evaluation.motion_sweep`): each held-out clip decoded from the same representation and noise at every level's flow value, and how
  closely the measured speed follows the requested one (whether the motion scope controls the motion);
* with ``--step-cache THRESHOLD [THRESHOLD ...]``, the trained game sampled with the step cache
  (``model.diffusion.cache=first_block``) at each threshold: its row, its time per turn against the
  uncached game's, and each turn's clip against the uncached one's (what the cache changes on a trained
  decoder; ``step_cache`` in the result, one record per threshold).

``--words shared`` gives the films' captions the same action words at every speed level
(:func:`benchmarks.known_answer.data.with_words`): the text then says nothing of the speed, and only the motion
scope can carry it. Each choice of words needs its own ``OUT`` (the films' captions are rewritten).

``OUT/known_answer.json`` holds every row's metrics and, per metric, the trained game against each
row; ``OUT/known_answer.md`` the table (docs/known-answer.md shows it);
``OUT/curves.png`` the training stages' losses; ``OUT/gallery.png`` generated clips under their
ground truth. The films, pipeline output and VAE are shared by every seed; each seed trains into
``OUT/seed_<N>/``. Running again reuses what is done (pipeline steps, the VAE, finished stages, and
evaluations with the same config, exports and clips: :mod:`animegamer.evaluation.reuse`).

``--vae-from FOLDER`` hands the benchmark a VAE trained elsewhere (``python -m animegamer.toy_vae``, e.g. in
stages with ``--init``): every stage and evaluation loads that folder as it is and ``OUT/vae`` is not made.
It is checked before any film is drawn (a trained folder of the size's preset VAE config, its weights those
its record names) and again once the clips are cut (trained on these clips: their content digest), before
anything trains; the VAE training options do not apply to it.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from animegamer.config.compose import path_override, quoted
from animegamer.config.schema import INIT_FROM_KEY
from animegamer.config.validate import ConfigError, seed_problems
from animegamer.contracts.files import ADAPTATION_DIR, METRICS_FILE, REPRESENTATIONS_DIR
from animegamer.contracts.shards import PRED_REP, REP
from animegamer.data.shards import folder_shards, iter_samples
from animegamer.diffusion.step_cache import check_sampling_cache
from animegamer.evaluation.reuse import evaluate_or_reuse
from animegamer.media.video import decode_mp4
from animegamer.metrics.psnr import psnr
from animegamer.phases.specs import A_BASE, A_JOINT, A_WARMUP, PHASE_B, PHASE_C
from animegamer.errors import InvalidInputError, UserError, exit_on_user_error
from animegamer.recipe import (Recipe, evaluation_config, machine_problems, run_recipe, train_stage,
                              trained_seconds, trained_vae)
from animegamer.toy_vae import TRAINING_RECORD, ToyVAETraining
from animegamer.utils.logging import setup_logging
from animegamer.utils.text import doc_summary
from benchmarks.known_answer.data import (
    CAPTION_WORDS,
    CAPTION_WORDS_MEANING,
    FILMS_DIR,
    LEVEL_WORDS,
    PIPELINE_DIR,
    TRUTH_WORDS_KEY,
    check_words,
    make_films,
    measure,
)
from benchmarks.known_answer.data import SIZES as DATA_SIZES
from benchmarks.known_answer.experiments import EVALUATE, PIPELINE, TRAIN, search_path
from benchmarks.known_answer.report import (
    RECONSTRUCTION,
    TRAINED,
    comparisons,
    loss_histories,
    plot_curves,
    rows_of,
    write_gallery,
    write_table,
)

log = logging.getLogger(__name__)

RESULT_FILE = "known_answer.json"
TABLE_FILE = "known_answer.md"
CURVES_FILE = "curves.png"
GALLERY_FILE = "gallery.png"
VAE_DIR = "vae"
VAE_FROM = "--vae-from"  # the option that hands the benchmark a trained VAE folder
VAE_TRAINING_OPTIONS = ("--vae-max-seconds", "--vae-steps", "--vae-device")  # the size's VAE stage's settings
VAE_OPTIONS = dict(zip(("max_seconds", "steps", "device"), VAE_TRAINING_OPTIONS))  # ToyVAETraining's field -> option
A2_RENDERER = "game rendered by the a2 decoder"
# The decoder base with the throwaway encoder it trained with: does the base itself render the motion that
# phases (a) and (c) are to control? (Its reconstruction row only: it has no motion scope to play a game with.)
BASE_RENDERER = "decoder base (its own encoder, no motion scope)"
BASE_RENDERER_OVERRIDES = ("model.decoder.motion_scope=false",)
# The recipe summary's export of each trained stage.
STAGE_EXPORTS = {A_BASE: "decoder base export", A_WARMUP: "phase a start", A_JOINT: "phase a2 export",
                 PHASE_B: "phase b export", PHASE_C: "phase c export"}
STEP_CACHE = "trained game, step cache (first block, threshold {threshold:g})"
# An evaluation's reconstruction also sweeps the motion scope over the levels (BenchmarkSize.motion_sweep).
MOTION_SWEEP = "evaluation.motion_sweep=true"


@dataclass(frozen=True)
class Ablation:
    """A Table 3 phase (a) variant the benchmark can afford: train.py overrides of its model, and
    whether it has its own warm-up (as :mod:`animegamer.ablations` plans them: a variant that changes
    what phase (a1) trains warms up on its own; ``no_warmup`` has none)."""

    overrides: tuple[str, ...]
    warmup: bool


# The overrides are those of configs/train/experiment/ablation_a_<name>.yaml, whose other settings are the
# paper's (model, trainer, logger) and do not apply here.
ABLATIONS = {
    "no_motion_scope": Ablation(("model.decoder.motion_scope=false",), warmup=True),
    "no_warmup": Ablation((), warmup=False),
}


# The stages an override can name (known_answer_<size>_<stage> experiments; "a" is a1 and a2 alike, and
# the ablations' phase (a) stages; "eval" every evaluation).
STAGE_NAMES = ("base", "a", "b", "c", "eval")


@dataclass(frozen=True)
class BenchmarkSize:
    """One size of the benchmark: the data set (:data:`benchmarks.known_answer.data.SIZES`), the stage
    experiments ``known_answer_<name>_{base,a,b,c,eval}``, the VAE stage's settings and whether the
    decoder base is pre-trained."""

    name: str
    vae: ToyVAETraining | None  # None: the preset's random frozen VAE
    base: bool = False  # pre-train the decoder base (experiment known_answer_<name>_base); False: the preset's
    ablations: tuple[str, ...] = tuple(ABLATIONS)
    overrides: tuple[str, ...] = ()  # for every stage
    # (stage, override) pairs for one stage each: STAGE_NAMES, e.g. ("base", "phase.batch_size=64")
    stage_extra: tuple[tuple[str, str], ...] = ()
    motion_sweep: bool = True  # every reconstruction also sweeps the motion scope over the levels

    def for_stage(self, stage: str) -> list[str]:
        return [override for name, override in self.stage_extra if name == stage]

    def sweep(self) -> list[str]:
        """The evaluations' override that turns the sweep on, if the size sweeps (before any caller's)."""
        return [MOTION_SWEEP] if self.motion_sweep else []


CPU_SIZE = "ci"  # the size that runs on a CPU machine
SIZES = {
    # 2 CPU cores: the tiny presets' random frozen VAE. Training one does not fit: a step of 2 crops of
    # 9x16x32 took over 3 s on the loaded CI machine (docs/plans/known_answer.md), so CI asserts what
    # needs no pixels back (states, and the conditioning the decoder reads, in latent-derived scores).
    # Its 40-step decoder base (~10 s) checks that every stage runs over a pre-trained base. No motion sweep:
    # its pixels are noise, and five more samplings and decodes per reconstructed clip in every evaluation
    # would lengthen the CI test for nothing.
    CPU_SIZE: BenchmarkSize(CPU_SIZE, None, base=True, motion_sweep=False),
    # One H200: the preset's VAE for 100 s (150 s gave 26.4 dB held out: docs/plans/known_answer.md).
    # The decoder base too: phases (a) and (c) train adapters over a frozen base, and the first GPU run's
    # random base made noise (docs/plans/known_answer.md).
    "gpu": BenchmarkSize("gpu", ToyVAETraining(steps=20000, batch_size=8, lr=1e-3, warmup_steps=200, eval_every=500,
                                               eval_clips=64, eval_batch_size=16, device="cuda", max_seconds=100.0),
                         base=True),
}


@dataclass
class Layout:
    """Where everything goes: data and VAE are shared by every seed, runs are per seed. ``vae_from``: a VAE
    folder trained elsewhere, used in place of ``OUT/vae`` (None: the size's own VAE stage, if any)."""

    out: Path
    seed: int
    vae_from: Path | None = None

    @property
    def films(self) -> Path:
        return self.out / FILMS_DIR

    @property
    def pipeline(self) -> Path:
        return self.out / PIPELINE_DIR

    @property
    def vae(self) -> Path:
        return self.vae_from or self.out / VAE_DIR

    def has_vae(self, size: BenchmarkSize) -> bool:
        """Whether the stages load a trained VAE (:attr:`vae`) rather than the preset's random one."""
        return bool(self.vae_from or size.vae)

    @property
    def runs(self) -> Path:
        return self.out / f"seed_{self.seed}"


def data_overrides(layout: Layout) -> list[str]:
    """The films as inputs and caption source, the pipeline output: for every stage."""
    films = layout.films.resolve()
    return [f"pipeline.inputs=[{quoted(str(films))}]", path_override("pipeline.caption.path", films),
            path_override("pipeline.output", layout.pipeline.resolve())]


def stage_folders(folder: Path) -> str:
    """``output_dir``: each stage in ``folder/<phase>`` (absolute), quoted with the phase's name kept as an
    interpolation, so any ``OUT`` name reaches the stage as it is."""
    return "output_dir=" + quoted(str(folder.resolve()), raw_suffix="/${phase.name}")


def stage_overrides(layout: Layout, size: BenchmarkSize, experiment: str) -> list[str]:
    return [search_path(TRAIN), f"experiment=known_answer_{size.name}_{experiment}", f"seed={layout.seed}",
            stage_folders(layout.runs), *size.for_stage(experiment)]


def eval_experiment(size: str) -> list[str]:
    """The size's evaluation experiment, with the search path that finds it."""
    return [search_path(EVALUATE), f"experiment=known_answer_{size}_eval"]


def vae_overrides(layout: Layout, size: BenchmarkSize) -> list[str]:
    """The recipe's trained VAE for the stages run beside it (the recipe passes it to its own)."""
    return [path_override("model.encoders.vae.path", layout.vae.resolve())] if layout.has_vae(size) else []


def recipe_of(layout: Layout, size: BenchmarkSize, extra: Sequence[str] = ()) -> Recipe:
    return Recipe(
        pipeline=[search_path(PIPELINE), f"experiment=known_answer_{size.name}"],
        phase_a=stage_overrides(layout, size, "a"), phase_b=stage_overrides(layout, size, "b"),
        phase_c=stage_overrides(layout, size, "c"),
        evaluation=[*eval_experiment(size.name), f"seed={layout.seed}", "evaluation.untrained_game=true",
                    *size.sweep(), *size.for_stage("eval")],
        extra=[*data_overrides(layout), *size.overrides, *extra], vae=None if layout.vae_from else size.vae,
        vae_out=str(layout.vae) if layout.has_vae(size) else "",
        decoder_base=stage_overrides(layout, size, "base") if size.base else None)


def base_overrides(summary: dict) -> list[str]:
    """The recipe's decoder base for the stages run beside it (the recipe passes it to its own)."""
    return [path_override("model.decoder.path", summary["decoder base"])] if summary["decoder base"] else []


def renderer_overrides(layout: Layout, size: BenchmarkSize, name: str, mllm: str, renderer: str,
                       overrides: Sequence[str] = (), reconstruction: str = "", extra: Sequence[str] = ()) -> list[str]:
    """The overrides of :func:`evaluate_renderer`'s evaluation, every folder quoted."""
    return [*eval_experiment(size.name), f"seed={layout.seed}", *data_overrides(layout), *size.overrides,
            *vae_overrides(layout, size), *overrides, path_override("evaluation.mllm_export", mllm),
            path_override("evaluation.renderer_export", renderer),
            path_override("evaluation.reconstruction_export", reconstruction),
            *size.sweep(), *extra, *size.for_stage("eval"),
            path_override("evaluation.out", layout.runs.resolve() / ("eval_" + name))]


def evaluate_renderer(layout: Layout, size: BenchmarkSize, name: str, mllm: str, renderer: str,
                      overrides: Sequence[str] = (), reconstruction: str = "", extra: Sequence[str] = ()) -> dict:
    """The benchmark's games played by the trained MLLM with another renderer, into ``runs/eval_<name>``
    (read back when it already ran with the same config and exports: a resumed benchmark replays none)."""
    return evaluate_or_reuse(evaluation_config(
        renderer_overrides(layout, size, name, mllm, renderer, overrides, reconstruction, extra)))


def ablation_stage(layout: Layout, size: BenchmarkSize, name: str, extra: Sequence[str], phase: str,
                   init_from: str | None = None) -> list[str]:
    """The train overrides of the ablation's stage ``phase`` (into ``runs/ablation_<name>/<phase>``), every
    folder quoted; ``init_from``: the export it starts from (None: the experiment's)."""
    ablation = ABLATIONS[name]
    return [search_path(TRAIN), f"experiment=known_answer_{size.name}_a", f"seed={layout.seed}",
            *data_overrides(layout), *size.overrides, *vae_overrides(layout, size), *ablation.overrides, *extra,
            *size.for_stage("a"), stage_folders(layout.runs / ("ablation_" + name)), f"phase={phase}",
            *([] if init_from is None else [path_override(INIT_FROM_KEY, init_from)])]


def train_ablation(layout: Layout, size: BenchmarkSize, name: str, extra: Sequence[str]) -> str:
    """The ablation's phase (a) stages into ``runs/ablation_<name>/``; returns its a2 export."""
    start = train_stage(ablation_stage(layout, size, name, extra, A_WARMUP))["export"] if ABLATIONS[name].warmup else ""
    return train_stage(ablation_stage(layout, size, name, extra, A_JOINT, start))["export"]


def game_clips(eval_out: Path, games: list[dict]) -> dict[str, Path]:
    """Each played turn's clip, by ``<game id>/<turn index>`` (paths in a report are relative to its folder)."""
    return {f"{g['id']}/{i}": eval_out / t["video"] for g in games for i, t in enumerate(g["turns"])}


def clips_deviation(ours: dict[str, Path], reference: dict[str, Path]) -> dict[str, Any]:
    """PSNR of each turn's clip against the same turn's clip of another evaluation of the same game:
    the same MLLM and seed, so the clips differ only by how they were sampled."""
    shared = sorted(set(ours) & set(reference))
    pairs = [(decode_mp4(ours[k].read_bytes()), decode_mp4(reference[k].read_bytes())) for k in shared]
    values = [psnr(a, b) for a, b in pairs]
    return {"turns": len(shared), "identical_turns": sum(np.array_equal(a, b) for a, b in pairs),
            "psnr_per_turn": values, "psnr_mean": sum(values) / len(values) if values else None,
            "psnr_min": min(values, default=None)}


def step_cache_overrides(threshold: float) -> tuple[str, str]:
    return "model.diffusion.cache=first_block", f"model.diffusion.cache_threshold={threshold}"


def check_step_cache(eval_overrides: Sequence[str], thresholds: Sequence[float]) -> None:
    """Refuse a step cache the evaluation could not run before any stage trains (it plays last)."""
    for threshold in thresholds:
        cfg = evaluation_config([*eval_overrides, *step_cache_overrides(threshold)])
        problems = check_sampling_cache(cfg.model.diffusion, cfg.model.decoder)
        if problems:
            raise UserError("--step-cache: " + "; ".join(problems))


MEDIAN, MEAN = "seconds_per_stage_median", "seconds_per_stage"


def typical_turns(*reports: dict) -> tuple[str, list[dict[str, float]]]:
    """The evaluations' seconds per stage of their median turns, or of their mean turns when one was
    written before medians were kept (a reused evaluation): the games compared were played in other
    processes (or calls), and a mean also counts the first turns' warm-up. Returns which, and each."""
    which = MEDIAN if all(MEDIAN in r for r in reports) else MEAN
    return which, [r[which] for r in reports]


def score_step_cache(layout: Layout, size: BenchmarkSize, summary: dict, eval_out: Path, threshold: float,
                     extra: Sequence[str]) -> tuple[dict, dict]:
    """The trained game played again with the step cache: its table row, and how much faster and how
    different its turns are than the uncached game's (``eval_out``)."""
    cached = evaluate_renderer(layout, size, f"step_cache_{threshold:g}", summary["phase b export"],
                               summary["phase c export"], step_cache_overrides(threshold), extra=extra)
    reports = {"cached": json.loads((Path(cached["out"]) / METRICS_FILE).read_text()),
               "uncached": json.loads((eval_out / METRICS_FILE).read_text())}
    which, stages = typical_turns(*(report["metrics"] for report in reports.values()))
    speed = dict(zip(reports, stages))
    record = {"threshold": threshold, "seconds_per_stage": speed, "timed_by": which,
              "turn_speedup": speed["uncached"]["total"] / speed["cached"]["total"],
              "sample_speedup": speed["uncached"]["sample"] / speed["cached"]["sample"],
              "against_uncached": clips_deviation(game_clips(Path(cached["out"]), reports["cached"]["games"]),
                                                  game_clips(eval_out, reports["uncached"]["games"]))}
    return rows_of(STEP_CACHE.format(threshold=threshold), cached["metrics"])[0], record


# --------------------------------------------------------------------------- representation prediction
def representation_prediction(pipeline_root: Path) -> dict[str, float]:
    """How well phase (b) predicts each clip's phase (a2) representation, from the shards the recipe
    already wrote: the adaptation shards' ``pred_rep`` (true history before it) against the
    representation shards' ``rep`` of the same clip. ``mse_ratio``: the mean squared error over that of
    predicting every clip's rep as the mean rep (1.0: nothing learned). The clips are the adaptation
    shards', phase (c)'s training data: each clip in the session where it has the most history, and
    that session may be a training one, a held-out one or one that mixes both (the first GPU run: 259 of
    456 from training sessions), so this mixes fitted and unseen windows."""
    true = {s["__key__"]: s[REP].astype(np.float64)
            for s in iter_samples(folder_shards(pipeline_root / REPRESENTATIONS_DIR), video=False)}
    pairs = [(s[PRED_REP].astype(np.float64), true[s["__key__"]])
             for s in iter_samples(folder_shards(pipeline_root / ADAPTATION_DIR), video=False)]
    if not pairs:
        raise ValueError(f"{pipeline_root / ADAPTATION_DIR}: no adaptation sample to score")
    predicted, target = (np.stack(v) for v in zip(*pairs))
    spread = float(((target - target.mean(axis=0)) ** 2).mean())
    error = float(((predicted - target) ** 2).mean())
    return {"clips": len(pairs), "mse": error, "mean_rep_mse": spread, "mse_ratio": error / spread}


# --------------------------------------------------------------------------- all of it
def resolve_size(size: str, vae: dict[str, Any] | None, films: int | None, ablations: Sequence[str] | None,
                 stage: Sequence[str]) -> tuple[BenchmarkSize, Any, tuple[str, ...]]:
    """The size's settings with the caller's changes, its data size, and the ablations to run; checked
    before anything is drawn or trained."""
    if size not in SIZES:
        raise UserError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
    bench = replace(SIZES[size], stage_extra=(*SIZES[size].stage_extra, *parse_stage_overrides(stage)))
    if vae:
        if bench.vae is None:
            given = ", ".join(VAE_OPTIONS.get(name, name) for name in sorted(vae))
            raise UserError(f"--size {size} trains no VAE (its stages use the preset's random one): {given} "
                            "does not apply")
        bench = replace(bench, vae=replace(bench.vae, **vae))
        try:
            bench.vae.validate()
        except ValueError as error:
            raise UserError(f"{error} ({', '.join(VAE_OPTIONS[name] for name in sorted(vae))})") from None
    data_size = DATA_SIZES[size] if films is None else replace(DATA_SIZES[size], films=films)
    names = bench.ablations if ablations is None else tuple(ablations)
    unknown = sorted(set(names) - set(ABLATIONS))
    if unknown:
        raise UserError(f"unknown ablation(s) {unknown}; choose from {sorted(ABLATIONS)}")
    return bench, data_size, names


def recipe_result(layout: Layout, bench: BenchmarkSize, summary: dict, data: dict, extra: Sequence[str],
                  representation: dict, seconds: dict[str, float]) -> dict[str, Any]:
    """``known_answer.json`` once the recipe and its evaluation are done: the trained game's rows and
    baselines, what the stages and the data measured, the curves and the gallery."""
    eval_out = Path(summary["evaluation report"]).parent
    main = json.loads((eval_out / METRICS_FILE).read_text())["metrics"]
    vae = json.loads((layout.vae / TRAINING_RECORD).read_text()) if layout.has_vae(bench) else {}
    curves, gallery = layout.out / CURVES_FILE, layout.out / GALLERY_FILE
    return {
        "size": bench.name, "seed": layout.seed, TRUTH_WORDS_KEY: data[TRUTH_WORDS_KEY], "overrides": list(extra),
        "stage_overrides": [f"{n}:{o}" for n, o in bench.stage_extra],
        "turns": main.get("games", {}).get("completed_turns"),
        "reconstruction_clips": (main.get("reconstruction") or {}).get("clips"),
        "rows": rows_of(TRAINED, main), "representation_prediction": representation,
        # The chain of a VAE trained in stages: ``init`` names the weights each stage started from.
        "vae": {**{k: vae.get(k) for k in ("held_out_psnr", "train_psnr", "steps_done", "total_steps", "train_seconds",
                                           "scaling_factor", "weights_sha256", "init")},
                "vae_from": str(layout.vae_from.resolve()) if layout.vae_from else None},
        "decoder_base": {"folder": summary["decoder base"], "train_loss": summary["decoder base train/loss"],
                         "seconds": summary["decoder base seconds"]},
        # Each stage's training time over all its launches (a benchmark resumed in a second call included).
        "train_seconds": {stage: trained_seconds(summary[key]) for stage, key in STAGE_EXPORTS.items()
                          if summary.get(key)},
        "data": {k: data[k] for k in ("films", "clips", "split", "sessions", "rules")},
        "motion_agreement": data["motion"]["agreement"],
        "files": {"curves": str(curves) if plot_curves(loss_histories(layout.runs), curves) else None,
                  "gallery": str(gallery) if write_gallery(eval_out, gallery) else None,
                  "evaluation": summary["evaluation report"]},
        "wall_seconds": seconds,
    }


def comparison_parts(layout: Layout, bench: BenchmarkSize, summary: dict, extra: Sequence[str],
                     a2_renderer: bool, step_cache: Sequence[float], base_reconstruction: bool,
                     ablations: Sequence[str]) -> Iterator[tuple[str, list[dict], dict]]:
    """The rows scored beside the trained game, one part at a time (its name, its rows, what it adds to
    the result), so each is written as soon as it is done."""
    game = summary["phase b export"]
    if a2_renderer:
        a2 = evaluate_renderer(layout, bench, "a2_renderer", game, summary["phase a2 export"], extra=extra)
        yield "a2 renderer evaluation", rows_of(A2_RENDERER, a2["metrics"])[:1], {}  # its baselines: the game's
    if step_cache:
        eval_out = Path(summary["evaluation report"]).parent
        scored = [score_step_cache(layout, bench, summary, eval_out, threshold, extra) for threshold in step_cache]
        yield "step cache evaluation", [row for row, _ in scored], {"step_cache": [record for _, record in scored]}
    if base_reconstruction and summary["decoder base export"]:
        export = summary["decoder base export"]
        # One game: only the reconstruction is kept (its game would ignore the motion levels asked for).
        scored = evaluate_renderer(layout, bench, "decoder_base", game, export,
                                   (*BASE_RENDERER_OVERRIDES, "evaluation.games=1"), reconstruction=export, extra=extra)
        yield "decoder base reconstruction", [r for r in rows_of(BASE_RENDERER, scored["metrics"])
                                              if RECONSTRUCTION in r["row"] and "baseline" not in r], {}
    for name in ablations:
        export = train_ablation(layout, bench, name, extra)
        scored = evaluate_renderer(layout, bench, f"ablation_{name}", game, export, ABLATIONS[name].overrides,
                                   reconstruction=export, extra=extra)
        # The same state baselines again: left out.
        yield f"ablation {name}", [r for r in rows_of(f"ablation {name}", scored["metrics"]) if "baseline" not in r], {}


def run_benchmark(out: str | Path, size: str = CPU_SIZE, seed: int = 0, extra: Sequence[str] = (),
                  ablations: Sequence[str] | None = None, films: int | None = None,
                  vae: dict[str, Any] | None = None, a2_renderer: bool = True,
                  stage: Sequence[str] = (), base_reconstruction: bool = True,
                  step_cache: Sequence[float] = (), words: str = LEVEL_WORDS,
                  vae_from: str | Path | None = None) -> dict[str, Any]:
    """The benchmark; returns (and writes) ``OUT/known_answer.json``'s content. ``extra``: overrides of
    every stage; ``ablations``: which Table 3 variants to train and score (default: the size's); ``films``:
    how many films (default: the size's); ``vae``: VAE training settings replacing the size's (e.g.
    ``max_seconds``, ``device``); ``a2_renderer``: also play the game with the a2 decoder as the renderer;
    ``stage``: ``STAGE:OVERRIDE`` strings, an override of one stage (:data:`STAGE_NAMES`);
    ``base_reconstruction``: also reconstruct the held-out clips with the decoder base (where there is one);
    ``step_cache``: also play the trained game with the step cache at each of these thresholds
    (:func:`score_step_cache`); ``words``: how the films' captions name the motion
    (:data:`benchmarks.known_answer.data.CAPTION_WORDS`); ``vae_from``: a VAE folder trained elsewhere, used by
    every stage instead of the size's VAE stage (``vae`` then must be empty)."""
    check_words(words)
    if problems := seed_problems(f"--seed {seed}", seed):  # before the films: the stages would check it after them
        raise UserError(problems[0])
    if vae_from is not None and vae:
        raise InvalidInputError(f"{VAE_FROM} {vae_from} uses a trained VAE as it is: the VAE training options "
                                f"({'/'.join(VAE_TRAINING_OPTIONS)}) do not apply to it; give one or the other")
    bench, data_size, names = resolve_size(size, vae, films, ablations, stage)
    layout = Layout(Path(out), seed, None if vae_from is None else Path(vae_from))
    seconds: dict[str, float] = {}
    mark = started = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        seconds[name] = time.perf_counter() - mark
        mark = time.perf_counter()

    eval_overrides = [*eval_experiment(size), *data_overrides(layout), *extra]
    eval_cfg = evaluation_config(eval_overrides)
    check_step_cache(eval_overrides, step_cache)
    recipe = recipe_of(layout, bench, extra)
    # Before the films are drawn: the recipe's own pre-flight comes after them.
    if problems := machine_problems(recipe, vae_device=VAE_TRAINING_OPTIONS[2]):
        elsewhere = [] if size == CPU_SIZE else [f"--size {size} is set for a GPU host (below); on this machine "
                                                 f"run --size {CPU_SIZE}"]
        raise ConfigError(elsewhere + problems)
    if layout.vae_from:  # its clips are checked by the recipe once they are cut
        trained_vae(recipe, VAE_FROM)
    keep_other_seeds_results(layout.out, seed)
    drawn = make_films(layout.films, data_size, int(eval_cfg.pipeline.workers), words)  # the pipeline's workers
    lap("films")
    summary = run_recipe(recipe)
    # Read now: the next seed's recipe writes its own representations and adaptation shards here.
    representation = representation_prediction(layout.pipeline)
    lap("recipe")
    data = {**measure(layout.out, drawn, float(eval_cfg.data.val_fraction)), TRUTH_WORDS_KEY: words}
    result = recipe_result(layout, bench, summary, data, extra, representation, seconds)
    # Written after each part, so a run stopped by a time limit leaves what it measured so far.
    write_result(layout.out, result, started)
    over_base = [*extra, *base_overrides(summary)]  # the renderers and ablations below over the same base
    for name, rows, record in comparison_parts(layout, bench, summary, over_base, a2_renderer, step_cache,
                                               base_reconstruction, names):
        result["rows"] += rows
        result.update(record)
        lap(name)
        write_result(layout.out, result, started)
    log.info("known-answer benchmark -> %s (%.0f s)", layout.out / RESULT_FILE, seconds["total"])
    return result


def keep_other_seeds_results(out: Path, seed: int) -> None:
    """``OUT``'s result files are one seed's: those of another seed are kept beside, under names that say
    which (``known_answer_seed1.json``), before this seed's replace them."""
    result = out / RESULT_FILE
    if not result.is_file():
        return
    other = json.loads(result.read_text()).get("seed")
    if other == seed:
        return
    kept = []
    for path in (out / name for name in (RESULT_FILE, TABLE_FILE, CURVES_FILE, GALLERY_FILE)):
        if path.is_file():
            kept.append(path.replace(path.with_name(f"{path.stem}_seed{other}{path.suffix}")).name)
    log.info("seed %s's results in %s kept as %s; this run writes seed %d's", other, out, ", ".join(kept), seed)


def parse_stage_overrides(specs: Sequence[str]) -> list[tuple[str, str]]:
    """``STAGE:OVERRIDE`` strings as (stage, override) pairs; every malformed one is named at once."""
    pairs, problems = [], []
    for spec in specs:
        name, sep, override = spec.partition(":")
        if not sep or name not in STAGE_NAMES or "=" not in override:
            problems.append(f"{spec!r}: expected STAGE:KEY=VALUE with STAGE one of {', '.join(STAGE_NAMES)}")
        else:
            pairs.append((name, override))
    if problems:
        raise UserError("bad --stage override(s): " + "; ".join(problems))
    return pairs


def write_result(out: Path, result: dict, started: float) -> None:
    """``known_answer.json`` (with the comparisons of the rows so far) and the table."""
    result["wall_seconds"]["total"] = time.perf_counter() - started
    result["trained_vs_baselines"] = comparisons(
        result["rows"], {TRAINED: result.get("turns") or 0, RECONSTRUCTION: result.get("reconstruction_clips") or 0})
    (out / RESULT_FILE).write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    write_table(out / TABLE_FILE, result["rows"], result)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.known_answer", description=doc_summary(__doc__))
    parser.add_argument("out", type=Path, help="folder for the films, pipeline, VAE, runs and results")
    parser.add_argument("--size", choices=sorted(SIZES), default=CPU_SIZE,
                        help=f"{CPU_SIZE}: tiny presets on a CPU in minutes; gpu: the small preset, a trained VAE and "
                             "longer stages on one CUDA GPU (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="training and evaluation seed (data and VAE are shared)")
    parser.add_argument("--words", choices=CAPTION_WORDS, default=LEVEL_WORDS,
                        help="how the films' captions name the motion (each choice its own OUT): "
                             + "; ".join(f"{k}: {v}" for k, v in CAPTION_WORDS_MEANING.items()))
    parser.add_argument("--ablations", nargs="*", default=None, metavar="NAME",
                        help=f"Table 3 variants to train and score (default: all of {' '.join(ABLATIONS)})")
    parser.add_argument("--films", type=int, default=None, help="number of films (default: the size's)")
    max_seconds, steps, device = VAE_TRAINING_OPTIONS
    parser.add_argument(max_seconds, type=float, default=None, help="VAE training time limit (0: none)")
    parser.add_argument(steps, type=int, default=None, help="VAE training steps")
    parser.add_argument(device, default=None, help="VAE training device (default: the size's)")
    parser.add_argument(VAE_FROM, type=Path, default=None, metavar="FOLDER",
                        help="a VAE folder trained elsewhere (python -m animegamer.toy_vae, e.g. in stages with "
                             "--init) on this benchmark's clips with the size's preset VAE config: every stage "
                             "and evaluation uses it instead of training OUT/vae; not with "
                             + ", ".join(VAE_TRAINING_OPTIONS))
    parser.add_argument("--stage", action="append", default=[], metavar="STAGE:OVERRIDE",
                        help=f"an override of one stage ({', '.join(STAGE_NAMES)}), e.g. base:phase.batch_size=64")
    parser.add_argument("--no-a2-renderer", dest="a2_renderer", action="store_false",
                        help="skip the game rendered by the a2 decoder")
    parser.add_argument("--no-base-reconstruction", dest="base_reconstruction", action="store_false",
                        help="skip the decoder base's reconstruction of the held-out clips")
    parser.add_argument("--step-cache", type=float, nargs="+", default=(), metavar="THRESHOLD",
                        help="also play the trained game with the step cache at each threshold (e.g. 0.05 0.1 0.2)")
    parser.add_argument("overrides", nargs="*", help="overrides for every stage, e.g. phase.max_steps=100")
    return parser.parse_intermixed_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    setup_logging("INFO")
    vae = {name: value for name in VAE_OPTIONS if (value := getattr(args, f"vae_{name}")) is not None}
    exit_on_user_error(run_benchmark)(args.out, args.size, args.seed, args.overrides, args.ablations, args.films, vae,
                                      args.a2_renderer, args.stage, args.base_reconstruction, args.step_cache,
                                      args.words, args.vae_from)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
