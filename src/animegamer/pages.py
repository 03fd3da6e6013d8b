"""The HTML pages a person opens (the game's storyboard, the evaluation gallery): jinja2 templates from
``animegamer/templates``, every link relative to the page's own folder, a poster frame on every clip.

A page and the clips it shows can be moved or copied together and opened from anywhere: links are
computed from where the files are when the page is written (``relative_url``), never from the
directory the run started in. A clip's poster is its first frame as a JPEG beside it
(``turn_000.mp4`` -> ``turn_000.jpg``), so a browser shows a frame before the clip is played.
"""
from __future__ import annotations

import functools
import io
import logging
import os
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

import jinja2
import numpy as np
from PIL import Image

from animegamer.utils.io import write_bytes_atomic

log = logging.getLogger(__name__)

TEMPLATE_PACKAGE, TEMPLATE_FOLDER = "animegamer", "templates"
POSTER_SUFFIX = ".jpg"
POSTER_QUALITY = 88


@functools.lru_cache(maxsize=1)
def environment():
    """The jinja2 environment of the package's templates (HTML escaped, undefined names are errors)."""
    return jinja2.Environment(loader=jinja2.PackageLoader(TEMPLATE_PACKAGE, TEMPLATE_FOLDER),
                              autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True)


def render_page(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


def write_page(path: str | Path, template: str, **context: Any) -> Path:
    """Render ``template`` into ``path`` atomically."""
    path = Path(path)
    write_bytes_atomic(path, render_page(template, **context).encode("utf-8"))
    return path


def relative_path(target: str | Path, folder: str | Path) -> str:
    """``target`` (a path as this process sees it: absolute, or relative to the current directory)
    relative to ``folder``, with forward slashes."""
    return Path(os.path.relpath(Path(target).resolve(), Path(folder).resolve())).as_posix()


def relative_url(target: str | Path, page_dir: str | Path) -> str:
    """The URL of ``target`` from a page in ``page_dir``."""
    return quote(relative_path(target, page_dir))


# --------------------------------------------------------------------------- posters
def poster_path(video: str | Path) -> Path:
    return Path(video).with_suffix(POSTER_SUFFIX)


def save_poster(frame: np.ndarray, path: str | Path) -> Path:
    """An (H, W, 3) uint8 frame as a JPEG, written atomically."""
    frame = np.asarray(frame)
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
        raise ValueError(f"{path}: a poster needs an (H, W, 3) uint8 frame, got {frame.shape} {frame.dtype}")
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="JPEG", quality=POSTER_QUALITY)
    write_bytes_atomic(Path(path), buffer.getvalue())
    return Path(path)


def first_frame(video: str | Path) -> np.ndarray:
    """The first decoded frame of a video file, (H, W, 3) uint8."""
    import av

    with av.open(str(video)) as container:
        for frame in container.decode(video=0):
            return frame.to_ndarray(format="rgb24")
    raise ValueError(f"{video}: no video frame")


def ensure_poster(video: str | Path) -> Optional[Path]:
    """The poster beside ``video``, written from its first frame unless an up-to-date one exists; None
    (with a warning) when the clip cannot be decoded, so the page still shows the clip's controls."""
    video = Path(video)
    poster = poster_path(video)
    if poster.exists() and poster.stat().st_mtime >= video.stat().st_mtime:
        return poster
    try:
        return save_poster(first_frame(video), poster)
    except Exception as error:  # noqa: BLE001 - any undecodable clip: the page shows it without a poster
        log.warning("no poster for %s: %s", video, error)
        return None


def clip_entry(video: str | Path, page_dir: str | Path, label: str = "") -> dict:
    """What a template needs to show one clip: its URL, its poster's URL (or None) and a label."""
    poster = None
    if Path(video).is_file():
        poster = ensure_poster(video)
    else:
        log.warning("%s: no such clip; the page links to it anyway", video)
    return {"src": relative_url(video, page_dir), "poster": relative_url(poster, page_dir) if poster else None,
            "label": label}
