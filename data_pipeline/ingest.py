"""Ingest: find the input films and probe each with decord, rejecting what cannot be used.

Every rejection is a :class:`BadInput` with a reason code that ends up in ``report.json``; probing
never raises anything else, so one broken file cannot stop a run over a thousand films. Its detail,
like every decoder error the pipeline records, is :func:`readable_error`'s: what went wrong, without
the decoder's source locations.
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from animegamer.config.schema import ClipsConfig, IngestConfig
from animegamer.utils.io import sha256_file
from data_pipeline.errors import BadInput

log = logging.getLogger(__name__)

# Reason codes (report.json), named once.
EMPTY = "empty_file"
UNREADABLE = "unreadable"
NO_VIDEO = "no_video_stream"
TRUNCATED = "truncated"
TOO_SHORT = "too_short"
BAD_SIZE = "bad_frame_size"
VFR = "variable_frame_rate"
BROKEN_LINK = "broken_link"

DETAIL_CHARS = 200  # the longest error detail report.json and the log keep
# decord prefixes an error with a time and its C++ source location ("[12:00:00] /src/video/ffmpeg/
# threaded_decoder.cc:292: "), once for each level it passes the error through; a failed check then
# gives its expression and the values compared, the first an ffmpeg error code when negative, and a
# failed read gives the code without its sign ("av_read_frame failed with 1094995529").
_SOURCE_LOCATION = re.compile(r"\[\d{2}:\d{2}:\d{2}\] \S+?\.(?:cc|cpp|cxx|c|h|hpp):\d+: ")
_FAILED_CHECK = re.compile(r"Check failed: .*? \((-?\d+) vs\. -?\d+\)\s*")
_FAILED_WITH = re.compile(r"failed with (-?\d+)")


@dataclass(frozen=True)
class FilmInfo:
    """What the later stages need to know about one readable film."""

    film_id: str
    path: str
    size: int
    sha256: str
    fps: float
    num_frames: int
    width: int
    height: int

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps

    def to_json(self) -> dict:
        return asdict(self)


_WARNED_LINKS: set[str] = set()


def _folder_films(folder: Path, exts: set[str]) -> list[Path]:
    """Everything under ``folder`` named like a film (by extension), links that point nowhere included."""
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in exts)


def _dangling(named: Iterable[Path]) -> list[BadInput]:
    return [BadInput(str(link), BROKEN_LINK, f"a link to {os.readlink(link)}, which does not exist")
            for link in named if link.is_symlink() and not link.exists()]


def broken_links(patterns: Iterable[str], extensions: Iterable[str]) -> list[BadInput]:
    """The links among the folders' films (by extension, as :func:`find_inputs` finds them) that point
    nowhere: :func:`find_inputs` leaves them out, and the report names them."""
    exts = {e.lower() for e in extensions}
    folders = [Path(pattern) for pattern in patterns if Path(pattern).is_dir()]
    return [bad for folder in folders for bad in _dangling(_folder_films(folder, exts))]


def find_inputs(patterns: Iterable[str], extensions: Iterable[str]) -> list[Path]:
    """Expand files, folders (recursively, by extension) and globs into a sorted, unique list."""
    exts = {e.lower() for e in extensions}
    found: set[Path] = set()
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            named = _folder_films(path, exts)  # one walk of the folder for its films and its broken links
            found.update(p for p in named if p.is_file())
            for broken in _dangling(named):
                if broken.path not in _WARNED_LINKS:  # a run looks for its inputs at several steps: said once
                    _WARNED_LINKS.add(broken.path)
                    log.warning("%s: %s; skipped", broken.path, broken.detail)
        elif path.exists():
            found.add(path)  # named explicitly: probed whatever its extension
        else:
            found.update(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    return sorted(p.resolve() for p in found)


def film_ids(paths: list[Path]) -> dict[Path, str]:
    """Stable, shard-key-safe ids from file stems; clashing stems get a short path hash."""
    stems = {p: re.sub(r"[^A-Za-z0-9_]+", "_", p.stem).strip("_") or "film" for p in paths}
    counts: dict[str, int] = {}
    for stem in stems.values():
        counts[stem] = counts.get(stem, 0) + 1
    return {
        p: stem if counts[stem] == 1 else f"{stem}_{hashlib.sha1(str(p).encode()).hexdigest()[:8]}"
        for p, stem in stems.items()
    }


def split_part(paths: list[Path], part: int, num_parts: int) -> list[Path]:
    """Deterministic share of machine ``part`` of ``num_parts``: round-robin over the sorted list."""
    return [p for i, p in enumerate(sorted(paths)) if i % num_parts == part]


def readable_error(error: BaseException, typed: bool = False) -> str:
    """What went wrong, for report.json and the log: the first line of ``error``'s message that says
    something, without decord's times, C++ source locations and failed-check expressions (an ffmpeg
    error code in decord's message named by ffmpeg's text), at most :data:`DETAIL_CHARS` long.
    ``typed``: an error from outside the decoder (no source location) starts with its type's name."""
    text, located = "", False
    for line in str(error).splitlines():
        cleaned, count = _SOURCE_LOCATION.subn("", line)
        located = located or count > 0
        if located:  # decord's message: its codes are ffmpeg's
            check, failed = _FAILED_CHECK.search(cleaned), _FAILED_WITH.search(cleaned)
            code = int(check.group(1)) if check else -abs(int(failed.group(1))) if failed else 0
            cleaned = _FAILED_CHECK.sub("", cleaned).strip()
            meaning = _ffmpeg_message(code)
            cleaned += f" (ffmpeg: {meaning})" if meaning else ""
        if cleaned.strip():
            text = cleaned.strip()
            break
    if typed and not located:
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text[:DETAIL_CHARS]


