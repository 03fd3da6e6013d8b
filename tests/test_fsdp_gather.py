"""FSDP saves gather only what they keep, one unit at a time (``animegamer.training.fsdp_gather``).

On 2 H200s a phase (b) FSDP save took about 75 s: the export copied the whole 7B float32 model to
host memory on every rank, and Lightning's full state dict once more on rank 0, only to keep the LoRA
and projections. Now the strategy gathers the kept tensors unit by unit, and the export is written
from that state.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_fsdp_compute import _cfg

from animegamer.training import fsdp_gather
from animegamer.phases.run import make_strategy
from animegamer.training.strategies import is_fsdp_strategy

DRIVER = Path(__file__).with_name("fsdp_gather_driver.py")


PHASES = ["b", "c"]


@pytest.fixture(scope="module")
def driven(tmp_path_factory) -> Path:
    """One driver run checks every phase (its two ranks import once); the folder of its reports."""
    out = tmp_path_factory.mktemp("fsdp_gather")
    done = subprocess.run([sys.executable, str(DRIVER), str(out), *PHASES], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module", params=PHASES)
def two_ranks(request, driven) -> list[dict]:
    """Phase (b): Mistral blocks, LoRA and a frozen extra inside a block; phase (c): CogVideoX blocks,
    the decoder's LoRA folder and the frozen encoder (``export_extra``) in the root unit."""
    return [json.loads((driven / request.param / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_rank0_gets_the_kept_weights_under_fsdps_full_state_dict_names(two_ranks):
    first, second = two_ranks
    assert first["kept"] > first["trainable"] > 20  # what trains, and the export's frozen extras
    assert first["state_keys"] == first["kept_keys"] and first["full_has_kept"]
    assert first["state_vs_full"] == 0.0 and first["state_vs_reference"] == 0.0 and first["state_on_cpu"]
    assert second["state_keys"] == []  # rank 0 writes; the others copy nothing


def test_units_are_gathered_one_at_a_time_and_resharded(two_ranks):
    for rank in two_ranks:
        assert rank["local_numel"] == rank["total_numel"] // 2 and rank["after_numel"] == rank["local_numel"]
        # the root and both blocks (each holds LoRA), each unsharded alone: never the whole model at once
        assert rank["units"] == 3 and len(rank["calls"]) == 3
        assert all(recurse is False for _, recurse in rank["calls"])


def test_the_export_from_the_gathered_state_equals_the_unsharded_models(two_ranks):
    first = two_ranks[0]
    assert first["export_files"] == first["expected_files"] and len(first["expected_files"]) >= 2
    assert first["export_keys_equal"] and first["export_vs_reference"] == 0.0


def test_the_checkpoint_resumes_through_lightnings_fsdp_loader(two_ranks):
    first, second = two_ranks
    # the phase's on_save_checkpoint keeps what trains; a fresh model loads it back exactly
    assert first["checkpoint_keys"] == first["trainable"] == second["checkpoint_keys"]
    assert first["resumed_vs_checkpoint"] == 0.0


def test_every_rank_ends_with_gloos_threads_joined(two_ranks):
    # end_process_group destroyed the group with nothing else holding it: no gloo worker is left to
    # free a collective's tensors while the interpreter finalizes (an abort at exit, now and then)
    assert [rank["gloo_threads_after_teardown"] for rank in two_ranks] == [0, 0]


def test_the_fsdp_preset_saves_through_the_gathered_state(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(fsdp_gather, "gathered_state", lambda root, rank, keep: seen.append((root, rank, keep)) or {"w": 1})
    strategy = make_strategy(_cfg(tmp_path))
    assert is_fsdp_strategy(strategy)  # gradient clipping and exports take the FSDP paths
    strategy._model = root = object()
    strategy._lightning_module = SimpleNamespace(export_extra=("encoder.",), trainable=["decoder.norm.weight"])
    assert strategy.lightning_module_state_dict() == {"w": 1}
    (found_root, rank, keep), = seen
    assert (found_root, rank) == (root, strategy.global_rank)
    frozen = SimpleNamespace(requires_grad=False)
    assert keep("model.encoder.proj.weight", frozen) and not keep("model.decoder.x.weight", frozen)
    assert keep("model.decoder.x.weight", SimpleNamespace(requires_grad=True))
    assert keep("model.decoder.norm.weight", frozen)  # the phase's trainable list, which its checkpoint keeps


def test_an_fsdp_export_is_written_from_the_checkpoints_state(tmp_path, monkeypatch):
    from animegamer.training.callbacks import ExportCallback

    written = []
    strategy = make_strategy(_cfg(tmp_path))
    monkeypatch.setattr(type(strategy), "lightning_module_state_dict", lambda self: {"model.b": 2, "other": 3})
    trainer = SimpleNamespace(strategy=strategy, global_step=7, max_steps=7, is_global_zero=True)
    callback = ExportCallback(tmp_path / "export", lambda module, folder, meta, **kw: written.append((meta, kw)), {})
    callback.on_save_checkpoint(trainer, None, {"state_dict": {"model.a": 1}})
    callback.on_train_end(trainer, None)  # no checkpoint at hand: the strategy gathers
    # Never started (no on_train_start): it has trained for no time.
    meta = {"step": 7, "max_steps": 7, "finished": True, "train_seconds": 0.0}
    assert written == [(meta, {"state": {"a": 1}}), (meta, {"state": {"b": 2}})]


def test_a_partial_state_is_refused_not_exported():
    from animegamer.utils.state import require, submodule_state

    with pytest.raises(KeyError, match="lacks 1 tensors"):
        require({"decoder.a": 1}, ["decoder.a", "decoder._fsdp_wrapped_module.b"])
    require({"decoder.a": 1, "encoder.c": 2}, ["decoder.a"])
    assert submodule_state({"decoder.a": 1, "encoder.c": 2}, "decoder.") == {"a": 1}
