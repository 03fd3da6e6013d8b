"""``trainer.sync_debug``: the host's waits for the GPU counted by line, on every thread, other warnings kept."""
from __future__ import annotations

import json
import threading
import warnings
from types import SimpleNamespace

import pytest
import torch

from animegamer.training import sync_sites
from animegamer.training.sync_sites import SITES_FILE, SYNC_MESSAGE, SyncSites


def _sync_warning(line: int) -> None:
    """What PyTorch raises in sync debug mode, located at this file's ``line``."""
    warnings.warn_explicit(f"{SYNC_MESSAGE}", UserWarning, "model.py", line)


def _fake_cuda_trainer():
    return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)), is_global_zero=True)


def test_waits_are_counted_by_line_on_every_thread_and_other_warnings_pass(tmp_path, monkeypatch):
    modes = []
    monkeypatch.setattr(sync_sites.torch.cuda, "set_sync_debug_mode", modes.append)
    callback, trainer = SyncSites(tmp_path), _fake_cuda_trainer()
    callback.on_train_start(trainer, None)
    for step in range(2):
        with pytest.warns(DeprecationWarning, match="an unrelated warning") as shown:  # shown, not swallowed
            callback.on_train_batch_start(trainer, None, None, step)
            _sync_warning(10)
            _sync_warning(10)
            worker = threading.Thread(target=_sync_warning, args=(20,))  # backward's own thread on CUDA
            worker.start()
            worker.join()
            warnings.warn("an unrelated warning", DeprecationWarning)
            callback.on_train_batch_end(trainer, None, None, None, step)
        assert not any(SYNC_MESSAGE in str(w.message) for w in shown)  # the waits are counted, not shown
    callback.on_train_end(trainer, None)
    assert modes == ["warn", 0, "warn", 0]  # on for the steps only
    written = json.loads((tmp_path / SITES_FILE).read_text())
    assert written == {"steps": 2, "waits_per_step": 3.0, "per_step_by_site": {"model.py:10": 2.0, "model.py:20": 1.0}}


def test_a_failed_step_turns_the_mode_off(tmp_path, monkeypatch):
    modes = []
    monkeypatch.setattr(sync_sites.torch.cuda, "set_sync_debug_mode", modes.append)
    callback, trainer = SyncSites(tmp_path), _fake_cuda_trainer()
    callback.on_train_start(trainer, None)
    callback.on_train_batch_start(trainer, None, None, 0)
    callback.on_exception(trainer, None, RuntimeError("boom"))
    assert modes == ["warn", 0]
    assert not (tmp_path / SITES_FILE).exists()


def test_a_cpu_run_counts_nothing_and_says_so(tmp_path, caplog):
    import logging

    callback = SyncSites(tmp_path)
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cpu")), is_global_zero=True)
    with caplog.at_level(logging.INFO, logger=sync_sites.__name__):
        callback.on_train_start(trainer, None)
        callback.on_train_batch_start(trainer, None, None, 0)
        callback.on_train_batch_end(trainer, None, None, None, 0)
        callback.on_train_end(trainer, None)
    assert "nothing is counted" in caplog.text
    assert not (tmp_path / SITES_FILE).exists()
