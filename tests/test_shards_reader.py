"""The webdataset readers: safe decoding, and equal per-rank sample counts for DDP."""
from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import webdataset as wds

from animegamer.data.shards import decode_sample, iter_samples, shard_urls, training_dataset
from animegamer.utils.io import load_npy_bytes, npy_bytes


def _write_shards(folder, sizes):
    urls = []
    for index, size in enumerate(sizes):
        path = folder / f"shard-{index:06d}.tar"
        with wds.TarWriter(str(path), encoder=False) as tar:
            for i in range(size):
                key = f"s{index}-{i:04d}"
                tar.write({"__key__": key, "json": b'{"i": %d}' % i, "x.npy": npy_bytes(np.full((2, 3), i, np.float16))})
        urls.append(str(path))
    return urls


def test_npy_round_trip_keeps_dtype_and_shape():
    for array in (np.arange(12, dtype=np.float16).reshape(3, 4), np.zeros((2, 226, 8), np.float32)):
        back = load_npy_bytes(npy_bytes(array))
        assert back.dtype == array.dtype and back.shape == array.shape and np.array_equal(back, array)


def test_pickled_npy_is_refused():
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        load_npy_bytes(buffer.getvalue())
    with pytest.raises(TypeError):
        npy_bytes(np.array([object()], dtype=object))


def test_unknown_member_is_an_error_naming_the_sample():
    with pytest.raises(ValueError, match="k1.pkl"):
        decode_sample({"__key__": "k1", "__url__": "u", "pkl": pickle.dumps(1)})


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_rank_gets_the_same_number_of_samples(tmp_path, world_size, monkeypatch):
    urls = _write_shards(tmp_path, [7, 3, 11])  # uneven shards: plain splitting would be unequal
    per_rank = 10
    counts = []
    for rank in range(world_size):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        samples = list(training_dataset(urls, samples_per_rank=per_rank, shuffle_buffer=4, seed=rank, video=False))
        assert all(s["x.npy"].dtype == np.float16 for s in samples)
        counts.append(len(samples))
    assert counts == [per_rank] * world_size


def test_iter_samples_reads_everything_in_order(tmp_path):
    urls = _write_shards(tmp_path, [3, 2])
    keys = [s["__key__"] for s in iter_samples(urls, video=False)]
    assert keys == ["s0-0000", "s0-0001", "s0-0002", "s1-0000", "s1-0001"]


def test_shard_urls_needs_a_manifest(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest"):
        shard_urls(tmp_path)
