"""Phase (b)'s training loader pins its batches for GPU runs (their history reps are tens of MB at paper
sizes; a pageable copy to the device stalls each step's start), and leaves CPU runs unpinned."""
from __future__ import annotations

from dataclasses import replace

from phase_b_helpers import tiny_b_cfg, write_synthetic_sessions

from animegamer.data.phase_b import SessionWindows, session_shards, train_loader
from animegamer.models.game_mllm import game_tokenizer


def test_training_loader_pins_on_gpu_runs_only(tmp_path):
    root = write_synthetic_sessions(tmp_path / "sessions", sessions=4)
    _, cfg = tiny_b_cfg(root, tmp_path / "run")
    tokenizer, ids = game_tokenizer(cfg)
    windows = SessionWindows(session_shards(cfg, "train"), tokenizer, ids, [1.0] * 5, seed=0)
    pinned = {}
    for accelerator in ("cpu", "gpu"):
        run = replace(cfg, trainer=replace(cfg.trainer, accelerator=accelerator))
        pinned[accelerator] = train_loader(run, windows, ids.pad, 0, 0, 1).pin_memory
    assert pinned == {"cpu": False, "gpu": True}
