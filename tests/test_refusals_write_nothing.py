"""A training start refused at run time writes nothing: a fresh start whose data cannot be read (a
``data.root`` server that sends no byte ranges) leaves no run record behind, and an earlier record in
the folder comes through it byte for byte; once a step is trained or a checkpoint is in the folder, the
record stays."""
from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest
from omegaconf import OmegaConf

from http_fakes import no_proxy  # noqa: F401 - no_proxy: autouse
from phase_a_helpers import tiny_train_cfg, write_synthetic_features

from animegamer.config.compose import compose_config
from animegamer.contracts.files import RECORD_FILE
from animegamer.data.storage import RemoteReadError
from animegamer.phases import run as runner
from animegamer.training import checkpointing
from animegamer.training.checkpointing import CHECKPOINT_DIR, checkpoint_name

EARLIER = b'{"config": {"phase": {"lr": 0.5}}, "data": {}, "changes": []}'


class _NoRanges(SimpleHTTPRequestHandler):
    """Answers every GET with the whole file: http.server ignores the Range header."""

    def log_message(self, *args) -> None:  # the test asserts on files, not on stderr
        pass


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory) -> Iterator[str]:
    """The base URL of ``python -m http.server`` serving tiny phase (a) feature shards."""
    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    root = write_synthetic_features(tmp_path_factory.mktemp("plain") / "data", enc, clips=6)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_NoRanges, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no index cached by another test


def _start(url: str, output: Path) -> None:
    composed, cfg = tiny_train_cfg(url, output, "phase=a_joint", "logger=none", "data.remote_retries=0")
    with pytest.raises(RemoteReadError, match="does not answer range requests"):
        runner.train(cfg, composed)


def test_a_start_refused_by_a_server_without_byte_ranges_leaves_no_record(plain_server, tmp_path):
    output = tmp_path / "run"
    _start(plain_server, output)
    assert not (output / RECORD_FILE).exists()
    assert [p for p in output.rglob("*") if p.is_file()] == []


def test_a_refused_fresh_start_keeps_the_folders_earlier_record(plain_server, tmp_path):
    output = tmp_path / "run"
    output.mkdir()
    (output / RECORD_FILE).write_bytes(EARLIER)
    _start(plain_server, output)
    assert (output / RECORD_FILE).read_bytes() == EARLIER


def test_a_start_failing_after_its_first_checkpoint_keeps_its_record(tmp_path, monkeypatch):
    """Checkpoints are only checked against the record that describes them: it is never taken away."""
    enc = OmegaConf.to_object(compose_config("train", ["model=tiny"])).model.encoders
    data = write_synthetic_features(tmp_path / "data", enc, clips=6)
    finish_save = checkpointing.finish_save

    def then_fail(trainer, path, keep_last):
        finish_save(trainer, path, keep_last)
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(checkpointing, "finish_save", then_fail)
    output = tmp_path / "run"
    composed, cfg = tiny_train_cfg(data, output, "phase=a_joint", "logger=none")
    with pytest.raises(RuntimeError, match="the disk went away"):
        runner.train(cfg, composed)
    assert (output / CHECKPOINT_DIR / checkpoint_name(2)).exists()
    assert (output / RECORD_FILE).exists()
