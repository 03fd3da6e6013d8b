"""The seed summary of the known-answer benchmark (benchmarks/known_answer/seeds.py) on fabricated results
of three seeds: each row's mean and spread, the trained model against each row paired seed by seed, the
refusals of what is not one variant's seeds, and the motion-sweep plot of the evaluations' sweeps."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from animegamer.evaluation.motion_sweep import LATENT_SHIFT, LEVELS, PIXEL_FLOW, SWEEP_KEY, sweep
from animegamer.metrics.baselines import MAJORITY, UNTRAINED
from benchmarks.known_answer.data import SHARED_WORDS, TRUTH_WORDS_KEY
from benchmarks.known_answer.driver import ABLATIONS, RESULT_FILE
from benchmarks.known_answer.report import RECONSTRUCTION, TRAINED
from benchmarks.known_answer.seeds import (
    MOTION_SCOPE_OTHER,
    NO_MOTION_SCOPE,
    PLOT_FILE,
    SUMMARY_FILE,
    TABLE_FILE,
    UNTRAINED_ROW,
    main,
    summarise,
)

ABLATION_GAME = f"ablation {NO_MOTION_SCOPE}"
A2_RENDERER = "game rendered by the a2 decoder"
BASE = f"decoder base: {RECONSTRUCTION}"
SEEDS = (0, 1, 2)
# Per row and metric, the value of seeds 0, 1, 2 (None: the seed has no such row).
VALUES = {
    (TRAINED, "acc_f"): (0.5, 0.6, 0.7),
    (TRAINED, "mae_f"): (0.5, 0.4, 0.3),
    (ABLATION_GAME, "acc_f"): (0.2, 0.4, 0.5),
    (ABLATION_GAME, "mae_f"): (0.6, 0.4, 0.5),
    (UNTRAINED, "acc_f"): (0.6, 0.5, 0.9),
    (A2_RENDERER, "acc_f"): (0.4, 0.3, None),
    (RECONSTRUCTION, "sweep_rho"): (0.8, 0.9, 0.7),
    (MOTION_SCOPE_OTHER, "sweep_rho"): (0.1, 0.0, 0.2),
    (BASE, "sweep_rho"): (None, None, 0.1),
}


def _rows(seed: int) -> list[dict]:
    rows: dict[str, dict] = {}
    for (name, key), values in VALUES.items():
        if values[seed] is None:
            continue
        # The untrained game's label names the seed its MLLM started from, as the evaluation writes it.
        label = f"untrained game (MLLM at phase (b)'s start: seed {seed})" if name == UNTRAINED else name
        row = rows.setdefault(name, {"row": label, "metrics": {"clip_i": None},
                                     **({"baseline": UNTRAINED} if name == UNTRAINED else {})})
        row["metrics"][key] = values[seed]
    rows["majority"] = {"row": "majority class", "baseline": MAJORITY, "metrics": {"acc_s": 0.5}}
    return list(rows.values())


def _result(folder: Path, seed: int, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = _rows(seed if seed in SEEDS else SEEDS[0])  # a seed beyond the three: the first one's rows
    result = {"size": "gpu", "seed": seed, TRUTH_WORDS_KEY: SHARED_WORDS, "rows": rows, **extra}
    (folder / RESULT_FILE).write_text(json.dumps(result))
    return folder


def _seed_folders(tmp_path: Path) -> list[Path]:
    return [_result(tmp_path / f"s{seed}", seed) for seed in SEEDS]


def _sweep_metrics(folder: Path, speed) -> None:
    """An evaluation's metrics.json whose reconstruction swept 2 clips: clip c at flow f measures speed(c, f)."""
    level_flow = {level: 1.5 * level for level in LEVELS}
    found = sweep(lambda clip, flow: (clip, flow), 2, level_flow,
                  {PIXEL_FLOW: lambda rendered: [speed(c, f) for c, f in rendered],
                   LATENT_SHIFT: lambda rendered: [0.5 * speed(c, f) for c, f in rendered]})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps({"metrics": {"reconstruction": {SWEEP_KEY: found}}}))


