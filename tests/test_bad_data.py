"""Bad data while training: corrupt samples and shards are skipped, counted and named, up to a budget."""
from __future__ import annotations

import io
import json
import logging
import tarfile
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import webdataset as wds
from phase_a_helpers import tiny_train_cfg, write_synthetic_features
from phase_b_helpers import write_synthetic_sessions
from torch.utils.data import DataLoader

from animegamer.contracts.shards import LATENTS, REPS
from animegamer.data.indexed import SKIPPED, WHOLE_SHARD, ExpectArrays, IndexedShardDataset, index_shard
from animegamer.data.phase_a import CLIP_ARRAYS, clip_transform, collate_samples
from animegamer.data.shards import shard_urls
from animegamer.training.bad_data import BadDataBudget
from animegamer.utils.io import npy_bytes


# --------------------------------------------------------------------------- shard builders
def _write_folder(folder: Path, shards: list[list[dict]]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for index, samples in enumerate(shards):
        name = f"shard-{index:06d}.tar"
        with wds.TarWriter(str(folder / name), encoder=False) as tar:
            for sample in samples:
                tar.write(sample)
        names.append(name)
    (folder / "manifest.json").write_text(json.dumps({"shards": [{"name": n} for n in names]}))
    return [str(folder / n) for n in names]


def _array_sample(key: str, value: np.ndarray) -> dict:
    return {"__key__": key, "json": json.dumps({"key": key}).encode(), "x.npy": npy_bytes(value)}


def _arrays(folder: Path, bad: dict[str, np.ndarray] | None = None, shards: int = 2, per_shard: int = 4) -> list[str]:
    """Shards of samples ``k{shard}-{i}`` holding x.npy = full((2, 3), n); ``bad`` replaces some."""
    bad = bad or {}
    rows = []
    for s in range(shards):
        rows.append([_array_sample(key, bad.get(key, np.full((2, 3), s * per_shard + i, np.float32)))
                     for i in range(per_shard) for key in [f"k{s}-{i}"]])
    return _write_folder(folder, rows)


def _x_transform(sample: dict) -> dict:
    return {"key": sample["__key__"], "x": torch.from_numpy(sample["x.npy"])}


def _dataset(folder: Path, **kwargs) -> IndexedShardDataset:
    return IndexedShardDataset(folder, _x_transform, video=False, skip_bad=True,
                               check=ExpectArrays({"x.npy": 2}), **kwargs)


def _batch(dataset, indices: list[int]) -> dict:
    return next(iter(DataLoader(dataset, batch_size=len(indices), sampler=indices, collate_fn=collate_samples)))


class _Module:
    def __init__(self):
        self.logged = {}

    def log(self, name, value, **_):
        self.logged[name] = value


def _trainer(datamodule=None):
    return SimpleNamespace(strategy=SimpleNamespace(reduce_boolean_decision=lambda decision, all=True: decision),
                           datamodule=datamodule)


def _feed(callback: BadDataBudget, batch: dict) -> _Module:
    module = _Module()
    callback.on_train_batch_start(_trainer(), module, batch, 0)
    return module


def _warned(caplog, shard: str, key: str) -> bool:
    return any(r.levelno == logging.WARNING and shard in r.getMessage() and f"key {key}" in r.getMessage()
               for r in caplog.records)


# --------------------------------------------------------------------------- each bad-data case
def _clip_mp4(frames: int = 3, size: int = 32, shade: int = 0) -> bytes:
    from animegamer.config.schema import ClipsConfig
    from animegamer.media.video import encode_mp4

    video = np.stack([np.full((size, size, 3), (shade + 40 * t) % 256, np.uint8) for t in range(frames)])
    return encode_mp4(video, 8, ClipsConfig())


def test_unreadable_mp4_in_a_clip_shard_is_skipped_counted_and_named(tmp_path, caplog):
    def clip(i, mp4):
        meta = {"captioner": {"status": "ok"}, "motion_text": "softly walk", "motion": {"flow": float(i)}}
        return {"__key__": f"clip-{i}", "json": json.dumps(meta).encode(), "mp4": mp4}

    samples = [clip(i, _clip_mp4(shade=30 * i)) for i in range(4)]
    samples[1]["mp4"] = b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50  # unreadable
    (shard,) = _write_folder(tmp_path / "clips", [samples])
    dataset = IndexedShardDataset(tmp_path / "clips", partial(clip_transform, random_frame=False, seed=0), video=True,
                                  skip_bad=True, check=CLIP_ARRAYS)
    with caplog.at_level(logging.WARNING):
        batch = _batch(dataset, [1, 3])
    assert batch["video"].shape == (2, 3, 32, 32, 3) and batch["key"] == ["clip-2", "clip-3"]
    assert [(r["shard"], r["key"]) for r in batch[SKIPPED]] == [(shard, "clip-1")]
    assert _warned(caplog, shard, "clip-1")
    callback = BadDataBudget(5)
    with caplog.at_level(logging.WARNING):
        module = _feed(callback, batch)
    assert callback.count == 1 and module.logged["data/skipped"] == 1.0
    assert caplog.records[-1].name == "animegamer.training.bad_data" and _warned(caplog, shard, "clip-1")


@pytest.mark.parametrize("cut", ["mid_member", "end_marker", "bad_header"])
def test_truncated_or_corrupt_tar_shard_is_skipped_at_indexing(tmp_path, caplog, cut):
    urls = _arrays(tmp_path / "data")
    data = Path(urls[1]).read_bytes()
    with tarfile.open(urls[1]) as tar:
        members = tar.getmembers()
        end = tar.offset
    if cut == "mid_member":
        data = data[: members[3].offset_data + 10]
    elif cut == "end_marker":
        data = data[:end]  # every member complete, the end-of-archive blocks gone
    else:
        header = members[6].offset  # a later header overwritten: tarfile alone would stop quietly there
        data = data[:header] + b"\x07" * 512 + data[header + 512 :]
    Path(urls[1]).write_bytes(data)

    with pytest.raises(tarfile.ReadError):
        index_shard(urls[1])
    with pytest.raises(tarfile.ReadError):  # without skip_bad (look-ups by key) it still fails loudly
        IndexedShardDataset(tmp_path / "data", _x_transform, video=False)
    with caplog.at_level(logging.WARNING):
        dataset = _dataset(tmp_path / "data")
    assert dataset.keys() == [f"k0-{i}" for i in range(4)]
    assert [(r["shard"], r["key"]) for r in dataset.bad_items] == [(urls[1], WHOLE_SHARD)]
    assert any(urls[1] in m and ("truncated" in m or "unexpected end" in m) for m in caplog.messages)
    assert len(_batch(dataset, [0, 1])["x"]) == 2

    callback = BadDataBudget(1)
    callback.on_train_start(_trainer(SimpleNamespace(train_set=dataset, val_set=dataset)), _Module())
    assert callback.count == 1  # the same shard in train and val counts once


def test_wrong_array_shape_is_skipped(tmp_path, caplog):
    urls = _arrays(tmp_path / "data", bad={"k0-2": np.zeros((2, 4), np.float32), "k1-0": np.zeros((2, 3, 1), np.float32)})
    dataset = _dataset(tmp_path / "data")
    with caplog.at_level(logging.WARNING):
        batch = _batch(dataset, [2, 4, 0])
    assert batch["x"].shape == (3, 2, 3)
    assert batch["key"] == ["k0-3", "k1-1", "k0-0"]
    skipped = {r["key"]: r for r in batch[SKIPPED]}
    assert set(skipped) == {"k0-2", "k1-0"}
    assert "(2, 4)" in skipped["k0-2"]["reason"]  # differs from the good samples' (2, 3)
    assert "expected" in skipped["k1-0"]["reason"]  # the per-phase expectation: rank 2
    assert _warned(caplog, urls[0], "k0-2") and _warned(caplog, urls[1], "k1-0")


def test_wrong_shape_of_the_very_first_sample_is_caught(tmp_path):
    _arrays(tmp_path / "data", bad={"k0-0": np.zeros((5, 3), np.float32)})
    dataset = _dataset(tmp_path / "data")
    assert dataset[0]["key"] == "k0-1" and dataset[0][SKIPPED][0]["key"] == "k0-0"
    assert SKIPPED not in dataset[1]


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_or_inf_in_an_array_is_skipped(tmp_path, caplog, value):
    bad = np.zeros((2, 3), np.float16)
    bad[1, 2] = value
    urls = _arrays(tmp_path / "data", bad={"k1-3": bad})
    dataset = _dataset(tmp_path / "data")
    with caplog.at_level(logging.WARNING):
        batch = _batch(dataset, [7, 5])
    # the last index wraps around to the first good one
    assert batch["key"] == ["k0-0", "k1-1"] and batch["x"].shape == (2, 2, 3)
    assert [(r["shard"], r["key"]) for r in batch[SKIPPED]] == [(urls[1], "k1-3")]
    assert "non-finite" in batch[SKIPPED][0]["reason"]
    assert _warned(caplog, urls[1], "k1-3")


def test_bad_session_reaches_the_phase_b_batch(tmp_path, caplog):
    from animegamer.data.phase_b import SessionWindows, _identity, check_session
    from animegamer.mllm import tokens as T
    from animegamer.mllm.collate import collate_sequences

    root = write_synthetic_sessions(tmp_path, sessions=4, turns=3, tokens=4, width=8)
    (url,) = shard_urls(root / "session_shards")
    with tarfile.open(url) as tar:  # rewrite session 1 with NaN reps
        samples = {}
        for info in tar:
            key, _, ext = info.name.partition(".")
            samples.setdefault(key, {"__key__": key})[ext] = tar.extractfile(info).read()
    reps = np.zeros((3, 4, 8), np.float16)
    reps[0, 0, 0] = np.nan
    samples["syn-000001-s3"][REPS] = npy_bytes(reps)
    _write_folder(root / "session_shards", [list(samples.values())])

    sessions = IndexedShardDataset(root / "session_shards", _identity, video=False, skip_bad=True, check=check_session)
    tok = T.byte_tokenizer()
    T.add_animegamer_tokens(tok)
    ids = T.TokenIds.from_tokenizer(tok)
    windows = SessionWindows(sessions, tok, ids, [1.0, 1.0, 1.0], seed=0)
    with caplog.at_level(logging.WARNING):
        batch = collate_sequences([windows[(1, 0)], windows[(3, 1)]], pad_id=ids.pad)
    assert batch["input_ids"].shape[0] == 2 and batch["keys"][0].startswith("syn-000002-s3")
    assert [(r["shard"], r["key"]) for r in batch[SKIPPED]] == [(url, "syn-000001-s3")]
    assert _warned(caplog, url, "syn-000001-s3")
    assert SKIPPED not in collate_sequences([windows[(0, 0)]], pad_id=ids.pad)  # clean batches unchanged


# --------------------------------------------------------------------------- budget, determinism, state
def test_budget_exceeded_stops_with_a_clear_error(tmp_path):
    urls = _arrays(tmp_path / "data", bad={"k0-1": np.full((2, 3), np.nan, np.float32),
                                             "k1-2": np.full((2, 3), np.nan, np.float32)})
    dataset = _dataset(tmp_path / "data")
    callback = BadDataBudget(1)
    _feed(callback, _batch(dataset, [1, 0]))
    _feed(callback, _batch(dataset, [1, 3]))  # the same bad sample again: still one
    assert callback.count == 1
    with pytest.raises(RuntimeError) as error:
        _feed(callback, _batch(dataset, [6, 0]))
    message = str(error.value)
    assert "bad data budget exceeded: 2 corrupt samples/shards skipped" in message
    assert "data.bad_sample_budget=1" in message
    assert f"shard {urls[1]} key k1-2" in message and f"shard {urls[0]} key k0-1" in message
    with pytest.raises(ValueError):
        BadDataBudget(-1)


def test_substitutes_are_a_pure_function_of_the_index(tmp_path):
    _arrays(tmp_path / "data", bad={"k0-1": np.full((2, 3), np.nan, np.float32), "k0-2": np.zeros(3, np.float32)})
    first, second = _dataset(tmp_path / "data"), _dataset(tmp_path / "data")  # e.g. another worker, a resumed run
    reads = [first[1], first[1], second[1], first[2], second[2]]
    for item in reads:
        assert item["key"] == "k0-3" and torch.equal(item["x"], reads[0]["x"])
    assert [r["key"] for r in reads[0][SKIPPED]] == ["k0-1", "k0-2"]
    assert [r["key"] for r in reads[3][SKIPPED]] == ["k0-2"]
    assert reads[0][SKIPPED] == reads[1][SKIPPED] == reads[2][SKIPPED]


def test_callback_state_round_trips_through_a_checkpoint(tmp_path):
    callback = BadDataBudget(3)
    callback.record([{"shard": "a.tar", "key": "k1", "reason": "NaN"}, {"shard": "b.tar", "key": "*", "reason": "cut"}])
    path = tmp_path / "state.pt"
    torch.save({"callbacks": {callback.state_key: callback.state_dict()}}, path)
    restored = BadDataBudget(3)
    restored.load_state_dict(torch.load(path, weights_only=True)["callbacks"][restored.state_key])
    assert restored.count == 2 and restored.seen == callback.seen
    restored.record([{"shard": "a.tar", "key": "k1", "reason": "NaN"}])
    assert restored.count == 2


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def corrupt_features(tmp_path_factory):
    """Tiny feature shards with NaN latents in one training sample."""
    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config
    from animegamer.data.phase_a import phase_a_dataset

    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"]).model.encoders)
    root = write_synthetic_features(tmp_path_factory.mktemp("bad_features"), enc, clips=8)
    _, cfg = tiny_train_cfg(root, root / "unused")
    victim = phase_a_dataset(cfg, "train").keys()[1]
    folder = root / "features"
    for url in shard_urls(folder):
        with tarfile.open(url) as tar:
            samples = {}
            for info in tar:
                key, _, ext = info.name.partition(".")
                samples.setdefault(key, {"__key__": key})[ext] = tar.extractfile(info).read()
        if victim in samples:
            latents = np.load(io.BytesIO(samples[victim][LATENTS]))
            latents[0, 0, 0, 0] = np.nan
            samples[victim][LATENTS] = npy_bytes(latents)
            with wds.TarWriter(url, encoder=False) as tar:
                for sample in samples.values():
                    tar.write(sample)
    return root, victim


def test_tiny_phase_a_run_skips_the_corrupt_sample(corrupt_features, tmp_path, caplog):
    from animegamer.phases.run import train

    root, victim = corrupt_features
    composed, cfg = tiny_train_cfg(root, tmp_path / "run", "phase.max_steps=4", "checkpoint.every_n_steps=4")
    with caplog.at_level(logging.WARNING):
        result = train(cfg, composed)
    assert result["step"] == 4 and result["metrics"]["data/skipped"] == 1.0
    assert any(f"key {victim}" in r.getMessage() and r.name == "animegamer.training.bad_data" for r in caplog.records)
    newest = sorted((tmp_path / "run" / "checkpoints").glob("step-*.ckpt"))[-1]  # the final step's checkpoint
    saved = torch.load(newest, weights_only=False)
    assert [item["key"] for item in saved["callbacks"]["BadDataBudget"]["seen"]] == [victim]


def test_tiny_phase_a_run_stops_past_the_budget(corrupt_features, tmp_path):
    from animegamer.phases.run import train

    root, victim = corrupt_features
    composed, cfg = tiny_train_cfg(root, tmp_path / "run", "phase.max_steps=4", "data.bad_sample_budget=0")
    with pytest.raises(RuntimeError, match=rf"bad data budget exceeded: 1 .*data.bad_sample_budget=0.*key {victim}"):
        train(cfg, composed)
