"""The pages a person opens after a run (evaluation gallery and reports, the game's storyboard), from a
real tiny run: the pipeline's toy film shards, untrained tiny exports, ``evaluate.py``'s code path and
the quick start's demonstration game, started from a relative output folder and then moved elsewhere."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import SMALL_CLIPS
from page_helpers import broken_links, image_pixels, read_page

BLACK = 16  # mean brightness (0..255) below which a poster reads as a black frame


def _untrained_exports(composed, root: Path) -> dict[str, Path]:
    """Phase (b) and (c) exports of untrained tiny models, recording the run's config as training would."""
    from animegamer.checkpoints.export import save_export
    from animegamer.config.compose import carried_over
    from animegamer.phases.phase_b import PhaseB
    from animegamer.phases.phase_c import PhaseC, export_phase_c

    composed = carried_over("train", composed)  # the training run that would have made them
    cfg = OmegaConf.to_object(composed)
    resolved = OmegaConf.to_container(composed, resolve=True)
    torch.manual_seed(0)
    exports = {"b": root / "b" / "export", "c": root / "c" / "export"}
    save_export(exports["b"], PhaseB(cfg).model, {"phase": "b", "config": {**resolved, "phase": {"name": "b"}}})
    export_phase_c(PhaseC(cfg), exports["c"], {"phase": "c", "config": {**resolved, "phase": {"name": "c"}}})
    return exports


@pytest.fixture(scope="session")
def pages(request, tmp_path_factory):
    """A run written from a relative folder (as the quick start does), then moved to another place; built once
    per test run by the first worker that needs it (this file's tests and tests/test_baselines.py read it),
    the others wait for it and read the same folder."""
    from filelock import FileLock

    from conftest import run_folder

    shared = run_folder(tmp_path_factory) / "pages"
    shared.mkdir(exist_ok=True)
    summary = shared / "pages.json"
    with FileLock(shared.with_suffix(".lock")):
        if not summary.is_file():  # a failed build left no summary: the next worker builds it again
            _build_pages(request.getfixturevalue("toy_run"), shared, summary)
    built = json.loads(summary.read_text())
    return SimpleNamespace(root=Path(built["root"]), result=built["result"], clips=Path(built["clips"]))


def _build_pages(toy_run, shared: Path, summary: Path) -> None:
    from animegamer.config.compose import compose_config
    from animegamer.evaluation.runner import run as run_evaluation
    from animegamer.recipe import play_story

    pipeline, _ = toy_run
    workdir, moved = shared / "workdir", shared / "moved" / "elsewhere"
    for leftover in (workdir, moved.parent):
        shutil.rmtree(leftover, ignore_errors=True)
    workdir.mkdir()
    moved.parent.mkdir()
    # Evaluation reads the clip shards only; the session shards it checks for need a phase (a) export.
    base = ["experiment=quickstart_eval", f"pipeline.output={pipeline}", "data.sessions=clips", *SMALL_CLIPS]
    exports = _untrained_exports(compose_config("evaluate", base), workdir / "run")
    overrides = [*base, f"evaluation.mllm_export={exports['b']}", f"evaluation.renderer_export={exports['c']}",
                 f"evaluation.reconstruction_export={exports['c']}", "evaluation.games=2", "evaluation.turns=2",
                 "evaluation.out=run/eval"]
    started = Path.cwd()
    os.chdir(workdir)
    try:
        result = run_evaluation(compose_config("evaluate", overrides))
        play_story(compose_config("evaluate", overrides), Path("run/game"))
    finally:
        os.chdir(started)
    shutil.move(str(workdir / "run"), moved)
    summary.write_text(json.dumps({"root": str(moved), "result": result, "clips": str(Path(pipeline) / "clips")}))


def _shard_clips(folder: Path, keys: set[str]) -> dict[str, bytes]:
    from animegamer.data.indexed import IndexedShardDataset

    clips = IndexedShardDataset(folder, lambda s: s["mp4"], lambda k: k in keys, video=False)
    return {key: clips[i] for i, key in enumerate(clips.keys())}


def _posters(page: Path) -> list[Path]:
    return [page.parent / v["poster"] for card in read_page(page).cards for v in card.videos]


