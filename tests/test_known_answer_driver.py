"""The known-answer benchmark's bookkeeping: rows from an evaluation's metrics, the trained game against
each row, the loss curves read from run folders, and the representation-prediction score on shards."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from animegamer.contracts.shards import PRED_REP, REP
from benchmarks.known_answer.driver import representation_prediction
from benchmarks.known_answer.report import (
    RECONSTRUCTION,
    TRAINED,
    comparisons,
    loss_histories,
    plot_curves,
    rows_of,
    write_table,
)


def _metric(value):
    return {"available": value is not None, "value": value}


EVALUATION = {
    "acc_s": _metric(0.75), "mae_s": _metric(0.5), "acc_f": _metric(0.6), "clip_i": _metric(None),
    "seconds_per_turn": _metric(2.0), "psnr_per_turn": [_metric(20.0)],
    "baselines": {"majority": {"label": "majority", "acc_s": _metric(0.5), "mae_s": _metric(1.0)},
                  "untrained": {"label": "untrained game", "acc_s": _metric(0.0), "mae_s": _metric(2.0),
                                "acc_f": _metric(0.2)}},
    "reconstruction": {"psnr": _metric(28.0), "clips": 4,
                       "baselines": {"shuffled": {"label": "shuffled", "psnr": _metric(24.5)}}},
}


def test_rows_and_margins_keep_games_and_reconstructions_apart(tmp_path: Path) -> None:
    rows = rows_of(TRAINED, EVALUATION)
    assert [r["row"] for r in rows] == [TRAINED, "majority", "untrained game", RECONSTRUCTION,
                                        f"{RECONSTRUCTION}, shuffled"]
    # Unavailable metrics are None; timings and per-turn lists are not metrics of the table.
    assert rows[0]["metrics"] == {"acc_s": 0.75, "mae_s": 0.5, "acc_f": 0.6, "clip_i": None}
    rows += [r for r in rows_of("ablation no_motion_scope", EVALUATION) if "baseline" not in r]
    margins = comparisons(rows, {TRAINED: 6, RECONSTRUCTION: 4})
    # Higher is better for ACC-S, lower for MAE-S: both margins positive when the trained game is better.
    assert margins["trained game: acc_s"]["majority"]["margin"] == pytest.approx(0.25)
    assert margins["trained game: mae_s"]["untrained game"]["margin"] == pytest.approx(1.5)
    assert margins["trained game: acc_f"]["untrained game"]["margin"] == pytest.approx(0.4)
    # A share over 6 turns: the margin's standard error, sqrt(0.6 * 0.4 / 6 + 0.2 * 0.8 / 6).
    assert margins["trained game: acc_f"]["untrained game"]["noise"] == pytest.approx((0.4 / 6) ** 0.5)
    assert "noise" not in margins["trained game: acc_s"]["majority"]  # not a share of independent items
    assert margins[f"{RECONSTRUCTION}: psnr"][f"{RECONSTRUCTION}, shuffled"]["margin"] == pytest.approx(3.5)
    # The ablation's own reconstruction is a reconstruction row; its game is a game row.
    assert f"ablation no_motion_scope: {RECONSTRUCTION}" in margins[f"{RECONSTRUCTION}: psnr"]
    assert "ablation no_motion_scope" in margins["trained game: acc_s"]
    assert not any(RECONSTRUCTION in other for other in margins["trained game: acc_s"])
    write_table(tmp_path / "t.md", rows, {"size": "ci", "seed": 0, "turns": 6, "reconstruction_clips": 4})
    table = (tmp_path / "t.md").read_text()
    assert "| row | acc_f | acc_s | mae_s | psnr |" in table  # clip_i had no value anywhere: no column
    assert "| trained game | 0.600 | 0.750 | 0.500 |  |" in table
    # The widest standard error of a difference: sqrt(2 * 0.25 / 6) = 0.29, sqrt(2 * 0.25 / 4) = 0.35.
    assert "0.29 between two rows over 6 game turns; 0.35 between two rows over 4 reconstructed clips" in table


def test_loss_curves_average_micro_batches_per_step(tmp_path: Path) -> None:
    (tmp_path / "a_warmup").mkdir()
    (tmp_path / "a_warmup" / "loss_history.json").write_text(json.dumps([[0, 0, 1.0], [0, 1, 3.0], [1, 0, 1.5]]))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "loss_history.json").write_text(json.dumps([[0, 0, 4.0]]))
    histories = loss_histories(tmp_path)
    assert histories == {"a_warmup": [(0, 2.0), (1, 1.5)], "b": [(0, 4.0)]}
    assert plot_curves(histories, tmp_path / "curves.png") and (tmp_path / "curves.png").stat().st_size > 1000
    assert not plot_curves({}, tmp_path / "none.png")


def test_representation_prediction_scores_against_the_mean_representation(tmp_path: Path) -> None:
    from animegamer.utils.io import npy_bytes
    from animegamer.contracts.files import MANIFEST
    from data_pipeline.writer import SHARD_PATTERN, write_shard

    def shards(folder: Path, member: str, arrays: dict[str, np.ndarray]) -> None:
        folder.mkdir()
        entry = write_shard(folder / SHARD_PATTERN.format(0), [{"__key__": k, member: npy_bytes(v)} for k, v in arrays.items()])
        (folder / MANIFEST).write_text(json.dumps({"shards": [entry]}))

    rng = np.random.default_rng(0)
    reps = {f"clip{i}": rng.normal(size=(3, 4)).astype(np.float32) for i in range(6)}
    mean = np.mean(list(reps.values()), axis=0)
    shards(tmp_path / "representations", REP, reps)
    # Predicting the mean representation scores 1 by definition; halfway to the truth, a quarter.
    shards(tmp_path / "adaptation", PRED_REP, {k: (mean + v) / 2 for k, v in reps.items()})
    score = representation_prediction(tmp_path)
    assert score["clips"] == 6 and score["mse_ratio"] == pytest.approx(0.25)


def test_stage_overrides_reach_their_stage_alone(tmp_path: Path) -> None:
    """``--stage base:phase.batch_size=64`` changes the decoder base stage and nothing else; malformed
    specs are all named in one error, before anything runs."""
    from dataclasses import replace

    from animegamer.errors import UserError
    from benchmarks.known_answer.driver import SIZES, Layout, parse_stage_overrides, recipe_of

    pairs = parse_stage_overrides(["base:phase.batch_size=64", "eval:model.diffusion.sampling_steps=50"])
    assert pairs == [("base", "phase.batch_size=64"), ("eval", "model.diffusion.sampling_steps=50")]
    recipe = recipe_of(Layout(tmp_path, 0), replace(SIZES["gpu"], stage_extra=tuple(pairs)))
    assert recipe.decoder_base[-1] == "phase.batch_size=64"
    assert recipe.evaluation[-1] == "model.diffusion.sampling_steps=50"
    for other in (recipe.phase_a, recipe.phase_b, recipe.phase_c, recipe.extra):
        assert not {"phase.batch_size=64", "model.diffusion.sampling_steps=50"} & set(other)
    with pytest.raises(UserError) as error:
        parse_stage_overrides(["a2:phase.lr=1", "base phase.lr=1", "b:phase.lr", "c:phase.lr=2"])
    message = str(error.value)
    assert "'a2:phase.lr=1'" in message and "'base phase.lr=1'" in message and "'b:phase.lr'" in message
    assert "c:phase.lr=2" not in message


def test_a_base_stage_override_the_base_cannot_take_is_refused_not_lost(tmp_path: Path) -> None:
    """The base stage is a plain transformer whatever its overrides say: ``--stage
    base:model.decoder.motion_scope=true`` would train the same plain base, so the pre-flight names it."""
    from dataclasses import replace

    from animegamer.recipe import base_stage_problems
    from benchmarks.known_answer.driver import SIZES, Layout, recipe_of

    def problems(*pairs: tuple[str, str]) -> list[str]:
        return base_stage_problems(recipe_of(Layout(tmp_path, 0), replace(SIZES["gpu"], stage_extra=pairs)).decoder_base)

    assert problems() == [] and problems(("base", "model.decoder.motion_scope=false")) == []
    assert problems(("a", "model.decoder.motion_scope=true")) == []  # phase (a) has it anyway
    (refused,) = problems(("base", "model.decoder.motion_scope=true"))
    assert refused.startswith("decoder base: model.decoder.motion_scope=true cannot apply")


def test_a_step_cache_the_evaluation_would_refuse_stops_before_anything_trains(tmp_path: Path) -> None:
    """The cached game plays last, after every stage: a bad threshold must fail at the start, not then."""
    from animegamer.errors import UserError
    from benchmarks.known_answer.driver import run_benchmark

    with pytest.raises(UserError, match="cache_threshold=-1.0 must be >= 0"):
        run_benchmark(tmp_path / "out", "ci", step_cache=[0.1, -1.0])
    assert not (tmp_path / "out").exists()


def test_a_gpu_size_on_a_machine_without_cuda_stops_before_any_film_is_drawn(tmp_path: Path, monkeypatch,
                                                                             capsys) -> None:
    """Every stage, pipeline step and the VAE stage that asks for CUDA is named in one refusal, exit 2, before
    the films are drawn (the recipe's own pre-flight would come only after them)."""
    import torch

    from benchmarks.known_answer.driver import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "out"), "--size", "gpu"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err
    assert "--size gpu is set for a GPU host (below); on this machine run --size ci" in err
    assert "phase a_base, a_warmup, a_joint, b, c: trainer.accelerator='gpu' needs a CUDA GPU" in err
    for step in ("precompute", "representations", "adaptation"):
        assert f"pipeline.{step}.device='cuda' needs a CUDA GPU" in err
    assert "--vae-device cuda needs a CUDA GPU, and torch sees none on this machine: run on the CPU with " \
           "--vae-device cpu" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, words", [
    (["--vae-device", "cpu"], "--size ci trains no VAE (its stages use the preset's random one): --vae-device does "
                              "not apply"),
    (["--size", "gpu", "--vae-max-seconds", "-1"], "max_seconds must be >= 0, got -1.0 (--vae-max-seconds)"),
    (["--ablations", "nope"], "unknown ablation(s) ['nope']"),
    (["--seed", "-1"], "--seed -1 must be in [0, 4294967295]"),
])
def test_options_the_size_cannot_take_are_one_line_and_exit_2(tmp_path: Path, capsys, args, words) -> None:
    from benchmarks.known_answer.driver import main

    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and words in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_another_seeds_results_are_kept_beside_under_their_seeds_names(tmp_path: Path) -> None:
    from benchmarks.known_answer.driver import (CURVES_FILE, RESULT_FILE, TABLE_FILE, keep_other_seeds_results)

    (tmp_path / RESULT_FILE).write_text(json.dumps({"seed": 0, "rows": []}))
    (tmp_path / TABLE_FILE).write_text("seed 0's table")
    (tmp_path / CURVES_FILE).write_bytes(b"png")
    keep_other_seeds_results(tmp_path, 0)  # the same seed: its own files, replaced by its run
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([RESULT_FILE, TABLE_FILE, CURVES_FILE])
    keep_other_seeds_results(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves_seed0.png", "known_answer_seed0.json",
                                                          "known_answer_seed0.md"]
    assert (tmp_path / "known_answer_seed0.md").read_text() == "seed 0's table"


