"""A malicious pickle in a shard, a checkpoint or an export is refused and never runs.

Every payload here would create a marker file when unpickled; each test checks the load fails with a
clear error (a user error, which entry points print with exit code 2) and the marker does not exist
afterwards.
"""
from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from torch import nn

from animegamer.contracts.shards import TEXT
from animegamer.errors import UnsafeCheckpointError, UserError
from unsafe_helpers import REFUSED_PICKLE as REFUSED, Evil, marker  # noqa: F401 - marker is a fixture


# --------------------------------------------------------------------------- shards
def object_npy(payload) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([payload], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def write_evil_shard(folder: Path, member: bytes) -> Path:
    folder.mkdir(parents=True)
    with wds.TarWriter(str(folder / "shard-000000.tar"), encoder=False) as tar:
        tar.write({"__key__": "evil-000000", "json": json.dumps({"key": "evil-000000"}).encode(),
                   TEXT: member})
    (folder / "manifest.json").write_text(json.dumps({"shards": [{"name": "shard-000000.tar", "count": 1}]}))
    return folder


@pytest.mark.parametrize("kind", ["object_array_npy", "raw_pickle"])
def test_pickled_npy_in_a_shard_is_refused(tmp_path, marker, kind):
    from animegamer.data.indexed import IndexedShardDataset
    from animegamer.data.shards import iter_samples, shard_urls

    member = object_npy(Evil(marker)) if kind == "object_array_npy" else pickle.dumps(Evil(marker))
    folder = write_evil_shard(tmp_path / "shards", member)
    with pytest.raises(ValueError, match="refused an .npy payload that holds pickled Python objects"):
        list(iter_samples(shard_urls(folder), video=False))
    with pytest.raises(ValueError, match="refused an .npy payload"):
        IndexedShardDataset(folder, lambda sample: sample, video=False).raw(0)


# --------------------------------------------------------------------------- checkpoints
def evil_checkpoint(path: Path, marker: Path, legacy: bool = False) -> Path:
    state = {"state_dict": {"w": torch.zeros(2)}, "global_step": 3, "callbacks": {"x": Evil(marker)}}
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    return path


@pytest.mark.parametrize("legacy", [False, True])
def test_project_checkpoint_io_refuses_a_pickled_payload(tmp_path, marker, legacy):
    from animegamer.training.checkpointing import AtomicCheckpointIO

    path = evil_checkpoint(tmp_path / "step-0000003.ckpt", marker, legacy)
    with pytest.raises(UnsafeCheckpointError, match=f"step-0000003.ckpt: {REFUSED}"):
        AtomicCheckpointIO().load_checkpoint(path)


class Tiny(__import__("lightning").LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(8, 2))
        return torch.utils.data.DataLoader(data, batch_size=4)


def project_trainer(tmp_path: Path):
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config
    from animegamer.phases.run import make_trainer

    cfg = OmegaConf.to_object(compose_config("train", ["model=tiny", "trainer=cpu", "logger=none",
                                                       f"output_dir={tmp_path / 'run'}", "phase.max_steps=2"]))
    return make_trainer(cfg, [])


def test_resuming_through_the_project_trainer_refuses_a_pickled_payload(tmp_path, marker):
    trainer = project_trainer(tmp_path)
    path = evil_checkpoint(tmp_path / "step-0000003.ckpt", marker)
    with pytest.raises(UnsafeCheckpointError, match=f"step-0000003.ckpt: {REFUSED}"):
        trainer.fit(Tiny(), ckpt_path=str(path))


def test_checkpoints_the_project_trainer_writes_pass_the_weights_only_check(tmp_path):
    from animegamer.training.safe_io import ensure_weights_only

    trainer, trained = project_trainer(tmp_path), Tiny()
    trainer.fit(trained)
    path = tmp_path / "written.ckpt"
    trainer.save_checkpoint(str(path))
    ensure_weights_only(path)  # raises on anything but tensors and plain containers
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert saved["global_step"] == 2
    assert torch.equal(saved["state_dict"]["layer.weight"], trained.layer.weight.detach())
    resumed, again = Tiny(), project_trainer(tmp_path / "again")
    again.fit(resumed, ckpt_path=str(path))  # at max_steps already: restores the weights, trains no further
    assert again.global_step == 2
    assert torch.equal(resumed.layer.weight, trained.layer.weight)


@pytest.mark.parametrize("legacy", [False, True])
def test_weights_only_precheck_refuses_files(tmp_path, marker, legacy):
    """FSDP (Lightning's ``_lazy_load``) and DeepSpeed bypass the CheckpointIO: the pre-check guards them."""
    from animegamer.training.safe_io import ensure_weights_only

    path = evil_checkpoint(tmp_path / "step-0000003.ckpt", marker, legacy)
    with pytest.raises(UserError, match=REFUSED):
        ensure_weights_only(path)


def test_weights_only_precheck_refuses_a_folder_checkpoint(tmp_path, marker):
    from animegamer.training.safe_io import ensure_weights_only

    folder = tmp_path / "step-0000003.ckpt"  # DeepSpeed layout: a folder of .pt files
    (folder / "checkpoint").mkdir(parents=True)
    torch.save({"module": {"w": torch.zeros(2)}}, folder / "checkpoint" / "mp_rank_00_model_states.pt")
    evil_checkpoint(folder / "checkpoint" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    with pytest.raises(UnsafeCheckpointError, match="zero_pp_rank_0_mp_rank_00_optim_states.pt: refused"):
        ensure_weights_only(folder)


# --------------------------------------------------------------------------- exports and imported weights
def test_export_is_safetensors_and_a_pickle_in_its_place_is_refused(tmp_path, marker):
    from animegamer.checkpoints.export import TRAINED_FILE, load_export, save_export

    model = nn.Linear(3, 2)
    folder = save_export(tmp_path / "export", model, {"phase": "a_warmup"})
    with open(folder / TRAINED_FILE, "rb") as f:
        assert f.read(4) != b"PK\x03\x04"  # safetensors (json header length), not a torch zip/pickle
    assert load_export(folder, nn.Linear(3, 2)) == ["bias", "weight"]
    torch.save({"weight": Evil(marker)}, folder / TRAINED_FILE)
    with pytest.raises(UnsafeCheckpointError, match="not a safetensors file"):  # read as safetensors, never unpickled
        load_export(folder, nn.Linear(3, 2))


def test_official_importers_refuse_a_pickled_payload(tmp_path, marker):
    from animegamer.models.official_decoder import read_official_state_dict
    from animegamer.models.official_mllm import read_official_mllm_state_dict

    torch.save({"module": {"w": Evil(marker)}}, tmp_path / "mp_rank_00_model_states.pt")
    torch.save({"llm.w": Evil(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UnsafeCheckpointError, match=f"{REFUSED}.*Weights only load failed"):
        read_official_state_dict(tmp_path)
    with pytest.raises(UnsafeCheckpointError, match=f"{REFUSED}.*Weights only load failed"):
        read_official_mllm_state_dict(tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").write_bytes(pickle.dumps({"llm.w": Evil(marker)}))
    with pytest.raises(UnsafeCheckpointError, match="model.safetensors: not a safetensors file"):
        read_official_mllm_state_dict(tmp_path)  # a folder with *.safetensors reads those only, never unpickled


def test_training_needs_no_network(tmp_path):
    """A tiny phase (a) run with every socket connection refused still trains and exports: nothing
    reaches for the network at run time (weights, tokenizers and loggers are local or offline)."""
    import subprocess
    import sys
    import textwrap

    root = Path(__file__).resolve().parents[1]
    script = textwrap.dedent(f"""
        import socket, sys
        def refuse(*args, **kwargs):
            raise OSError("network access attempted at run time")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        sys.path[:0] = [{str(root / 'tests')!r}, {str(root / 'src')!r}]
        from pathlib import Path
        from omegaconf import OmegaConf
        from animegamer.config.compose import compose_config
        from animegamer.phases.run import train
        from phase_a_helpers import tiny_train_cfg, write_synthetic_features
        enc = OmegaConf.to_object(compose_config("train", ["model=tiny"]).model.encoders)
        data = write_synthetic_features(Path({str(tmp_path / 'data')!r}), enc)
        composed, cfg = tiny_train_cfg(data, Path({str(tmp_path / 'run')!r}), "phase.max_steps=2")
        print("step", train(cfg, composed)["step"])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 2" in done.stdout
    assert (tmp_path / "run" / "export" / "trained.safetensors").is_file()
