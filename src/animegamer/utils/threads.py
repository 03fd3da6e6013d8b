"""CPU threads per process: the cores this process may run on, shared by the processes working at once.

torch, OpenMP/BLAS and OpenCV each default to one thread per core of the machine. Several worker
processes that each take every core (or one process on cores other work already uses) oversubscribe
them: OpenMP threads then spin waiting for each other and the run slows down far more than the extra
threads could gain (a small model's step many times over). Each process that starts work takes its share
of the cores among the processes it works beside, and no more than the cores the machine's load leaves.
An ``OMP_NUM_THREADS`` the process was started with is the user's own choice and is kept.
"""
from __future__ import annotations

import logging
import math
import os

import cv2
import torch

log = logging.getLogger(__name__)

# Read at their library's start: set for the processes this one spawns, which start their libraries afresh.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENCV_FOR_THREADS_NUM")
USER_THREADS_ENV = THREAD_ENV[0]
# Read once, before this module sets it for the processes it spawns.
_ASKED = os.environ.get(USER_THREADS_ENV, "")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or ``taskset`` narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without affinity: every core
        return os.cpu_count() or 1


def threads_for(cores: int, processes: int = 1, load: float = 0.0) -> int:
    """Threads for each of ``processes`` processes working at once on ``cores`` cores, of which the
    run-queue ``load`` (processes running or waiting, averaged over the last minute) keeps its whole
    part busy: at least one."""
    free = cores - math.floor(max(0.0, load))
    return max(1, min(cores // max(1, processes), free))


def machine_load() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def apply_threads(count: int) -> int:
    """Use ``count`` threads in this process (torch intra- and inter-op, OpenCV) and in the processes it
    spawns (their OpenMP/BLAS start with it). Returns ``count``."""
    for name in THREAD_ENV:
        os.environ[name] = str(count)
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    try:
        torch.set_num_interop_threads(count)
    except RuntimeError:  # fixed once this process ran inter-op work; the intra-op count above still holds
        log.debug("torch inter-op threads already started (%d); kept", torch.get_num_interop_threads())
    cv2.setNumThreads(count)
    log.info("CPU threads: %d (%d usable cores, load %.1f)", count, usable_cores(), machine_load())
    return count


def asked_threads(value: str) -> int | None:
    """The thread count a user's ``OMP_NUM_THREADS`` asks for; None where it is unset or not a count."""
    return int(value) if value.strip().isdigit() and int(value) > 0 else None


def use_threads(processes: int = 1, kept: int | None = None) -> int:
    """The hook of each entry point that starts work: the count the user asked for, else ``kept`` (the count
    an interrupted run used: a CPU run's float sums depend on it), else this process's share of the usable
    cores (:func:`threads_for`), applied."""
    asked = asked_threads(_ASKED)
    if asked and kept and asked != kept:
        log.warning("%s=%d where the run started with %d CPU threads: the resumed steps may differ in the last "
                    "bits from an uninterrupted run's", USER_THREADS_ENV, asked, kept)
    return apply_threads(asked or kept or threads_for(usable_cores(), processes, machine_load()))