def test_rows_over_the_same_items_are_compared_item_by_item() -> None:
    """Two renderers of the same 4 turns: the trained one right on turns 0-2, the other on turns 0-1 and 3.
    The margin's paired standard error comes from the per-turn differences (0, 0, 1, -1), not from the two
    shares alone."""
    def evaluation(levels):
        return {"acc_f": _metric(sum(a == b for a, b in zip(levels, TARGETS)) / 4),
                "motion": {"levels": levels, "targets": TARGETS}}

    TARGETS = [1, 2, 3, 4]
    rows = rows_of(TRAINED, evaluation([1, 2, 3, 5])) + rows_of("other renderer", evaluation([1, 2, 2, 4]))
    assert rows[0]["items"]["acc_f"]["hits"] == [1, 1, 1, 0]
    entry = comparisons(rows, {TRAINED: 4, RECONSTRUCTION: 0})["trained game: acc_f"]["other renderer"]
    assert entry["margin"] == 0 and entry["noise_kind"] == "paired"
    assert entry["noise"] == pytest.approx((2 / 3 / 4) ** 0.5)  # sample variance of (0, 0, 1, -1) is 2/3
    # Other items (other targets): only the independent bound applies.
    rows[-1]["items"]["acc_f"]["targets"] = [4, 3, 2, 1]
    entry = comparisons(rows, {TRAINED: 4, RECONSTRUCTION: 0})["trained game: acc_f"]["other renderer"]
    assert entry["noise_kind"] == "independent" and entry["noise"] == pytest.approx((2 * 0.75 * 0.25 / 4) ** 0.5)


