"""Shard names in a manifest never run code and never leave their folder; recorded digests are checked.

Every reader that takes a manifest (the storage API, the webdataset readers, the indexed reader, the
pipeline's steps and pre-flight, the toy VAE, the known-answer benchmark, the training pre-flight) is
given a folder whose manifest names its shard by a command, a scheme, an absolute path, a parent or
sub folder, or a URL. Each refuses it naming the manifest and the entry; the command never runs, and
the files the escaping names point at (real shards outside the folder) are never read.
"""
from __future__ import annotations

import copy
import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from omegaconf import OmegaConf

from animegamer.config.compose import compose_config
from animegamer.config.validate import ConfigError
from animegamer.data.indexed import IndexedShardDataset
from animegamer.contracts.files import MANIFEST, shard_name_problem
from animegamer.data.shards import folder_shards, iter_samples, shard_samples, shard_urls, training_dataset
from animegamer.data.storage import RemoteReadError, ShardDigestError, ShardNameError, ShardSource
from animegamer.errors import USER_ERROR_EXIT_CODE
from animegamer.utils.io import npy_bytes, sha256_file

MARKER = "marker"  # the file the command in a pipe: name would create
FINGERPRINT_VALUE = "f" * 64  # a manifest's recorded step fingerprint (lineage's reuse check compares it)
FOLDERS = ("clips", "features", "representations", "adaptation")  # what the readers below read
# Real shards at the places the escaping names point to: a reader that followed one would read it.
OUTSIDE = ("x.tar", "clips/sub/x.tar", "elsewhere/x.tar")


def _bad_names(root: Path) -> dict[str, str]:
    marker = root / MARKER
    return {
        "pipe scheme": f"pipe:/bin/sh -c 'touch {marker}'",
        "pipe url": f"pipe://bin/sh -c 'touch {marker}'",
        "file scheme": "file:x.tar",
        "file url": f"file://{root}/x.tar",
        "absolute path": str(root / "elsewhere" / "x.tar"),
        "parent folder": "../x.tar",
        "sub folder": "sub/x.tar",
        "http url": "http://host/x.tar",
    }


def _write_shard(path: Path, keys: list[str]) -> str:
    """A webdataset shard of tiny samples (json and one array each); returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path), encoder=False) as tar:
        for i, key in enumerate(keys):
            tar.write({"__key__": key, "json": json.dumps({"key": key, "i": i}).encode(),
                       "x.npy": npy_bytes(np.full((2, 3), i, np.float32))})
    return sha256_file(path)


def _manifest(folder: Path, shards: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"kind": folder.name, "sources": [], "motion_bins": {"edges": [1.0]}, "fingerprint": FINGERPRINT_VALUE,
                "shards": shards}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder / MANIFEST


def _pipeline_root(tmp_path: Path, name: str) -> Path:
    """A pipeline output whose every shard folder's manifest names its one shard ``name``."""
    root = tmp_path / "pipeline"
    for place in OUTSIDE:
        digest = _write_shard(root / place, ["outside-000000"])
    for folder in FOLDERS:
        _manifest(root / folder, [{"name": name, "count": 1, "sha256": digest}])
    (root / "export").mkdir()
    (root / "export" / "trained.safetensors").write_bytes(b"not read: the step stops before loading it")
    return root


@functools.lru_cache(maxsize=1)
def _default_pipeline_cfg():
    return OmegaConf.to_object(compose_config("pipeline", []))


def _pipeline_cfg(root: Path):
    """The default pipeline config writing to ``root``, its representation step on ``root/export``."""
    cfg = copy.deepcopy(_default_pipeline_cfg())
    cfg.pipeline.output, cfg.pipeline.representations.export = str(root), str(root / "export")
    return cfg


def _sessions(root):
    from data_pipeline.sessions import build_sessions

    return build_sessions(_pipeline_cfg(root).pipeline)


def _precompute(root):
    from data_pipeline.precompute import precompute

    cfg = _pipeline_cfg(root)
    return precompute(cfg.pipeline, cfg.model, {})


def _representations(root):
    from data_pipeline.representations import export_representations

    cfg = _pipeline_cfg(root)
    return export_representations(cfg.pipeline, cfg.model, {})


