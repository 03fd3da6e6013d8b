"""The known-answer data set: several toy films through the real pipeline, with what is true about them.

    python -m benchmarks.known_answer.data OUT [--size ci|gpu] [--words level|shared] [--clips-only] [--vae FOLDER]
        [override ...]

Each film is :func:`data_pipeline.toyfilm.make_toy_film` with its own seed and variant (film ``i``:
seed ``FIRST_SEED + i``, variant ``i``), so the films differ in cast (every group of three of the six
characters in turn), scene order and palette, shot lengths, the order of the speed levels, texture and
positions. They are written to ``OUT/films/`` and run through the pipeline (shot detection, clips,
measured motion levels, captions imported from the generators' JSONL, precompute, sessions) into
``OUT/pipeline/`` with the experiment ``known_answer_<size>`` (:mod:`benchmarks.known_answer.experiments`); the
usual held-out split (``data.val_fraction`` of the stages' experiments, whole shots) applies to everything
trained on it.

``--clips-only`` stops after the clip shards (what ``python -m animegamer.toy_vae`` trains the frozen
VAE on); ``--vae FOLDER`` then precomputes the latents with that VAE. Running again reuses what is done.

``--words`` says how a shot's caption names its motion: ``level`` (the default) gives each speed level its
own verb and adverb (``toyfilm.LEVEL_VOCABULARY``), so the text tells the speed; ``shared`` draws every
shot's pair from the same pairs whatever its speed (:func:`shared_words`), so only the motion scope (the
clip's measured flow) tells it. The pictures and every state are the same either way: the stamina state
still follows the speed, which the ``shared`` text no longer names.

``OUT/known_answer.json`` holds the measurements: clips and detected shots per film, the measured
motion level against the generator's speed level (agreement and confusion), captions and their
states against the generator's truth, whether each state rule can be read off the instruction (and
whether every held-out instruction value was seen in training), sessions, the split, and wall times.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from animegamer.config.compose import compose_config
from animegamer.contracts.files import CLIPS_DIR
from animegamer.contracts.steps import CLIP_STEPS
from animegamer.data.shards import folder_shards, iter_samples
from animegamer.data.split import HeldOut
from animegamer.data.split_counts import split_counts
from animegamer.errors import exit_on_user_error
from animegamer.media.captions import STATUS_OK
from animegamer.utils.logging import setup_logging
from animegamer.utils.text import doc_summary
from benchmarks.known_answer.experiments import EVALUATE, PIPELINE, search_path
from data_pipeline.__main__ import run
from data_pipeline.toyfilm import (
    CHARACTER_JOINER,
    LEVEL_VOCABULARY,
    NUM_LEVELS,
    SETTINGS,
    TIRING_LEVEL,
    ToyFilm,
    _write_captions,
    make_toy_film,
)

logger = logging.getLogger(__name__)

FIRST_SEED = 1000  # away from the seeds the unit tests and the quick start draw (0..3)
FILMS_DIR = "films"
PIPELINE_DIR = "pipeline"
MEASUREMENTS_FILE = "known_answer.json"
FEATURE_STEPS = ("precompute", "sessions")
EVAL_SUFFIX = "_eval"  # a data set's evaluation experiment: known_answer_<size>_eval

# The instruction template's fields, read back from the pipeline's clip json (not from the captions),
# so the learnability check sees exactly the text the game model is given.
_INSTRUCTION = re.compile(r"^Character: (?P<character>.+); Motion: (?P<motion>.+); Background: (?P<background>.+)\.$")


@dataclass(frozen=True)
class DataSize:
    """One size of the data set: how many films, drawn at what size, through which experiment."""

    films: int
    film_width: int
    film_height: int
    experiment: str


SIZES = {
    # Two films give 40 clips and a handful of held-out shots: enough for a CPU learning test.
    "ci": DataSize(films=2, film_width=480, film_height=272, experiment="known_answer_ci"),
    # 24 films: 480 clips, ~48 held-out shots at val_fraction 0.2; every cast group, scene and level
    # appears many times in training, so held-out shots test new combinations, not new words.
    "gpu": DataSize(films=24, film_width=480, film_height=272, experiment="known_answer_gpu"),
}


@dataclass(frozen=True)
class FilmSpec:
    film_id: str
    seed: int
    variant: int


# Every moving shot pans the same way. The instruction and the first frame say how fast a shot moves but
# not which way, and a decoder trained for minutes renders the mean of the two ways, a still clip: the
# first GPU runs' reconstructions measured 0.2-0.4 px/frame for every level while the VAE round trip of
# the same clips measured 0.0-1.8 (docs/plans/known_answer.md). A real video model's prior picks a way;
# the benchmark's small one needs what it renders to follow from what it is given.
PAN_DIRECTION = 1


def film_specs(count: int) -> list[FilmSpec]:
    return [FilmSpec(f"ka{i:02d}", FIRST_SEED + i, i) for i in range(count)]


# --------------------------------------------------------------------------- caption words
LEVEL_WORDS = "level"
SHARED_WORDS = "shared"
# What each choice of words means (the command lines' help, the benchmark's table).
CAPTION_WORDS_MEANING = {
    LEVEL_WORDS: "each speed level its own action words (the text tells the speed)",
    SHARED_WORDS: "the same action words at every speed level, drawn apart from the speed (only the motion scope "
                  "tells it)",
}
CAPTION_WORDS = tuple(CAPTION_WORDS_MEANING)
TRUTH_WORDS_KEY = "caption_words"  # where a film's truth file records which words its captions use
# Mixed into a film's seed for the shared words' draw, so that draw leaves the film's own randomness alone.
_SHARED_WORDS_STREAM = 1


def check_words(words: str) -> None:
    if words not in CAPTION_WORDS:
        raise ValueError(f"unknown caption words {words!r}; choose from {list(CAPTION_WORDS)}")


def shared_words(seed: int, variant: int, shots: int) -> list[tuple[str, str]]:
    """Each shot's (motion, adverb) in the ``shared`` captions of the film drawn with ``seed`` and
    ``variant``: every pair of ``LEVEL_VOCABULARY`` equally often (as every level is), in an order drawn
    from the seed and variant alone, never from the shots' levels, so that over films every pair meets
    every speed and the words say nothing about it."""
    pairs = [LEVEL_VOCABULARY[i % NUM_LEVELS] for i in range(shots)]
    order = np.random.default_rng([seed, variant, _SHARED_WORDS_STREAM]).permutation(shots)
    return [pairs[int(i)] for i in order]


def with_words(film: ToyFilm, words: str) -> ToyFilm:
    """``film`` with its captions naming the motion by ``words`` (:data:`CAPTION_WORDS`); the captions and
    truth files are rewritten when they named it otherwise (the video is the same either way)."""
    check_words(words)
    wanted = (shared_words(film.seed, film.variant, len(film.shots)) if words == SHARED_WORDS
              else [LEVEL_VOCABULARY[shot.level - 1] for shot in film.shots])
    shots = tuple(replace(shot, caption=replace(shot.caption, motion=motion, adverb=adverb))
                  for shot, (motion, adverb) in zip(film.shots, wanted))
    recorded = json.loads(film.truth_path.read_text(encoding="utf-8")).get(TRUTH_WORDS_KEY, LEVEL_WORDS)
    if shots == film.shots and recorded == words:
        return film
    film = replace(film, shots=shots)
    _write_captions(film.captions_path, film.captions)
    truth = {**film.to_json(), TRUTH_WORDS_KEY: words}
    film.truth_path.write_text(json.dumps(truth, indent=2) + "\n", encoding="utf-8")
    return film


# --------------------------------------------------------------------------- films
def _draw(folder: Path, spec: FilmSpec, size: DataSize) -> ToyFilm:
    return make_toy_film(folder, film_id=spec.film_id, seed=spec.seed, variant=spec.variant,
                         width=size.film_width, height=size.film_height, pan_direction=PAN_DIRECTION)


def make_films(folder: Path, size: DataSize, workers: int = 1, words: str = LEVEL_WORDS) -> list[ToyFilm]:
    """Draw the size's films into ``folder`` (``workers`` processes at once), their captions naming the
    motion by ``words`` (:func:`with_words`); a film whose truth file says it was drawn with the same
    arguments is reused."""
    check_words(words)  # before any film is drawn

    films: dict[str, ToyFilm] = {}
    missing = []
    for spec in film_specs(size.films):
        truth = folder / f"{spec.film_id}.truth.json"
        if truth.exists():
            film = ToyFilm.load(truth)
            same = (film.seed, film.variant, film.width, film.height, film.pan_direction) == (
                spec.seed, spec.variant, size.film_width, size.film_height, PAN_DIRECTION)
            if same and film.video_path.exists() and film.captions_path.exists():
                films[spec.film_id] = film
                continue
        missing.append(spec)
    if workers > 1 and len(missing) > 1:
        with ProcessPoolExecutor(min(workers, len(missing))) as pool:
            drawn = list(pool.map(_draw, [folder] * len(missing), missing, [size] * len(missing)))
    else:
        drawn = [_draw(folder, spec, size) for spec in missing]
    films.update({film.film_id: film for film in drawn})
    return [with_words(films[spec.film_id], words) for spec in film_specs(size.films)]


# --------------------------------------------------------------------------- pipeline
def pipeline_config(out: Path, size: DataSize, steps: Sequence[str], vae: str | None,
                    workers: int | None, overrides: Sequence[str]):
    """The composed pipeline config: the size's experiment, the films as inputs and caption source."""
    cfg = compose_config(PIPELINE, [search_path(PIPELINE), f"experiment={size.experiment}", *overrides])
    films = str((out / FILMS_DIR).resolve())
    cfg.pipeline.inputs = [films]
    cfg.pipeline.caption.path = films
    cfg.pipeline.output = str((out / PIPELINE_DIR).resolve())
    cfg.pipeline.steps = list(steps)
    if workers is not None:
        cfg.pipeline.workers = workers
    if vae is not None:
        cfg.model.encoders.vae.path = str(Path(vae).resolve())
    return cfg