def test_the_step_cache_compares_typical_turns_and_reads_older_evaluations() -> None:
    """The cached and uncached games run in other processes: their median turns are compared, so the
    first turn's warm-up does not count as a speed-up; when one evaluation was written before medians
    were kept (a reused one), both are compared by their means, and the record says which."""
    from benchmarks.known_answer.driver import MEAN, MEDIAN, typical_turns

    median = {"mllm": 0.05, "sample": 0.15, "vae_decode": 0.01, "total": 0.21}
    mean = {"mllm": 0.12, "sample": 0.16, "vae_decode": 0.02, "total": 0.30}
    new, old = {MEAN: mean, MEDIAN: median}, {MEAN: mean}
    assert typical_turns(new, new) == (MEDIAN, [median, median])
    assert typical_turns(new, old) == (MEAN, [mean, mean])


def test_every_benchmark_evaluation_sweeps_the_motion_scope_unless_told_not_to(tmp_path: Path, monkeypatch) -> None:
    """At gpu size the trained game's evaluation (through the recipe) and every other renderer's (the a2
    decoder, the decoder base, the ablations) reconstruct with the motion sweep on; an ``eval:`` stage
    override still turns it off. The ci size (its pixels noise) does not sweep."""
    from dataclasses import replace

    import benchmarks.known_answer.driver as driver
    from benchmarks.known_answer.driver import MOTION_SWEEP, SIZES, Layout, evaluate_renderer, parse_stage_overrides, recipe_of

    layout = Layout(tmp_path, 0)
    assert MOTION_SWEEP in recipe_of(layout, SIZES["gpu"]).evaluation
    assert MOTION_SWEEP not in recipe_of(layout, SIZES["ci"]).evaluation
    monkeypatch.setattr(driver, "evaluate_or_reuse", lambda cfg: cfg)  # the composed config, nothing played
    cfg = evaluate_renderer(layout, SIZES["gpu"], "ablation_x", "mllm", "renderer", reconstruction="renderer")
    assert cfg.evaluation.motion_sweep is True and cfg.evaluation.reconstruction_export == "renderer"
    off = replace(SIZES["gpu"], stage_extra=tuple(parse_stage_overrides(["eval:evaluation.motion_sweep=false"])))
    assert evaluate_renderer(layout, off, "ablation_x", "mllm", "renderer").evaluation.motion_sweep is False
    assert evaluate_renderer(layout, SIZES["ci"], "ablation_x", "mllm", "renderer").evaluation.motion_sweep is False


