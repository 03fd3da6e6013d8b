"""CPU threads per process: each process's share of the usable cores, no more than the load leaves free."""
from __future__ import annotations

import os

import pytest
import torch

from animegamer.utils import threads
from animegamer.utils.threads import THREAD_ENV, asked_threads, threads_for
from data_pipeline.run import _map


@pytest.mark.parametrize("cores, processes, load, expected", [
    (2, 1, 0.0, 2),    # an idle machine: every usable core
    (2, 2, 0.0, 1),    # two pipeline workers on two cores: one thread each, not two
    (16, 4, 0.0, 4),
    (16, 3, 0.0, 5),   # the share rounds down: 3 x 5 threads on 16 cores
    (1, 4, 0.0, 1),    # never below one thread
    (2, 1, 2.3, 1),    # two cores another run keeps busy: one thread
    (2, 1, 1.9, 1),
    (2, 1, 0.9, 2),    # less than one core busy: both cores
    (16, 1, 10.5, 6),  # the cores the load leaves
    (16, 2, 9.0, 7),   # the load leaves fewer than the share
    (16, 2, 3.0, 8),   # the share is fewer than the load leaves
    (8, 0, 0.0, 8),    # no process count (a config's 0 or -1 devices): one process
])
def test_threads_for_shares_cores_among_processes_and_load(cores, processes, load, expected):
    assert threads_for(cores, processes, load) == expected


@pytest.mark.parametrize("value, expected", [("3", 3), (" 2 ", 2), ("", None), ("0", None), ("-1", None),
                                             ("auto", None), ("1.5", None)])
def test_asked_threads(value, expected):
    assert asked_threads(value) == expected


@pytest.fixture
def restore_threads(monkeypatch):
    """The test process's own thread settings back after the test."""
    before = torch.get_num_threads()
    for name in THREAD_ENV:
        monkeypatch.setenv(name, os.environ.get(name, "0"))
    yield monkeypatch
    torch.set_num_threads(before)


def _threads_seen(_job: int) -> tuple[int, str]:
    return torch.get_num_threads(), os.environ[THREAD_ENV[0]]


def test_use_threads_applies_the_share_of_affinity_and_load(restore_threads):
    monkeypatch = restore_threads
    monkeypatch.setattr(threads, "_ASKED", "")
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert threads.use_threads(2) == 2
    assert torch.get_num_threads() == 2
    assert [os.environ[name] for name in THREAD_ENV] == ["2"] * len(THREAD_ENV)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (3.2, 1.0, 1.0))  # three of four cores busy
    assert threads.use_threads(1) == 1
    assert torch.get_num_threads() == 1
    monkeypatch.setattr(threads, "_ASKED", "3")  # the user's OMP_NUM_THREADS wins over the share
    assert threads.use_threads(2) == 3
    assert torch.get_num_threads() == 3


def test_pipeline_jobs_run_with_the_share(restore_threads):
    """The pipeline's job runner sets the threads before its jobs start: on 4 free cores a lone job takes 4;
    a pool of 3 workers hands each spawned worker 4 // 3 = 1 through the environment they start with."""
    monkeypatch = restore_threads
    monkeypatch.setattr(threads, "_ASKED", "")
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(4)))
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert _map(_threads_seen, [(0,)], workers=3, desc="test") == [(4, "4")]
    started = {}

    class Pool:  # records the environment a spawned worker would start with, runs nothing in another process
        def __init__(self, workers, **kwargs):
            started["env"] = os.environ[THREAD_ENV[0]]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *args):
            from concurrent.futures import Future

            future = Future()
            future.set_result(fn(*args))
            return future

    monkeypatch.setattr("data_pipeline.run.ProcessPoolExecutor", Pool)
    _map(_threads_seen, [(0,), (1,)], workers=3, desc="test")
    assert started["env"] == "1"
