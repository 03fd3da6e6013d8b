"""The fine-tune's command line without training: its help names every default, its schedule is a share
of what --from's exports trained (with what it will cost), a refusal to resume names --out, and a game
that played nothing ends the command with exit code 1 and the way on."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from animegamer import finetune
from animegamer.config.compose import compose_config
from animegamer.finetune import (FAILED, FINETUNED, NOTHING_PLAYED_EXIT_CODE, STEP_SHARES, finetune_recipe, schedules,
                                 trained_steps)
from animegamer.phases.specs import A_JOINT, PHASE_B, PHASE_C

CLIP_SIZE = {"frames": 17, "height": 96, "width": 144, "fps": 8.0}


def write_export(folder: Path, phase: str, step: int, seconds: float | None, init_from: str = "") -> Path:
    """An export.json as training writes it (its tensors are not needed here)."""
    folder.mkdir(parents=True, exist_ok=True)
    record = {"config": {"model": {"name": "tiny"}, "phase": {"name": phase, "init_from": init_from}},
              "trained_data": {"clip_size": CLIP_SIZE}, "step": step, "max_steps": step}
    if seconds is not None:
        record["train_seconds"] = seconds
    (folder / "export.json").write_text(json.dumps(record))
    return folder


@pytest.fixture
def start(tmp_path) -> Path:
    """A --from run folder like the quick start's: a2 60 steps in 30 s, b 300 in 60 s, c 40 in 8 s."""
    root = tmp_path / "quickstart"
    for phase, step, seconds in ((A_JOINT, 60, 30.0), (PHASE_B, 300, 60.0), (PHASE_C, 40, 8.0)):
        write_export(root / phase / "export", phase, step, seconds)
    return root


def test_help_names_every_default(capsys):
    with pytest.raises(SystemExit) as done:
        finetune.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    shares = ", ".join(f"{STEP_SHARES[p]} ({p})" for p in FINETUNED)
    assert f"--steps A2 B C phase.max_steps of phases (a2), (b) and (c) (default: {shares} of the steps each " \
           f"--from export trained, at least 1; the log says what they will cost)" in text
    assert "(default: the one --from's exports were trained with, else paper)" in text
    assert "(default: --from's b/export)" in text and "(default: free decoding" in text


def test_default_steps_are_shares_of_what_the_exports_trained_with_their_cost(start):
    plan = schedules(start, "tiny")
    expected = [math.ceil(n * STEP_SHARES[p]) for p, n in zip(FINETUNED, (60, 300, 40))]
    assert [s.steps for s in plan] == expected == [2, 30, 4]
    assert [s.seconds for s in plan] == pytest.approx([2 * 0.5, 30 * 0.2, 4 * 0.2])
    assert plan[1].basis == f"1/10 of the 300 steps {start / PHASE_B / 'export'} trained"
    # --steps as given, still priced at the exports' pace
    given = schedules(start, "tiny", steps=(10, 20, 30))
    assert [(s.steps, s.basis) for s in given] == [(10, "--steps"), (20, "--steps"), (30, "--steps")]
    assert [s.seconds for s in given] == pytest.approx([5.0, 4.0, 6.0])


def test_a_paper_scale_start_and_a_fine_tune_of_a_fine_tune_keep_the_full_schedule(tmp_path):
    """The share is of the longest run of the phase along the exports' starts: fine-tuning a fine-tune does
    not shrink the schedule again."""
    paper = write_export(tmp_path / "paper" / A_JOINT / "export", A_JOINT, 80_000, None)
    first = write_export(tmp_path / "ft1" / A_JOINT / "export", A_JOINT, 2_000, 400.0, init_from=str(paper))
    assert trained_steps(first, A_JOINT) == (80_000, str(paper), None)
    assert trained_steps(tmp_path / "nothing", A_JOINT) is None


def test_without_an_export_the_configured_schedule_is_shared(start):
    """Phase (b) from the official MLLM: its --from b/export is not what it starts from."""
    plan = schedules(start, "tiny", official_mllm="pytorch_model.bin")
    configured = compose_config("train", ["model=tiny", "phase=b"]).phase.max_steps
    assert plan[1].steps == math.ceil(configured * STEP_SHARES[PHASE_B]) and plan[1].seconds is None
    assert f"configured {configured}" in plan[1].basis
    assert [plan[0].steps, plan[2].steps] == [2, 4]


