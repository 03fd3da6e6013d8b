"""The pipeline's pre-flight: steps that need no films write no toy film and need no caption file; the
toy film never replaces real clips (and is recognised in an output folder moved elsewhere); every
problem is listed at once (every caption setting's too); a run refused after drawing the toy film (its
caption endpoint unreachable, a step switched off) leaves no toy film behind but keeps one that was there;
a step never reads a derived folder made from older inputs."""
from __future__ import annotations

import json
import shutil

import pytest
from conftest import run_pipeline
from http_fakes import FakeChatServer, no_proxy  # noqa: F401 - no_proxy: autouse

from animegamer.config.compose import compose_config
from animegamer.config.validate import ConfigError, check_pipeline
from animegamer.utils.io import write_json_atomic

TOY_DIR = "toy_film"


def _shards(*names: str) -> list[dict]:
    return [{"name": name, "count": 1, "sha256": name * 4} for name in names]


def test_steps_that_need_no_films_write_no_toy_film(tmp_path):
    output = tmp_path / "pipeline"
    with pytest.raises(ConfigError, match="representations/manifest.json does not exist"):
        run_pipeline([f"pipeline.output='{output}'", "pipeline.steps=[session_shards]"])
    assert not (output / TOY_DIR).exists()


def test_only_captioning_steps_need_the_caption_file():
    def caption_problems(steps: str) -> list[str]:
        cfg = compose_config("pipeline", ["source=films", "pipeline.inputs=[/films]", f"pipeline.steps=[{steps}]"])
        return [p for p in check_pipeline(cfg.pipeline) if "pipeline.caption" in p]

    for steps in ("adaptation", "sessions", "representations,session_shards", "precompute"):
        assert caption_problems(steps) == [], steps
    for steps in ("process", "finalize"):
        assert len(caption_problems(steps)) == 1, steps


def test_every_caption_setting_problem_is_named():
    """A missing caption file does not hide a wrong frame count (one run names both)."""
    cfg = compose_config("pipeline", ["source=films", "pipeline.inputs=[/films]",
                                      "pipeline.caption.path=/no/captions.jsonl", "pipeline.caption.num_frames=0"])
    frames = cfg.pipeline.clips.frames
    assert [p for p in check_pipeline(cfg.pipeline) if p.startswith("pipeline.caption")] == [
        "pipeline.caption.path='/no/captions.jsonl': /no/captions.jsonl does not exist (the jsonl backend reads a "
        "caption file or a folder of them)",
        f"pipeline.caption.num_frames=0 must be in 1..pipeline.clips.frames={frames}"]


def test_toy_film_never_replaces_the_clips_of_real_films(tmp_path):
    output = tmp_path / "pipeline"
    film = "/data/films/ep01.mp4"
    write_json_atomic(output / "clips" / "manifest.json",
                      {"sources": [{"path": film, "sha256": "0" * 64}], "shards": []})
    with pytest.raises(ConfigError) as caught:
        run_pipeline([f"pipeline.output='{output}'", "pipeline.steps=[process,finalize,precompute]",
                      "pipeline.precompute.enabled=false"])
    toy, precompute = caught.value.problems  # listed together, not one per attempt
    assert f"holds clips of other films ({film})" in toy
    assert precompute == "pipeline.steps names precompute but pipeline.precompute.enabled is false: set it to true"
    assert not (output / TOY_DIR).exists()


def test_toy_film_is_recognised_in_a_moved_output_folder(tmp_path):
    """The clips' sources name the toy film where the folder was; its content is the same."""
    from animegamer.utils.io import sha256_file
    from data_pipeline.preflight import toy_problems

    output = tmp_path / "moved"
    toy_film = output / TOY_DIR / "toyfilm.mp4"
    toy_film.parent.mkdir(parents=True)
    toy_film.write_bytes(b"the toy film's bytes")
    sources = [{"path": f"/old/place/{TOY_DIR}/{toy_film.name}", "sha256": sha256_file(toy_film)}]
    write_json_atomic(output / "clips" / "manifest.json", {"sources": sources, "shards": []})
    cfg = compose_config("pipeline", [f"pipeline.output='{output}'"]).pipeline
    assert toy_problems(cfg, toy_film.parent) == []


