"""One run per folder: an exclusive lock file held for the life of a run.

``<folder>/.lock`` is a small json record of its holder (pid, host, the process's start time, since
when, the command). It appears atomically with its whole record (written under a unique name, then
hard-linked to the lock's name, which fails when the lock exists) and is removed when the run ends,
whatever the way out (normal end, exception, ``SystemExit`` of a preemption). A run killed outright
(SIGKILL, a node crash) leaves it behind, stale:

* on the same host the holder's pid is checked (with its start time, so a reused pid is not taken
  for the holder): a lock of a dead process is taken over at once, with a warning;
* on another host the pid cannot be checked. The holder touches the lock every
  :data:`HEARTBEAT_SECONDS` (a daemon thread); a waiter that sees the lock unchanged for
  :data:`STALE_AFTER_SECONDS` of its own waiting (its own clock: no clock is compared across hosts)
  takes it over, with a warning. A wait shorter than that never takes over another host's lock.

A start into a locked folder polls for up to ``wait_seconds`` (0: refuse at once), then raises
:class:`FolderLockedError` naming the holder. The lock is only as good as the filesystem: every
process that can write into the folder must see the same files (a local folder, or a network
filesystem shared by the nodes). Machines that share a folder by design (the pipeline's
``num_parts``) each take their own part's lock (:func:`part_lock_name`).
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from animegamer.errors import UserError
from animegamer.utils.command import recorded_command
from animegamer.utils.io import read_json

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
HEARTBEAT_SECONDS = 10.0
STALE_AFTER_SECONDS = 60.0  # six missed heartbeats
POLL_SECONDS = 1.0
_PROC_STAT = "/proc/{pid}/stat"
_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)
_STAT_START_FIELD = 19  # starttime, counted after the ")" that ends the command name (field 22 of proc(5))
_STAT_STATE_FIELD = 0  # the state letter, the first field after the ")" (field 3 of proc(5))
_DEAD_STATES = ("Z", "X")  # zombie, dead: exited, whatever is left of them is only waiting to be reaped


def _proc_stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (the state first), None where not available."""
    try:
        stat = Path(_PROC_STAT.format(pid=pid)).read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def process_start(pid: int) -> str | None:
    """The process's start time (clock ticks since boot) from /proc, None where not available."""
    fields = _proc_stat_fields(pid)
    return None if fields is None else fields[_STAT_START_FIELD]


