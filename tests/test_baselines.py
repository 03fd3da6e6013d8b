"""Baselines beside the evaluation's numbers: majority-class and copy-the-last-turn states (ACC-S /
MAE-S against a hand count on constructed turns), the shuffled-representation reconstruction
baseline, and both in the report of a real tiny ``evaluate.py`` run."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from animegamer.metrics.baselines import (
    COPY_LAST,
    MAJORITY,
    SHUFFLED,
    SOURCE_BENCHMARK,
    SOURCE_TRAINING,
    copy_last_predictions,
    derangement,
    majority_states,
    state_baselines,
)
from animegamer.metrics.common import available, unavailable
from animegamer.evaluation.report import write_report
from test_pages import pages  # noqa: F401  (the real tiny evaluation run, shared fixture)


def _turn(ml, sc, et, st):
    return {"states": {"ML": ml, "SC": sc, "ET": et, "ST": st}}


GAMES = [
    [_turn(1, 0, 0, 1), _turn(2, 1, 0, 1), _turn(2, 1, 1, -1)],
    [_turn(3, 0, 1, -1), _turn(3, 0, 1, -1)],
]
TRAINING = [{"ML": 2, "SC": 0, "ET": 0, "ST": 1}] * 2 + [{"ML": 3, "SC": 1, "ET": 1, "ST": -1}]


def test_majority_from_the_training_split_matches_a_hand_count():
    result = state_baselines(GAMES, TRAINING)[MAJORITY]
    assert result["source"] == SOURCE_TRAINING
    assert result["prediction"] == {"ML": 2, "SC": 0, "ET": 0, "ST": 1}
    # 20 entries; right per turn: 3, 3, 1, 1, 1; |error| per turn: 1, 1, 4, 4, 4
    assert result["acc_s"]["value"] == pytest.approx(9 / 20, abs=1e-12)
    assert result["mae_s"]["value"] == pytest.approx(14 / 20, abs=1e-12)
    assert result["states"]["per_state"]["ST"]["acc"] == pytest.approx(2 / 5, abs=1e-12)


def test_majority_falls_back_to_the_benchmark_turns_and_breaks_ties_by_the_smallest_value():
    result = state_baselines(GAMES, [])[MAJORITY]
    assert result["source"] == SOURCE_BENCHMARK
    # ML: 1, 2, 2, 3, 3 is a tie of 2 and 3 -> 2
    assert result["prediction"] == {"ML": 2, "SC": 0, "ET": 1, "ST": -1}
    # right per turn: 1, 1, 3, 3, 3; |error| per turn: 4, 4, 1, 1, 1
    assert result["acc_s"]["value"] == pytest.approx(11 / 20, abs=1e-12)
    assert result["mae_s"]["value"] == pytest.approx(11 / 20, abs=1e-12)
    assert majority_states([{"ML": 5}, {"ML": 4}, {"SC": 1}]) == {"ML": 4, "SC": 1}


def test_copy_last_turn_matches_a_hand_count_with_first_turns_missing():
    predictions = copy_last_predictions(GAMES)
    assert predictions == [{}, GAMES[0][0]["states"], GAMES[0][1]["states"], {}, GAMES[1][0]["states"]]
    result = state_baselines(GAMES, TRAINING)[COPY_LAST]
    # turns 1 of both games: 8 missing entries (wrong); the other 12 entries: right 2, 2, 4, |error| 2, 3, 0
    assert result["states"]["missing"] == 8
    assert result["acc_s"]["value"] == pytest.approx(8 / 20, abs=1e-12)
    assert result["mae_s"]["value"] == pytest.approx(5 / 12, abs=1e-12)
    one_turn_games = state_baselines([[_turn(1, 0, 0, 1)]], TRAINING)[COPY_LAST]
    assert one_turn_games["acc_s"]["value"] == 0.0 and not one_turn_games["mae_s"]["available"]


def test_derangement_has_no_fixed_point_and_is_fixed_by_its_seed():
    for n in (2, 3, 7):
        for seed in range(20):
            order = derangement(n, seed)
            assert sorted(order) == list(range(n))
            assert all(j != i for i, j in enumerate(order))
            assert order == derangement(n, seed)
    assert derangement(2, 0) == [1, 0]
    with pytest.raises(ValueError, match="at least 2"):
        derangement(1, 0)


def test_shuffled_reconstruction_decodes_each_clip_from_another_clips_representation():
    from animegamer.evaluation.runner import RECONSTRUCTION_KEYS, mean_scores, shuffled_reconstruction

    calls = []

    # Scores that say 1 exactly when clip i is decoded from its own representation.
    def score(order):
        calls.append(list(order))
        return mean_scores([{"clip_i": available(float(index == source)), "dreamsim": unavailable("no weights"),
                             "psnr": available(10.0 + index)} for index, source in enumerate(order)])

    result = shuffled_reconstruction(SimpleNamespace(seed=3), 3, score)
    assert calls == [derangement(3, 3)] and result["derangement"] == derangement(3, 3)
    assert result["clip_i"]["value"] == 0.0
    assert result["psnr"]["value"] == pytest.approx(11.0)  # mean of 10, 11, 12
    assert result["dreamsim"] == unavailable("no weights")
    alone = shuffled_reconstruction(SimpleNamespace(seed=3), 1, score)
    assert set(alone) == {"label", *RECONSTRUCTION_KEYS, "acc_f", "mae_f"}
    assert not alone["psnr"]["available"] and "at least 2" in alone["psnr"]["reason"]
    assert not alone["acc_f"]["available"] and len(calls) == 1


def test_report_shows_baselines_as_rows_beside_ours(tmp_path):
    baselines = state_baselines(GAMES, TRAINING)
    files = write_report(tmp_path, {"acc_s": available(0.9), "mae_s": available(0.1), "baselines": baselines}, [])
    report = files["report_md"].read_text()
    assert "## Baselines" in report
    assert f"| {baselines[MAJORITY]['label']} | 0.4500 | 0.7000 |" in report
    # a game's first turn has no last turn to copy: the row says what its scores leave out
    assert (f"| {baselines[COPY_LAST]['label']} (8 of 20 state values without a prediction: wrong in ACC-S, "
            f"not in MAE-S) | 0.4000 | 0.4167 |") in report
    assert "| Ours | 0.9000 | 0.1000 |" in report
    saved = json.loads(files["metrics_json"].read_text())["metrics"]["baselines"]
    assert saved[COPY_LAST]["acc_s"]["value"] == pytest.approx(0.4)


def test_real_evaluation_reports_every_baseline(pages):  # noqa: F811
    from animegamer.metrics.states import state_accuracy

    root = pages.root
    metrics = json.loads((root / "eval" / "metrics.json").read_text())["metrics"]
    benchmark = json.loads((root / "eval" / "benchmark.json").read_text())
    played = sum(len(g["turns"]) for g in benchmark["games"])
    assert metrics["games"]["completed_turns"] == played  # untrained tiny games play every turn
    base = metrics["baselines"]
    assert base[MAJORITY]["source"] == SOURCE_TRAINING
    assert base[MAJORITY]["states"]["n"] == metrics["states"]["n"] == 4 * played
    # copy-last recomputed from benchmark.json directly
    predictions, targets = [], []
    for game in benchmark["games"]:
        for t, turn in enumerate(game["turns"]):
            predictions.append(game["turns"][t - 1]["states"] if t else {})
            targets.append(turn["states"])
    assert base[COPY_LAST]["acc_s"]["value"] == pytest.approx(state_accuracy(predictions, targets)["acc_s"])
    report = (root / "eval" / "report.md").read_text()
    assert "## Baselines" in report and base[MAJORITY]["label"] in report and base[COPY_LAST]["label"] in report
    reconstruction = json.loads((root / "eval" / "reconstruction" / "metrics.json").read_text())["metrics"]
    shuffled = reconstruction["baselines"][SHUFFLED]
    assert set(shuffled) >= {"label", "clip_i", "dreamsim", "psnr"}
    if reconstruction["clips"] >= 2:
        assert sorted(shuffled["derangement"]) == list(range(reconstruction["clips"]))
    assert shuffled["label"] in (root / "eval" / "reconstruction" / "report.md").read_text()