def held_out_fraction(size: DataSize) -> float:
    """The share of the data set the stages and evaluations hold out (``data.val_fraction`` of the size's
    evaluation experiment; the pipeline's root has no ``data.*``)."""
    cfg = compose_config(EVALUATE, [search_path(EVALUATE), f"experiment={size.experiment}{EVAL_SUFFIX}"])
    return float(cfg.data.val_fraction)


def run_steps(out: Path, size: DataSize, steps: Sequence[str], vae: str | None = None,
              workers: int | None = None, overrides: Sequence[str] = ()) -> dict:
    return run(pipeline_config(out, size, steps, vae, workers, overrides))


# --------------------------------------------------------------------------- measurements
def _truth_shot(film: ToyFilm, seconds: float):
    frame = seconds * film.fps
    for shot in film.shots:
        if shot.start_frame <= frame < shot.end_frame:
            return shot
    raise ValueError(f"{film.truth_path}: no shot holds {seconds:.3f} s")


def _clip_metas(clips: Path) -> list[dict]:
    return [s["json"] for s in iter_samples(folder_shards(clips), video=False)]


def _rule_table(rows: list[tuple[str, int]]) -> dict[str, Any]:
    """How well a state is a function of one instruction value: the share of clips whose state is the
    most common state of their value (1.0: the value decides the state)."""
    by_value: dict[str, Counter] = defaultdict(Counter)
    for value, state in rows:
        by_value[value][state] += 1
    decided = sum(counter.most_common(1)[0][1] for counter in by_value.values())
    return {"values": len(by_value), "consistency": decided / max(1, len(rows))}