def _ffmpeg_message(code: int) -> str | None:
    """ffmpeg's message for a negative error code (None for anything else)."""
    import av

    if code >= 0:
        return None
    try:
        av.error.err_check(code)
    except av.error.FFmpegError as error:
        return error.strerror
    return None


def _open(path: Path):
    import decord  # imported here: decord loads ffmpeg libraries, not needed by importers of FilmInfo

    try:
        return decord.VideoReader(str(path), num_threads=1)
    except Exception as exc:  # decord raises its own DECORDError for every ffmpeg failure
        raw = (str(exc).splitlines() or [""])[0]  # classified by what decord's first line names
        message = readable_error(exc)
        if "st_nb" in raw or ("stream" in raw.lower() and "video" in raw.lower()):
            raise BadInput(str(path), NO_VIDEO, message) from None
        if "av_read_frame" in raw:  # the index was read, the packets it points to are missing
            raise BadInput(str(path), TRUNCATED, message) from None
        raise BadInput(str(path), UNREADABLE, message) from None


def _check_constant_rate(path: Path, reader, tolerance: float) -> None:
    stamps = np.asarray(reader.get_frame_timestamp(range(len(reader))))[:, 0]
    deltas = np.diff(stamps)
    if len(deltas) < 2:
        return
    median = float(np.median(deltas))
    spread = float(deltas.max() - deltas.min())
    if median <= 0 or spread > tolerance * median:
        raise BadInput(str(path), VFR, f"frame intervals {deltas.min():.4f}..{deltas.max():.4f}s")


def probe(path: Path, film_id: str, ingest: IngestConfig, clips: ClipsConfig) -> FilmInfo:
    """Open ``path`` and return its :class:`FilmInfo`, or raise :class:`BadInput` saying why not."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise BadInput(str(path), EMPTY)
    reader = _open(path)
    num_frames = len(reader)
    if num_frames == 0:
        raise BadInput(str(path), NO_VIDEO, "no decodable frames")
    fps = float(reader.get_avg_fps())
    height, width = reader[0].shape[:2]
    if min(height, width) < ingest.min_side or max(height, width) / min(height, width) > ingest.max_aspect:
        raise BadInput(str(path), BAD_SIZE, f"{width}x{height}")
    clip_seconds = (clips.frames - 1) / clips.fps
    if not fps > 0 or num_frames / fps < clip_seconds:
        raise BadInput(str(path), TOO_SHORT, f"{num_frames} frames at {fps:.3f} fps < {clip_seconds:.2f}s")
    _check_constant_rate(path, reader, ingest.vfr_tolerance)
    try:
        reader.seek(0)
        reader[num_frames - 1]  # a cut-off download decodes its header but not its tail
    except Exception as exc:
        raise BadInput(str(path), TRUNCATED, readable_error(exc)) from None
    return FilmInfo(film_id, str(path), size, sha256_file(path), fps, num_frames, width, height)