def pid_alive(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` of this host runs and is the one that started at ``start`` (when known). A
    zombie (killed, not yet reaped by its parent) runs no more: its lock is free at once."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    fields = _proc_stat_fields(pid)
    if fields is None:
        return True  # no /proc: the signal's answer is all there is
    if fields[_STAT_STATE_FIELD] in _DEAD_STATES:
        return False
    return start is None or fields[_STAT_START_FIELD] == start


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its record says."""

    pid: int
    host: str
    since: str
    command: str
    token: str
    start: str | None = None

    @classmethod
    def me(cls) -> "Holder":
        return cls(pid=os.getpid(), host=socket.gethostname(), since=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   command=recorded_command(), token=uuid.uuid4().hex, start=process_start(os.getpid()))

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host} since {self.since}, command: {self.command}"

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()


class FolderLockedError(UserError):
    """Another run holds the folder's lock (and kept it for the whole wait)."""

    def __init__(self, path: Path, holder: Holder | None, waited: float, stale_after: float) -> None:
        who = holder.describe() if holder else "a holder whose record cannot be read"
        remote = ("" if holder is None or holder.on_this_host() else
                  f"; its process cannot be checked from this host: a lock that stays unchanged for "
                  f"{stale_after:g} s of waiting is taken over (lock_wait_seconds >= {stale_after:g})")
        super().__init__(f"{path.parent} is in use by another run ({who}); waited {waited:.1f} s (lock_wait_seconds)"
                         f"{remote}. Wait for that run to end, or use another folder; if that run is certainly no "
                         f"longer running, delete {path} and start again.")


def read_holder(path: Path) -> Holder | None:
    """The lock's holder, None when the file is gone or not a lock record."""
    try:
        data = read_json(path)
        return Holder(**data)
    except (OSError, ValueError, TypeError):
        return None


def _create(path: Path, holder: Holder) -> bool:
    """Make the lock with ``holder``'s whole record in one step; False when it exists."""
    temp = path.with_name(f"{path.name}.{holder.token}")
    temp.write_text(json.dumps(holder.__dict__))
    try:
        os.link(temp, path)
        return True
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno not in _NO_HARD_LINKS:
            raise
        return _create_exclusive(path, holder)  # a filesystem without hard links
    finally:
        temp.unlink()


def _create_exclusive(path: Path, holder: Holder) -> bool:
    """O_CREAT|O_EXCL, then the record (a reader may see it empty for a moment: it waits, as for any holder)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as file:
        file.write(json.dumps(holder.__dict__))
    return True


def _remove_if_held_by(path: Path, token: str) -> bool:
    """Remove the lock when ``token`` holds it. Moved aside first, so a lock made in the meantime by
    another process is put back instead of removed."""
    aside = path.with_name(f"{path.name}.removing-{uuid.uuid4().hex}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    found = read_holder(aside)
    if found is None or found.token != token:
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
        aside.unlink()
        return False
    aside.unlink()
    return True


class _Heartbeat:
    """Touches the lock file every ``every`` seconds, so that waiters on other hosts see it alive."""

    def __init__(self, path: Path, every: float) -> None:
        self.path, self.every = path, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="folder-lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def part_lock_name(part: int, num_parts: int) -> str:
    """The lock of one of ``num_parts`` machines that share an output folder by design (each its own part)."""
    return LOCK_FILE if num_parts <= 1 else f"{LOCK_FILE}.part-{part}-of-{num_parts}"


def acquire(path: Path, wait_seconds: float, poll: float = POLL_SECONDS,
            stale_after: float = STALE_AFTER_SECONDS) -> Holder:
    """Take the lock file ``path`` (its folder exists), waiting up to ``wait_seconds`` for its holder to
    go; raises :class:`FolderLockedError` naming the holder. Returns this process's record."""
    if wait_seconds < 0:
        raise UserError(f"lock_wait_seconds must be >= 0, got {wait_seconds}")
    me = Holder.me()
    started = time.monotonic()
    seen_mtime, unchanged_since = None, started
    told = False
    while True:
        if _create(path, me):
            return me
        holder, mtime = read_holder(path), _mtime(path)
        now = time.monotonic()
        if mtime != seen_mtime:
            seen_mtime, unchanged_since = mtime, now
        if holder is not None and _stale(holder, now - unchanged_since, stale_after):
            if _remove_if_held_by(path, holder.token):
                log.warning("%s: took over the lock of a run that is no longer running (%s)", path, holder.describe())
            continue
        waited = now - started
        if waited >= wait_seconds:
            raise FolderLockedError(path, holder, waited, stale_after)
        if not told:
            log.warning("%s is locked by another run (%s); waiting up to %.0f s for it to end", path.parent,
                        holder.describe() if holder else "record not readable yet", wait_seconds)
            told = True
        time.sleep(min(poll, max(wait_seconds - waited, 0.0)))


def _stale(holder: Holder, unchanged_for: float, stale_after: float) -> bool:
    """A holder of this host whose process is gone; one of another host whose lock has not been
    touched for ``stale_after`` seconds of this process's waiting."""
    if holder.on_this_host():
        return not pid_alive(holder.pid, holder.start)
    return unchanged_for >= stale_after


def release(path: Path, holder: Holder) -> None:
    """Remove the lock ``path`` if ``holder`` still holds it (a lock taken over by another is left alone)."""
    if not _remove_if_held_by(path, holder.token):
        log.warning("%s: the lock was no longer this run's at its end (taken over by another run?)", path)


@contextlib.contextmanager
def folder_lock(folder: str | Path, wait_seconds: float, enabled: bool = True, name: str = LOCK_FILE,
                heartbeat: float = HEARTBEAT_SECONDS) -> Iterator[Holder | None]:
    """Hold ``folder``'s lock ``name`` for the ``with`` body (released on every way out); ``enabled=False``
    (e.g. ranks other than global rank 0) does nothing."""
    if not enabled:
        yield None
        return
    path = Path(folder) / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # nothing can be written there either: the run's own checks say why
        log.debug("%s not locked: %s", path, error)
        yield None
        return
    holder = acquire(path, wait_seconds)
    beat = _Heartbeat(path, heartbeat)
    try:
        yield holder
    finally:
        beat.stop()
        release(path, holder)
