"""The pipeline against the toy film's ground truth: cuts, motion levels, captions, shard contents."""
from __future__ import annotations

import json

import numpy as np
import pytest

from animegamer.contracts.shards import IMAGE, LATENTS, TEXT
from animegamer.data.shards import iter_samples, read_manifest, shard_urls
from data_pipeline.staging import Staging


def _clip_metas(output):
    return [s["json"] for s in iter_samples(shard_urls(output / "clips"), video=False)]


def _truth_shot(toy_film, meta):
    middle = (meta["source_frames"][0] + meta["source_frames"][-1]) / 2
    return next(s for s in toy_film.shots if s.start_frame <= middle < s.end_frame)


def test_every_cut_found_within_one_frame_and_no_false_cut(toy_film, toy_run):
    output, _ = toy_run
    plan = Staging(output).plan(toy_film.film_id)
    found = [start for start, _ in plan["shots"][1:]]
    assert len(found) == len(toy_film.cut_frames), (found, toy_film.cut_frames)
    for true_cut, cut in zip(toy_film.cut_frames, found):
        assert abs(true_cut - cut) <= 1


def test_clips_never_straddle_a_cut(toy_film, toy_run):
    for meta in _clip_metas(toy_run[0]):
        shot = _truth_shot(toy_film, meta)
        assert shot.start_frame <= meta["source_frames"][0] and meta["source_frames"][-1] < shot.end_frame


def test_motion_levels_ordered_like_true_speeds(toy_film, toy_run):
    pairs = [(_truth_shot(toy_film, m).speed_px_per_frame, m["motion"]["level"], m["motion"]["flow"])
             for m in _clip_metas(toy_run[0])]
    speeds = sorted({p[0] for p in pairs})
    assert len(speeds) == 5
    for slow, level_slow, flow_slow in pairs:
        for fast, level_fast, flow_fast in pairs:
            if slow < fast:
                assert level_slow <= level_fast and flow_slow < flow_fast, (slow, fast, flow_slow, flow_fast)
    mean_level = [np.mean([lv for s, lv, _ in pairs if s == speed]) for speed in speeds]
    assert mean_level == sorted(mean_level) and mean_level[0] == 1 and mean_level[-1] == 5
    static_flows = [f for s, _, f in pairs if s == 0]
    assert max(static_flows) == 0.0


def test_captions_equal_ground_truth(toy_film, toy_run):
    metas = _clip_metas(toy_run[0])
    assert metas
    for meta in metas:
        truth = _truth_shot(toy_film, meta).caption.to_record()
        assert meta["captioner"]["status"] == "ok"
        assert meta["caption"] == {k: truth[k] for k in ("character", "motion", "adverb", "environment", "time_of_day")}
        assert meta["states"] == truth["states"]
        c = meta["caption"]
        assert meta["instruction"] == (f"Character: {c['character']}; Motion: {c['adverb']} {c['motion']}; "
                                       f"Background: {c['time_of_day']} {c['environment']}.")
        assert meta["motion_text"] == f"{c['adverb']} {c['motion']}"


def test_clip_shards_round_trip_the_contract(toy_run):
    output, report = toy_run
    manifest = read_manifest(output / "clips")
    samples = list(iter_samples(shard_urls(output / "clips")))
    assert len(samples) == manifest["counts"]["clips"] == report["counts"]["clips"] > 10
    for sample in samples:
        meta, video = sample["json"], sample["mp4"]
        assert sample["__key__"] == meta["key"] == f"{meta['film']}-{meta['clip']:06d}"
        assert video.dtype == np.uint8 and video.shape == (meta["frames"], meta["height"], meta["width"], 3)
        assert (meta["frames"], meta["fps"]) == (17, 8)
        assert meta["end"] - meta["start"] == pytest.approx((meta["frames"] - 1) / meta["fps"], abs=0.1)
        assert set(meta["caption"]) == {"character", "motion", "adverb", "environment", "time_of_day"}
        assert set(meta["states"]) == {"SC", "ET", "ST"} and meta["states"]["ST"] in (-1, 1)
        assert meta["motion"]["level"] in range(1, 6) and meta["motion"]["flow"] >= 0
        assert {"name", "version", "status"} <= set(meta["captioner"])
    bins = manifest["motion_bins"]
    assert len(bins["edges"]) == 4 and sorted(bins["level_flow"]) == ["1", "2", "3", "4", "5"]
    assert manifest["sources"][0]["sha256"] and manifest["sources"][0]["size"] > 0


def test_report_and_histogram(toy_run):
    output, report = toy_run
    on_disk = json.loads((output / "report.json").read_text())
    assert on_disk["counts"] == report["counts"]
    assert on_disk["skipped_inputs"] == []
    assert set(on_disk["seconds_per_stage"]) >= {"ingest", "shots", "decode", "motion", "encode", "caption"}
    assert (output / "motion_levels.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sessions_are_consecutive_clips_of_one_film(toy_run):
    output, _ = toy_run
    index = json.loads((output / "sessions.json").read_text())
    assert index["sessions"] and index["turns"] == 5
    for session in index["sessions"]:
        numbers = [int(k.rsplit("-", 1)[1]) for k in session["keys"]]
        assert numbers == list(range(numbers[0], numbers[0] + 5))


def test_feature_shards_round_trip_the_contract(toy_run):
    from animegamer.config.compose import compose_config

    output, report = toy_run
    enc = compose_config("pipeline", ["model=tiny"]).model.encoders
    clip_keys = [m["key"] for m in _clip_metas(output)]
    samples = list(iter_samples(shard_urls(output / "features"), video=False))
    assert [s["__key__"] for s in samples] == clip_keys
    assert report["features"]["clips"] == len(samples)
    patches = (enc.clip.image_size // enc.clip.patch_size) ** 2
    spatial = 2 ** (len(enc.vae.block_out_channels) - 1)
    for sample in samples:
        meta = sample["json"]
        latent_frames = (meta["frames"] - 1) // enc.vae.temporal_compression_ratio + 1
        expected = {
            LATENTS: (latent_frames, enc.vae.latent_channels, meta["height"] // spatial, meta["width"] // spatial),
            TEXT: (enc.t5.max_tokens, enc.t5.d_model),
            IMAGE: (patches, enc.clip.hidden_size),
        }
        for name, shape in expected.items():
            assert sample[name].shape == shape and sample[name].dtype == np.float32, name
            assert np.isfinite(sample[name]).all()
    manifest = read_manifest(output / "features")
    assert manifest["clip_manifest_sha256"] and manifest["encoders"]
