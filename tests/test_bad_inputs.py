"""Each kind of bad input is reported in report.json with its reason and skipped; the rest runs."""
from __future__ import annotations

import json

import pytest
from bad_inputs import make_bad_inputs
from conftest import pipeline_overrides, run_pipeline

from animegamer.config.schema import ClipsConfig, IngestConfig
from data_pipeline.errors import BadInput
from data_pipeline.ingest import probe

EXPECTED_REASON = {"not_video": "unreadable"}


@pytest.fixture(scope="module")
def bad_files(toy_film, tmp_path_factory):
    return make_bad_inputs(tmp_path_factory.mktemp("bad"), toy_film.video_path)


def test_probe_names_each_reason(bad_files):
    for kind, path in bad_files.items():
        with pytest.raises(BadInput) as caught:
            probe(path, path.stem, IngestConfig(), ClipsConfig())
        assert caught.value.reason == EXPECTED_REASON.get(kind, kind), (path, caught.value)
        assert str(path) in str(caught.value)


def test_bad_inputs_reported_and_skipped_good_film_unaffected(toy_film, toy_run, bad_files, tmp_path):
    output = tmp_path / "run"
    inputs = [toy_film.video_path, *bad_files.values()]
    report = run_pipeline(pipeline_overrides(output, inputs, toy_film.captions_path, "pipeline.steps=[process,finalize]"))
    on_disk = json.loads((output / "report.json").read_text())
    skipped = {item["path"]: item["reason"] for item in on_disk["skipped_inputs"]}
    assert skipped == {str(p.resolve()): EXPECTED_REASON.get(k, k) for k, p in bad_files.items()}
    assert report["counts"]["clips"] == toy_run[1]["counts"]["clips"]
    assert report["counts"]["films"] == 1 and report["counts"]["skipped_inputs"] == len(bad_files)
    shards = sorted((output / "clips").glob("shard-*.tar"))
    assert [p.read_bytes() for p in shards] == [p.read_bytes() for p in sorted((toy_run[0] / "clips").glob("shard-*.tar"))]


def test_only_bad_inputs_stop_with_each_reason_before_later_steps(toy_film, bad_files, tmp_path):
    """Nothing usable among the inputs: the run stops with the skipped files and their reasons (no
    traceback from a later step reading empty shards), after writing report.json."""
    from animegamer.errors import UserError

    output = tmp_path / "run"
    with pytest.raises(UserError, match="no clips from") as caught:
        run_pipeline(pipeline_overrides(output, list(bad_files.values()), toy_film.captions_path,
                                        "pipeline.steps=[process,finalize,sessions]"))
    message = str(caught.value)
    assert all(str(p.resolve()) in message for p in bad_files.values()) and "report.json" in message, message
    assert json.loads((output / "report.json").read_text())["counts"]["skipped_inputs"] == len(bad_files)
