"""Evaluation metrics (animegamer.metrics) on inputs whose answers are known, CPU, tiny random CLIP."""
from __future__ import annotations

import html
import json
import math
import re

import numpy as np
import pytest

from animegamer.config.schema import MotionConfig
from animegamer.evaluation.report import PAPER_TABLE1, PAPER_TABLE3_RECONSTRUCTION, write_report
from animegamer.metrics import available, format_metric, mean_metric, state_accuracy, unavailable
from animegamer.media.motion_bins import MotionBins
from motion_helpers import shifted_clip, smooth_texture

EDGES = (0.5, 2.5, 10.0, 20.0)
BINS = MotionBins(
    edges=EDGES,
    level_flow={1: 0.0, 2: 1.5, 3: 6.0, 4: 15.0, 5: 25.0},
    source="fixed",
    counts={level: 10 for level in range(1, 6)},
)


def expected_level(flow: float) -> int:
    """The level whose bin holds ``flow``, counted straight from the edges."""
    return 1 + sum(flow > edge for edge in EDGES)


# --------------------------------------------------------------------------- metric values
def test_available_and_unavailable_shapes():
    assert available(0.5) == {"value": 0.5, "available": True}
    missing = unavailable("no weights")
    assert missing == {"value": None, "available": False, "reason": "no weights"}
    assert format_metric(missing) == "n/a (no weights)"
    with pytest.raises(ValueError):
        available(float("nan"))
    with pytest.raises(ValueError):
        unavailable("")
    assert mean_metric([available(0.2), 0.4])["value"] == pytest.approx(0.3)
    assert mean_metric([0.2, missing]) == missing
    assert mean_metric([])["available"] is False


# --------------------------------------------------------------------------- CLIP
@pytest.fixture(scope="module")
def clip_scorer():
    from animegamer.metrics import ClipScorer

    return ClipScorer.random(seed=0)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    halves = np.zeros((48, 64, 3), dtype=np.uint8)
    halves[:, :32] = 255
    return noise, halves


def test_clip_embeddings_are_unit_vectors(clip_scorer, images):
    noise, halves = images
    image = clip_scorer.image_embeddings(np.stack([noise, halves, noise]))
    text = clip_scorer.text_embeddings(["softly talk", "a much longer instruction " * 20])
    assert image.shape == (3, 16) and text.shape == (2, 16)
    np.testing.assert_allclose(image.norm(dim=-1).numpy(), 1.0, atol=1e-5)
    np.testing.assert_allclose(text.norm(dim=-1).numpy(), 1.0, atol=1e-5)
    np.testing.assert_allclose(image[0].numpy(), image[2].numpy(), atol=1e-6)
    assert clip_scorer.image_embeddings(noise).shape == (1, 16)  # one (H, W, 3) image


def test_clip_i_is_one_for_identical_clips_and_lower_for_another_image(clip_scorer, images):
    noise, halves = images
    clip = np.stack([noise] * 4)
    assert clip_scorer.clip_i(clip, clip) == pytest.approx(1.0, abs=1e-5)
    assert clip_scorer.clip_i(clip, noise) == pytest.approx(1.0, abs=1e-5)
    other = clip_scorer.clip_i(np.stack([halves] * 4), noise)
    assert -1.0 <= other < 1.0 - 1e-4


def test_clip_t_in_range_and_deterministic(clip_scorer, images):
    from animegamer.metrics import ClipScorer

    clip = np.stack(images)
    text = "Character: Qiqi; Motion: softly talk; Background: day forest."
    score = clip_scorer.clip_t(clip, text)
    assert -1.0 <= score <= 1.0
    assert clip_scorer.clip_t(clip, text) == score
    assert ClipScorer.random(seed=0).clip_t(clip, text) == pytest.approx(score, abs=1e-6)
    assert ClipScorer.random(seed=1).clip_t(clip, text) != pytest.approx(score, abs=1e-6)