def _instruction_parts(instruction: str) -> dict[str, str]:
    match = _INSTRUCTION.match(instruction)
    if match is None:
        raise ValueError(f"instruction {instruction!r} does not follow the instruction template")
    return match.groupdict()


def measure(out: Path, films: Sequence[ToyFilm], val_fraction: float) -> dict[str, Any]:
    """Everything ``known_answer.json`` reports about the pipeline output under ``out``."""
    root = out / PIPELINE_DIR
    metas = _clip_metas(root / CLIPS_DIR)
    by_id = {film.film_id: film for film in films}
    split = HeldOut(root, CLIPS_DIR, val_fraction)
    per_film: dict[str, dict[str, Any]] = {
        f.film_id: {"clips": 0, "detected_shots": set(), "truth_shots": len(f.shots)} for f in films}
    confusion: Counter = Counter()
    captioned = 0
    states_match = 0
    rules: dict[str, list[tuple[str, int]]] = {"SC": [], "ET": [], "ST": [], "ML": []}
    seen: dict[str, set[str]] = {"character_count": set(), "background": set(), "motion": set()}
    held_out_values: list[dict[str, str]] = []
    leisure = {s.environment for s in SETTINGS if s.leisure}
    for meta in metas:
        film = by_id[meta["film"]]
        shot = _truth_shot(film, (meta["start"] + meta["end"]) / 2)
        record = per_film[film.film_id]
        record["clips"] += 1
        record["detected_shots"].add(meta["shot"])
        confusion[(shot.level, int(meta["motion"]["level"]))] += 1
        if meta["captioner"]["status"] != STATUS_OK:
            continue
        captioned += 1
        truth = shot.caption
        states = meta["states"]
        states_match += (states["SC"], states["ET"], states["ST"]) == (truth.sc, truth.et, truth.st)
        parts = _instruction_parts(meta["instruction"])
        values = {"character_count": str(len(parts["character"].split(CHARACTER_JOINER))),
                  "background": parts["background"], "motion": parts["motion"]}
        rules["SC"].append((values["character_count"], states["SC"]))
        rules["ET"].append((values["background"], states["ET"]))
        rules["ST"].append((values["motion"], states["ST"]))
        rules["ML"].append((values["motion"], int(meta["motion"]["level"])))
        if split.clip(meta["key"]):
            held_out_values.append(values)
        else:
            for name, value in values.items():
                seen[name].add(value)
    levels = sorted({level for pair in confusion for level in pair})
    agree = sum(n for (truth_level, measured), n in confusion.items() if truth_level == measured)
    counts = split_counts(root, CLIPS_DIR, val_fraction)
    sessions_file = root / "sessions.json"
    sessions = len(json.loads(sessions_file.read_text())["sessions"]) if sessions_file.exists() else 0
    return {
        "films": len(films),
        "clips": len(metas),
        "clips_per_film": {k: v["clips"] for k, v in per_film.items()},
        "detected_shots": sum(len(v["detected_shots"]) for v in per_film.values()),
        "truth_shots": sum(v["truth_shots"] for v in per_film.values()),
        "motion": {
            "agreement": agree / max(1, len(metas)),
            "truth_level_counts": {str(lv): sum(n for (t, _), n in confusion.items() if t == lv) for lv in levels},
            "measured_level_counts": {str(lv): sum(n for (_, m), n in confusion.items() if m == lv) for lv in levels},
            "confusion_truth_measured": {f"{t}->{m}": n for (t, m), n in sorted(confusion.items())},
        },
        "captions": {"captioned": captioned, "states_equal_truth": states_match},
        # Each state as a function of the instruction value its rule reads: SC of the number of
        # characters named, ET of the background (leisure settings: sorted below), ST and ML of the motion.
        "rules": {name: _rule_table(rows) for name, rows in rules.items()},
        "leisure_environments": sorted(leisure),
        "tiring_level": TIRING_LEVEL,
        "held_out_values_seen_in_training": {
            name: sum(v[name] in seen[name] for v in held_out_values) / max(1, len(held_out_values))
            for name in seen},
        "split": {"val_fraction": val_fraction, "train_clips": counts.train_clips,
                  "held_out_clips": counts.held_out_clips, "shots": len(counts.shots),
                  "held_out_shots": counts.held_out_shots},
        "sessions": {"total": sessions, "train": counts.train_sessions, "held_out": counts.held_out_sessions,
                     "turns": counts.turns},
    }


