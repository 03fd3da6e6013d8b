"""Each kind of bad input is reported in report.json with its reason and skipped; the rest runs."""
from __future__ import annotations

import json
import re

import pytest
from bad_inputs import make_bad_inputs
from conftest import pipeline_overrides, run_pipeline

from animegamer.config.schema import ClipsConfig, IngestConfig
from data_pipeline.errors import BadInput
from data_pipeline.ingest import probe, readable_error

EXPECTED_REASON = {"not_video": "unreadable"}
# What decord puts in front of its messages: a time and the C++ source location (none may reach a report).
DECODER_INTERNALS = re.compile(r"\[\d\d:\d\d:\d\d\]|\.cc:\d+|Check failed")
# decord's error for a packet its decoder thread could not decode (a corrupt stream), as it raises it.
THREAD_ERROR = ("[22:43:20] /github/workspace/src/video/ffmpeg/threaded_decoder.cc:292: [22:43:20] /github/workspace/"
                "src/video/ffmpeg/threaded_decoder.cc:218: Check failed: avcodec_send_packet(dec_ctx_.get(), pkt.get()) "
                ">= 0 (-1094995529 vs. 0) Thread worker: Error sending packet.")


@pytest.fixture(scope="module")
def bad_files(toy_film, tmp_path_factory):
    return make_bad_inputs(tmp_path_factory.mktemp("bad"), toy_film.video_path)


def test_probe_names_each_reason(bad_files):
    for kind, path in bad_files.items():
        with pytest.raises(BadInput) as caught:
            probe(path, path.stem, IngestConfig(), ClipsConfig())
        assert caught.value.reason == EXPECTED_REASON.get(kind, kind), (path, caught.value)
        assert str(path) in str(caught.value)
        assert not DECODER_INTERNALS.search(caught.value.detail), caught.value.detail


def test_a_decoder_error_is_recorded_as_what_went_wrong():
    """The reason report.json and the log give: the message without decord's source locations and check
    expression, its ffmpeg code named by ffmpeg's text; any other error keeps its type's name."""
    import decord

    assert readable_error(decord.DECORDError(THREAD_ERROR)) == \
        "Thread worker: Error sending packet. (ffmpeg: Invalid data found when processing input)"
    assert readable_error(decord.DECORDError("\n[10:00:00] /src/video/video_reader.cc:486: Error: av_read_frame failed "
                                             "with 1094995529\nStack trace:\n  [bt] (0) libdecord.so")) == \
        "Error: av_read_frame failed with 1094995529 (ffmpeg: Invalid data found when processing input)"
    assert readable_error(KeyError("film"), typed=True) == "KeyError: 'film'"
    assert readable_error(RuntimeError("x" * 500), typed=True) == "RuntimeError: " + "x" * 186  # 200 characters


def test_a_decoder_crash_after_probing_is_reported_readably(toy_film, tmp_path, monkeypatch, caplog):
    """A film that probes fine but whose decoder fails later is skipped with the readable reason."""
    import decord

    from animegamer.config.schema import PipelineConfig
    from data_pipeline import process

    def crash(film, shots):
        raise decord.DECORDError(THREAD_ERROR)

    monkeypatch.setattr(process, "detect_cuts", crash)
    with caplog.at_level("WARNING", logger=process.log.name):
        record = process.plan_film(str(toy_film.video_path), "film", PipelineConfig(), str(tmp_path))
    assert record["reason"] == process.DECODE_ERROR
    assert record["detail"] == "Thread worker: Error sending packet. (ffmpeg: Invalid data found when processing input)"
    assert not DECODER_INTERNALS.search(caplog.text) and record["detail"] in caplog.text


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