def test_clip_scorer_loads_from_a_local_folder(clip_scorer, images, tmp_path):
    from animegamer.metrics import ClipScorer, try_load_clip

    clip_scorer.model.save_pretrained(tmp_path / "clip")
    clip_scorer.tokenizer.save_pretrained(tmp_path / "clip")
    loaded = ClipScorer.from_pretrained(str(tmp_path / "clip"))
    clip = np.stack(images)
    assert loaded.clip_t(clip, "run") == pytest.approx(clip_scorer.clip_t(clip, "run"), abs=1e-6)
    assert loaded.clip_i(clip, images[0]) == pytest.approx(clip_scorer.clip_i(clip, images[0]), abs=1e-6)

    scorer, reason = try_load_clip(str(tmp_path / "absent"))
    assert scorer is None and "not found" in reason
    scorer, reason = try_load_clip("")
    assert scorer is None and reason


def test_clip_scorer_refuses_non_uint8(clip_scorer):
    with pytest.raises(ValueError):
        clip_scorer.image_embeddings(np.zeros((2, 32, 32, 3), dtype=np.float32))


# --------------------------------------------------------------------------- DreamSim
def test_dreamsim_without_weights_is_unavailable_never_zero(tmp_path, images):
    from animegamer.metrics import dreamsim_score, load_dreamsim, try_load_dreamsim

    assert load_dreamsim(str(tmp_path / "no_weights")) is None
    scorer, reason = try_load_dreamsim(str(tmp_path / "no_weights"))
    assert scorer is None and reason
    metric = dreamsim_score(scorer, np.stack(images), images[0], reason)
    assert metric == {"value": None, "available": False, "reason": reason}
    assert metric["value"] != 0


def test_dreamsim_names_missing_weight_files(tmp_path, monkeypatch):
    import animegamer.metrics.dreamsim as ds

    monkeypatch.setattr(ds.importlib.util, "find_spec", lambda name: object())  # packages "installed"
    (tmp_path / "dino_vitb16_lora").mkdir()
    reason = ds.dreamsim_missing(str(tmp_path))
    assert "clip_vitb16_lora" in reason and "dino_vitb16_lora" not in reason.split("missing")[1]
    assert ds.load_dreamsim(str(tmp_path)) is None


# --------------------------------------------------------------------------- motion
def test_static_clip_measures_level_one():
    from animegamer.metrics import motion_accuracy

    static = np.stack([smooth_texture(96, 144)] * 9)
    result = motion_accuracy([static], [1], BINS, MotionConfig())
    assert result["flows"] == [0.0]
    assert result["levels"] == [1]
    assert result["acc_f"] == 1.0 and result["mae_f"] == 0.0


@pytest.mark.parametrize("pixels", [1, 4])
def test_known_shift_measures_the_level_of_its_bin(pixels):
    from animegamer.metrics import measure_levels

    clip = shifted_clip(smooth_texture(96, 144), pixels)
    flows, levels = measure_levels([clip], BINS, MotionConfig())
    assert flows[0] == pytest.approx(pixels, rel=0.1)
    assert levels == [expected_level(pixels)]


def test_motion_accuracy_fractions():
    from animegamer.metrics import motion_accuracy

    texture = smooth_texture(96, 144)
    clips = [np.stack([texture] * 9), shifted_clip(texture, 4)]  # levels 1 and 3
    result = motion_accuracy(clips, [1, 5], BINS, {"estimator": "farneback", "threshold": 0.2})  # dict config
    assert result["levels"] == [1, expected_level(4)]
    assert result["acc_f"] == 0.5
    assert result["mae_f"] == pytest.approx(abs(expected_level(4) - 5) / 2)
    assert result["confusion"][4][expected_level(4) - 1] == 1 and result["confusion"][0][0] == 1
    with pytest.raises(ValueError):
        motion_accuracy(clips, [1], BINS, MotionConfig())


