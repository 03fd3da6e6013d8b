"""Inputs split over N machines: each part processes its share, one finalize writes all shards."""
from __future__ import annotations

import pytest
from conftest import pipeline_overrides, run_pipeline

from data_pipeline.ingest import split_part


def test_split_is_a_deterministic_partition(tmp_path):
    paths = [tmp_path / f"film{i:02d}.mp4" for i in range(11)]
    parts = [split_part(paths, part, 3) for part in range(3)]
    assert sorted(p for part in parts for p in part) == sorted(paths)
    assert parts == [split_part(list(reversed(paths)), part, 3) for part in range(3)]


def test_two_parts_then_finalize_equals_one_run(toy_film, tmp_path_factory):
    from data_pipeline.toyfilm import make_toy_film

    second = make_toy_film(tmp_path_factory.mktemp("toy_b"), film_id="toyfilm_b", variant=1)
    inputs = [toy_film.video_path, second.video_path]
    captions = tmp_path_factory.mktemp("captions")
    for film in (toy_film, second):
        (captions / film.captions_path.name).write_bytes(film.captions_path.read_bytes())

    def overrides(output, *extra):
        return pipeline_overrides(output, inputs, captions, *extra)

    split = tmp_path_factory.mktemp("split")
    run_pipeline(overrides(split, "pipeline.num_parts=2", "pipeline.part=0", "pipeline.steps=[process]"))
    with pytest.raises(RuntimeError, match="not processed yet"):
        run_pipeline(overrides(split, "pipeline.steps=[finalize]"))
    run_pipeline(overrides(split, "pipeline.num_parts=2", "pipeline.part=1", "pipeline.steps=[process]"))
    report = run_pipeline(overrides(split, "pipeline.steps=[finalize]"))

    whole = tmp_path_factory.mktemp("whole")
    reference = run_pipeline(overrides(whole, "pipeline.steps=[process,finalize]", "pipeline.workers=2"))
    assert report["counts"] == reference["counts"] and report["counts"]["films"] == 2
    read = lambda folder: [p.read_bytes() for p in sorted((folder / "clips").glob("shard-*.tar"))]
    assert read(split) == read(whole)
