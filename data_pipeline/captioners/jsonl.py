"""The ``jsonl`` backend: captions imported from files written by hand, by the toy film or by another tool.

Import format, one JSON object per line (blank lines are skipped)::

    {"film": "ep01", "start": 12.0, "end": 15.5,
     "character": "Sosuke", "motion": "talk", "adverb": "softly",
     "environment": "seaside village", "time_of_day": "evening",
     "states": {"SC": 1, "ET": 0, "ST": -1}}

``film`` is the pipeline's film id, or the film's path, file name or file stem (see
:func:`base.film_aliases`). ``start``/``end`` are seconds of the film. A clip takes the record of its
film whose half-open range [start, end) covers the clip's midpoint. When overlapping records cover it,
the one with the latest ``start`` wins (the more specific, later-starting annotation refines a longer
one); equal starts go to the record read last (files in name order, lines in file order).

A malformed file is a configuration error: it raises at load time naming ``file:line``.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from .base import BACKEND_JSONL, CaptionResult, ClipContext, FilmPaths, film_aliases
from .fields import ANSWER_FIELDS, STATES, Caption, States

logger = logging.getLogger(__name__)

FILM = "film"
START = "start"
END = "end"
RECORD_FIELDS: tuple[str, ...] = (FILM, START, END) + ANSWER_FIELDS
JSONL_SUFFIX = ".jsonl"
VERSION_HEX_CHARS = 12


@dataclass(frozen=True)
class CaptionRecord:
    """One validated line of an import file; ``source`` ("file:line") is kept for error messages."""

    film: str
    start: float
    end: float
    caption: Caption
    states: States
    source: str

    def covers(self, t: float) -> bool:
        return self.start <= t < self.end


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name!r} must be a finite number of seconds, got {value!r}")
    if value < 0:
        raise ValueError(f"{name!r} must be >= 0, got {value!r}")
    return float(value)


def parse_record(data: Any, source: str) -> CaptionRecord:
    """Validate one decoded line; every problem is a ValueError (the caller adds file:line)."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    missing = [key for key in RECORD_FIELDS if key not in data]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(repr(k) for k in missing)}")
    extra = sorted(key for key in data if key not in RECORD_FIELDS)
    if extra:
        raise ValueError(f"unexpected field(s) {', '.join(repr(k) for k in extra)}")
    film = data[FILM]
    if not isinstance(film, str) or not film.strip():
        raise ValueError(f"{FILM!r} must be a non-empty string, got {film!r}")
    start, end = _seconds(data[START], START), _seconds(data[END], END)
    if end <= start:
        raise ValueError(f"{END!r} ({end}) must be greater than {START!r} ({start})")
    return CaptionRecord(film.strip(), start, end, Caption.from_dict(data), States.from_dict(data[STATES]), source)


def caption_files(path: str | Path) -> list[Path]:
    """The import files named by ``caption.path``: the file itself, or every ``*.jsonl`` of a folder."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.glob(f"*{JSONL_SUFFIX}") if p.is_file())
        if not files:
            raise FileNotFoundError(f"caption folder {str(path)!r} holds no *{JSONL_SUFFIX} file")
        return files
    if not path.is_file():
        raise FileNotFoundError(f"caption path {str(path)!r} does not exist")
    return [path]


def read_records(file: Path) -> list[CaptionRecord]:
    """All records of one file; the first bad line raises ``ValueError("file:line: reason")``."""
    records = []
    with open(file, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            source = f"{file}:{line_no}"
            try:
                records.append(parse_record(json.loads(line), source))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{source}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
            except ValueError as exc:
                raise ValueError(f"{source}: {exc}") from exc
    return records


def files_version(files: Sequence[Path]) -> str:
    """sha256 of the files' bytes in name order (first 12 hex): equal imports give equal versions."""
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()[:VERSION_HEX_CHARS]


class JsonlCaptioner:
    """Looks each clip up among imported records by film and midpoint; loads everything once."""

    name = BACKEND_JSONL
    needs_frames = False

    def __init__(
        self, path: str | Path, film_paths: Optional[FilmPaths] = None, warn_unknown_films: bool = True
    ) -> None:
        files = caption_files(path)
        self.version = files_version(files)
        self._film_paths = film_paths
        self._by_film: dict[str, list[CaptionRecord]] = defaultdict(list)
        for file in files:
            for record in read_records(file):
                self._by_film[record.film].append(record)
        for records in self._by_film.values():
            records.sort(key=lambda r: r.start)  # stable: equal starts keep their reading order
        self._starts = {film: [r.start for r in records] for film, records in self._by_film.items()}
        total = sum(len(r) for r in self._by_film.values())
        logger.info("caption import: %d records for %d films from %d file(s), version %s",
                    total, len(self._by_film), len(files), self.version)
        unknown = self.unknown_films()
        if warn_unknown_films and unknown:
            logger.warning("caption records name films that are not among the inputs: %s (the inputs' film ids: %s; a "
                           "record may also name a film by its file name or path)", unknown, sorted(self._film_paths))

    def unknown_films(self) -> list[str]:
        """Film names of records that match no known film (id, path, file name or stem): almost always
        a typo in the film name. Empty when no films are known."""
        if not self._film_paths:
            return []
        known = {alias for film_id in self._film_paths for alias in film_aliases(film_id, self._film_paths)}
        return sorted(set(self._by_film) - known)

    def find_record(self, film_id: str, t: float) -> Optional[CaptionRecord]:
        """The covering record with the latest start among the film's aliases, or None."""
        best: Optional[CaptionRecord] = None
        for alias in film_aliases(film_id, self._film_paths):
            records = self._by_film.get(alias)
            if not records:
                continue
            # Records starting after t cannot cover it; walk back from the latest start <= t.
            for index in range(bisect.bisect_right(self._starts[alias], t) - 1, -1, -1):
                record = records[index]
                if record.covers(t):
                    if best is None or record.start >= best.start:
                        best = record
                    break
        return best

    def caption(self, ctx: ClipContext) -> CaptionResult:
        t = ctx.midpoint_s
        record = self.find_record(ctx.film_id, t)
        if record is None:
            reason = f"no caption record covers t={t:.2f}s of film {ctx.film_id!r}"
            return CaptionResult.failure(reason, self.name, self.version, attempts=1)
        logger.debug("clip %s: caption from %s", ctx.clip_key, record.source)
        return CaptionResult.success(record.caption, record.states, self.name, self.version, attempts=1)
