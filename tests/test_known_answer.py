"""The known-answer data set: films whose state rules hold and can be read off the instruction, and the
CI-size data set through the real pipeline, measured against the generators' truth."""
from __future__ import annotations

import inspect
import json
import re
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator

import pytest

from data_pipeline.captioners.fields import Caption as CaptionFields
from data_pipeline.captioners.fields import build_instruction
from benchmarks.known_answer.data import (
    CAPTION_WORDS,
    LEVEL_WORDS,
    MEASUREMENTS_FILE,
    SHARED_WORDS,
    SIZES,
    TRUTH_WORDS_KEY,
    build,
    film_specs,
    make_films,
    shared_words,
    with_words,
)
from data_pipeline.toyfilm import (
    CAST,
    CAST_SIZE_PER_FILM,
    CHARACTER_JOINER,
    LEVEL_VOCABULARY,
    NUM_LEVELS,
    NUM_SHOTS,
    SETTINGS,
    TIRING_LEVEL,
    ToyFilm,
    _film_cast,
    _plan_shots,
    make_toy_film,
)

# Rules and casts do not depend on the picture size: small films keep these tests to seconds.
SMALL_FILM = {"width": 192, "height": 108}
# The rate the known-answer films are drawn (and their shots planned) at: make_toy_film's default.
FILM_FPS = inspect.signature(make_toy_film).parameters["fps"].default
RULE_FILMS = 6


def _small_film(folder: Path, index: int) -> ToyFilm:
    spec = film_specs(index + 1)[index]
    return make_toy_film(folder, film_id=spec.film_id, seed=spec.seed, variant=spec.variant, **SMALL_FILM)


@pytest.fixture(scope="module")
def small_films(tmp_path_factory: pytest.TempPathFactory) -> list[ToyFilm]:
    folder = tmp_path_factory.mktemp("films")
    return [_small_film(folder, i) for i in range(RULE_FILMS)]


def test_same_spec_gives_identical_truth_and_other_specs_differ(tmp_path: Path, small_films: list[ToyFilm]) -> None:
    again = _small_film(tmp_path, 1)
    first = small_films[1]
    assert again.truth_path.read_bytes() == first.truth_path.read_bytes()  # file names in it are relative
    assert again.captions_path.read_bytes() == first.captions_path.read_bytes()
    assert again.video_path.read_bytes() == first.video_path.read_bytes()
    plans = [[(s.level, s.environment, s.characters, s.num_frames) for s in film.shots] for film in small_films]
    assert len({json.dumps(p) for p in plans}) == len(plans)


