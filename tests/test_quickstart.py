"""README command 1's job, end to end: toy film -> pipeline -> phase (a1, a2) -> representations."""
from __future__ import annotations

import numpy as np

from animegamer.data.shards import iter_samples, read_manifest, shard_urls


def test_quickstart_end_to_end(tmp_path):
    from animegamer.quickstart import run_quickstart

    summary = run_quickstart([f"pipeline.output={tmp_path}/pipeline", f"output_dir={tmp_path}/" + "${phase.name}"])
    reps = list(iter_samples(shard_urls(summary["representations"]), video=False))
    clips = read_manifest(summary["clip shards"])["counts"]["clips"]
    assert len(reps) == clips > 0
    assert all(r["rep.npy"].dtype == np.float16 and r["rep.npy"].shape == (46, 32) for r in reps)
    manifest = read_manifest(summary["representations"])
    assert manifest["export_sha256"] and manifest["features_manifest_sha256"]
    assert summary["phase a2 val/loss"] is not None and np.isfinite(summary["phase a2 val/loss"])
    assert list((tmp_path / "a_joint" / "validation").rglob("*.mp4"))
    sessions = read_manifest(summary["session shards"])
    assert sessions["counts"]["sessions"] > 0 and sessions["representations_manifest_sha256"]
    adaptation = list(iter_samples(shard_urls(summary["adaptation shards"]), video=False))
    assert {a["__key__"] for a in adaptation} <= {r["__key__"] for r in reps} and adaptation
    assert all(a["pred_rep.npy"].shape == (46, 32) and a["latents.npy"].ndim == 4 for a in adaptation)
    assert 0 <= summary["phase b val/state_accuracy"] <= 1
    # Running it again resumes everything that is done: same representations, byte for byte.
    before = {p.name: p.read_bytes() for p in sorted((tmp_path / "pipeline" / "representations").glob("*.tar"))}
    run_quickstart([f"pipeline.output={tmp_path}/pipeline", f"output_dir={tmp_path}/" + "${phase.name}"])
    after = {p.name: p.read_bytes() for p in sorted((tmp_path / "pipeline" / "representations").glob("*.tar"))}
    assert before == after