def test_unwritable_output_is_reported_before_the_toy_film_is_written(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    output = blocker / "pipeline"
    with pytest.raises(ConfigError) as caught:
        run_pipeline([f"pipeline.output='{output}'", "pipeline.steps=[process,finalize]"])
    assert caught.value.problems[0].startswith(f"pipeline.output={output}: cannot write there")


def _closed_endpoint() -> list[str]:
    """An http caption backend whose port refuses connections (the server is gone)."""
    with FakeChatServer([]) as gone:
        url = gone.url
    return ["pipeline.caption.backend=http", f"pipeline.caption.url='{url}'", "pipeline.caption.model_name=x"]


@pytest.mark.parametrize(("refusal", "says"), [
    ("endpoint", "cannot reach"),
    ("switched_off", "pipeline.steps names precompute but pipeline.precompute.enabled is false"),
])
def test_a_run_refused_after_drawing_the_toy_film_leaves_nothing(tmp_path, refusal, says):
    """source=toy (the default) into an empty folder: the checks that read the films come after the toy
    film is drawn, and their refusal writes nothing."""
    output = tmp_path / "pipeline"
    output.mkdir()
    extra = _closed_endpoint() if refusal == "endpoint" else [
        "pipeline.steps=[process,finalize,precompute]", "pipeline.precompute.enabled=false"]
    with pytest.raises(ConfigError, match=says):
        run_pipeline([f"pipeline.output='{output}'", *extra])
    assert list(output.iterdir()) == []


def test_a_refused_run_keeps_the_toy_film_it_found(tmp_path, toy_film):
    output = tmp_path / "pipeline"
    kept = output / TOY_DIR
    kept.mkdir(parents=True)
    for path in (toy_film.video_path, toy_film.captions_path, toy_film.truth_path):
        shutil.copy(path, kept / path.name)
    before = {p.name: p.read_bytes() for p in kept.iterdir()}
    with pytest.raises(ConfigError, match="cannot reach"):
        run_pipeline([f"pipeline.output='{output}'", *_closed_endpoint()])
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == before
    assert [p.name for p in output.iterdir()] == [TOY_DIR]


def test_a_step_refuses_inputs_made_from_older_ones(tmp_path):
    """Representations made from features that have been recomputed since are refused, naming the step."""
    from animegamer.media.fingerprint import shards_digest
    from animegamer.data.lineage import MADE_FROM, stale_reason

    output = tmp_path / "pipeline"
    clips = {"sources": [], "shards": _shards("a")}
    features = {"shards": _shards("b"), MADE_FROM: {"clips": shards_digest(clips)}}
    old_features = {"shards": _shards("c")}
    representations = {"shards": _shards("d"), MADE_FROM: {"features": shards_digest(old_features)}}
    sessions = {"sessions": [], MADE_FROM: {"clips": shards_digest(clips)}}
    for name, data in (("clips", clips), ("features", features), ("representations", representations)):
        write_json_atomic(output / name / "manifest.json", data)
    (output / "sessions.json").write_text(json.dumps(sessions))

    assert stale_reason(output, "features") is None and stale_reason(output, "sessions") is None
    reason = stale_reason(output, "representations")
    assert reason == (f"{output}/representations/manifest.json was made from other features than the current "
                      "ones: run pipeline.steps=[representations] again")
    with pytest.raises(ConfigError) as caught:
        run_pipeline(["source=films", f"pipeline.output='{output}'", "pipeline.steps=[session_shards]"])
    assert caught.value.problems == [f"step session_shards: {reason}"]

    representations[MADE_FROM] = {"features": shards_digest(features)}
    write_json_atomic(output / "representations" / "manifest.json", representations)
    assert stale_reason(output, "representations") is None