def test_state_rules_hold_and_are_named_in_the_instruction(small_films: list[ToyFilm]) -> None:
    leisure = {s.environment: s.leisure for s in SETTINGS}
    for film in small_films:
        assert Counter(shot.level for shot in film.shots) == {lv: NUM_SHOTS // NUM_LEVELS for lv in range(1, 6)}
        for shot in film.shots:
            caption = shot.caption
            assert caption.sc == int(len(shot.characters) == 2)
            assert caption.et == int(leisure[shot.environment])
            assert caption.st == (-1 if shot.level >= TIRING_LEVEL else 1)
            assert (caption.motion, caption.adverb) == LEVEL_VOCABULARY[shot.level - 1]
            # What the game model reads: the pipeline's instruction built from the caption.
            instruction = build_instruction(CaptionFields(caption.character, caption.motion, caption.adverb,
                                                          caption.environment, caption.time_of_day))
            named = instruction.split(";")[0].removeprefix("Character: ").split(CHARACTER_JOINER)
            assert named == list(shot.characters)
            assert f"Motion: {caption.adverb} {caption.motion};" in instruction
            assert instruction.endswith(f"{caption.time_of_day} {caption.environment}.")
    states = Counter((s.caption.sc, s.caption.et, s.caption.st) for f in small_films for s in f.shots)
    for index, values in enumerate(((0, 1), (0, 1), (-1, 1))):
        assert {key[index] for key in states} == set(values)  # every state takes both values


def test_variants_go_through_every_cast_group() -> None:
    groups = [frozenset(m.name for m in _film_cast(v)) for v in range(40)]
    assert len(set(groups)) == 20 and groups[:20] == groups[20:]
    assert all(len(g) == CAST_SIZE_PER_FILM for g in groups)
    for even in range(0, 20, 2):
        assert groups[even].isdisjoint(groups[even + 1])
    # The earlier casts of variants 0 and 1 are kept, so existing toy films are unchanged.
    assert [m.name for m in _film_cast(0)] == [m.name for m in CAST[:3]]
    assert [m.name for m in _film_cast(1)] == [m.name for m in CAST[3:]]
    counts = Counter(name for g in groups[:20] for name in g)
    assert set(counts.values()) == {10}


def test_known_answer_sizes_have_distinct_films() -> None:
    specs = film_specs(SIZES["gpu"].films)
    assert len({s.seed for s in specs}) == len({s.variant for s in specs}) == len({s.film_id for s in specs}) == 24
    assert SIZES["gpu"].films * NUM_SHOTS * 2 >= 200  # two 2-s clips per shot


# --------------------------------------------------------------------------- caption words
def test_shared_words_meet_every_speed_level_and_tell_none() -> None:
    """Over the gpu size's films (their shot levels planned, nothing drawn), every (motion, adverb) pair
    meets every level, and the words predict a shot's level no better than chance, where the level words
    name it exactly."""
    size = SIZES["gpu"]
    cells: Counter = Counter()
    for spec in film_specs(size.films):
        levels = [plan.level for plan in _plan_shots(spec.seed, spec.variant, size.film_width, size.film_height,
                                                     FILM_FPS)]
        words = shared_words(spec.seed, spec.variant, len(levels))
        assert Counter(words) == {pair: NUM_SHOTS // NUM_LEVELS for pair in LEVEL_VOCABULARY}  # as often as levels
        cells.update(zip(words, levels))
    assert {(pair, level) for pair in LEVEL_VOCABULARY for level in range(1, NUM_LEVELS + 1)} <= set(cells)
    # Each pair's most common level: the share of shots a reader of the words would place right.
    guessed = sum(max(cells[(pair, level)] for level in range(1, NUM_LEVELS + 1)) for pair in LEVEL_VOCABULARY)
    shots = size.films * NUM_SHOTS
    assert guessed / shots < 0.35  # chance is 0.2; the level words give 1.0
    # Another film's words differ: drawn from its own seed and variant.
    assert len({tuple(shared_words(s.seed, s.variant, NUM_SHOTS)) for s in film_specs(size.films)}) == size.films


def test_words_rewrite_the_captions_and_keep_the_video_and_states(tmp_path: Path) -> None:
    film = _small_film(tmp_path, 0)
    original = {path: path.read_bytes() for path in (film.captions_path, film.truth_path, film.video_path)}
    shared = with_words(film, SHARED_WORDS)
    expected = shared_words(film.seed, film.variant, len(film.shots))
    assert [(s.caption.motion, s.caption.adverb) for s in shared.shots] == expected
    assert [(s.level, s.caption.sc, s.caption.et, s.caption.st) for s in shared.shots] == [
        (s.level, s.caption.sc, s.caption.et, s.caption.st) for s in film.shots]  # the stamina still follows the speed
    records = [json.loads(line) for line in film.captions_path.read_text().splitlines()]
    assert [(r["motion"], r["adverb"]) for r in records] == expected
    reloaded = ToyFilm.load(film.truth_path)
    assert reloaded.captions == shared.captions
    assert json.loads(film.truth_path.read_text())[TRUTH_WORDS_KEY] == SHARED_WORDS
    assert film.video_path.read_bytes() == original[film.video_path]
    assert with_words(reloaded, SHARED_WORDS) is reloaded  # already so: nothing written
    back = with_words(reloaded, LEVEL_WORDS)
    assert back.captions == film.captions and film.captions_path.read_bytes() == original[film.captions_path]
    with pytest.raises(ValueError, match="unknown caption words 'verbs'"):
        with_words(film, "verbs")


def test_films_are_drawn_with_the_words_asked_for_and_reused(tmp_path: Path) -> None:
    size = replace(SIZES["ci"], films=1, film_width=SMALL_FILM["width"], film_height=SMALL_FILM["height"])
    with pytest.raises(ValueError, match=re.escape(f"choose from {list(CAPTION_WORDS)}")):
        make_films(tmp_path, size, words="verbs")
    assert not any(tmp_path.iterdir())  # refused before any film is drawn
    (level,) = make_films(tmp_path, size)
    video = level.video_path.stat().st_mtime_ns
    (shared,) = make_films(tmp_path, size, words=SHARED_WORDS)
    assert shared.video_path.stat().st_mtime_ns == video  # the same film, its captions rewritten
    assert [(s.caption.motion, s.caption.adverb) for s in shared.shots] == shared_words(
        shared.seed, shared.variant, len(shared.shots))
    assert ToyFilm.load(shared.truth_path).captions == shared.captions


# --------------------------------------------------------------------------- the CI data set, end to end
@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Small convolutions on a busy shared 2-core CPU ran several times slower with two intra-op threads
    than with one (measured: precompute 17 s vs 6 s, the VAE test 136 s vs 20 s)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def ci_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("known_answer")
    with one_torch_thread():
        return out, build(out, "ci")


def test_ci_data_set_agrees_with_the_generators_truth(ci_data: tuple[Path, dict]) -> None:
    out, result = ci_data
    assert json.loads((out / MEASUREMENTS_FILE).read_text()) == result
    films = SIZES["ci"].films
    assert result["clips"] == films * NUM_SHOTS * 2
    assert set(result["clips_per_film"].values()) == {NUM_SHOTS * 2}
    assert result["detected_shots"] == result["truth_shots"] == films * NUM_SHOTS
    assert result["motion"]["agreement"] == 1.0
    assert result["captions"] == {"captioned": result["clips"], "states_equal_truth": result["clips"]}
    for state in ("SC", "ET", "ST", "ML"):
        assert result["rules"][state]["consistency"] == 1.0, state
    assert result["rules"]["SC"]["values"] == 2 and result["rules"]["ST"]["values"] == NUM_LEVELS
    assert set(result["held_out_values_seen_in_training"].values()) == {1.0}
    split = result["split"]
    assert split["held_out_shots"] >= 1 and split["train_clips"] + split["held_out_clips"] == result["clips"]
    assert result["sessions"]["train"] >= 1
    assert result["clip_size"] == [17, 32, 64]


def test_the_flow_probe_shows_detail_fixed_to_the_screen_hiding_the_pan(ci_data: tuple[Path, dict],
                                                                     tmp_path: Path) -> None:
    """On the true clips: blur keeps the levels readable, detail finer than a latent px held still does not, and
    the detail persistence tells the two apart (benchmarks/known_answer/flow_probe.py)."""
    from benchmarks.known_answer.flow_probe import LATENT_PX, main

    out, _ = ci_data
    assert main([str(out / "pipeline"), "--out", str(tmp_path / "probe.json")]) == 0
    rows = {row["degradation"]: row for row in json.loads((tmp_path / "probe.json").read_text())["rows"]}
    drawn = rows["as drawn"]
    fixed = rows[f"detail under {LATENT_PX:g} px (a latent px) fixed to the screen"]
    moving = [str(level) for level in range(2, NUM_LEVELS + 1)]
    assert drawn["acc_f"] == 1.0 and drawn["rank_correlation"] > 0.9
    assert drawn["persistence_per_level"]["1"] == pytest.approx(1.0)  # the still level
    assert max(drawn["persistence_per_level"][level] for level in moving) < 0.6
    assert rows["blurred, sigma 1 px"]["acc_f"] >= 0.9
    assert fixed["acc_f"] <= 0.3
    assert min(fixed["persistence_per_level"][level] for level in moving) > 0.9
    fastest = str(NUM_LEVELS)
    assert fixed["flow_per_level"][fastest] < 0.25 * drawn["flow_per_level"][fastest]
    # flicker: the still level reads fast and has lost its detail's persistence
    flicker = rows[f"detail under {LATENT_PX:g} px (a latent px) drawn afresh every frame"]
    assert flicker["flow_per_level"]["1"] > 0.5 > drawn["flow_per_level"]["1"]
    assert max(flicker["persistence_per_level"].values()) < 0.3
    with pytest.raises(SystemExit) as refused:
        main([str(tmp_path / "no_such_pipeline")])
    assert refused.value.code == 2


def test_toy_vae_trains_on_the_ci_clips_and_loads_as_the_frozen_vae(ci_data: tuple[Path, dict], tmp_path: Path) -> None:
    from animegamer.config.schema import EncodersConfig, VAEConfig
    from animegamer.models.frozen_encoders import build_frozen_encoders
    from animegamer.toy_vae import TRAINING_RECORD

    out, result = ci_data
    vae_dir = tmp_path / "vae"
    with one_torch_thread():
        _train_twice_then_retrain(out, vae_dir)
    record = json.loads((vae_dir / TRAINING_RECORD).read_text())
    assert record["held_out_clips"] == result["split"]["held_out_clips"]
    assert record["loaded_held_out_psnr"] == pytest.approx(record["held_out_psnr"], abs=1e-3)
    encoders = build_frozen_encoders(EncodersConfig(vae=VAEConfig(path=str(vae_dir))), which=("vae",))
    assert encoders.vae.from_disk and encoders.vae.scaling_factor == pytest.approx(record["scaling_factor"])
    assert encoders.vae.latent_shape(17, 32, 64) == (5, 4, 8, 16)


def _train_twice_then_retrain(out: Path, vae_dir: Path) -> None:
    from animegamer.toy_vae import TRAINING_RECORD, main

    command = [str(vae_dir), "--data", str(out / "pipeline"), "--steps", "2", "--batch-size", "1",
               "--crop-frames", "9", "--eval-every", "1", "--eval-clips", "1"]
    assert main(command) == 0
    record = json.loads((vae_dir / TRAINING_RECORD).read_text())
    assert record["steps_done"] == 2 and len(record["curve"]) == 2
    weights = next(vae_dir.glob("*.safetensors"))
    written = weights.stat().st_mtime_ns
    assert main(command) == 0  # the same clips and settings: reused, not trained again
    assert next(vae_dir.glob("*.safetensors")).stat().st_mtime_ns == written
    assert main([*command[:4], "3", *command[5:]]) == 0  # another setting: trained again
    assert json.loads((vae_dir / TRAINING_RECORD).read_text())["steps_done"] == 3