def test_rows_are_summarised_over_the_seeds_that_have_them(tmp_path: Path) -> None:
    summary = summarise(_seed_folders(tmp_path), tmp_path / "summary")
    rows = {row["row"]: row for row in summary["rows"]}
    trained = rows[TRAINED]["metrics"]["acc_f"]
    assert (trained["n"], trained["mean"], trained["min"], trained["max"]) == (3, pytest.approx(0.6), 0.5, 0.7)
    assert trained["sd"] == pytest.approx(0.1)  # sample standard deviation: sqrt((0.01 + 0 + 0.01) / 2)
    # Each seed's untrained game (its label names its seed) is one row over the three seeds.
    assert rows[UNTRAINED_ROW]["n"] == 3 and rows[UNTRAINED_ROW]["metrics"]["acc_f"]["mean"] == pytest.approx(2 / 3)
    # A row of two seeds is marked so; a row of one has no spread; unavailable metrics count nowhere.
    assert rows[A2_RENDERER]["n"] == 2 and rows[A2_RENDERER]["seeds"] == [0, 1]
    assert rows[A2_RENDERER]["metrics"]["acc_f"]["sd"] == pytest.approx(math.sqrt(0.005))
    assert rows[BASE]["metrics"]["sweep_rho"]["sd"] is None
    assert "clip_i" not in rows[TRAINED]["metrics"]
    table = (tmp_path / "summary" / TABLE_FILE).read_text()
    assert f"| {A2_RENDERER} (2 of 3 seeds) | acc_f | 2 | 0.350 | 0.071 | 0.300 | 0.400 |" in table
    assert f"| {TRAINED} | acc_f | 3 | 0.600 | 0.100 | 0.500 | 0.700 |" in table
    assert json.loads((tmp_path / "summary" / SUMMARY_FILE).read_text())["seeds"] == list(SEEDS)


def test_the_trained_model_against_each_row_paired_seed_by_seed(tmp_path: Path) -> None:
    summary = summarise(_seed_folders(tmp_path), tmp_path / "summary")
    game = summary["comparisons"][f"{TRAINED}: acc_f"]
    # Differences 0.3, 0.2, 0.2: mean 0.7 / 3, spread 0.1 / sqrt(3) (0.058): more than twice over.
    against = game[ABLATION_GAME]
    assert against["difference"] == pytest.approx(0.7 / 3) and against["spread"] == pytest.approx(0.1 / math.sqrt(3))
    assert (against["n"], against["exceeds_twice_spread"], against["better"]) == (3, True, "trained")
    # Differences -0.1, 0.1, -0.2: mean -1 / 15, spread sqrt(0.07 / 3) (0.153): within it; the other is better.
    against = game[UNTRAINED_ROW]
    assert against["difference"] == pytest.approx(-1 / 15) and against["spread"] == pytest.approx(math.sqrt(0.07 / 3))
    assert (against["exceeds_twice_spread"], against["better"]) == (False, "other")
    # Lower is better for MAE-F: differences -0.1, 0, -0.2 (mean -0.1, spread 0.1): the trained one better, within it.
    against = summary["comparisons"][f"{TRAINED}: mae_f"][ABLATION_GAME]
    assert against["difference"] == pytest.approx(-0.1) and against["spread"] == pytest.approx(0.1)
    assert (against["exceeds_twice_spread"], against["better"]) == (False, "trained")
    # Two seeds: differences 0.1, 0.3 (mean 0.2, spread sqrt(0.02) = 0.141): within it.
    against = game[A2_RENDERER]
    assert (against["n"], against["difference"], against["exceeds_twice_spread"]) == (2, pytest.approx(0.2), False)
    # One seed: no spread, so never "exceeds", whatever the difference.
    base = summary["comparisons"][f"{RECONSTRUCTION}: sweep_rho"][BASE]
    assert (base["n"], base["difference"], base["spread"], base["exceeds_twice_spread"]) == (
        1, pytest.approx(0.6), None, False)
    # Games are compared with games, reconstructions with reconstructions.
    assert MOTION_SCOPE_OTHER not in game
    assert ABLATION_GAME not in summary["comparisons"][f"{RECONSTRUCTION}: sweep_rho"]
    # The motion scope's own comparison: sweep_rho differences 0.7, 0.9, 0.5 (mean 0.7, spread 0.2).
    motion = summary["motion_scope"]
    assert motion["differences"] == {0: pytest.approx(0.7), 1: pytest.approx(0.9), 2: pytest.approx(0.5)}
    assert (motion["difference"], motion["spread"], motion["exceeds_twice_spread"]) == (
        pytest.approx(0.7), pytest.approx(0.2), True)
    table = (tmp_path / "summary" / TABLE_FILE).read_text()
    assert "+0.700 over 3 seeds (seed spread 0.200): exceeds twice the seed spread." in table
    assert f"| {TRAINED} | mae_f | {ABLATION_GAME} | 3 | -0.100 | 0.100 | trained | within it |" in table
    assert (f"| {RECONSTRUCTION} | sweep_rho | {BASE} | 1 | +0.600 |  | trained | 1 seed: no spread to judge by |"
            in table)


def test_the_ablation_named_is_the_drivers_without_the_motion_scope() -> None:
    assert ABLATIONS[NO_MOTION_SCOPE].overrides == ("model.decoder.motion_scope=false",)