def _lineage_reuse(root):
    from data_pipeline.lineage import reusable

    return reusable(root, "features", FINGERPRINT_VALUE)


def _toy_vae_clips(root):
    from animegamer.toy_vae import load_clips

    return load_clips(root, 0.5)


def _toy_vae_identity(root):
    from animegamer.data.trained_data import clip_content_sha256

    return clip_content_sha256(root, "clips")


def _known_answer_clips(root):
    from benchmarks.known_answer.data import _clip_metas

    return _clip_metas(root / "clips")


def _known_answer_scores(root):
    from benchmarks.known_answer.driver import representation_prediction

    return representation_prediction(root)


READERS = {
    "ShardSource.shards": lambda root: ShardSource(root / "clips").shards(),
    "shard_urls": lambda root: shard_urls(root / "clips"),
    "iter_samples": lambda root: list(iter_samples(folder_shards(root / "clips"), video=False)),
    "training_dataset": lambda root: list(training_dataset(shard_urls(root / "clips"), samples_per_rank=2,
                                                           video=False)),
    "indexed reader": lambda root: IndexedShardDataset(root / "clips", dict, video=False),
    "indexed reader, skipping bad data": lambda root: IndexedShardDataset(root / "clips", dict, video=False,
                                                                          skip_bad=True),
    "sessions step": _sessions,
    "precompute step": _precompute,
    "representations step": _representations,
    "step reuse (lineage)": _lineage_reuse,
    "toy VAE clips": _toy_vae_clips,
    "toy VAE data identity": _toy_vae_identity,
    "known-answer clips": _known_answer_clips,
    "known-answer scores": _known_answer_scores,
}
BAD = list(_bad_names(Path("/root-placeholder")))


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("kind", BAD)
def test_every_reader_refuses_a_shard_name_that_is_no_plain_file_name(tmp_path, kind, reader):
    name = _bad_names(tmp_path / "pipeline")[kind]
    root = _pipeline_root(tmp_path, name)
    with pytest.raises(ShardNameError) as refused:
        READERS[reader](root)
    message = str(refused.value)
    assert str(root) in message and f"/{MANIFEST}: shards[0] {name!r}" in message
    assert not (root / MARKER).exists()


@pytest.mark.parametrize("kind", BAD)
def test_the_pre_flights_report_a_bad_shard_name_before_anything_runs(tmp_path, kind):
    from animegamer.phases.preflight import validate_train_run
    from animegamer.data.split_counts import split_counts

    name = _bad_names(tmp_path / "pipeline")[kind]
    root = _pipeline_root(tmp_path, name)
    expected = f"{root / 'clips' / MANIFEST}: shards[0] {name!r}"
    assert expected in ShardSource(root / "clips").manifest_problem()
    with pytest.raises(ConfigError) as held_out:  # the recipes' and the evaluation's split counts
        split_counts(root, "clips", 0.5)
    assert any(expected in problem for problem in held_out.value.problems)
    train = compose_config("train", ["model=tiny", "trainer=cpu", f"data.root={root}", "phase=a_warmup"])
    with pytest.raises(ConfigError) as training:
        validate_train_run(train)
    assert any(f"{root / 'features' / MANIFEST}: shards[0] {name!r}" in p for p in training.value.problems)
    assert not (root / MARKER).exists()


def test_a_pipeline_command_stops_with_exit_code_2_naming_the_manifest_and_entry(tmp_path, capsys):
    from data_pipeline.__main__ import run

    from animegamer.errors import exit_on_user_error

    root = _pipeline_root(tmp_path, _bad_names(tmp_path / "pipeline")["pipe url"])
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as stopped:
        exit_on_user_error(run)(compose_config("pipeline", [f"pipeline.output={root}", "pipeline.steps=[sessions]"]))
    assert stopped.value.code == USER_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert f"step sessions: {root / 'clips' / MANIFEST}: shards[0]" in err and "Traceback" not in err
    assert not (root / MARKER).exists()
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before  # nothing written or lost


def test_a_path_given_to_the_readers_is_opened_as_a_file_never_run(tmp_path):
    """The readers hand webdataset opened files: a path string is never a command, whatever it says."""
    command = f"/bin/sh -c 'touch {tmp_path / MARKER}'"
    with pytest.raises(FileNotFoundError):  # a local path of that name
        list(iter_samples([f"pipe:{command}"], video=False))
    with pytest.raises(RemoteReadError, match="cannot read pipe:// URLs"):  # a URL of no storage protocol
        list(iter_samples([f"pipe:/{command}"], video=False))
    assert not (tmp_path / MARKER).exists()