def test_motion_accuracy_scores_the_renderer_against_the_level_it_was_asked_for():
    from animegamer.metrics import motion_accuracy

    texture = smooth_texture(96, 144)
    clips = [np.stack([texture] * 9), shifted_clip(texture, 4), np.stack([texture] * 9)]
    level = expected_level(4)
    # the game asked for 1, the moving clip's level and 5; the truth wanted 2, 5 and 1
    result = motion_accuracy(clips, [2, 5, 1], BINS, MotionConfig(), requested_levels=[1, level, 5])
    assert result["levels"] == [1, level, 1]
    assert result["requested"] == [1, level, 5]
    assert result["acc_f_requested"] == pytest.approx(2 / 3)  # rendered as asked: the first two
    assert result["acc_f"] == pytest.approx(1 / 3)  # at the true level: the third only
    assert "acc_f_requested" not in motion_accuracy(clips, [2, 5, 1], BINS, MotionConfig())
    with pytest.raises(ValueError, match="requested levels"):
        motion_accuracy(clips, [2, 5, 1], BINS, MotionConfig(), requested_levels=[1, 2])
    with pytest.raises(ValueError, match="requested levels must be in"):
        motion_accuracy(clips, [2, 5, 1], BINS, MotionConfig(), requested_levels=[1, 2, 6])


# --------------------------------------------------------------------------- states
TARGET = [{"ML": 3, "SC": 1, "ET": 0, "ST": 1}, {"ML": 1, "SC": 0, "ET": 1, "ST": -1}]


def test_perfect_states():
    result = state_accuracy([dict(t) for t in TARGET], TARGET)
    assert result["acc_s"] == 1.0 and result["mae_s"] == 0.0
    assert all(row == {"acc": 1.0, "mae": 0.0, "n": 2, "missing": 0} for row in result["per_state"].values())


def test_one_state_wrong_by_two():
    predicted = [dict(t) for t in TARGET]
    predicted[1]["ST"] = 1  # target -1
    result = state_accuracy(predicted, TARGET)
    assert result["acc_s"] == pytest.approx(7 / 8)
    assert result["mae_s"] == pytest.approx(2 / 8)
    assert result["per_state"]["ST"] == {"acc": 0.5, "mae": 1.0, "n": 2, "missing": 0}
    assert result["per_state"]["ML"]["acc"] == 1.0


def test_missing_prediction_is_wrong_and_not_in_mae():
    predicted = [dict(t) for t in TARGET]
    del predicted[0]["SC"]
    result = state_accuracy(predicted, TARGET)
    assert result["acc_s"] == pytest.approx(7 / 8)
    assert result["mae_s"] == 0.0
    assert result["missing"] == 1 and result["per_state"]["SC"]["missing"] == 1


# --------------------------------------------------------------------------- report
def test_paper_reference_values():
    assert PAPER_TABLE1 == {
        "clip_i": 0.8132, "dreamsim": 0.7403, "clip_t": 0.4161, "clip_t_env": 0.4012,
        "acc_f": 0.6744, "mae_f": 0.4238, "acc_s": 0.6773, "mae_s": 0.5872, "seconds_per_turn": 24.0,
    }
    assert PAPER_TABLE3_RECONSTRUCTION == {"clip_i": 0.8672, "dreamsim": 0.7928}