def _refused(capsys: pytest.CaptureFixture, folders: list[Path], out: Path) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*map(str, folders), "--out", str(out)])
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_what_is_not_one_variants_seeds_is_refused_naming_the_folder(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    folders, out = _seed_folders(tmp_path), tmp_path / "summary"
    assert main([*map(str, folders), "--out", str(out)]) == 0
    written = (out / SUMMARY_FILE).read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"{empty}: no {RESULT_FILE}" in _refused(capsys, [*folders, empty], out)
    again = _result(tmp_path / "again", 1)
    assert f"{again}: seed 1 again (also {folders[1]})" in _refused(capsys, [*folders, again], out)
    level = _result(tmp_path / "level", 3, **{TRUTH_WORDS_KEY: "level"})
    assert f"{level}: caption words 'level', but {folders[0]} has 'shared'" in _refused(capsys, [*folders, level], out)
    ci = _result(tmp_path / "ci", 4, size="ci")
    assert f"{ci}: size 'ci', but {folders[0]} has 'gpu'" in _refused(capsys, [*folders, ci], out)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / RESULT_FILE).write_text('{"size": "gpu", "seed": 5}')
    assert f"{broken / RESULT_FILE}: not a known-answer result (KeyError: 'rows')" in _refused(capsys, [broken], out)
    (broken / RESULT_FILE).write_text(json.dumps({"size": "gpu", "seed": 5, "rows": [{"row": TRAINED,
                                                                                   "metrics": {"acc_f": "high"}}]}))
    assert f"row '{TRAINED}' has a metric that is neither a number nor null" in _refused(capsys, [broken], out)
    assert (out / SUMMARY_FILE).read_text() == written  # a refused summary writes nothing


def test_the_sweep_plot_pools_the_seeds_evaluations(tmp_path: Path) -> None:
    folders = _seed_folders(tmp_path)
    summarise(folders, tmp_path / "none")
    assert not (tmp_path / "none" / PLOT_FILE).exists()  # no evaluation folder kept: no plot
    # The full model in seeds 0 and 1 renders faster clips for faster levels; the ablation in seed 0 ignores them.
    for seed in (0, 1):
        _sweep_metrics(folders[seed] / f"seed_{seed}" / "eval", lambda clip, flow: flow * (1 + clip))
    _sweep_metrics(folders[0] / "seed_0" / "eval_ablation_no_motion_scope", lambda clip, flow: 2.0 + clip)
    (folders[0] / "seed_0" / "a_joint").mkdir()  # a training run's folder: no metrics.json, not an evaluation
    summary = summarise(folders, tmp_path / "summary")
    assert (tmp_path / "summary" / PLOT_FILE).stat().st_size > 0
    assert summary["files"]["plot"] == str(tmp_path / "summary" / PLOT_FILE)
    sweeps = summary["motion_sweep"]
    assert list(sweeps) == ["eval", "eval_ablation_no_motion_scope"]
    full = sweeps["eval"][PIXEL_FLOW]
    assert sorted(full["seeds"]) == [0, 1] and full["clips"] == 4
    # Pooled over both seeds' clips: rank correlation of requested against measured speed.
    requested = [1.5 * level for level in LEVELS]
    assert full["seeds"][0]["requested"] == requested
    assert full["seeds"][1]["mean_per_level"] == pytest.approx([1.5 * f for f in requested])
    # Both seeds swept alike: pooled, their correlation is each one's (below 1: clip 1 outruns clip 0's next level).
    own = json.loads((folders[0] / "seed_0" / "eval" / "metrics.json").read_text())
    rho = own["metrics"]["reconstruction"][SWEEP_KEY]["measures"][PIXEL_FLOW]["rank_correlation"]
    assert full["pooled_rank_correlation"] == pytest.approx(rho) and 0.5 < rho < 1.0
    assert sweeps["eval_ablation_no_motion_scope"][PIXEL_FLOW]["pooled_rank_correlation"] == pytest.approx(0.0)
    assert sweeps["eval_ablation_no_motion_scope"][LATENT_SHIFT]["clips"] == 2
    assert f"]({PLOT_FILE})" in (tmp_path / "summary" / TABLE_FILE).read_text()


def test_a_sweep_without_a_speed_per_level_is_refused_naming_its_file(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    folders = _seed_folders(tmp_path)
    evaluation = folders[2] / "seed_2" / "eval"
    _sweep_metrics(evaluation, lambda clip, flow: flow)
    record = json.loads((evaluation / "metrics.json").read_text())
    record["metrics"]["reconstruction"][SWEEP_KEY]["measures"][PIXEL_FLOW]["values"][1].pop()  # one level short
    (evaluation / "metrics.json").write_text(json.dumps(record))
    error = _refused(capsys, folders, tmp_path / "summary")
    assert f"{evaluation / 'metrics.json'}: its motion sweep's {PIXEL_FLOW} does not give one value" in error
    assert not (tmp_path / "summary").exists()
