"""Checkpoint integrity, full disks and ``checkpoint.keep_last`` (issue 17, points 2, 3 and 5).

A damaged newest checkpoint (cut short, or one bit flipped) is set aside and the run resumes from the
newest intact one to the uninterrupted run's result; a pickled payload whose record matches is still
refused as unsafe; a disk that fills during a save stops with a message naming the file and keeps
every earlier checkpoint; every save (periodic, final, preemption) leaves at most ``keep_last``.
Tiny phase (a) runs in this process, on CPU.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import signal
from pathlib import Path

import lightning as L
import pytest
import torch

from phase_a_helpers import tiny_train_cfg, write_synthetic_features
from test_safe_loading import evil_checkpoint, marker  # noqa: F401 - the fixture checks the payload never ran

from animegamer.training import checkpointing, runner
from animegamer.training.checkpoint_integrity import record_path, write_file_record
from animegamer.training.checkpointing import (DiskFullError, AtomicCheckpointIO, checkpoint_name,
                                               resume_checkpoint)
from animegamer.training.faults import LOSS_HISTORY, PREEMPTED_EXIT_CODE

RUN = ("phase=a_joint", "logger=none", "phase.max_steps=6", "checkpoint.every_n_steps=2")


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> Path:
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config

    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    return write_synthetic_features(tmp_path_factory.mktemp("integrity_data") / "features", enc)


def train(features: Path, output: Path, *overrides: str) -> dict:
    composed, cfg = tiny_train_cfg(features, output, *RUN, *overrides)
    return runner.train(cfg, composed)


def result(output: Path) -> tuple[bytes, bytes]:
    return (output / LOSS_HISTORY).read_bytes(), (output / "export" / "trained.safetensors").read_bytes()


def checkpoint_files(output: Path) -> list[str]:
    return sorted(p.name for p in (output / "checkpoints").iterdir())


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # in the tensors' bytes: the file still loads, with other numbers
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, flip_bit], ids=["truncated", "bit_flipped"])
def test_damaged_newest_checkpoint_is_set_aside_and_the_resume_matches_an_uninterrupted_run(
        damage, features, tmp_path, caplog):
    output = tmp_path / "run"
    train(features, output, "checkpoint.keep_last=-1")
    uninterrupted = result(output)
    newest = output / "checkpoints" / checkpoint_name(6)
    damage(newest)
    damaged_bytes = newest.read_bytes()
    (output / LOSS_HISTORY).unlink()
    (output / "export" / "trained.safetensors").unlink()

    with caplog.at_level(logging.WARNING, logger="animegamer.training.checkpointing"):
        assert train(features, output, "checkpoint.keep_last=-1")["step"] == 6
    assert f"checkpoint {newest} is damaged" in caplog.text
    assert "steps 5..6 (2 steps) are trained again" in caplog.text
    aside = newest.with_name(newest.name + ".damaged")
    assert aside.read_bytes() == damaged_bytes  # renamed, never deleted
    assert record_path(aside).is_file()
    assert result(output) == uninterrupted  # loss history and export, byte for byte
    assert resume_checkpoint(output / "checkpoints") == newest  # the re-trained step 6, intact


def test_a_pickled_payload_with_a_matching_record_is_still_refused_as_unsafe(tmp_path, marker):  # noqa: F811
    from animegamer.training.safe_io import UnsafeCheckpointError, ensure_weights_only

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    older = folder / checkpoint_name(2)
    torch.save({"global_step": 2}, older)
    evil = evil_checkpoint(folder / checkpoint_name(4), marker)
    write_file_record(evil, evil)  # its record matches: it is not damaged
    assert resume_checkpoint(folder) == evil
    with pytest.raises(UnsafeCheckpointError, match="refused: it does not load as weights only"):
        ensure_weights_only(evil)
    assert evil.is_file() and not list(folder.glob("*.damaged"))


def test_a_disk_that_fills_during_a_save_names_the_file_and_keeps_every_earlier_checkpoint(
        features, tmp_path, monkeypatch):
    save, saves = torch.save, []

    def filling_save(obj, f, *args, **kwargs):
        if str(getattr(f, "name", "")).endswith(checkpointing.PARTIAL):
            saves.append(f.name)
            if len(saves) == 2:  # the step-4 save: half written, then the disk is full
                f.write(b"x" * 1000)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", filling_save)
    output = tmp_path / "run"
    with pytest.raises(DiskFullError) as error:
        train(features, output, "checkpoint.keep_last=-1")
    folder = output / "checkpoints"
    assert str(error.value).startswith(f"checkpoint {folder / checkpoint_name(4)} does not fit: "
                                       "the disk filled up during the write, ")
    assert "bytes are free on its disk" in str(error.value)
    assert checkpoint_files(output) == [checkpoint_name(2), checkpoint_name(2) + ".integrity.json"]
    assert resume_checkpoint(folder) == folder / checkpoint_name(2)
    assert torch.load(folder / checkpoint_name(2), weights_only=True)["global_step"] == 2


def test_a_save_that_does_not_fit_is_refused_before_writing(tmp_path, monkeypatch):
    path = tmp_path / checkpoint_name(2)
    state = {"state_dict": {"w": torch.zeros(1000)}}  # 4,000 bytes; 4,200 with the margin
    usage = checkpointing.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda _: usage._replace(free=4000))
    with pytest.raises(DiskFullError, match=f"checkpoint {path} does not fit: about 4,200 bytes are needed, "
                                            "4,000 bytes are free"):
        AtomicCheckpointIO().save_checkpoint(state, path)
    assert not list(tmp_path.iterdir())


def test_keep_last_holds_after_the_final_save(features, tmp_path):
    output = tmp_path / "run"
    train(features, output, "phase.max_steps=5", "checkpoint.keep_last=1")  # saves at 2, 4, then the final 5
    assert checkpoint_files(output) == [checkpoint_name(5), checkpoint_name(5) + ".integrity.json"]


class Preempt(L.Callback):
    """SIGTERM to this process during step 3 (after the step-2 save)."""

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)


def test_keep_last_holds_after_a_preemption_save(features, tmp_path, monkeypatch):
    make_trainer = runner.make_trainer
    monkeypatch.setattr(runner, "make_trainer", lambda cfg, callbacks: make_trainer(cfg, [*callbacks, Preempt()]))
    handler = signal.getsignal(signal.SIGTERM)
    output = tmp_path / "run"
    try:
        with pytest.raises(SystemExit) as stop:
            train(features, output, "checkpoint.keep_last=1")
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert stop.value.code == PREEMPTED_EXIT_CODE
    assert checkpoint_files(output) == [checkpoint_name(3), checkpoint_name(3) + ".integrity.json"]
    record = json.loads(record_path(output / "checkpoints" / checkpoint_name(3)).read_text())
    assert record["files"]["."]["size"] == (output / "checkpoints" / checkpoint_name(3)).stat().st_size


def test_deepspeed_folders_are_recorded_by_size_checked_and_pruned_like_files(tmp_path):
    from animegamer.training.checkpoint_integrity import write_folder_record
    from animegamer.training.checkpointing import prune_checkpoints

    folder = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        checkpoint = folder / checkpoint_name(step)
        (checkpoint / "checkpoint").mkdir(parents=True)
        (checkpoint / "checkpoint" / "mp_rank_00_model_states.pt").write_bytes(b"w" * 100)
        (checkpoint / "latest").write_text("checkpoint")
        write_folder_record(checkpoint)
    shard = folder / checkpoint_name(6) / "checkpoint" / "mp_rank_00_model_states.pt"
    shard.write_bytes(b"w" * 50)  # cut short after the save
    assert resume_checkpoint(folder) == folder / checkpoint_name(4)
    assert (folder / (checkpoint_name(6) + ".damaged") / "checkpoint" / "mp_rank_00_model_states.pt").is_file()
    assert prune_checkpoints(folder, 1, folder / checkpoint_name(4)) == [folder / checkpoint_name(2)]
    assert checkpoint_files(tmp_path) == [checkpoint_name(4), checkpoint_name(4) + ".integrity.json",
                                          checkpoint_name(6) + ".damaged",
                                          checkpoint_name(6) + ".damaged.integrity.json"]
