"""Generators of broken or unusable input files, one per rejection reason of the ingest stage."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

FPS = 24


def write_video(path: Path, frames: int, width: int, height: int, pts_step=None, faststart=False) -> Path:
    """A plain H.264 mp4 of moving noise; ``pts_step(i)`` gives irregular timestamps (VFR)."""
    rng = np.random.default_rng(0)
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), mode="w", options=options) as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = Fraction(1, FPS * 10)
        pts = 0
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8), format="rgb24")
            frame.pts, frame.time_base = pts, Fraction(1, FPS * 10)
            pts += pts_step(i) if pts_step else 10
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def write_audio_only(path: Path, seconds: float = 3.0) -> Path:
    rate = 16000
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("aac", rate=rate)
        samples = np.sin(np.linspace(0, 440 * 2 * np.pi * seconds, int(rate * seconds))).astype(np.float32)
        for start in range(0, samples.size, 1024):
            frame = av.AudioFrame.from_ndarray(samples[None, start : start + 1024], format="flt", layout="mono")
            frame.sample_rate = rate
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def make_bad_inputs(folder: Path, good_film: Path) -> dict[str, Path]:
    """reason code -> a file that must be rejected with it."""
    folder.mkdir(parents=True, exist_ok=True)
    data = good_film.read_bytes()
    out = {}
    (out_empty := folder / "empty.mp4").write_bytes(b"")
    out["empty_file"] = out_empty
    (cut := folder / "cut_download.mp4").write_bytes(data[: len(data) // 2])
    out["unreadable"] = cut  # moov atom at the end: half a file has no index at all
    fast = write_video(folder / "fast.mp4", 120, 128, 96, faststart=True)
    (fast_cut := folder / "truncated.mp4").write_bytes(fast.read_bytes()[: fast.stat().st_size * 2 // 3])
    fast.unlink()
    out["truncated"] = fast_cut
    (text := folder / "notes.mp4").write_text("this is not a video\n" * 50)
    out["not_video"] = text
    out["no_video_stream"] = write_audio_only(folder / "audio_only.mp4")
    out["too_short"] = write_video(folder / "short.mp4", FPS, 128, 96)
    out["bad_frame_size"] = write_video(folder / "sliver.mp4", 3 * FPS, 320, 16)
    out["variable_frame_rate"] = write_video(folder / "vfr.mp4", 3 * FPS, 128, 96, pts_step=lambda i: 5 + 10 * (i % 3))
    return out