def _run(monkeypatch, argv: list[str], summary: dict) -> list:
    """main(argv) with the recipe replaced by one that returns ``summary``; returns the recipes it got."""
    recipes = []
    monkeypatch.setattr(finetune, "run_recipe", lambda recipe: recipes.append(recipe) or dict(summary))
    monkeypatch.setattr(finetune, "setup_logging", lambda level: None)  # keeps caplog's handler on the root logger
    monkeypatch.setattr(sys, "argv", ["animegamer-finetune", *argv])
    return recipes


def test_the_schedule_and_its_cost_are_logged_before_training(start, tmp_path, monkeypatch, caplog):
    argv = ["--film", "f.mp4", "--captions", "f.jsonl", "--from", str(start), "--out", str(tmp_path / "ft")]
    recipes = _run(monkeypatch, argv, {"evaluation turns planned": 4, "evaluation turns played": 4})
    with caplog.at_level("INFO", logger=finetune.log.name):
        summary = finetune.main(argv)
    assert FAILED not in summary
    [recipe] = recipes
    assert "phase.max_steps=2" in recipe.phase_a and "phase.max_steps=30" in recipe.phase_b
    assert "phase.max_steps=4" in recipe.phase_c
    assert "phase b 30 step(s) (1/10 of the 300 steps" in caplog.text and "about 6 s at the pace" in caplog.text
    assert "about 8 s of training in all" in caplog.text


@pytest.mark.parametrize("constrained", [False, True])
def test_a_game_that_played_nothing_exits_1_with_the_way_on(start, tmp_path, monkeypatch, caplog, constrained):
    argv = ["--film", "f.mp4", "--captions", "f.jsonl", "--from", str(start), "--out", str(tmp_path / "ft"),
            *(["--constrained-states"] if constrained else [])]
    _run(monkeypatch, argv, {"evaluation turns planned": 4, "evaluation turns played": 0,
                             "5-turn game turns planned": 5, "5-turn game turns played": 0})
    with caplog.at_level("ERROR", logger=finetune.log.name), pytest.raises(SystemExit) as done:
        finetune.cli()
    assert done.value.code == NOTHING_PLAYED_EXIT_CODE == 1
    assert "the evaluation (0 of 4 turns) and the demonstration game (0 of 5 turns)" in caplog.text
    assert ("--constrained-states" in caplog.text) is not constrained and "--steps" in caplog.text


def test_a_game_that_played_exits_0(start, tmp_path, monkeypatch):
    argv = ["--film", "f.mp4", "--captions", "f.jsonl", "--from", str(start), "--out", str(tmp_path / "ft")]
    _run(monkeypatch, argv, {"evaluation turns planned": 4, "evaluation turns played": 1,
                             "5-turn game turns planned": 5, "5-turn game turns played": 5})
    assert finetune.cli() is None


def test_a_refusal_to_resume_names_out_not_output_dir(start, tmp_path, monkeypatch):
    """An output_dir override would put every stage of the fine-tune into one folder."""
    from animegamer import recipe
    from animegamer.recipe import OUT_NEW_FOLDER
    from animegamer.phases import run as runner
    from animegamer.training.run_record import Change, RunFolderChanged

    folder = tmp_path / "ft" / "b"
    refusal = RunFolderChanged(folder, folder / "run_config.json", [(Change("phase.lr", 1, 2), "changes it")])

    def refuse(composed):
        raise refusal

    monkeypatch.setattr(runner, "run", refuse)
    made = finetune_recipe("f.mp4", "f.jsonl", start, tmp_path / "ft", "tiny", (2, 30, 4))
    with pytest.raises(RunFolderChanged) as error:
        recipe.train_stage(["phase=b", f"output_dir={folder}"], made.new_folder)
    assert f"train into a new folder ({OUT_NEW_FOLDER})" in str(error.value) and "output_dir" not in str(error.value)
    assert "phase.lr: 1 (recorded) -> 2 (now)" in str(error.value)
