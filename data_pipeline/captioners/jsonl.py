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

A malformed file is a configuration error: loading raises :class:`CaptionFileError` naming every bad line
as ``file:line: reason`` (not only the first). Loading for the run (the pipeline's pre-flight, which knows
every film) also warns about the import's coverage: records naming no input film, input films that no
record names, and records of one film whose spans overlap (both lines named; the rule above decides).
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
LISTED_BAD_LINES = 100  # bad lines an error names one by one; the rest are counted
LISTED_OVERLAPS = 20  # overlapping pairs the warning names one by one; the rest are counted
# How a caption record names its film, for the messages about films no record names.
FILM_NAMING = "a record names a film by its id, path, file name or file stem"


class CaptionFileError(ValueError):
    """Bad lines of caption import files; ``problems`` holds one ``file:line: reason`` per bad line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{len(problems)} bad line(s) in the caption import:\n" + "\n".join(
            f"  {problem}" for problem in listed(problems, LISTED_BAD_LINES, "bad lines")))

    def __reduce__(self):  # raised in a pipeline worker, it reaches the parent process whole
        return type(self), (self.problems,)


def listed(items: list[str], limit: int, what: str) -> list[str]:
    """``items`` up to ``limit`` of them, then one entry counting the rest."""
    return items if len(items) <= limit else [*items[:limit], f"... and {len(items) - limit} more {what}"]


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
        raise FileNotFoundError(f"caption path {path} does not exist")
    return [path]


def parse_line(raw: bytes, source: str) -> CaptionRecord | None:
    """One line of an import file (None: blank); a bad line raises ValueError with its reason."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})") from None
    line = line.rstrip("\r\n")  # a line cut short would be reported at the column of what follows it
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise ValueError("invalid JSON: arrays or objects nested too deeply to read") from None
    return parse_record(data, source)


def read_file_records(file: Path) -> tuple[list[CaptionRecord], list[str]]:
    """The records of one file and its bad lines, each ``"file:line: reason"``."""
    records, problems = [], []
    with open(file, "rb") as handle:  # bytes: a line that is not UTF-8 is named, not the whole file
        for line_no, raw in enumerate(handle, start=1):
            source = f"{file}:{line_no}"
            try:
                record = parse_line(raw, source)
            except (ValueError, TypeError, RecursionError) as exc:
                problems.append(f"{source}: {exc}")
                continue
            if record is not None:
                records.append(record)
    return records, problems


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
        """``warn_unknown_films``: warn about the import's coverage of ``film_paths`` (records naming
        none of them, films no record names, overlapping records); off where only some films are known
        (a worker), so that a run warns once."""
        files = caption_files(path)
        self.version = files_version(files)
        self._film_paths = film_paths
        self._by_film: dict[str, list[CaptionRecord]] = defaultdict(list)
        problems: list[str] = []
        for file in files:
            records, bad = read_file_records(file)
            problems += bad
            for record in records:
                self._by_film[record.film].append(record)
        if problems:
            raise CaptionFileError(problems)
        for records in self._by_film.values():
            records.sort(key=lambda r: r.start)  # stable: equal starts keep their reading order
        self._starts = {film: [r.start for r in records] for film, records in self._by_film.items()}
        total = sum(len(r) for r in self._by_film.values())
        logger.info("caption import: %d records for %d films from %d file(s), version %s",
                    total, len(self._by_film), len(files), self.version)
        if warn_unknown_films:
            self.warn_coverage()

    def warn_coverage(self) -> None:
        """Warn about records naming no input film, input films without a record (each film once: its
        clips will all fail to caption), and records of one film whose spans overlap."""
        unknown = self.unknown_films()
        if unknown:
            logger.warning("caption records name films that are not among the inputs: %s (the inputs' film ids: %s; a "
                           "record may also name a film by its file name or path)", unknown, sorted(self._film_paths))
        for film_id in self.films_without_records():
            logger.warning("film %r (%s) has no caption record: none of its clips will be captioned (%s)", film_id,
                           self._film_paths[film_id], FILM_NAMING)
        overlaps = self.overlaps()
        if overlaps:
            logger.warning("caption records of one film overlap (where they do, a clip takes the record with the later "
                           "start): %s", "; ".join(listed(overlaps, LISTED_OVERLAPS, "overlaps")))

    def films_without_records(self) -> list[str]:
        """Input films (ids) that no record names by any of their aliases."""
        return [film_id for film_id in sorted(self._film_paths or {})
                if not any(self._by_film.get(alias) for alias in film_aliases(film_id, self._film_paths))]

    def overlaps(self) -> list[str]:
        """Each record whose span starts inside an earlier-starting record of the same film (its aliases
        counted as one film), named with that record: ``"a:3 [5.00, 8.00) overlaps a:1 [0.00, 10.00)"``."""
        known = {alias: film_id for film_id in self._film_paths or {}
                 for alias in film_aliases(film_id, self._film_paths)}
        films: dict[str, list[CaptionRecord]] = defaultdict(list)
        for name, records in self._by_film.items():
            films[known.get(name, name)] += records
        found = []
        for records in films.values():
            reach: Optional[CaptionRecord] = None  # the record reaching furthest among those started so far
            for record in sorted(records, key=lambda r: r.start):
                if reach is not None and reach.end > record.start:
                    found.append(f"{record.source} [{record.start:.2f}, {record.end:.2f}) overlaps "
                                 f"{reach.source} [{reach.start:.2f}, {reach.end:.2f})")
                if reach is None or record.end > reach.end:
                    reach = record
        return found

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