def test_the_name_rule():
    assert shard_name_problem("shard-000000.tar") is None and shard_name_problem("a_b.c-1.tar") is None
    for name, why in (("", "empty"), ("a\0.tar", "NUL"), ("x" * 252 + ".tar", "longer than 255"),
                      ("pipe:x.tar", "':'"), ("s3://b/x.tar", "':'"), ("C:\\x.tar", "':'"), ("a\\x.tar", "separator"),
                      ("..", "folder"), ("shard.npy", "does not end in .tar"), (".hidden.tar", "starts with"),
                      ("-rf.tar", "starts with"), ("a b.tar", "characters"), ("é.tar", "characters"),
                      ("x.tar\n", "does not end"), (7, "not a string")):
        assert why in shard_name_problem(name), name


# ------------------------------------------------------------------------------------------ digests
def _shard_folder(tmp_path: Path, sizes=(3, 2)) -> Path:
    folder = tmp_path / "shards"
    shards = []
    for number, size in enumerate(sizes):
        name = f"shard-{number:06d}.tar"
        digest = _write_shard(folder / name, [f"s{number}-{i:04d}" for i in range(size)])
        shards.append({"name": name, "count": size, "sha256": digest})
    _manifest(folder, shards)
    return folder


def _record_sha256(folder: Path, number: int, sha256: str) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["shards"][number]["sha256"] = sha256
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_a_shard_whose_bytes_differ_from_the_recorded_sha256_is_an_error_naming_it(tmp_path):
    folder = _shard_folder(tmp_path)
    assert len(list(iter_samples(folder_shards(folder), video=False))) == 5
    _record_sha256(folder, 1, "0" * 64)
    with pytest.raises(ShardDigestError) as mismatch:
        list(iter_samples(folder_shards(folder), video=False))
    assert f"{folder / 'shard-000001.tar'}: its sha256 is {sha256_file(folder / 'shard-000001.tar')}" in str(mismatch.value)
    assert f"{folder / MANIFEST} records {'0' * 64}" in str(mismatch.value)
    with pytest.raises(ShardDigestError, match="shard-000001.tar"):
        list(training_dataset(folder_shards(folder), samples_per_rank=40, shuffle_buffer=0, video=False))


def test_a_shard_changed_after_its_manifest_stops_the_pipeline_step_reading_it(tmp_path):
    from data_pipeline.sessions import build_sessions

    root = tmp_path / "pipeline"
    digest = _write_shard(root / "clips" / "shard-000000.tar", ["f-000000"])
    _manifest(root / "clips", [{"name": "shard-000000.tar", "count": 1, "sha256": digest}])
    _write_shard(root / "clips" / "shard-000000.tar", ["f-000001"])  # rewritten in place, manifest not
    with pytest.raises(ShardDigestError, match=f"{root / 'clips' / 'shard-000000.tar'}: its sha256"):
        build_sessions(_pipeline_cfg(root).pipeline)
    assert not (root / "sessions.json").exists()


def test_a_good_folder_reads_as_webdatasets_own_reader_reads_it(tmp_path):
    """Opened files instead of paths: the same raw samples, byte for byte, in the same order."""
    folder = _shard_folder(tmp_path)
    paths = shard_urls(folder)
    ours = list(shard_samples(folder_shards(folder)))
    theirs = [{k: v for k, v in s.items() if k != "__local_path__"}
              for s in wds.WebDataset(paths, shardshuffle=False, nodesplitter=None)]
    assert len(ours) == 5 and ours == theirs
    assert [s["__key__"] for s in iter_samples(folder_shards(folder), video=False)] == [s["__key__"] for s in theirs]
    assert paths == [str(folder / "shard-000000.tar"), str(folder / "shard-000001.tar")]
    moved = shutil.copytree(folder, tmp_path / "moved")  # a folder read where it is now
    assert [s.path for s in folder_shards(moved)] == [str(moved / "shard-000000.tar"), str(moved / "shard-000001.tar")]
