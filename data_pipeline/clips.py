"""Clips: 2-second windows inside shots, frame sampling at the clip rate, resize + crop (the mp4 encoding is
:func:`animegamer.media.video.encode_mp4`)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import cv2
import numpy as np

from animegamer.config.schema import ClipsConfig
from data_pipeline.ingest import FilmInfo, readable_error
from data_pipeline.shots import Shot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClipWindow:
    film_id: str
    clip_index: int  # running index over the whole film: the shard key's number
    shot_index: int
    frame_indices: tuple[int, ...]  # source frames, one per output frame

    @property
    def key(self) -> str:
        return clip_key(self.film_id, self.clip_index)

    def start_s(self, fps: float) -> float:
        return self.frame_indices[0] / fps

    def end_s(self, fps: float) -> float:
        return (self.frame_indices[-1] + 1) / fps


def clip_key(film_id: str, clip_index: int) -> str:
    return f"{film_id}-{clip_index:06d}"


def clip_span_frames(src_fps: float, cfg: ClipsConfig) -> float:
    """Source frames between a clip's first and last sampled frame."""
    return (cfg.frames - 1) * src_fps / cfg.fps


def plan_windows(film: FilmInfo, shots: list[Shot], cfg: ClipsConfig) -> list[ClipWindow]:
    """Every clip window of the film, numbered in time order; deterministic from shots and config."""
    span = clip_span_frames(film.fps, cfg)
    stride = cfg.stride_seconds * film.fps
    step = film.fps / cfg.fps
    windows: list[ClipWindow] = []
    for shot in shots:
        first, last_allowed = shot.start + cfg.margin_frames, shot.end - 1 - cfg.margin_frames
        k = 0
        while first + k * stride + span <= last_allowed + 1e-6:
            if cfg.max_clips_per_shot and k >= cfg.max_clips_per_shot:
                break
            start = first + k * stride
            frames = tuple(int(round(start + j * step)) for j in range(cfg.frames))
            windows.append(ClipWindow(film.film_id, len(windows), shot.index, frames))
            k += 1
    return windows


def shots_without_clips(film: FilmInfo, shots: list[Shot], cfg: ClipsConfig) -> list[Shot]:
    """The shots too short for one clip window (its span plus the margins at both ends)."""
    with_clips = {w.shot_index for w in plan_windows(film, shots, cfg)}
    return [shot for shot in shots if shot.index not in with_clips]


def short_shots_warning(film: FilmInfo, shots: list[Shot], cfg: ClipsConfig) -> str | None:
    """What to change when at least half of a film's shots give no clip (e.g. real footage whose camera
    motion the shot detector cuts often), else None."""
    short = shots_without_clips(film, shots, cfg)
    if not shots or 2 * len(short) < len(shots):
        return None
    needed = (clip_span_frames(film.fps, cfg) + 1 + 2 * cfg.margin_frames) / film.fps
    return (f"{film.film_id}: {len(short)} of {len(shots)} detected shots are shorter than one clip "
            f"({needed:.2f} s: pipeline.clips.frames at pipeline.clips.fps plus margin_frames at both ends) and "
            f"give no clip: raise pipeline.shots.threshold (or min_scene_frames) for fewer cuts, or lower "
            f"pipeline.clips.margin_frames")


def cover_size(width: int, height: int, out_w: int, out_h: int) -> tuple[int, int]:
    """Smallest (w, h) with the source aspect that covers the output, for resize-then-crop."""
    scale = max(out_w / width, out_h / height)
    return max(out_w, int(round(width * scale))), max(out_h, int(round(height * scale)))


def center_crop(frames: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """(T, H, W, 3) -> (T, out_h, out_w, 3), centred."""
    _, h, w, _ = frames.shape
    top, left = (h - out_h) // 2, (w - out_w) // 2
    return frames[:, top : top + out_h, left : left + out_w]


class FrameSource:
    """Decodes a film's frames already scaled to cover the output size (decoder-side resize)."""

    def __init__(self, film: FilmInfo, cfg: ClipsConfig) -> None:
        import decord

        self._cover = cover_size(film.width, film.height, cfg.width, cfg.height)
        w, h = self._cover
        self._reader = decord.VideoReader(film.path, width=w, height=h, num_threads=1)
        self._host_resize = False
        try:
            self._reader.get_batch([0])
        except decord.DECORDError as error:
            # decord 0.6's scaler hands back 4 bytes per pixel at a few sizes (e.g. 48x40 and 72x60
            # from a 176x144 film) and fails its own size check: decode at the film's size instead.
            log.info("%s: decord cannot scale to %dx%d (%s); resizing with OpenCV", film.path, w, h,
                     readable_error(error))
            self._reader = decord.VideoReader(film.path, num_threads=1)
            self._host_resize = True
        self._cfg = cfg

    def _decode(self, indices: list[int]) -> np.ndarray:
        frames = self._reader.get_batch(indices).asnumpy()
        if not self._host_resize:
            return frames
        return np.stack([cv2.resize(f, self._cover, interpolation=cv2.INTER_AREA) for f in frames])

    def clip_frames(self, window: ClipWindow) -> np.ndarray:
        """(frames, H_out, W_out, 3) uint8 RGB of one window."""
        unique = sorted(set(window.frame_indices))
        decoded = dict(zip(unique, self._decode(unique)))
        frames = np.stack([decoded[i] for i in window.frame_indices])
        return np.ascontiguousarray(center_crop(frames, self._cfg.height, self._cfg.width))
