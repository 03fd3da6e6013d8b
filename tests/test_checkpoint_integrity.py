"""Checkpoint integrity, full disks and ``checkpoint.keep_last`` (issue 17, points 2, 3 and 5).

A damaged newest checkpoint (cut short, or one bit flipped) is set aside and the run resumes from the
newest intact one to the uninterrupted run's result, in phases a_joint, b and c; a pickled payload
whose record matches is still refused as unsafe; a disk that fills during a save stops with a message
naming the file and keeps every earlier checkpoint; every save (periodic, final, preemption) leaves at
most ``keep_last``. Tiny runs in this process, on CPU.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from phase_a_helpers import tiny_train_cfg, write_synthetic_features
from phase_b_helpers import tiny_b_cfg, write_synthetic_sessions
from phase_c_helpers import write_synthetic_adaptation
from test_safe_loading import evil_checkpoint, marker  # noqa: F401 - the fixture checks the payload never ran

from animegamer.config.compose import compose_config
from animegamer.phases import run as runner
from animegamer.training import checkpointing
from animegamer.training.checkpoint_integrity import record_path, write_file_record
from animegamer.training.checkpointing import (DiskFullError, AtomicCheckpointIO, checkpoint_name,
                                               resume_checkpoint)
from animegamer.training.faults import LOSS_HISTORY, PREEMPTED_EXIT_CODE

STEPS, EVERY = 6, 2  # checkpoints at 2, 4 and 6: the newest damaged, steps 5..6 are trained again
RUN = ("logger=none", f"phase.max_steps={STEPS}", f"checkpoint.every_n_steps={EVERY}")


def tiny_c_cfg(data_root: Path, output: Path, *overrides: str):
    """Tiny phase (c) config over ``data_root``, with phase (a)'s and (b)'s step settings."""
    composed = compose_config("train", [
        "model=tiny", "phase=c", "trainer=cpu", f"data.root={data_root}", f"output_dir={output}",
        "phase.warmup_steps=2", "phase.lr=1e-3", "phase.batch_size=2", "phase.val_every_n_steps=1000",
        "data.val_fraction=0.2", *overrides,
    ])
    return composed, OmegaConf.to_object(composed)


PHASES = {  # phase -> (its tiny config, the fixture with its data)
    "a_joint": (lambda root, output, *overrides: tiny_train_cfg(root, output, "phase=a_joint", *overrides),
                "features"),
    "b": (tiny_b_cfg, "sessions"),
    "c": (tiny_c_cfg, "adaptation"),
}


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> Path:
    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    return write_synthetic_features(tmp_path_factory.mktemp("integrity_data") / "features", enc)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> Path:
    return write_synthetic_sessions(tmp_path_factory.mktemp("integrity_sessions") / "sessions")


@pytest.fixture(scope="module")
def adaptation(tmp_path_factory) -> Path:
    return write_synthetic_adaptation(tmp_path_factory.mktemp("integrity_adaptation") / "adaptation")


def train_phase(phase: str, data: Path, output: Path, *overrides: str) -> dict:
    composed, cfg = PHASES[phase][0](data, output, *RUN, *overrides)
    return runner.train(cfg, composed)


def train(features: Path, output: Path, *overrides: str) -> dict:
    return train_phase("a_joint", features, output, *overrides)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """``get(phase, data)``: (run folder, untouched copy of it) of the phase's uninterrupted run, which
    saves at 2, 4 and 6; trained once for both kinds of damage. A test restores the run folder from the
    copy, so the restart happens in the folder the checkpoints were written to, as it does for real
    (Lightning's checkpoint state names that folder)."""
    runs: dict[str, tuple[Path, Path]] = {}

    def get(phase: str, data: Path) -> tuple[Path, Path]:
        if phase not in runs:
            root = tmp_path_factory.mktemp(f"uninterrupted_{phase}")
            train_phase(phase, data, root / "run", "checkpoint.keep_last=-1")
            shutil.copytree(root / "run", root / "untouched")
            runs[phase] = root / "run", root / "untouched"
        return runs[phase]

    return get


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
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_damaged_newest_checkpoint_is_set_aside_and_the_resume_matches_an_uninterrupted_run(
        phase, damage, request, uninterrupted, caplog):
    data = request.getfixturevalue(PHASES[phase][1])
    output, untouched = uninterrupted(phase, data)
    shutil.rmtree(output)  # what an earlier test of this phase left
    shutil.copytree(untouched, output)
    expected = result(untouched)
    assert len(json.loads(expected[0])) == STEPS  # one loss per micro-batch, so the comparison is not vacuous
    older, newest = (output / "checkpoints" / checkpoint_name(step) for step in (STEPS - EVERY, STEPS))
    damage(newest)
    damaged_bytes = newest.read_bytes()
    (output / LOSS_HISTORY).unlink()  # as a run stopped after its step-6 save would have left it
    (output / "export" / "trained.safetensors").unlink()

    with caplog.at_level(logging.WARNING, logger="animegamer.training.checkpointing"), \
            caplog.at_level(logging.INFO, logger="animegamer.phases.run"):
        assert train_phase(phase, data, output, "checkpoint.keep_last=-1")["step"] == STEPS
    assert f"checkpoint {newest} is damaged" in caplog.text
    assert f"set aside as {newest.name}.damaged" in caplog.text
    assert f"resuming from {older}" in caplog.text
    assert f"steps {STEPS - EVERY + 1}..{STEPS} ({EVERY} steps) are trained again" in caplog.text
    aside = newest.with_name(newest.name + ".damaged")
    assert aside.read_bytes() == damaged_bytes  # renamed, never deleted
    assert record_path(aside).is_file()
    assert result(output) == expected  # loss history and export, byte for byte
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
    monkeypatch.setattr(runner, "make_trainer",
                        lambda cfg, callbacks, **kw: make_trainer(cfg, [*callbacks, Preempt()], **kw))
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
