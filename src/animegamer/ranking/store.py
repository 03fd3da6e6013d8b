"""``answers.jsonl``: every choice of every rater, one line each, shared by every process that serves or
reports the same ``--out`` folder.

A choice is one line (rater, game, dimension, run, rank or null to clear it), appended and fsynced
before the page is told it is saved; the current answers are the latest line for each (rater, game,
dimension, run). Every read and write of the folder's answers, session and report happens under an
exclusive ``flock`` of the folder's lock file, after the store has read the lines other processes
appended since its last look: two servers on one folder (or a ``--report-only`` beside a server) each
see every answer, and the report written last holds them all. The kernel drops the lock of a process
that dies, so a crash never leaves the folder locked.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterator, Mapping

from animegamer.errors import InvalidInputError

log = logging.getLogger(__name__)

ANSWERS_FILE = "answers.jsonl"
LOCK_FILE = ".answers.lock"  # beside the answers; only ever flock'ed, never written
ANSWER_FIELDS = ("rater", "game", "dimension", "run")  # with "rank"; a line also keeps its "time"

State = dict[tuple[str, str, str], dict[str, int]]  # (rater, game, dimension) -> run -> rank


@contextlib.contextmanager
def folder_flock(lock: Path) -> Iterator[None]:
    """An exclusive ``flock`` of the file ``lock`` (made if missing) for the body: one holder at a time,
    across threads (each opens its own descriptor) and processes."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def valid_answer(record: Any, runs: int) -> bool:
    if not isinstance(record, dict):
        return False
    rank = record.get("rank")
    return (all(isinstance(record.get(k), str) for k in ANSWER_FIELDS)
            and (rank is None or (isinstance(rank, int) and not isinstance(rank, bool) and 1 <= rank <= runs)))


class AnswerStore:
    """The answers of one folder for ``runs`` runs, kept up to date with every process's appends."""

    def __init__(self, path: Path, runs: int) -> None:
        self.path = Path(path)
        self.runs = runs
        self.lock_path = self.path.with_name(LOCK_FILE)
        self._thread_lock = threading.Lock()  # one descriptor per holder: the flock alone would not nest
        self._state: State = {}
        self._offset = 0  # bytes of the file already applied to the state
        self.lines = 0
        with self.locked():
            pass

    @contextlib.contextmanager
    def locked(self) -> Iterator[State]:
        """The current answers (every line any process has appended), held exclusively for the body: no
        other thread or process appends meanwhile. Not reentrant."""
        with self._thread_lock, folder_flock(self.lock_path):
            self._catch_up()
            yield self._state

    def _catch_up(self) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < self._offset:
            log.warning("%s: shorter than the %d bytes already read (replaced or cut by hand?): read again from "
                        "its start", self.path, self._offset)
            self._state, self._offset, self.lines = {}, 0, 0
        if size == self._offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            # Every line is written whole under the lock: a part line here was cut by a crash of its writer,
            # which never told the page it was saved. Dropped, so that the next line starts on a line of its own.
            log.warning("%s: dropping an incomplete last line (%d bytes) left by an interrupted write",
                        self.path, len(data) - complete)
            with open(self.path, "r+b") as f:
                f.truncate(self._offset + complete)
                os.fsync(f.fileno())
        for raw in data[:complete].splitlines(keepends=True):
            number = self.lines + 1
            try:
                record = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError) as error:
                raise InvalidInputError(f"{self.path}:{number}: not a JSON answer ({error}); "
                                        "fix or remove that line") from error
            if not valid_answer(record, self.runs):
                raise InvalidInputError(f"{self.path}:{number}: not an answer for {self.runs} runs: "
                                        f"{raw[:200].decode('utf-8', 'replace').strip()}")
            self._apply(record)
            self.lines = number
            self._offset += len(raw)

    def _apply(self, record: Mapping) -> None:
        ranks = self._state.setdefault((record["rater"], record["game"], record["dimension"]), {})
        if record["rank"] is None:
            ranks.pop(record["run"], None)
        else:
            ranks[record["run"]] = record["rank"]

    def append(self, record: dict) -> None:
        """Write ``record`` durably, then apply it: when this returns, the answer survives a crash."""
        if not valid_answer(record, self.runs):
            raise ValueError(f"not an answer for {self.runs} runs: {record}")
        line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        with self.locked():
            new = not self.path.exists()
            with open(self.path, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            if new:  # the file's name is durable only once its folder is synced
                folder = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
            self._apply(record)
            self.lines += 1
            self._offset += len(line)

    def snapshot(self) -> State:
        """A copy of the current answers."""
        with self.locked() as state:
            return {key: dict(ranks) for key, ranks in state.items()}
