"""Video clips as bytes and frames: H.264 mp4 encoding with reproducible bytes, decoding, and picking
evenly spaced frames of a clip. PyAV, decord and OpenCV load only when a clip is encoded or decoded."""
from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

from animegamer.config.schema import ClipsConfig

_PIX_FMT = "yuv420p"
_FPS_MAX_DENOMINATOR = 1001  # NTSC-style rates stay exact


def encode_mp4(frames: np.ndarray, fps: float, cfg: ClipsConfig) -> bytes:
    """H.264 mp4 bytes of (T, H, W, 3) uint8 RGB; single-threaded x264 so bytes are reproducible."""
    import av

    buffer = io.BytesIO()
    rate = Fraction(fps).limit_denominator(_FPS_MAX_DENOMINATOR)
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(cfg.codec, rate=rate)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = _PIX_FMT
        stream.options = {"qp": str(cfg.qp), "preset": "veryfast", "threads": "1"}
        stream.thread_count = 1
        for index, rgb in enumerate(frames):
            frame = _i420_frame(rgb)
            # Explicit timestamps: the muxer needs them and PyAV leaves them unset.
            frame.pts, frame.time_base = index, 1 / rate
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def _i420_frame(rgb: np.ndarray):
    """An ``av.VideoFrame`` in I420 with every padding byte zeroed.

    Two sources of run-to-run byte differences are closed here: colour conversion is done by
    OpenCV (decord and PyAV each bundle an FFmpeg, and which libswscale runs depended on import
    order), and the planes' line padding, which PyAV leaves uninitialised and x264 reads when a
    plane's width is not a multiple of 32, is written as zeros.
    """
    import av
    import cv2

    h, w = rgb.shape[:2]
    yuv = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)  # (H*3/2, W): Y, then U and V as H/4 rows each
    quarter = h * w // 4
    chroma = yuv[h:].reshape(-1)
    planes = (yuv[:h], chroma[:quarter].reshape(h // 2, w // 2), chroma[quarter:].reshape(h // 2, w // 2))
    frame = av.VideoFrame(w, h, _PIX_FMT)
    for plane, data in zip(frame.planes, planes):
        padded = np.zeros((plane.height, plane.line_size), np.uint8)
        padded[:, : plane.width] = data
        plane.update(padded)
    return frame


def decode_mp4(data: bytes) -> np.ndarray:
    """(T, H, W, 3) uint8 RGB from mp4 bytes, with decord (the reader's decoder)."""
    import decord

    reader = decord.VideoReader(io.BytesIO(data), num_threads=1)
    return reader.get_batch(list(range(len(reader)))).asnumpy()


def evenly_spaced_indices(total: int, count: int) -> list[int]:
    """``count`` frame indices spread over ``total`` frames, always including the first and last.

    Asking for more frames than exist returns every frame once (never duplicates).
    """
    if total <= 0:
        raise ValueError(f"cannot pick frames from an empty clip (total={total})")
    if count <= 0:
        raise ValueError(f"count must be >= 1, got {count}")
    if count >= total:
        return list(range(total))
    if count == 1:
        return [(total - 1) // 2]  # the middle frame represents the clip best
    return [int(i) for i in np.linspace(0, total - 1, count).round().astype(int)]


def pick_frames(frames: np.ndarray, count: int) -> list[np.ndarray]:
    """The ``count`` evenly spaced frames of a (T, H, W, 3) clip, in temporal order."""
    return [frames[i] for i in evenly_spaced_indices(len(frames), count)]
