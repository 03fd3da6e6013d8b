"""Shard folders read from a URL through fsspec (issue 20, point 7), against an HTTP server on localhost.

The server (a small ``http.server`` handler: single-range GETs, HEAD, every request recorded, failures
on demand) serves tiny phase (a) feature shards. Over HTTP the samples equal the local ones in the
same step-indexed order, every shard request is a bounded range request, the tar index is scanned
once and then read from the local cache, a server that fails briefly (503, 429, dropped connections)
is retried, one that keeps failing stops with an error naming the URL, and a phase (a) run from the
URL, stopped by the server dying after a checkpoint and started again, ends bitwise where the
uninterrupted run from the local folder does.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from http_fakes import LocalServer
from phase_a_helpers import tiny_train_cfg, write_synthetic_features

from animegamer.config.compose import compose_config
from animegamer.data.indexed import IndexedShardDataset, StepSampler
from animegamer.contracts.files import MANIFEST
from animegamer.data.phase_a import FEATURE_ARRAYS, collate_samples, feature_transform
from animegamer.data.storage import HEADER_READAHEAD, RemoteReadError, RemoteSettings, ShardSource, join
from animegamer.phases import run as runner
from animegamer.training import checkpointing
from animegamer.training.checkpointing import checkpoint_name
from animegamer.training.faults import LOSS_HISTORY
from animegamer.utils.io import sha256_file

FAST = RemoteSettings(retries=3, timeout_s=10.0, backoff_s=0.01)  # retries without waiting seconds
STEPS, EVERY, DIES_AFTER = 6, 2, 4  # the server dies right after the step-4 checkpoint


# ------------------------------------------------------------------------------------------ the server
@dataclass(frozen=True)
class Request:
    method: str
    path: str
    start: int | None = None  # a range request's first byte
    end: int | None = None  # ... and the byte after its last

    @property
    def length(self) -> int | None:
        return None if self.start is None else self.end - self.start


class RangeServer:
    """Serves ``root`` on 127.0.0.1 with byte ranges (``SimpleHTTPRequestHandler`` ignores Range)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[Request] = []
        self.fail_next = 0  # the next N requests fail ...
        self.fail_always = False  # ... or every one does
        self.failure = "503"  # an HTTP status, or "reset": the connection is dropped without an answer
        self.failed = 0
        self._lock = threading.Lock()
        # keep-alive (HTTP/1.1), as object stores answer
        self.local = LocalServer(lambda handler: self.answer(handler, body=handler.command != "HEAD"),
                                 methods=("HEAD", "GET"), protocol_version="HTTP/1.1").start()

    def url(self, *parts: str) -> str:
        return "/".join([self.local.base_url, *parts])

    def answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = handler.path.lstrip("/")
        file = self.root / path
        size = file.stat().st_size if file.is_file() else 0
        start = end = None
        if handler.headers.get("Range"):
            first, _, last = handler.headers["Range"].removeprefix("bytes=").partition("-")
            start, end = int(first), min(size, int(last) + 1) if last else size
        with self._lock:
            self.requests.append(Request("GET" if body else "HEAD", path, start, end))
            failing = self.fail_always or self.fail_next > 0
            if failing:
                self.fail_next = max(0, self.fail_next - 1)
                self.failed += 1
        if failing and self.failure == "reset":
            handler.close_connection = True  # no status line at all: the client sees a dropped connection
            return
        if failing:
            status = int(self.failure)
            handler.send_response(status)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        if not file.is_file():
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        data = file.read_bytes()
        if start is not None:
            data = data[start:end]
        handler.send_response(206 if start is not None else 200)
        if start is not None:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("Last-Modified", handler.date_time_string(int(file.stat().st_mtime)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)

    def tar_gets(self, since: int = 0) -> list[Request]:
        return [r for r in self.requests[since:] if r.method == "GET" and r.path.endswith(".tar")]

    def reset(self) -> None:
        self.fail_next, self.fail_always, self.failure, self.failed = 0, False, "503", 0

    def close(self) -> None:
        self.local.close()


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """``<root>/features`` (tiny phase (a) shards, no sha256 in the manifest: versions come from HEAD) and
    ``<root>/features_sha`` (the same shards, with the sha256 the pipeline writes)."""
    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    root = write_synthetic_features(tmp_path_factory.mktemp("remote") / "data", enc, clips=14)
    shutil.copytree(root / "features", root / "features_sha")
    manifest = json.loads((root / "features_sha" / MANIFEST).read_text())
    for entry in manifest["shards"]:
        entry["sha256"] = sha256_file(root / "features_sha" / entry["name"])
    (root / "features_sha" / MANIFEST).write_text(json.dumps(manifest))
    return root


@pytest.fixture(scope="module")
def server(data_root):
    served = RangeServer(data_root)
    yield served
    served.close()


@pytest.fixture(autouse=True)
def fresh(server, tmp_path, monkeypatch):
    """Each test: a healthy server and an empty index cache of its own."""
    server.reset()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def features(folder, **kwargs) -> IndexedShardDataset:
    return IndexedShardDataset(folder, feature_transform, skip_bad=True, check=FEATURE_ARRAYS, video=False, **kwargs)


def same_items(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


# ------------------------------------------------------------------------------------------ reading
def test_sub_folders_join_a_url_root_as_pathlib_joins_folders():
    assert join("s3://bucket/run/", "features", MANIFEST) == "s3://bucket/run/features/manifest.json"
    assert join("s3://bucket/run", "/local/clips") == "/local/clips"  # an absolute sub-folder stays local
    assert join("/data/run", "gs://bucket/features") == "gs://bucket/features"
    assert join("/data/run", "features") == str(Path("/data/run") / "features")
    assert ShardSource("https://host/run/").path("shard-000000.tar") == "https://host/run/shard-000000.tar"


def test_samples_over_http_equal_the_local_ones_in_step_order_by_bounded_range_requests(data_root, server, caplog):
    local = features(data_root / "features")
    remote = features(ShardSource(server.url("features"), FAST))
    assert remote.keys() == local.keys() and len(local) == 14
    indexing = len(server.requests)

    order = list(StepSampler(len(local), seed=3, start=5, total=5 + 12))  # a resumed run's next 12 samples
    for index in order:
        assert same_items(remote[index], local[index])
    sample_reads = server.tar_gets(indexing)
    # One range request per sample (reference_shapes reads the first 3 good samples once).
    assert len(sample_reads) == len(order) + IndexedShardDataset.REFERENCE_SAMPLES

    shard_size = (data_root / "features" / "shard-000000.tar").stat().st_size
    spans = [max(o + s for _, o, s in loc.members) - min(o for _, o, s in loc.members) for loc in local.locations]
    assert shard_size > 4 * max(HEADER_READAHEAD, max(spans))  # so "bounded" below means something
    tar_requests = server.tar_gets()
    assert all(r.start is not None for r in tar_requests), "a shard was requested without a Range"
    assert max(r.length for r in tar_requests) <= max(HEADER_READAHEAD, max(spans))

    # DataLoader workers (forked) carry the source and read the same batches in the same order.
    loaders = [DataLoader(d, batch_size=2, sampler=StepSampler(len(d), seed=3, start=5, total=5 + 8),
                          num_workers=workers, collate_fn=collate_samples) for d, workers in ((local, 0), (remote, 2))]
    for expected, got in zip(*loaders, strict=True):
        assert got["key"] == expected["key"] and same_items(got, expected)
    # The workers are gone and never closed this process's connections: its next read needs no retry.
    with caplog.at_level(logging.WARNING):
        assert same_items(remote[order[0]], local[order[0]])
    assert "attempt" not in caplog.text


def test_the_index_is_scanned_once_then_read_from_the_local_cache(data_root, server):
    first = features(ShardSource(server.url("features"), FAST))
    scan = server.tar_gets()
    assert len(scan) >= 2 and {r.start for r in scan} >= {0}  # the header scan starts at byte 0 of each shard

    before = len(server.requests)
    again = features(ShardSource(server.url("features"), FAST))
    assert again.keys() == first.keys() and [l.members for l in again.locations] == [l.members for l in first.locations]
    assert server.tar_gets(before) == []  # no header read: one HEAD per shard for its version, then the cache
    assert [r.method for r in server.requests[before:]] == ["GET", "HEAD", "HEAD"]

    # With the pipeline's sha256 in the manifest the version needs no request: only the manifest is read.
    features(ShardSource(server.url("features_sha"), FAST))
    before = len(server.requests)
    features(ShardSource(server.url("features_sha"), FAST))
    assert [(r.method, r.path) for r in server.requests[before:]] == [("GET", "features_sha/manifest.json")]

    # A shard rewritten in place (new Last-Modified) is scanned again.
    shard = data_root / "features" / "shard-000001.tar"
    stat = shard.stat()
    os.utime(shard, (stat.st_atime, stat.st_mtime + 10))
    try:
        before = len(server.requests)
        features(ShardSource(server.url("features"), FAST))
        assert {r.path for r in server.tar_gets(before) if r.start == 0} == {"features/shard-000001.tar"}
    finally:
        os.utime(shard, (stat.st_atime, stat.st_mtime))


@pytest.mark.parametrize("failure", ["503", "429", "reset"])
def test_a_server_failing_briefly_is_retried_and_the_samples_are_the_same(data_root, server, failure, caplog):
    local = features(data_root / "features")
    server.failure, server.fail_next = failure, 2  # the manifest request and its first retry fail
    with caplog.at_level(logging.WARNING):
        remote = features(ShardSource(server.url("features"), FAST))
    assert server.failed == 2 and remote.keys() == local.keys()
    assert f"reading {server.url('features', MANIFEST)}: attempt 1/4" in caplog.text
    server.fail_next = 2  # and a sample read
    assert same_items(remote[5], local[5]) and server.failed == 4


def test_a_server_that_keeps_failing_stops_with_an_error_naming_the_url(data_root, server):
    remote = features(ShardSource(server.url("features"), RemoteSettings(retries=1, timeout_s=10.0, backoff_s=0.01)))
    server.fail_always = True
    shard = remote.locations[0].shard
    with pytest.raises(RemoteReadError) as error:
        remote[0]  # a bad sample would be skipped: a failing server is not bad data, it stops the run
    message = str(error.value)
    assert message.startswith(f"{shard}: range request ") and "failed 2 times (data.remote_retries=1" in message
    assert "ClientResponseError: 503" in message and server.failed == 2
    assert remote.bad_items == [] and remote._bad == {}

    server.fail_always = False
    before = len(server.requests)
    with pytest.raises(FileNotFoundError, match=f"{server.url('missing', MANIFEST)}: no manifest"):
        features(ShardSource(server.url("missing"), FAST))
    assert len(server.requests) == before + 1  # a 404 is an answer, not a failure: never retried


# ------------------------------------------------------------------------------------------ checks
def test_validation_and_the_run_record_read_a_url_root(data_root, server, tmp_path):
    from animegamer.phases.preflight import check_training
    from animegamer.data.shapes import _first_sample_shapes
    from animegamer.training.run_record import data_digests

    composed, _ = tiny_train_cfg(data_root, tmp_path / "local", "phase=a_joint")
    remote, _ = tiny_train_cfg(server.url(), tmp_path / "remote", "phase=a_joint", "data.remote_retries=1")
    assert check_training(composed) == [] and check_training(remote) == []
    assert _first_sample_shapes(ShardSource(server.url("features"))) == _first_sample_shapes(data_root / "features")
    digests = data_digests(OmegaConf.to_container(remote, resolve=True), "features")  # phase (a)'s samples
    assert digests == data_digests(OmegaConf.to_container(composed, resolve=True), "features")
    assert digests["data.features"] is not None and digests["data.clips"] is None  # synthetic data: no clips

    server.fail_always = True
    problems = check_training(remote)
    assert len(problems) == 1 and problems[0].startswith(f"data.root={server.url()!r}: {server.url('features', MANIFEST)}: ")
    assert "failed 2 times" in problems[0] and "no such" not in problems[0]
    server.fail_always = False
    wrong, _ = tiny_train_cfg(server.url("nowhere"), tmp_path / "wrong", "phase=a_joint")
    assert check_training(wrong) == [f"data.root={server.url('nowhere')!r}: {server.url('nowhere', 'features', MANIFEST)}: "
                                     "missing (no such file there: is the URL right, and was the folder uploaded whole?)"]
    unknown, _ = tiny_train_cfg("nosuchprotocol://bucket/data", tmp_path / "unknown", "phase=a_joint")
    assert check_training(unknown) == ["data.root='nosuchprotocol://bucket/data': nosuchprotocol://bucket/data/features: "
                                       "cannot read nosuchprotocol:// URLs here: Protocol not known: nosuchprotocol "
                                       "(pip install -e '.[remote]' adds s3:// and gs://)"]
    bad, _ = tiny_train_cfg(server.url(), tmp_path / "bad", "phase=a_joint", "data.remote_retries=-1",
                            "data.remote_timeout_s=0")
    assert check_training(bad) == ["data.remote_retries=-1 must be >= 0", "data.remote_timeout_s=0.0 must be > 0"]


# ------------------------------------------------------------------------------------------ training
def test_a_run_from_the_url_stopped_by_the_server_dying_resumes_to_the_local_runs_result(
        data_root, server, tmp_path, monkeypatch, caplog):
    run = ("phase=a_joint", "logger=none", f"phase.max_steps={STEPS}", f"checkpoint.every_n_steps={EVERY}",
           "checkpoint.keep_last=-1")
    composed, cfg = tiny_train_cfg(data_root, tmp_path / "local", *run)
    runner.train(cfg, composed)

    finish_save, died = checkpointing.finish_save, []

    def then_die(trainer, path, keep_last):
        finish_save(trainer, path, keep_last)
        if trainer.global_step == DIES_AFTER and not died:
            died.append(path)
            server.fail_always = True

    monkeypatch.setattr(checkpointing, "finish_save", then_die)
    output = tmp_path / "remote"
    composed, cfg = tiny_train_cfg(server.url(), output, *run, "data.remote_retries=1")
    with pytest.raises(RemoteReadError, match=rf"^{server.url('features')}/shard-00000[01]\.tar: range request"):
        runner.train(cfg, composed)
    assert died and sorted(p.name for p in (output / "checkpoints").glob("*.ckpt")) == [
        checkpoint_name(step) for step in range(EVERY, DIES_AFTER + 1, EVERY)]

    server.reset()
    before = len(server.requests)
    with caplog.at_level(logging.INFO, logger="animegamer.phases.run"):
        assert runner.train(cfg, composed)["step"] == STEPS
    assert f"resuming from {output / 'checkpoints' / checkpoint_name(DIES_AFTER)}" in caplog.text
    assert not [r for r in server.tar_gets(before) if r.start == 0]  # the index came from the cache
    for name in (LOSS_HISTORY, "export/trained.safetensors"):
        assert (output / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    assert len(json.loads((output / LOSS_HISTORY).read_text())) == STEPS