def test_report_writes_every_file_with_ours_beside_the_paper(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    games = []
    for g in range(2):
        turns = []
        for t in range(3):
            path = videos / f"game{g}_turn{t}.mp4"
            path.write_bytes(b"")
            turns.append({
                "instruction": f"Character: Qiqi; Motion: quickly run <{t}>; Background: day forest.",
                "environment": "day forest",
                "video": str(path),
                "states": {"ML": 3, "SC": 1, "ET": 0, "ST": 1},
                "target_states": {"ML": 3, "SC": 1, "ET": 1, "ST": 1},
                "metrics": {
                    "clip_i": 0.8 - 0.01 * t, "dreamsim": unavailable("no DreamSim weights"),
                    "clip_t": available(0.3), "clip_t_env": 0.25, "motion_level": 3, "target_level": 3,
                },
            })
        games.append({"id": f"game-{g}", "turns": turns})
    metrics = {
        "clip_i": available(0.7912),
        "dreamsim": unavailable("no DreamSim weights"),
        "clip_t": available(0.3011),
        "clip_t_env": 0.2522,
        "motion": {"acc_f": 0.5, "mae_f": 1.0, "levels": [1, 3], "targets": [1, 5], "flows": [0.0, 4.0]},
        "states": state_accuracy([{"ML": 3, "SC": 1, "ET": 0, "ST": 1}], [{"ML": 3, "SC": 1, "ET": 1, "ST": 1}]),
        "seconds_per_turn": 31.5,
    }
    out = tmp_path / "report"
    written = write_report(out, metrics, games, PAPER_TABLE1)

    for name in ("metrics.json", "report.md", "gallery.html", "per_turn_consistency.png",
                 "motion_confusion.png", "state_accuracy.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert set(written) == {"metrics_json", "report_md", "gallery_html", "consistency_plot", "motion_plot",
                            "states_plot"}
    for png in ("per_turn_consistency.png", "motion_confusion.png", "state_accuracy.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    data = json.loads((out / "metrics.json").read_text())
    assert data["headline"]["dreamsim"] == {"value": None, "available": False, "reason": "no DreamSim weights"}
    assert data["headline"]["acc_f"] == {"value": 0.5, "available": True}  # read from metrics["motion"]
    assert data["headline"]["acc_s"]["value"] == pytest.approx(0.75)
    assert data["paper"] == PAPER_TABLE1

    report = (out / "report.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")}
    ours = {"CLIP-I": "0.7912", "DreamSim": "n/a (no DreamSim weights)", "CLIP-T": "0.3011",
            "CLIP-T^E": "0.2522", "ACC-F": "0.5000", "MAE-F": "1.0000", "ACC-S": "0.7500", "MAE-S": "0.2500",
            "Time (s/turn)": "31.50"}
    paper = {"CLIP-I": "0.8132", "DreamSim": "0.7403", "CLIP-T": "0.4161", "CLIP-T^E": "0.4012",
             "ACC-F": "0.6744", "MAE-F": "0.4238", "ACC-S": "0.6773", "MAE-S": "0.5872", "Time (s/turn)": "24.00"}
    for label in ours:
        assert ours[label] in rows[label] and paper[label] in rows[label], rows.get(label)
    assert "-0.0220" in rows["CLIP-I"]  # ours - paper

    gallery = (out / "gallery.html").read_text()
    assert gallery.count("<video") == 6
    assert 'src="../videos/game0_turn0.mp4"' in gallery
    assert "&lt;2&gt;" in gallery  # instructions are escaped
    assert "game-1" in gallery and "ML=3" in gallery


def test_reconstruction_report_lists_table3(tmp_path):
    metrics = {"clip_i": 0.85, "dreamsim": unavailable("dreamsim package not installed")}
    write_report(tmp_path, metrics, [], PAPER_TABLE3_RECONSTRUCTION, title="Reconstruction")
    report = (tmp_path / "report.md").read_text()
    assert "0.8672" in report and "0.7928" in report and "0.8500" in report
    assert "n/a (dreamsim package not installed)" in report
    assert "ACC-F" not in report
    assert not math.isnan(json.loads((tmp_path / "metrics.json").read_text())["headline"]["clip_i"]["value"])


SETUP = {"model": "tiny", "parameters": {"MLLM": 1_234_567, "renderer (encoder + decoder)": 62_800, "VAE": 164_771},
         "dtype": "float32", "device": "cpu", "hardware": "Example CPU, 2 cores", "cpu": "Example CPU, 2 cores",
         "torch": "2.13.0", "sampling_steps": 4}


def test_reconstruction_report_counts_clips_and_names_the_models(tmp_path):
    """A report without games (Table 3 reconstruction) says how many clips it scored, never "0 games",
    and writes no empty gallery; the setup beside the paper says which model and hardware."""
    metrics = {"clips": 2, "clip_i": 0.85, "dreamsim": unavailable("no DreamSim weights"), "setup": SETUP}
    written = write_report(tmp_path, metrics, [], PAPER_TABLE3_RECONSTRUCTION, title="Reconstruction")
    report = (tmp_path / "report.md").read_text()
    assert "2 clips" in report and "games" not in report and "gallery" not in report
    assert "gallery_html" not in written and not (tmp_path / "gallery.html").exists()
    ours = next(line for line in report.splitlines() if line.startswith("- Ours:"))
    assert ours == ("- Ours: model preset `tiny` (MLLM 1.23 M, renderer (encoder + decoder) 62.8 K, VAE 165 K "
                    "parameters), float32 on cpu (Example CPU, 2 cores), torch 2.13.0, 4 sampling steps per clip; "
                    "2 clips.")
    assert "- Paper: the full-size AnimeGamer" in report and "| Metric | Ours (`tiny`) |" in report
    cached = {**metrics, "setup": {**SETUP, "sampling_cache": "first_block (threshold 0.05)"}}
    write_report(tmp_path / "cached", cached, [], PAPER_TABLE3_RECONSTRUCTION, title="Reconstruction")
    assert ("4 sampling steps per clip with the step cache first_block (threshold 0.05); 2 clips."
            in (tmp_path / "cached" / "report.md").read_text())


def test_the_setup_names_the_step_cache_only_when_it_is_on():
    from dataclasses import replace

    from omegaconf import OmegaConf

    from animegamer.config.compose import compose_config
    from animegamer.evaluation.runner import sampling_setup

    cfg = OmegaConf.to_object(compose_config("evaluate", ["model=tiny", "evaluation.sampling_steps=4"]))
    assert sampling_setup(cfg) == {"sampling_steps": 4}
    diffusion = replace(cfg.model.diffusion, cache="first_block", cache_threshold=0.1)
    cached = replace(cfg, model=replace(cfg.model, diffusion=diffusion))
    assert sampling_setup(cached) == {"sampling_steps": 4, "sampling_cache": "first_block (threshold 0.1)"}


def test_gallery_says_each_unavailable_reason_once_and_shows_the_truth_beside_each_clip(tmp_path):
    from animegamer.pages import save_poster

    clips = tmp_path / "clips"
    games = [{"id": f"game-{g}", "turns": []} for g in range(2)]
    for g, game in enumerate(games):
        for t in range(3):
            paths = {}
            for side, shade in (("video", 60), ("truth_video", 200)):
                paths[side] = clips / f"{side}-{g}-{t}.mp4"
                paths[side].parent.mkdir(exist_ok=True)
                paths[side].write_bytes(b"not decoded: its poster is newer")
                save_poster(np.full((8, 12, 3), shade, np.uint8), paths[side].with_suffix(".jpg"))
            game["turns"].append({"instruction": f"turn {t}", **{k: str(v) for k, v in paths.items()},
                                  "states": {"ML": 1}, "metrics": {
                                      "clip_i": unavailable("no CLIP weights configured"),
                                      "dreamsim": unavailable("no DreamSim weights"), "acc": 0.5}})
    write_report(tmp_path / "report", {"clip_i": unavailable("no CLIP weights configured")}, games)
    page = (tmp_path / "report" / "gallery.html").read_text()
    assert page.count("no CLIP weights configured") == 1 and page.count("no DreamSim weights") == 1
    assert "n/a" not in page
    pairs = re.findall(r'<video src="([^"]+)" poster="([^"]+)"', page)
    assert len(pairs) == 12
    assert pairs[:2] == [("../clips/video-0-0.mp4", "../clips/video-0-0.jpg"),
                         ("../clips/truth_video-0-0.mp4", "../clips/truth_video-0-0.jpg")]


def test_gallery_says_why_a_game_stopped(tmp_path):
    """A game ended by a malformed state generation shows how far it got and why, not an empty row."""
    reason = "turn 0 ('Go.'): malformed state generation (token 4 is not </SC>)"
    games = [{"id": "film-000000", "turns": [], "completed": 0, "planned": 3, "stopped": reason},
             {"id": "film-000007", "turns": [], "completed": 3, "planned": 3}]
    write_report(tmp_path / "report", {}, games)
    page = (tmp_path / "report" / "gallery.html").read_text()
    assert page.count("Stopped after") == 1
    assert f"Stopped after 0 of 3 turns: {reason}" in html.unescape(page) and "</SC>)" not in page