# --------------------------------------------------------------------------- all of it
def build(out: str | Path, size: str = "ci", clips_only: bool = False, vae: str | None = None,
          workers: int | None = None, overrides: Sequence[str] = (), films: int | None = None,
          words: str = LEVEL_WORDS) -> dict[str, Any]:
    """Films, pipeline, measurements; returns (and writes) the measurements. ``films`` replaces the
    size's number of films; ``words``: how the captions name the motion (:data:`CAPTION_WORDS`)."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
    data_size = SIZES[size]
    if films is not None:
        if films < 1:
            raise ValueError(f"films must be >= 1, got {films}")
        data_size = replace(data_size, films=films)
    out = Path(out)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    toy_films = make_films(out / FILMS_DIR, data_size, workers or 1, words)
    seconds["films"] = time.perf_counter() - started
    mark = time.perf_counter()
    run_steps(out, data_size, CLIP_STEPS, workers=workers, overrides=overrides)
    seconds["clips"] = time.perf_counter() - mark
    if not clips_only:
        mark = time.perf_counter()
        run_steps(out, data_size, FEATURE_STEPS, vae=vae, workers=workers, overrides=overrides)
        seconds["features_and_sessions"] = time.perf_counter() - mark
    cfg = pipeline_config(out, data_size, (), vae, workers, overrides)
    result = measure(out, toy_films, held_out_fraction(data_size))
    result["size"] = size
    result[TRUTH_WORDS_KEY] = words
    result["clip_size"] = [int(cfg.pipeline.clips.frames), int(cfg.pipeline.clips.height),
                           int(cfg.pipeline.clips.width)]
    result["vae"] = str(cfg.model.encoders.vae.path)
    result["wall_seconds"] = {**seconds, "total": time.perf_counter() - started}
    (out / MEASUREMENTS_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    logger.info("known-answer data set: %d films, %d clips, motion agreement %.3f, %d sessions -> %s",
                result["films"], result["clips"], result["motion"]["agreement"], result["sessions"]["total"],
                out / MEASUREMENTS_FILE)
    return result


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.known_answer.data", description=doc_summary(__doc__))
    parser.add_argument("out", type=Path, help="folder for films/, pipeline/ and known_answer.json")
    parser.add_argument("--size", choices=sorted(SIZES), default="ci")
    parser.add_argument("--words", choices=CAPTION_WORDS, default=LEVEL_WORDS, help="how captions name the motion: "
                        + "; ".join(f"{k}: {v}" for k, v in CAPTION_WORDS_MEANING.items()))
    parser.add_argument("--clips-only", action="store_true", help="stop after the clip shards")
    parser.add_argument("--vae", default=None, help="VAE folder (diffusers format) for the precomputed latents")
    parser.add_argument("--workers", type=int, default=None, help="pipeline workers (default: the experiment's)")
    parser.add_argument("--films", type=int, default=None, help="number of films (default: the size's)")
    parser.add_argument("overrides", nargs="*", help="further config overrides, e.g. pipeline.precompute.device=cuda")
    return parser.parse_intermixed_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    setup_logging("INFO")
    exit_on_user_error(build)(args.out, args.size, args.clips_only, args.vae, args.workers, args.overrides, args.films,
                              args.words)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