@pytest.mark.parametrize("page", ["eval/gallery.html", "game/index.html"])
def test_every_link_resolves_from_the_moved_folder_and_every_clip_has_a_frame_poster(pages, page):
    page = pages.root / page
    assert broken_links(page) == []
    videos = [v for card in read_page(page).cards for v in card.videos]
    assert videos and all(v.get("poster") for v in videos)
    for poster in _posters(page):
        pixels = image_pixels(poster).astype(np.float64)
        assert pixels.mean() > BLACK and pixels.std() > 1.0, (poster, pixels.mean(), pixels.std())


def test_the_report_links_each_games_storyboard_from_the_moved_folder(pages):
    import re

    report = pages.root / "eval" / "report.md"
    games = json.loads((pages.root / "eval" / "metrics.json").read_text())["games"]
    line = next(line for line in report.read_text().splitlines() if line.startswith("Each game turn by turn"))
    links = dict(re.findall(r"\[([^\]]+)\]\(([^)]+)\)", line))
    assert sorted(links) == sorted(game["id"] for game in games if game["turns"])
    assert all((report.parent / target).is_file() and target.endswith("/index.html") for target in links.values())


def test_gallery_shows_the_held_out_clip_beside_each_generated_one(pages):
    gallery = pages.root / "eval" / "gallery.html"
    metrics = json.loads((pages.root / "eval" / "metrics.json").read_text())
    benchmark = json.loads((pages.root / "eval" / "benchmark.json").read_text())
    cards = [card for card in read_page(gallery).cards if card.videos]
    assert len(cards) == metrics["metrics"]["games"]["completed_turns"] > 0
    keys = [turn["key"] for game in benchmark["games"] for turn in game["turns"]][: len(cards)]
    truth = _shard_clips(pages.clips, set(keys))
    for card, key in zip(cards, keys):
        generated, real = card.videos
        assert generated["src"].startswith("games/") and real["src"] == f"truth/{key}.mp4"
        assert (gallery.parent / real["src"]).read_bytes() == truth[key]  # the held-out clip itself
    # metrics.json records clip paths relative to its own folder too.
    recorded = [t["truth_video"] for g in metrics["games"] for t in g["turns"]]
    assert recorded == [f"truth/{key}.mp4" for key in keys]


def test_gallery_states_each_unavailable_metric_reason_once(pages):
    text = (pages.root / "eval" / "gallery.html").read_text()
    reasons = {m["reason"] for name, m in pages.result["metrics"].items()
               if isinstance(m, dict) and m.get("available") is False}
    assert reasons  # no CLIP weights in CI: CLIP-I/T/T^E are not measured
    cards = len([c for c in read_page(pages.root / "eval" / "gallery.html").cards if c.videos])
    assert cards > 1
    for reason in reasons:
        assert text.count(reason) == 1, reason
    assert "n/a" not in text


def test_reports_say_what_they_measured_and_with_which_model(pages):
    from animegamer.metrics.setup import format_count

    eval_dir = pages.root / "eval"
    metrics = json.loads((eval_dir / "metrics.json").read_text())["metrics"]
    report = (eval_dir / "report.md").read_text()
    setup = metrics["setup"]
    games = json.loads((eval_dir / "metrics.json").read_text())["games"]
    turns = sum(len(g["turns"]) for g in games)
    assert setup["model"] == "tiny" and setup["device"] == "cpu" and setup["dtype"] == "float32"
    assert set(setup["parameters"]) == {"MLLM", "renderer (encoder + decoder)", "VAE"}
    assert all(count > 0 for count in setup["parameters"].values())
    setup_line = next(line for line in report.splitlines() if line.startswith("- Ours:"))
    for label, count in setup["parameters"].items():
        assert f"{label} {format_count(count)}" in setup_line
    assert "`tiny`" in setup_line and "float32 on cpu" in setup_line and setup["hardware"] in setup_line
    assert f"{len(games)} games, {turns} turns" in setup_line
    assert "full-size" in report and "Ours (`tiny`)" in report

    reconstruction = json.loads((eval_dir / "reconstruction" / "metrics.json").read_text())["metrics"]
    text = (eval_dir / "reconstruction" / "report.md").read_text()
    assert reconstruction["clips"] > 0 and f"{reconstruction['clips']} clips" in text
    assert not re.search(r"\d+ games", text) and not (eval_dir / "reconstruction" / "gallery.html").exists()
    assert "`tiny`" in text and "full-size" in text
