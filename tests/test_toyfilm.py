"""Tests of the toy film generator: reproducibility, file formats, and - most important - that the
real shot detector and optical flow agree with its ground truth, so pipeline tests can trust it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import av
import cv2
import decord
import numpy as np
import pytest
from scenedetect import ContentDetector, detect

from data_pipeline.toyfilm import (
    LEVEL_VOCABULARY,
    NUM_LEVELS,
    SHOT_SECONDS_MAX,
    SHOT_SECONDS_MIN,
    TIRING_LEVEL,
    Caption,
    ToyFilm,
    level_speeds,
    main,
    make_toy_film,
)

# The pipeline's measurement settings, reproduced here to check the film against them.
SCENE_THRESHOLD = 27.0
MIN_SCENE_LEN = 8
CUT_TOLERANCE_FRAMES = 1
FLOW_WIDTH = 256
FLOW_FRAME_GAP = 3  # 8-fps clips from a 24-fps film: consecutive clip frames are 3 apart
FLOW_MIN_MAGNITUDE = 0.2  # smaller per-pixel magnitudes count as zero (encoder noise)
FLOW_PAIR_STRIDE = 6  # sample every other clip-frame pair; plenty for a mean
FARNEBACK_ARGS = (None, 0.5, 3, 15, 3, 5, 1.2, 0)  # pyr_scale, levels, winsize, iters, poly_n/sigma
STATIC_FLOW_MAX = 0.05

CONFIGS = {
    "default": {"seed": 0, "variant": 0},
    "variant1": {"seed": 0, "variant": 1},
    "seed1": {"seed": 1, "variant": 0},
}


@pytest.fixture(scope="module")
def film_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], ToyFilm]:
    """Make each configuration's film once per module (each takes a couple of seconds)."""
    cache: dict[str, ToyFilm] = {}

    def get(name: str) -> ToyFilm:
        if name not in cache:
            cache[name] = make_toy_film(tmp_path_factory.mktemp(name), **CONFIGS[name])
        return cache[name]

    return get


def _gray_small(frame_rgb: np.ndarray) -> np.ndarray:
    gray = cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2GRAY)
    height = round(gray.shape[0] * FLOW_WIDTH / gray.shape[1])
    return cv2.resize(gray, (FLOW_WIDTH, height), interpolation=cv2.INTER_AREA)


def _mean_flow(first: np.ndarray, second: np.ndarray) -> float:
    flow = cv2.calcOpticalFlowFarneback(first, second, *FARNEBACK_ARGS)
    magnitude = np.linalg.norm(flow, axis=2)
    magnitude[magnitude < FLOW_MIN_MAGNITUDE] = 0.0
    return float(magnitude.mean())


def _shot_flows(film: ToyFilm) -> list[float]:
    """Mean Farneback magnitude over the middle half of every shot."""
    reader = decord.VideoReader(str(film.video_path))
    flows = []
    for shot in film.shots:
        quarter = shot.num_frames // 4
        firsts = list(range(shot.start_frame + quarter, shot.end_frame - quarter - FLOW_FRAME_GAP,
                            FLOW_PAIR_STRIDE))
        wanted = sorted(set(firsts) | {i + FLOW_FRAME_GAP for i in firsts})
        frames = dict(zip(wanted, (_gray_small(f) for f in reader.get_batch(wanted).asnumpy())))
        flows.append(float(np.mean([_mean_flow(frames[i], frames[i + FLOW_FRAME_GAP]) for i in firsts])))
    return flows


# --------------------------------------------------------------------------- files and truth
def test_same_arguments_give_identical_files(tmp_path: Path) -> None:
    first = make_toy_film(tmp_path / "a", seed=3)
    second = make_toy_film(tmp_path / "b", seed=3)
    for name in ("video_path", "captions_path", "truth_path"):
        assert getattr(first, name).read_bytes() == getattr(second, name).read_bytes(), name


def test_variant_makes_a_different_film(film_of: Callable[[str], ToyFilm]) -> None:
    base, other = film_of("default"), film_of("variant1")
    base_cast = {name for shot in base.shots for name in shot.characters}
    other_cast = {name for shot in other.shots for name in shot.characters}
    assert base_cast.isdisjoint(other_cast)
    assert [s.environment for s in base.shots] != [s.environment for s in other.shots]
    assert base.video_path.read_bytes() != other.video_path.read_bytes()


def test_decord_reads_exact_frames_and_fps(film_of: Callable[[str], ToyFilm]) -> None:
    film = film_of("default")
    reader = decord.VideoReader(str(film.video_path))
    assert len(reader) == film.num_frames
    assert reader.get_avg_fps() == pytest.approx(film.fps)
    assert reader[film.num_frames - 1].shape == (film.height, film.width, 3)


