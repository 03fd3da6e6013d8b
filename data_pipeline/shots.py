"""Shots: hard-cut detection with PySceneDetect's detectors, fed frames decoded once at low width.

Decoding at ``analysis_width`` lets the decoder's own scaler shrink frames, which is what makes the
stage several times faster than real time; the detectors score colour/edge changes, which survive
the downscale.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from animegamer.config.schema import ShotsConfig
from data_pipeline.ingest import FilmInfo

log = logging.getLogger(__name__)

DETECTORS = ("content", "adaptive")
_DECODE_BATCH = 64  # frames per decord call: bounded memory whatever the film length


@dataclass(frozen=True)
class Shot:
    index: int
    start: int  # first source frame
    end: int  # one past the last source frame

    def to_json(self) -> list[int]:
        return [self.start, self.end]


def analysis_size(width: int, height: int, target_width: int) -> tuple[int, int]:
    """(w, h) at ``target_width`` keeping the aspect ratio, even-sized for the decoder's scaler."""
    w = min(target_width, width)
    h = max(2, int(round(height * w / width / 2)) * 2)
    return w - w % 2, h


def make_detector(cfg: ShotsConfig):
    # PySceneDetect loads PyAV and OpenCV: imported where shots are detected, not by every pipeline command.
    from scenedetect import AdaptiveDetector, ContentDetector

    if cfg.detector == "content":
        return ContentDetector(threshold=cfg.threshold, min_scene_len=cfg.min_scene_frames)
    if cfg.detector == "adaptive":
        return AdaptiveDetector(
            adaptive_threshold=cfg.adaptive_threshold,
            min_scene_len=cfg.min_scene_frames,
            min_content_val=cfg.min_content_val,
        )
    raise ValueError(f"unknown shot detector {cfg.detector!r}; choose one of {DETECTORS}")


def iter_small_frames(film: FilmInfo, target_width: int, start: int = 0, end: int | None = None):
    """Yield (index, RGB uint8 frame at analysis size) sequentially from ``start`` to ``end``."""
    import decord

    w, h = analysis_size(film.width, film.height, target_width)
    reader = decord.VideoReader(film.path, width=w, height=h, num_threads=1)
    end = len(reader) if end is None else end
    for batch_start in range(start, end, _DECODE_BATCH):
        indices = list(range(batch_start, min(end, batch_start + _DECODE_BATCH)))
        for i, frame in zip(indices, reader.get_batch(indices).asnumpy()):
            yield i, frame


def detect_cuts(film: FilmInfo, cfg: ShotsConfig, progress=None) -> list[int]:
    """Frame indices where a new shot starts (the first frame after each cut)."""
    from scenedetect import FrameTimecode  # with make_detector's detectors

    detector = make_detector(cfg)
    cuts: list[FrameTimecode] = []
    last = FrameTimecode(0, fps=film.fps)
    for index, rgb in iter_small_frames(film, cfg.analysis_width):
        last = FrameTimecode(index, fps=film.fps)
        # PySceneDetect's detectors expect OpenCV's BGR channel order.
        cuts.extend(detector.process_frame(last, np.ascontiguousarray(rgb[..., ::-1])))
        if progress is not None:
            progress.update(1)
    cuts.extend(detector.post_process(last))
    return sorted({int(c.frame_num) for c in cuts if 0 < int(c.frame_num) < film.num_frames})


def shots_from_cuts(cuts: list[int], num_frames: int) -> list[Shot]:
    bounds = [0, *cuts, num_frames]
    return [Shot(i, s, e) for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])) if e > s]