def test_the_table_names_the_caption_words_and_carries_the_sweep(tmp_path: Path) -> None:
    from animegamer.evaluation.motion_sweep import HEADLINE, PIXEL_FLOW
    from benchmarks.known_answer.data import CAPTION_WORDS_MEANING, SHARED_WORDS, TRUTH_WORDS_KEY

    rho, rising = HEADLINE[PIXEL_FLOW]
    evaluation = {**EVALUATION, "reconstruction": {**EVALUATION["reconstruction"], rho: _metric(0.9),
                                                     rising: _metric(0.75)}}
    rows = rows_of(TRAINED, evaluation)
    assert next(r for r in rows if r["row"] == RECONSTRUCTION)["metrics"][rho] == 0.9
    about = {"size": "gpu", "seed": 1, "turns": 6, "reconstruction_clips": 4}
    write_table(tmp_path / "shared.md", rows, {**about, TRUTH_WORDS_KEY: SHARED_WORDS})
    first = (tmp_path / "shared.md").read_text().splitlines()[0]
    assert f"captions with shared words ({CAPTION_WORDS_MEANING[SHARED_WORDS]})" in first
    write_table(tmp_path / "before.md", rows, about)  # a result from before the choice: the level words
    assert "captions with level words" in (tmp_path / "before.md").read_text()
    table = (tmp_path / "shared.md").read_text()
    assert f"| {RECONSTRUCTION} | " in table and f" {rho} " in table and "0.900" in table


def test_the_table_says_when_the_instruction_does_not_tell_the_game_its_motion_level(tmp_path: Path) -> None:
    rows = rows_of(TRAINED, EVALUATION)
    about = {"size": "gpu", "seed": 0, "turns": 6, "reconstruction_clips": 4}
    told = {"data": {"rules": {"ML": {"values": 5, "consistency": 1.0}}}}
    untold = {"data": {"rules": {"ML": {"values": 5, "consistency": 0.2417}}}}
    for name, extra in (("none", {}), ("told", told), ("untold", untold)):
        write_table(tmp_path / f"{name}.md", rows, {**about, **extra})
    assert "motion words tell" not in (tmp_path / "none.md").read_text()
    assert "motion words tell" not in (tmp_path / "told.md").read_text()
    assert ("The instruction's motion words tell a training clip's motion level in 0.24 of the clips"
            in (tmp_path / "untold.md").read_text())