def test_video_is_constant_rate_h264_yuv420p(film_of: Callable[[str], ToyFilm]) -> None:
    film = film_of("default")
    with av.open(str(film.video_path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert stream.codec_context.pix_fmt == "yuv420p"
        assert stream.average_rate == film.fps
        pts = sorted(frame.pts for frame in container.decode(stream))
    assert len(pts) == film.num_frames
    assert len(set(np.diff(pts))) == 1


def test_truth_round_trips_and_matches_captions(film_of: Callable[[str], ToyFilm]) -> None:
    film = film_of("default")
    assert ToyFilm.load(film.truth_path) == film
    truth = json.loads(film.truth_path.read_text())
    assert truth["cut_frames"] == list(film.cut_frames)
    assert truth["duration"] == pytest.approx(film.num_frames / film.fps)
    lines = film.captions_path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [Caption.from_record(r) for r in records] == [shot.caption for shot in film.shots]
    assert set(records[0]) == {"film", "start", "end", "character", "motion", "adverb",
                               "environment", "time_of_day", "states"}
    for shot, record in zip(film.shots, records):
        assert record["film"] == film.film_id
        assert record["start"] == pytest.approx(shot.start_frame / film.fps)
        assert record["end"] == pytest.approx(shot.end_frame / film.fps)
        assert record["character"] == " and ".join(shot.characters)
        assert (record["motion"], record["adverb"]) == LEVEL_VOCABULARY[shot.level - 1]
        assert record["environment"] == shot.environment
        assert record["states"]["SC"] == int(len(shot.characters) > 1)
        assert record["states"]["ET"] in (0, 1)
        assert record["states"]["ST"] == (-1 if shot.level >= TIRING_LEVEL else 1)


def test_shots_tile_the_film_with_sane_lengths(film_of: Callable[[str], ToyFilm]) -> None:
    film = film_of("default")
    assert film.shots[0].start_frame == 0
    assert film.shots[-1].end_frame == film.num_frames
    for previous, shot in zip(film.shots, film.shots[1:]):
        assert shot.start_frame == previous.end_frame
    for shot in film.shots:
        assert SHOT_SECONDS_MIN * film.fps <= shot.num_frames <= SHOT_SECONDS_MAX * film.fps
    assert 40 <= film.duration <= 60
    environments = [shot.environment for shot in film.shots]
    assert len(set(environments)) == len(environments)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_level_appears_twice_with_its_speed(film_of: Callable[[str], ToyFilm], name: str) -> None:
    film = film_of(name)
    speeds = level_speeds(film.width)
    for level in range(1, NUM_LEVELS + 1):
        assert sum(shot.level == level for shot in film.shots) >= 2, level
    for shot in film.shots:
        assert shot.speed_px_per_frame == speeds[shot.level - 1]
    assert speeds[0] == 0 and all(a < b for a, b in zip(speeds, speeds[1:]))


# --------------------------------------------------------------------------- the real tools
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_content_detector_finds_exactly_the_cuts(film_of: Callable[[str], ToyFilm], name: str) -> None:
    film = film_of(name)
    detector = ContentDetector(threshold=SCENE_THRESHOLD, min_scene_len=MIN_SCENE_LEN)
    scenes = detect(str(film.video_path), detector)
    found = [start.frame_num for start, _ in scenes[1:]]
    assert len(found) == len(film.cut_frames), (found, film.cut_frames)
    for detected, true in zip(found, film.cut_frames):
        assert abs(detected - true) <= CUT_TOLERANCE_FRAMES, (found, film.cut_frames)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_farneback_flow_orders_the_levels(film_of: Callable[[str], ToyFilm], name: str) -> None:
    film = film_of(name)
    flows = _shot_flows(film)
    by_level = {
        level: [flow for flow, shot in zip(flows, film.shots) if shot.level == level]
        for level in range(1, NUM_LEVELS + 1)
    }
    medians = [float(np.median(by_level[level])) for level in sorted(by_level)]
    assert all(a < b for a, b in zip(medians, medians[1:])), medians
    assert max(by_level[1]) < STATIC_FLOW_MAX, by_level
    # Stronger than ordered medians: the levels are separable by thresholds, shot by shot.
    for level in range(1, NUM_LEVELS):
        assert max(by_level[level]) < min(by_level[level + 1]), by_level


# --------------------------------------------------------------------------- API edges
def test_cli_writes_the_three_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path), "--film-id", "mini", "--width", "160", "--height", "96"]) == 0
    for suffix in (".mp4", ".captions.jsonl", ".truth.json"):
        assert (tmp_path / f"mini{suffix}").is_file()
    assert "mini.mp4" in capsys.readouterr().out
    assert ToyFilm.load(tmp_path / "mini.truth.json").width == 160


def test_odd_frame_size_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        make_toy_film(tmp_path, width=481)


def test_a_fixed_pan_direction_changes_the_pans_and_nothing_else(tmp_path: Path) -> None:
    """The known-answer films pan one way (benchmarks/known_answer/data.PAN_DIRECTION): the same shots,
    scenes, cast and positions as the drawn film, every moving shot panning +1, recorded in the truth."""
    from dataclasses import replace

    from data_pipeline.toyfilm import _plan_shots

    drawn = _plan_shots(0, 0, 160, 96, 24)
    fixed = _plan_shots(0, 0, 160, 96, 24, pan_direction=1)
    assert {plan.pan_direction for plan in drawn if plan.speed > 0} == {-1, 1}  # drawn: both ways
    assert [plan.pan_direction for plan in fixed] == [1 if plan.speed > 0 else 0 for plan in fixed]
    assert [replace(p, pan_direction=0) for p in drawn] == [replace(p, pan_direction=0) for p in fixed]
    film = make_toy_film(tmp_path, film_id="pan", width=160, height=96, pan_direction=1)
    assert ToyFilm.load(film.truth_path).pan_direction == 1
    with pytest.raises(ValueError, match="pan_direction"):
        make_toy_film(tmp_path, film_id="bad", width=160, height=96, pan_direction=2)


@pytest.mark.parametrize("options, words", [
    (["--width", "0"], "--width 0: must be an even number of pixels, at least 16"),
    (["--height", "33"], "--height 33: must be an even number of pixels, at least 16"),
    (["--fps", "-5"], "--fps -5: must be at least 1"),
    (["--seed", "-1", "--variant", "-2"], "--seed -1: must be in [0, 4294967295]; --variant -2: must be 0 or more"),
])
def test_the_commands_options_are_checked_before_anything_is_drawn(tmp_path, capsys, options, words):
    from data_pipeline.toyfilm import main

    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "film"), *options])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and words in err and "Traceback" not in err
    assert not (tmp_path / "film").exists()
